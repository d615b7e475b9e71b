//! Tensor descriptors as they cross the backend boundary.

use crate::DType;

/// Most dimensions a tensor has. Shapes use ggml's order: `ne[0]` is the innermost,
/// contiguous dimension (a row), `ne[1]` counts rows, and so on. Quantized blocks always run
/// along `ne[0]`.
pub const MAX_DIMS: usize = 4;

/// A view of a tensor. The memory belongs to the caller: a backend reads inputs and writes
/// outputs during one `compute` call and keeps no pointer afterwards.
///
/// `nb` are strides in bytes (ggml's convention): element `(i0,i1,i2,i3)` of a plain type lives
/// at `data + i0*nb[0] + i1*nb[1] + i2*nb[2] + i3*nb[3]`; for block formats `nb[0]` is the size
/// of one block and `i0` must be a block boundary. Unused dimensions have `ne = 1`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TensorDesc {
    pub data: *mut u8,
    /// A [`DType`] id. Kept as `u32` so a value from a foreign library that names an unknown
    /// format is representable and can be refused instead of being undefined behaviour.
    pub dtype: u32,
    pub ndim: u32,
    pub ne: [i64; MAX_DIMS],
    pub nb: [i64; MAX_DIMS],
    /// 0: host memory. Otherwise a handle returned by the backend's `buffer_alloc`: for a
    /// buffer in host memory (`buffer_host_ptr`) `data` is an offset-carrying pointer the
    /// backend itself understands; for device memory `data` is the byte offset in the buffer
    /// (ABI 1.7). A prepared weight's handle keeps the original's `data`.
    pub buffer: u64,
}

impl TensorDesc {
    /// A densely packed tensor of `dtype` with shape `ne` (trailing ones may be omitted).
    ///
    /// Panics if `ne[0]` is not a whole number of blocks: the caller built the shape itself.
    pub fn contiguous(data: *mut u8, dtype: DType, shape: &[i64]) -> TensorDesc {
        assert!(
            !shape.is_empty() && shape.len() <= MAX_DIMS,
            "bad rank {}",
            shape.len()
        );
        let info = dtype.info();
        let mut ne = [1i64; MAX_DIMS];
        ne[..shape.len()].copy_from_slice(shape);
        assert!(
            ne[0] % info.block_len as i64 == 0,
            "row of {} elements is not a whole number of {} blocks",
            ne[0],
            dtype
        );
        let mut nb = [0i64; MAX_DIMS];
        nb[0] = info.block_bytes as i64;
        nb[1] = nb[0] * (ne[0] / info.block_len as i64);
        for i in 2..MAX_DIMS {
            nb[i] = nb[i - 1] * ne[i - 1];
        }
        TensorDesc {
            data,
            dtype: dtype.id(),
            ndim: shape.len() as u32,
            ne,
            nb,
            buffer: 0,
        }
    }

    pub fn dtype(&self) -> Option<DType> {
        DType::from_id(self.dtype)
    }

    pub fn shape(&self) -> [i64; MAX_DIMS] {
        self.ne
    }

    /// Number of elements, or `None` on a negative or overflowing shape.
    pub fn numel(&self) -> Option<i64> {
        self.ne.iter().try_fold(
            1i64,
            |acc, &n| if n < 0 { None } else { acc.checked_mul(n) },
        )
    }

    /// Rows of `ne[0]` elements each.
    pub fn nrows(&self) -> i64 {
        self.ne[1] * self.ne[2] * self.ne[3]
    }

    /// True when rows follow each other without gaps (dims 1..3 packed).
    pub fn is_contiguous(&self) -> bool {
        let Some(d) = self.dtype() else { return false };
        let info = d.info();
        let row = info.block_bytes as i64 * (self.ne[0] / info.block_len as i64);
        self.nb[0] == info.block_bytes as i64
            && self.nb[1] == row
            && self.nb[2] == self.nb[1] * self.ne[1]
            && self.nb[3] == self.nb[2] * self.ne[2]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_strides_follow_blocks() {
        let t = TensorDesc::contiguous(core::ptr::null_mut(), DType::Q4_0, &[64, 3, 2]);
        assert_eq!(t.nb, [18, 36, 108, 216]);
        assert_eq!(t.nrows(), 6);
        assert!(t.is_contiguous());
        assert_eq!(t.numel(), Some(384));
    }
}
