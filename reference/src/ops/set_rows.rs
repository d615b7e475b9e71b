//! set_rows: scatter f32 rows into an f32 or f16 cache (f16 rounding to nearest even).

use crate::tensor::{invalid, read_i32, read_row, row_ptr, Result};
use abi::{DType, HostApi, TensorDesc};
use half::f16;

unsafe fn store(dst: &TensorDesc, r: i64, v: &[f32]) {
    let p = row_ptr(dst, r, 0, 0);
    match dst.dtype() {
        Some(DType::F16) => {
            for (j, &x) in v.iter().enumerate() {
                (p.wrapping_offset(j as isize * dst.nb[0] as isize) as *mut u16)
                    .write_unaligned(f16::from_f32(x).to_bits());
            }
        }
        _ => {
            for (j, &x) in v.iter().enumerate() {
                (p.wrapping_offset(j as isize * dst.nb[0] as isize) as *mut f32).write(x);
            }
        }
    }
}

/// # Safety
/// Validated call on valid memory.
pub unsafe fn run(_host: &HostApi, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    let (src, idx, dst_in, dst) = (&inputs[0], &inputs[1], &inputs[2], &outputs[0]);
    if dst_in.dtype != dst.dtype {
        return invalid("set_rows: dst input and output formats differ");
    }
    let m = src.ne[1];
    let mut rows = Vec::with_capacity(m as usize);
    for i in 0..m {
        let r = read_i32(idx, i) as i64;
        if r < 0 || r >= dst.ne[1] {
            return invalid(format!(
                "set_rows: index {r} at {i} outside 0..{}",
                dst.ne[1]
            ));
        }
        rows.push(r);
    }
    if dst_in.data != dst.data || dst_in.nb != dst.nb {
        // Distinct tensors: the output starts as a copy of the input cache.
        let bytes = dst.dtype().unwrap().info().block_bytes as usize;
        for r in 0..dst.ne[1] {
            for j in 0..dst.ne[0] {
                let s = row_ptr(dst_in, r, 0, 0).wrapping_offset((j * dst_in.nb[0]) as isize);
                let d = row_ptr(dst, r, 0, 0).wrapping_offset((j * dst.nb[0]) as isize);
                core::ptr::copy(s, d, bytes);
            }
        }
    }
    for (i, &r) in rows.iter().enumerate() {
        store(dst, r, &read_row(src, i as i64, 0, 0));
    }
    Ok(())
}
