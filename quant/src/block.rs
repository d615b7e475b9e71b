//! The [`Block`] trait: a fixed-size, `#[repr(C)]` block parsed from (and written to)
//! unaligned little-endian bytes.

use abi::DType;

pub trait Block: Sized + Copy + Default + 'static {
    const DTYPE: DType;
    /// Elements per block.
    const ELEMS: usize;
    /// Bytes per block, as stored in GGUF (equals `size_of::<Self>()`).
    const BYTES: usize;
    /// Parses one block; `b.len()` must be at least `BYTES`.
    fn read(b: &[u8]) -> Self;
    /// Writes one block; `out.len()` must be at least `BYTES`.
    fn write(&self, out: &mut [u8]);
}

/// Iterates the blocks of a row held in `src`.
#[inline(always)]
pub(crate) fn blocks<B: Block>(src: &[u8]) -> impl Iterator<Item = B> + '_ {
    src.chunks_exact(B::BYTES).map(B::read)
}

/// Asserts at compile time that a block struct's size matches `abi`'s `block_bytes` and that
/// its element count matches `block_len`.
macro_rules! check_layout {
    ($t:ty, $dt:expr, $elems:expr, $bytes:expr) => {
        const _: () = assert!(core::mem::size_of::<$t>() == $bytes);
        const _: () = assert!($dt.info().block_bytes as usize == $bytes);
        const _: () = assert!($dt.info().block_len as usize == $elems);
    };
}
pub(crate) use check_layout;
