//! Where activations live: the arena a step's nodes write into (the engine's memory, a host
//! buffer a backend lent, or the device memory of a backend that has its own), the device
//! memory the KV cache may share with it, and the calls staged through host memory when the
//! device declines one.

use super::Exec;
use crate::error::{EngineError, Result};
use abi::{DType, Op, OpParams, TensorDesc};

/// The executor's memory state.
pub(super) struct Memory {
    /// The graph executor's activation memory (see [`Exec::arena`]).
    arena: std::cell::RefCell<ArenaMem>,
    /// The backend whose device memory holds the activations and the KV cache
    /// ([`Exec::use_device_memory`]); `None`: host memory.
    pub(super) device: Option<usize>,
    /// Waits for the device: copies of device tensors into host memory (the logits, the
    /// operands of ops the device declines) and host calls the device takes (each waits for
    /// its result); and steps run, for profiles and tests.
    round_trips: std::cell::Cell<u64>,
    steps: std::cell::Cell<u64>,
}

impl Memory {
    pub(super) fn new() -> Memory {
        Memory {
            arena: std::cell::RefCell::new(ArenaMem::None),
            device: None,
            round_trips: Default::default(),
            steps: Default::default(),
        }
    }

    /// The arena's buffer handle when it is in device memory; 0 otherwise.
    pub(super) fn device_arena(&self) -> u64 {
        match &*self.arena.borrow() {
            ArenaMem::Device { handle, .. } => *handle,
            _ => 0,
        }
    }

    /// A host call went to backend `bi`: where that is the device, it waited for its result.
    pub(super) fn waited(&self, bi: usize) {
        if self.device == Some(bi) {
            self.round_trips.set(self.round_trips.get() + 1);
        }
    }

    /// The arena, taken out (for the executor's drop).
    pub(super) fn take_arena(&mut self) -> ArenaMem {
        std::mem::replace(self.arena.get_mut(), ArenaMem::None)
    }
}

/// Activation memory: a host buffer a backend lent (`buffer_alloc` + `buffer_host_ptr`), or
/// the engine's own when none does.
pub(super) enum ArenaMem {
    None,
    Backend {
        backend: usize,
        handle: u64,
        ptr: *mut u8,
        size: usize,
    },
    Own(Vec<AlignedLine>),
    /// Device memory (`data` of a tensor there is its offset).
    Device {
        backend: usize,
        handle: u64,
        size: usize,
    },
}

#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(super) struct AlignedLine([u8; 64]);

impl ArenaMem {
    fn size(&self) -> usize {
        match self {
            ArenaMem::None => 0,
            ArenaMem::Backend { size, .. } | ArenaMem::Device { size, .. } => *size,
            ArenaMem::Own(v) => v.len() * 64,
        }
    }
}

/// Bytes from a tensor's first element to one past its last.
fn span_bytes(d: &TensorDesc) -> usize {
    let Some(dt) = d.dtype() else { return 0 };
    let blocks = [
        d.ne[0] / dt.info().block_len as i64,
        d.ne[1],
        d.ne[2],
        d.ne[3],
    ];
    if blocks.iter().any(|&n| n <= 0) {
        return 0;
    }
    (0..4).map(|i| (blocks[i] - 1) * d.nb[i]).sum::<i64>() as usize + dt.info().block_bytes as usize
}

/// `bytes` bytes at `data` (an address, or an offset in `buffer`) as one I32 row.
fn flat(data: *mut u8, buffer: u64, bytes: usize) -> TensorDesc {
    let mut d = TensorDesc::contiguous(data, DType::I32, &[(bytes / 4) as i64]);
    d.buffer = buffer;
    d
}

/// A pool in device memory: the memory and copies of the backend that holds the activations.
impl crate::kv::DeviceMemory for Exec {
    fn alloc(&self, bytes: usize) -> Result<u64> {
        self.device_alloc(bytes)
    }

    fn copy_within(&self, buffer: u64, from: usize, to: usize, bytes: usize) -> Result<()> {
        let at = |off: usize| flat(off as *mut u8, buffer, bytes);
        self.device_copy(&at(to), &at(from))
    }
}

impl Exec {
    /// At least `bytes` of 64-byte aligned activation memory, valid until a later call asks
    /// for more (or the executor drops): its address, and its buffer handle (0: host memory).
    /// In device memory where [`Exec::use_device_memory`] chose a backend (the address is then
    /// null: tensors there carry offsets); else allocated through the first backend that lends
    /// host buffers, so that the memory is the backend's; the engine's own otherwise. Grows,
    /// never shrinks: a steady-state step allocates nothing.
    pub(crate) fn arena(&self, bytes: usize) -> Result<(*mut u8, u64)> {
        let bytes = bytes.max(64);
        let mut a = self.memory.arena.borrow_mut();
        if a.size() < bytes {
            let old = std::mem::replace(&mut *a, ArenaMem::None);
            self.free_arena(old);
            *a = match self.memory.device {
                Some(bi) => ArenaMem::Device {
                    backend: bi,
                    handle: self.backends[bi].device_alloc(bytes)?,
                    size: bytes,
                },
                None => self
                    .backends
                    .iter()
                    .enumerate()
                    .find_map(|(i, b)| {
                        b.host_buffer(bytes).map(|(handle, ptr)| ArenaMem::Backend {
                            backend: i,
                            handle,
                            ptr,
                            size: bytes,
                        })
                    })
                    .unwrap_or_else(|| {
                        ArenaMem::Own(vec![AlignedLine([0; 64]); bytes.div_ceil(64)])
                    }),
            };
        }
        Ok(match &mut *a {
            ArenaMem::None => unreachable!("sized above"),
            ArenaMem::Backend { ptr, .. } => (*ptr, 0),
            ArenaMem::Own(v) => (v.as_mut_ptr() as *mut u8, 0),
            ArenaMem::Device { handle, .. } => (core::ptr::null_mut(), *handle),
        })
    }

    /// Holds the activations and the KV cache in the device memory of the first backend when
    /// it has its own (ABI 1.7) and `p` suits: ops then pass device tensors, with no host
    /// round trip between them, and a step waits once, for its logits. Off with
    /// MOLLM_DEVICE_MEMORY=0, and for programs that run host code between calls (`host`:
    /// MoE routing, recurrent state). The backend's name where it is on.
    pub fn use_device_memory(&mut self, host: bool) -> Option<&str> {
        let off = !abi::settings::DEVICE_MEMORY.on(true);
        if host || off || !self.backends[0].has_device_memory() {
            return None;
        }
        self.memory.device = Some(0);
        Some(self.backends[0].name())
    }

    /// `size` bytes of device memory of the backend [`Exec::use_device_memory`] chose: its
    /// handle (freed with the backend).
    pub(crate) fn device_alloc(&self, size: usize) -> Result<u64> {
        let bi = self
            .memory
            .device
            .ok_or_else(|| EngineError::Invalid("no device memory".into()))?;
        self.backends[bi].device_alloc(size)
    }

    /// `buffer_copy` on the device backend; a copy into host memory counts as a round trip.
    pub(crate) fn device_copy(&self, dst: &TensorDesc, src: &TensorDesc) -> Result<()> {
        let bi = self
            .memory
            .device
            .ok_or_else(|| EngineError::Invalid("no device memory".into()))?;
        if dst.buffer == 0 && src.buffer != 0 {
            self.memory
                .round_trips
                .set(self.memory.round_trips.get() + 1);
        }
        self.backends[bi].copy(dst, src)
    }

    /// A step ran (for the round trips a step makes, see [`Exec::arena_report`]).
    pub(crate) fn count_step(&self) {
        self.memory.steps.set(self.memory.steps.get() + 1);
    }

    /// (host round trips, steps) so far.
    pub fn round_trips(&self) -> (u64, u64) {
        (self.memory.round_trips.get(), self.memory.steps.get())
    }

    /// A call some of whose operands lie in device memory, which the device backend declined:
    /// those operands are copied into host memory (whole spans, so strided caches too), the
    /// call goes to the backends as a host call, and its outputs are copied back.
    pub(super) fn staged(
        &self,
        op: Op,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        params: OpParams,
        first: Option<(usize, &[TensorDesc])>,
    ) -> Result<()> {
        // (device tensor, its host copy); the same tensor twice (set_rows in place) shares one.
        let mut copies: Vec<(TensorDesc, TensorDesc, Vec<AlignedLine>)> = Vec::new();
        let mut host = |d: &TensorDesc, read: bool| -> Result<TensorDesc> {
            if d.buffer == 0 {
                return Ok(*d);
            }
            if let Some((_, h, _)) = copies
                .iter()
                .find(|(x, _, _)| x.buffer == d.buffer && x.data == d.data && x.nb == d.nb)
            {
                return Ok(*h);
            }
            let span = span_bytes(d).next_multiple_of(4);
            let mut mem = vec![AlignedLine([0; 64]); span.div_ceil(64)];
            let mut h = *d;
            h.buffer = 0;
            h.data = mem.as_mut_ptr() as *mut u8;
            if read {
                self.device_copy(&flat(h.data, 0, span), &flat(d.data, d.buffer, span))?;
            }
            copies.push((*d, h, mem));
            Ok(h)
        };
        let ins = inputs
            .iter()
            .map(|d| host(d, true))
            .collect::<Result<Vec<_>>>()?;
        let outs = outputs
            .iter()
            .map(|d| host(d, false))
            .collect::<Result<Vec<_>>>()?;
        // The backend's own weight stays (operand 0); the rest are the host copies.
        let first = first.map(|(bi, f)| {
            let mut v = ins.clone();
            v[0] = f[0];
            (bi, v)
        });
        self.call_with(
            op,
            &ins,
            &outs,
            params,
            first.as_ref().map(|(b, v)| (*b, &v[..])),
        )?;
        for (d, h, _) in &copies {
            if outputs
                .iter()
                .any(|o| o.buffer == d.buffer && o.data == d.data)
            {
                let span = span_bytes(d).next_multiple_of(4);
                self.device_copy(&flat(d.data, d.buffer, span), &flat(h.data, 0, span))?;
            }
        }
        Ok(())
    }

    /// The backend whose buffer holds the activation arena (`None`: the engine's memory, or
    /// no arena yet).
    pub fn arena_backend(&self) -> Option<&str> {
        match &*self.memory.arena.borrow() {
            ArenaMem::Backend { backend, .. } => Some(self.backends[*backend].name()),
            _ => None,
        }
    }

    /// One line on where the activation arena lives, for MOLLM_PROFILE reports.
    pub fn arena_report(&self) -> String {
        let mib = self.memory.arena.borrow().size() as f64 / (1 << 20) as f64;
        if let ArenaMem::Device { backend, .. } = &*self.memory.arena.borrow() {
            let (trips, steps) = self.round_trips();
            return format!(
                "activation arena: {mib:.1} MiB of {}'s device memory, with the KV cache; {trips} \
                 host round trips in {steps} steps",
                self.backends[*backend].name()
            );
        }
        match self.arena_backend() {
            Some(b) => format!("activation arena: {mib:.1} MiB, a host buffer of {b}"),
            None => format!("activation arena: {mib:.1} MiB of the engine's memory"),
        }
    }

    pub(super) fn free_arena(&self, a: ArenaMem) {
        if let ArenaMem::Backend {
            backend, handle, ..
        }
        | ArenaMem::Device {
            backend, handle, ..
        } = a
        {
            self.backends[backend].free_buffer(handle);
        }
    }
}
