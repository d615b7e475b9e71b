//! # What mollm's GPU backends share
//!
//! A GPU backend is a [`Device`] (buffers, kernels by name, one wait per op) and a
//! [`GpuBackend`] (its name, score, how its device opens); [`table`] makes the ABI table of
//! it. Everything else is here, once: the checks of a call ([`check`]), the host side of every
//! op ([`ops`]: operands gathered into packed buffers, the weight layout every kernel reads
//! ([`weights`]), activations in the weight's dot format, attention's rows gathered through
//! block tables), `prepare_weight` into device buffers, and the panic guard. Kernels for each
//! device take the same operands in the same order: a parameter struct (`meta`, `u32` words)
//! and then the buffers of each [`Launch`].

pub mod attention;
pub mod host;
pub mod mem;
pub mod ops;
mod table;
pub mod weights;

pub use table::{check, header, table, Ctx, GpuBackend};

/// Why a call does not run.
#[derive(Debug)]
pub enum Error {
    Invalid(String),
    Unsupported(String),
    /// The device failed (validation, lost).
    Device(String),
    /// Device memory ran out: the message names what was asked and what is free.
    OutOfMemory(String),
}

impl Error {
    pub fn status(&self) -> abi::Status {
        match self {
            Error::Invalid(_) => abi::Status::InvalidArgument,
            Error::Unsupported(_) => abi::Status::Unsupported,
            Error::Device(_) => abi::Status::Internal,
            Error::OutOfMemory(_) => abi::Status::OutOfMemory,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Error::Invalid(m)
            | Error::Unsupported(m)
            | Error::Device(m)
            | Error::OutOfMemory(m) => m,
        }
    }
}

impl From<backend_kit::Error> for Error {
    fn from(e: backend_kit::Error) -> Error {
        match e {
            backend_kit::Error::Invalid(m) => Error::Invalid(m),
            backend_kit::Error::Unsupported(m) => Error::Unsupported(m),
        }
    }
}

/// One kernel launch: `groups` groups of 64 threads of `kernel`, given `meta` (its parameter
/// struct as `u32` words) and `bufs` in the kernel's order.
pub struct Launch<'a, B> {
    pub kernel: &'static str,
    pub meta: Vec<u32>,
    pub bufs: Vec<&'a B>,
    pub groups: u32,
}

/// A GPU as the shared host code uses it. Work is queued in order: a launch sees what every
/// launch, copy and write queued before it wrote, and only `read` and `sync` wait.
pub trait Device: Send + Sync + 'static {
    type Buf;
    /// The largest buffer one kernel operand may be, in bytes.
    fn max_binding(&self) -> u64;
    /// The largest buffer, in bytes (buffers above `max_binding` are reached through copies).
    fn max_buffer(&self) -> u64;
    /// Output rows one 64-thread group of the matmul kernels covers.
    fn matmul_rows_per_group(&self) -> u32;
    /// A device buffer holding `bytes` (`what` names it in errors).
    fn upload(&self, what: &str, bytes: &[u8]) -> Result<Self::Buf, Error>;
    /// A device buffer of `size` bytes that kernels may bind (at most `max_binding`).
    fn empty(&self, what: &str, size: u64) -> Result<Self::Buf, Error>;
    /// A device buffer of `size` bytes, up to `max_buffer` (`buffer_alloc`: the engine's
    /// activations and KV cache).
    fn alloc(&self, what: &str, size: u64) -> Result<Self::Buf, Error>;
    /// Queues `launches`, in order.
    fn enqueue(&self, launches: &[Launch<'_, Self::Buf>]) -> Result<(), Error>;
    /// Queues a copy of `size` bytes (offsets and size multiples of 4).
    fn copy(
        &self,
        src: &Self::Buf,
        src_off: u64,
        dst: &Self::Buf,
        dst_off: u64,
        size: u64,
    ) -> Result<(), Error>;
    /// Queues a write of `bytes` at `off` (multiples of 4).
    fn write(&self, dst: &Self::Buf, off: u64, bytes: &[u8]) -> Result<(), Error>;
    /// Waits for the queued work and returns `size` bytes of `src` from `off`.
    fn read(&self, src: &Self::Buf, off: u64, size: u64) -> Result<Vec<u8>, Error>;
    /// Waits for the queued work (and reports a device failure since the last wait).
    fn sync(&self) -> Result<(), Error>;
    /// Runs `launches` in order, waits, and returns the first `size` bytes of `out`.
    fn run(
        &self,
        launches: &[Launch<'_, Self::Buf>],
        out: &Self::Buf,
        size: u64,
    ) -> Result<Vec<u8>, Error> {
        self.enqueue(launches)?;
        self.read(out, 0, size)
    }
}
