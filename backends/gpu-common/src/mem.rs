//! Device memory the engine holds through the ABI (`buffer_alloc`): its activations and KV
//! cache. An operand in such a buffer has `data` = its byte offset there. Ops read it and
//! write their results there without a host round trip; work is queued in order and the
//! host waits only where it reads (`buffer_copy` to host memory, `synchronize`).
//!
//! An operand a kernel reads on the host (ids, positions, block tables, and the activations
//! of the products whose conversion runs on the host) must be passed in host memory: `check`
//! declines such a call, and the engine copies the operand out itself, so that every wait is
//! the engine's and it can count them.

use crate::host;
use crate::{Ctx, Device, Error, Launch};
use abi::{Op, TensorDesc};
use std::sync::Arc;

/// A device operand: its buffer (of `cap` bytes) and the byte range it spans there.
pub struct Place<B> {
    pub buf: Arc<B>,
    pub cap: u64,
    pub off: u64,
    pub size: u64,
}

/// Whether operand `i` of `op` (its `n_in` inputs, then its outputs) may lie in device
/// memory: `false` for those read on the host. `exact`: a mat_mul whose activations are
/// converted on the device.
pub fn on_device_ok(op: Op, i: usize, n_in: usize, exact: bool) -> bool {
    match op {
        Op::MatMul => i == 2 || (i == 1 && exact),
        Op::Rope => i != 1,
        // A table in device memory is an activation (f32 rows, copied row by row).
        Op::GetRows => i != 1,
        Op::Attention => i <= 2 || i >= n_in,
        Op::SetRows => i != 1,
        _ => true,
    }
}

/// Bytes one element (block) of `t` takes.
fn element(t: &TensorDesc) -> u64 {
    t.dtype().map_or(0, |d| d.info().block_bytes as u64)
}

impl<D: Device> Ctx<D> {
    /// Where device operand `t` lies: its buffer and the bytes from its first to one past its
    /// last element. Whole words: offsets, strides and size multiples of 4.
    pub fn place(&self, t: &TensorDesc) -> Result<Place<D::Buf>, Error> {
        let (buf, cap) = self.buffer(t.buffer)?;
        let off = t.data as u64;
        let el = element(t);
        let mut end = off + el;
        for d in 0..4 {
            if t.ne[d] <= 0 {
                return Ok(Place {
                    buf,
                    cap,
                    off,
                    size: 0,
                });
            }
            if t.nb[d] < 0 {
                return Err(Error::Invalid("negative stride in a device tensor".into()));
            }
            let blocks = if d == 0 {
                t.ne[0] / t.dtype().map_or(1, |x| x.info().block_len as i64)
            } else {
                t.ne[d]
            };
            end += (blocks - 1) as u64 * t.nb[d] as u64;
        }
        if end > cap {
            return Err(Error::Invalid(format!(
                "a device tensor spans bytes {off}..{end} of a {cap}-byte buffer"
            )));
        }
        let size = end - off;
        if off % 4 != 0 || t.nb.iter().any(|&b| b % 4 != 0 && b != el as i64) || size % 4 != 0 {
            return Err(Error::Unsupported(format!(
                "a device tensor at byte {off}, strides {:?}, {size} bytes: not whole words",
                t.nb
            )));
        }
        Ok(Place {
            buf,
            cap,
            off,
            size,
        })
    }

    /// Device operand `t`, packed: its place, refused unless its elements lie densely.
    pub(crate) fn packed(&self, t: &TensorDesc) -> Result<Place<D::Buf>, Error> {
        if !t.is_contiguous() {
            return Err(Error::Unsupported(
                "a strided device tensor (only packed ones are read whole)".into(),
            ));
        }
        self.place(t)
    }

    /// Operand `t` in a device buffer of its own, packed: a host tensor uploaded, a device one
    /// copied there (in queue order, no wait).
    ///
    /// # Safety
    /// A host `t` is readable for its shape and strides.
    pub unsafe fn input(&self, t: &TensorDesc, what: &str) -> Result<D::Buf, Error> {
        if t.buffer == 0 {
            return self.dev.upload(what, &host::gather(t));
        }
        let p = self.packed(t)?;
        let b = self.dev.empty(what, p.size)?;
        self.dev.copy(&p.buf, p.off, &b, 0, p.size)?;
        Ok(b)
    }

    /// Operand `t`'s bytes on the host, packed (what kernels take as parameters: ids,
    /// positions, tables). A device operand is read back, which waits.
    ///
    /// # Safety
    /// As [`Ctx::input`].
    pub unsafe fn host_bytes(&self, t: &TensorDesc) -> Result<Vec<u8>, Error> {
        if t.buffer == 0 {
            return Ok(host::gather(t));
        }
        let p = self.packed(t)?;
        self.dev.read(&p.buf, p.off, p.size)
    }

    /// Runs `launches`, whose result is `out`'s packed bytes in `ob`, and puts it in `out`:
    /// host memory waits for it, a device tensor gets it by a queued copy.
    ///
    /// # Safety
    /// A host `out` is writable for its shape and strides.
    pub unsafe fn deliver(
        &self,
        launches: &[Launch<'_, D::Buf>],
        ob: &D::Buf,
        out: &TensorDesc,
        mangle: impl FnOnce(&mut [u8]),
    ) -> Result<(), Error> {
        let size = host::packed_bytes(out) as u64;
        if out.buffer == 0 {
            let mut r = self.dev.run(launches, ob, size)?;
            mangle(&mut r);
            host::scatter(out, &r);
            return Ok(());
        }
        let p = self.packed(out)?;
        self.dev.enqueue(launches)?;
        self.dev.copy(ob, 0, &p.buf, p.off, p.size)
    }

    /// Queues a copy of `size` bytes from `src` at `so` to `dst` at `d_off`. Within one buffer
    /// (a cache's page copies, rows of the arena) through a scratch buffer: devices copy
    /// between distinct buffers only.
    pub(crate) fn copy_buf(
        &self,
        src: &Arc<D::Buf>,
        so: u64,
        dst: &Arc<D::Buf>,
        d_off: u64,
        size: u64,
    ) -> Result<(), Error> {
        if !Arc::ptr_eq(src, dst) {
            return self.dev.copy(src, so, dst, d_off, size);
        }
        let tmp = self.dev.alloc("copy", size)?;
        self.dev.copy(src, so, &tmp, 0, size)?;
        self.dev.copy(&tmp, 0, dst, d_off, size)
    }

    /// `buffer_copy`: `src` into `dst`, either of them in host memory or in this context's
    /// buffers. A copy into host memory waits for the queued work.
    ///
    /// # Safety
    /// Host tensors are valid for their shapes and strides.
    pub unsafe fn copy(&self, dst: &TensorDesc, src: &TensorDesc) -> Result<(), Error> {
        for (t, what) in [(dst, "dst"), (src, "src")] {
            if t.buffer == 0 {
                backend_kit::tensor::check_layout(t, what)?;
            } else {
                self.place(t)?;
            }
        }
        if dst.dtype != src.dtype || dst.ne != src.ne {
            return Err(Error::Invalid(format!(
                "buffer_copy: {:?} {:?} into {:?} {:?}",
                src.dtype(),
                src.ne,
                dst.dtype(),
                dst.ne
            )));
        }
        match (src.buffer, dst.buffer) {
            (0, 0) => {
                host::scatter(dst, &host::gather(src));
                Ok(())
            }
            (0, _) => {
                let p = self.packed(dst)?;
                self.dev.write(&p.buf, p.off, &host::gather(src))
            }
            (_, 0) => {
                self.read_allowed()?;
                let b = self.host_bytes(src)?;
                host::scatter(dst, &b);
                Ok(())
            }
            _ => {
                let (s, d) = (self.packed(src)?, self.packed(dst)?);
                self.copy_buf(&s.buf, s.off, &d.buf, d.off, s.size)
            }
        }
    }
}
