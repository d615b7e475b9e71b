//! A backend instance behind the ABI table: the engine reaches every op through here.

use crate::error::{EngineError, Result};
use abi::{BackendHeader, BackendTable, HostApi, Op, OpCall, OpParams, Status, TensorDesc};
use core::ffi::{c_void, CStr};

thread_local! {
    static IN_BACKEND: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread is inside a backend's `compute` (what the backend allocates for its own
/// scratch is its business; tests that count the engine's allocations leave it out).
pub fn in_backend_call() -> bool {
    IN_BACKEND.with(|f| f.get())
}

fn in_backend<R>(f: impl FnOnce() -> R) -> R {
    IN_BACKEND.with(|b| b.set(true));
    let r = f();
    IN_BACKEND.with(|b| b.set(false));
    r
}

pub struct Backend {
    name: String,
    table: &'static BackendTable,
    ctx: *mut c_void,
    /// Kept so the pointer handed to `init` outlives the instance.
    _host: Box<HostApi>,
    /// Ops refused for this backend (bit `1 << op`), e.g. by the conformance gate: `supports`
    /// answers false for them, so dispatch passes them on.
    refused: u32,
    /// The ABI minor version the backend was built against: newer operands are not sent to it.
    abi_minor: u16,
    /// The plugin library the table lives in, for backends loaded at run time; dropped after
    /// `shutdown` (fields drop after `Drop::drop`).
    _lib: Option<std::sync::Arc<libloading::Library>>,
}

// SAFETY: a backend context is used from one engine thread at a time (calls are sequential);
// the backend parallelises internally through the host pool.
unsafe impl Send for Backend {}

impl Backend {
    /// Opens a backend from its header after checking the layout it was built with.
    pub fn open(header: &'static BackendHeader, host: HostApi) -> Result<Backend> {
        header.check_layout().map_err(EngineError::Invalid)?;
        // SAFETY: check_layout verified name and table are non-null; both are static.
        let name = unsafe { CStr::from_ptr(header.name) }
            .to_string_lossy()
            .into_owned();
        let table: &'static BackendTable = unsafe { &*header.table };
        Self::open_table(name, table, header.abi_minor, host, None)
    }

    /// Opens a backend whose table lives in a loaded plugin library; `lib` is kept alive as
    /// long as the instance.
    ///
    /// # Safety
    /// `table` must stay valid while `lib` is loaded (the registry passes a table from the
    /// library itself, or a padded copy of a short one).
    pub(crate) unsafe fn open_plugin(
        name: String,
        table: &'static BackendTable,
        abi_minor: u16,
        host: HostApi,
        lib: std::sync::Arc<libloading::Library>,
    ) -> Result<Backend> {
        Self::open_table(name, table, abi_minor, host, Some(lib))
    }

    fn open_table(
        name: String,
        table: &'static BackendTable,
        abi_minor: u16,
        host: HostApi,
        lib: Option<std::sync::Arc<libloading::Library>>,
    ) -> Result<Backend> {
        let host = Box::new(host);
        let mut ctx = core::ptr::null_mut();
        let st = Status::from_raw((table.init)(&*host, &mut ctx));
        if st != Status::Ok {
            return Err(EngineError::Backend {
                backend: name,
                op: "init",
                msg: format!("{st:?}"),
            });
        }
        Ok(Backend {
            name,
            table,
            ctx,
            _host: host,
            refused: 0,
            abi_minor,
            _lib: lib,
        })
    }

    /// Refuses `op` on this backend: `supports` answers false for it from now on.
    pub fn refuse(&mut self, op: Op) {
        self.refused |= 1 << (op as u32);
    }

    pub fn is_refused(&self, op: Op) -> bool {
        self.refused & (1 << (op as u32)) != 0
    }

    /// Whether this call uses what the backend's ABI version does not know (it is then
    /// declined, as an unsupported call, instead of sent).
    fn too_new(&self, op: Op, inputs: &[TensorDesc]) -> bool {
        // ABI 1.2: attention's block_table; 1.4: its seqs (several sequences in one call);
        // 1.8: ssm_conv; 1.9: gated_delta_net; 1.10: rwkv_wkv7; 1.11: norm, l2_norm and
        // token_shift (an older plugin's decode refuses the unknown op id as malformed).
        match op {
            Op::Attention => {
                (inputs.len() > 4 && self.abi_minor < 2) || (inputs.len() > 5 && self.abi_minor < 4)
            }
            Op::SsmConv => self.abi_minor < 8,
            Op::GatedDeltaNet => self.abi_minor < 9,
            Op::RwkvWkv7 => self.abi_minor < 10,
            Op::Norm | Op::L2Norm | Op::TokenShift => self.abi_minor < 11,
            _ => false,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether this backend takes this exact call (formats and shapes).
    pub fn supports(
        &self,
        op: Op,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        params: &OpParams,
    ) -> bool {
        if self.is_refused(op) || self.too_new(op, inputs) {
            return false;
        }
        let call = OpCall::new(op, inputs, outputs, *params);
        match self.table.supports {
            Some(f) => Status::from_raw(f(self.ctx, &call)) == Status::Ok,
            None => true,
        }
    }

    /// [`Backend::compute`], except that a call the backend declines (`Unsupported`, or an op
    /// refused for it) answers `Ok(false)` instead of an error, so the caller can offer it to
    /// the next backend without asking `supports` first (one boundary crossing, not two).
    pub fn try_compute(
        &self,
        op: Op,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        params: OpParams,
    ) -> Result<bool> {
        if self.is_refused(op) || self.too_new(op, inputs) {
            return Ok(false);
        }
        let call = OpCall::new(op, inputs, outputs, params);
        match Status::from_raw(in_backend(|| (self.table.compute)(self.ctx, &call))) {
            Status::Ok => Ok(true),
            Status::Unsupported => Ok(false),
            st => Err(EngineError::Backend {
                backend: self.name.clone(),
                op: op.name(),
                msg: format!("{st:?}: {}", self.last_error()),
            }),
        }
    }

    pub fn compute(
        &self,
        op: Op,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        params: OpParams,
    ) -> Result<()> {
        let call = OpCall::new(op, inputs, outputs, params);
        let st = Status::from_raw(in_backend(|| (self.table.compute)(self.ctx, &call)));
        if st == Status::Ok {
            return Ok(());
        }
        Err(EngineError::Backend {
            backend: self.name.clone(),
            op: op.name(),
            msg: format!("{st:?}: {}", self.last_error()),
        })
    }

    /// The weight repacked into this backend's private layout (`prepare_weight`), if the
    /// backend wants it; the descriptor's `buffer` is the handle to free.
    /// `mapped`: `w` lies in the model file's read-only mapping, so a backend of ABI 1.6 may
    /// drop its pages as its repack reads them (`PREPARE_SOURCE_MAPPED`).
    pub fn prepare_weight(&self, w: &TensorDesc, mapped: bool) -> Result<Option<TensorDesc>> {
        let mut out = *w;
        let st = match (self.table.prepare_weight_ex, self.table.prepare_weight) {
            (Some(f), _) if self.abi_minor >= 6 => {
                let flags = if mapped {
                    abi::PREPARE_SOURCE_MAPPED
                } else {
                    0
                };
                f(self.ctx, w, flags, &mut out)
            }
            (_, Some(f)) => f(self.ctx, w, &mut out),
            _ => return Ok(None),
        };
        match Status::from_raw(st) {
            // A device without room for the weight: said plainly, not run slower elsewhere.
            Status::OutOfMemory => Err(EngineError::Backend {
                backend: self.name.clone(),
                op: "prepare_weight",
                msg: self.last_error(),
            }),
            Status::Ok if out.buffer != 0 => Ok(Some(out)),
            _ => Ok(None),
        }
    }

    /// `prepare_weight_into` (ABI 1.5): the weight repacked into `cap` bytes at `dst` (which
    /// may hold the weight itself), or `None` where the backend has no layout for it that fits.
    pub fn prepare_weight_into(
        &self,
        w: &TensorDesc,
        dst: *mut u8,
        cap: usize,
    ) -> Option<TensorDesc> {
        let f = self.table.prepare_weight_into?;
        let mut out = *w;
        (Status::from_raw(f(self.ctx, w, dst, cap, &mut out)) == Status::Ok && out.buffer != 0)
            .then_some(out)
    }

    /// `size` bytes of host memory lent by the backend (`buffer_alloc`, `buffer_host_ptr`):
    /// its handle and 64-byte aligned address, or `None` if it lends none.
    pub fn host_buffer(&self, size: usize) -> Option<(u64, *mut u8)> {
        let (alloc, ptr) = (self.table.buffer_alloc?, self.table.buffer_host_ptr?);
        let mut handle = 0u64;
        if Status::from_raw(alloc(self.ctx, size, &mut handle)) != Status::Ok || handle == 0 {
            return None;
        }
        let p = ptr(self.ctx, handle);
        if p.is_null() || p as usize % 64 != 0 {
            self.free_buffer(handle);
            return None;
        }
        Some((handle, p))
    }

    /// Whether this backend computes on operands in its own device memory (ABI 1.7): it
    /// allocates buffers without host addresses and copies in and out of them.
    pub fn has_device_memory(&self) -> bool {
        let t = self.table;
        self.abi_minor >= 7
            && t.buffer_alloc.is_some()
            && t.buffer_copy.is_some()
            && t.synchronize.is_some()
            && t.buffer_host_ptr.is_none()
    }

    fn status(&self, what: &'static str, rc: i32) -> Result<()> {
        match Status::from_raw(rc) {
            Status::Ok => Ok(()),
            st => Err(EngineError::Backend {
                backend: self.name.clone(),
                op: what,
                msg: format!("{st:?}: {}", self.last_error()),
            }),
        }
    }

    /// `size` bytes of device memory (see [`Backend::has_device_memory`]): its handle.
    pub fn device_alloc(&self, size: usize) -> Result<u64> {
        let alloc = self.table.buffer_alloc.ok_or_else(|| {
            EngineError::Invalid(format!("backend {} allocates no memory", self.name))
        })?;
        let mut handle = 0u64;
        self.status("buffer_alloc", alloc(self.ctx, size, &mut handle))?;
        Ok(handle)
    }

    /// `buffer_copy`: `src` into `dst` (host memory or this backend's buffers); a copy into
    /// host memory waits for the backend's queued work.
    pub fn copy(&self, dst: &TensorDesc, src: &TensorDesc) -> Result<()> {
        let f = self.table.buffer_copy.ok_or_else(|| {
            EngineError::Invalid(format!("backend {} copies no buffers", self.name))
        })?;
        self.status("buffer_copy", in_backend(|| f(self.ctx, dst, src)))
    }

    /// Frees a buffer of this backend (a prepared weight, a host buffer).
    pub fn free_buffer(&self, buffer: u64) {
        if let Some(f) = self.table.buffer_free {
            f(self.ctx, buffer)
        }
    }

    pub fn last_error(&self) -> String {
        let mut buf = vec![0u8; 1024];
        let n = (self.table.last_error)(self.ctx, buf.as_mut_ptr(), buf.len());
        if n > buf.len() {
            buf.resize(n, 0);
            (self.table.last_error)(self.ctx, buf.as_mut_ptr(), buf.len());
        }
        buf.truncate(n);
        String::from_utf8_lossy(&buf).into_owned()
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        (self.table.shutdown)(self.ctx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ssm_conv (op 12, ABI 1.8) is not sent to a plugin built before it, whose decode would
    /// call the unknown op id malformed: it is declined as unsupported and goes elsewhere.
    #[test]
    fn ssm_conv_reaches_backends_of_abi_1_8_only() {
        let (mut sx, mut c, mut out) = (vec![1f32; 4], vec![0.5f32; 4], vec![0f32]);
        let f32s = |v: &mut [f32], s: &[i64]| {
            TensorDesc::contiguous(v.as_mut_ptr() as *mut u8, abi::DType::F32, s)
        };
        let ins = [f32s(&mut sx, &[4, 1, 1]), f32s(&mut c, &[4, 1])];
        let outs = [f32s(&mut out, &[1, 1, 1])];
        let p = OpParams::default();
        for (minor, takes) in [(7, false), (8, true)] {
            let host = reference::serial_host();
            let b =
                Backend::open_table("ref".into(), &reference::TABLE, minor, host, None).unwrap();
            assert_eq!(b.supports(Op::SsmConv, &ins, &outs, &p), takes, "1.{minor}");
            let ran = b.try_compute(Op::SsmConv, &ins, &outs, p).unwrap();
            assert_eq!(ran, takes, "1.{minor}");
        }
        assert_eq!(out, [2.0]);
    }

    /// gated_delta_net (op 13, ABI 1.9): the same for plugins built before it.
    #[test]
    fn gated_delta_net_reaches_backends_of_abi_1_9_only() {
        // Head size 1, one head, one token: M = 0.5 * e^0 = 0.5; d = (3 - 0.5 * 2) * 0.5 = 1;
        // M = 0.5 + 2 * 1 = 2.5; o = 2.5 * 4 * (1 / sqrt(1)) = 10.
        let (mut q, mut k, mut v) = (vec![4f32], vec![2f32], vec![3f32]);
        let (mut g, mut beta, mut st) = (vec![0f32], vec![0.5f32], vec![0.5f32]);
        let (mut o, mut st2) = (vec![0f32], vec![0f32]);
        let f32s = |v: &mut [f32]| {
            TensorDesc::contiguous(v.as_mut_ptr() as *mut u8, abi::DType::F32, &[1, 1, 1, 1])
        };
        let ins = [
            f32s(&mut q),
            f32s(&mut k),
            f32s(&mut v),
            f32s(&mut g),
            f32s(&mut beta),
            f32s(&mut st),
        ];
        let outs = [f32s(&mut o), f32s(&mut st2)];
        let p = OpParams::default();
        for (minor, takes) in [(8, false), (9, true)] {
            let host = reference::serial_host();
            let b =
                Backend::open_table("ref".into(), &reference::TABLE, minor, host, None).unwrap();
            assert_eq!(
                b.supports(Op::GatedDeltaNet, &ins, &outs, &p),
                takes,
                "1.{minor}"
            );
            let ran = b.try_compute(Op::GatedDeltaNet, &ins, &outs, p).unwrap();
            assert_eq!(ran, takes, "1.{minor}");
        }
        assert_eq!((o[0], st2[0]), (10.0, 2.5));
    }

    /// rwkv_wkv7 (op 14, ABI 1.10): the same for plugins built before it.
    #[test]
    fn rwkv_wkv7_reaches_backends_of_abi_1_10_only() {
        // Head size 1, one head, one token: sa = a * M = 2 * 0.5 = 1; M = 1 * 0.5 (b) +
        // (0.5 * 0.5 (w) + 3 * 2 (v k)) = 6.75; out = 6.75 * 4 (r) = 27.
        let (mut r, mut w, mut k, mut v) = (vec![4f32], vec![0.5f32], vec![2f32], vec![3f32]);
        let (mut a, mut b, mut st) = (vec![2f32], vec![0.5f32], vec![0.5f32]);
        let (mut o, mut st2) = (vec![0f32], vec![0f32]);
        let f32s = |v: &mut [f32]| {
            TensorDesc::contiguous(v.as_mut_ptr() as *mut u8, abi::DType::F32, &[1, 1, 1, 1])
        };
        let ins = [
            f32s(&mut r),
            f32s(&mut w),
            f32s(&mut k),
            f32s(&mut v),
            f32s(&mut a),
            f32s(&mut b),
            f32s(&mut st),
        ];
        let outs = [f32s(&mut o), f32s(&mut st2)];
        let p = OpParams::default();
        for (minor, takes) in [(9, false), (10, true)] {
            let host = reference::serial_host();
            let b =
                Backend::open_table("ref".into(), &reference::TABLE, minor, host, None).unwrap();
            assert_eq!(
                b.supports(Op::RwkvWkv7, &ins, &outs, &p),
                takes,
                "1.{minor}"
            );
            let ran = b.try_compute(Op::RwkvWkv7, &ins, &outs, p).unwrap();
            assert_eq!(ran, takes, "1.{minor}");
        }
        assert_eq!((o[0], st2[0]), (27.0, 6.75));
    }

    /// norm, l2_norm and token_shift (ops 15-17, ABI 1.11): the same for plugins built before.
    #[test]
    fn rwkv_side_ops_reach_backends_of_abi_1_11_only() {
        let (mut x, mut st, mut o, mut st2) = (vec![3f32], vec![5f32], vec![0f32], vec![0f32]);
        let f32s = |v: &mut [f32], ne: &[i64]| {
            TensorDesc::contiguous(v.as_mut_ptr() as *mut u8, abi::DType::F32, ne)
        };
        let ins = [f32s(&mut x, &[1, 1, 1]), f32s(&mut st, &[1, 1])];
        let outs = [f32s(&mut o, &[1, 1, 1]), f32s(&mut st2, &[1, 1])];
        let p = OpParams::default();
        for (minor, takes) in [(10, false), (11, true)] {
            let host = reference::serial_host();
            let b =
                Backend::open_table("ref".into(), &reference::TABLE, minor, host, None).unwrap();
            assert_eq!(
                b.supports(Op::TokenShift, &ins, &outs, &p),
                takes,
                "1.{minor}"
            );
            let l2 = abi::L2NormAttrs { eps: 1e-12 }.to_params();
            assert_eq!(
                b.supports(Op::L2Norm, &ins[..1], &outs[..1], &l2),
                takes,
                "1.{minor}"
            );
            let ran = b.try_compute(Op::TokenShift, &ins, &outs, p).unwrap();
            assert_eq!(ran, takes, "1.{minor}");
        }
        assert_eq!((o[0], st2[0]), (2.0, 3.0));
    }
}
