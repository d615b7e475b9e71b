//! Host tensors in and out: the kernels see packed tensors in ggml's element order, so strided
//! views are gathered before upload and results scattered back through the caller's strides.

use abi::TensorDesc;

/// Bytes per row of `ne[0]` elements and per element (block) of `t`.
fn geometry(t: &TensorDesc) -> (usize, usize, usize) {
    let info = t.dtype().expect("validated").info();
    let row = (t.ne[0] as usize / info.block_len as usize) * info.block_bytes as usize;
    (row, info.block_bytes as usize, info.block_len as usize)
}

/// Bytes of `t` packed (rows one after another).
pub fn packed_bytes(t: &TensorDesc) -> usize {
    geometry(t).0 * t.nrows().max(0) as usize
}

/// Calls `f(offset of row, index of row)` for every row (dims 1..3) of `t`.
fn rows(t: &TensorDesc, mut f: impl FnMut(isize, usize)) {
    let mut i = 0;
    for i3 in 0..t.ne[3] {
        for i2 in 0..t.ne[2] {
            for i1 in 0..t.ne[1] {
                f((i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3]) as isize, i);
                i += 1;
            }
        }
    }
}

/// `t`'s bytes, rows packed one after another.
///
/// # Safety
/// `t` is a validated host tensor whose memory is readable for its shape and strides.
pub unsafe fn gather(t: &TensorDesc) -> Vec<u8> {
    let (row, el, blen) = geometry(t);
    let mut out = vec![0u8; row * t.nrows() as usize];
    rows(t, |off, i| {
        let dst = &mut out[i * row..(i + 1) * row];
        let src = t.data.offset(off);
        if t.nb[0] as usize == el || blen > 1 {
            core::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), row);
        } else {
            for (j, d) in dst.chunks_exact_mut(el).enumerate() {
                core::ptr::copy_nonoverlapping(
                    src.offset(j as isize * t.nb[0] as isize),
                    d.as_mut_ptr(),
                    el,
                );
            }
        }
    });
    out
}

/// Row `r` (dims 1..3 flattened) of a tensor whose rows are packed, or of `t` as laid out.
///
/// # Safety
/// As [`gather`]; rows must be packed within (block formats always are).
pub unsafe fn row<'a>(t: &TensorDesc, r: usize) -> &'a [u8] {
    let (row, _, _) = geometry(t);
    let (ne1, ne2) = (t.ne[1] as usize, t.ne[2] as usize);
    let (i1, i2, i3) = (r % ne1, (r / ne1) % ne2, r / (ne1 * ne2));
    let off = i1 as i64 * t.nb[1] + i2 as i64 * t.nb[2] + i3 as i64 * t.nb[3];
    core::slice::from_raw_parts(t.data.offset(off as isize), row)
}

/// Writes packed `bytes` (as [`gather`] returns them) into `t` through its strides.
///
/// # Safety
/// `t` is a validated host tensor whose memory is writable for its shape and strides.
pub unsafe fn scatter(t: &TensorDesc, bytes: &[u8]) {
    let (row, el, _) = geometry(t);
    assert_eq!(bytes.len(), row * t.nrows() as usize, "scatter: size");
    rows(t, |off, i| {
        let src = &bytes[i * row..(i + 1) * row];
        let dst = t.data.offset(off);
        if t.nb[0] as usize == el {
            core::ptr::copy_nonoverlapping(src.as_ptr(), dst, row);
        } else {
            for (j, s) in src.chunks_exact(el).enumerate() {
                core::ptr::copy_nonoverlapping(
                    s.as_ptr(),
                    dst.offset(j as isize * t.nb[0] as isize),
                    el,
                );
            }
        }
    });
}

/// The bytes of plain numbers.
pub fn bytes<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: plain numbers have no padding or invalid bit patterns.
    unsafe { core::slice::from_raw_parts(v.as_ptr() as *const u8, core::mem::size_of_val(v)) }
}

pub fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|x| f32::from_le_bytes(x.try_into().unwrap()))
        .collect()
}

pub fn i32s(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|x| i32::from_le_bytes(x.try_into().unwrap()))
        .collect()
}
