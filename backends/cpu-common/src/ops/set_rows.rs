//! set_rows: rows into a cache (f32, or f16 rounded to nearest even).

#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use super::*;

pub(crate) unsafe fn set_rows(inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<(), Error> {
    let (src, idx, dst_in, dst) = (inputs[0], inputs[1], inputs[2], outputs[0]);
    let m = src.ne[1];
    let mut rows = Vec::with_capacity(m as usize);
    for i in 0..m {
        let r = read_i32(&idx, i) as i64;
        if r < 0 || r >= dst.ne[1] {
            return invalid(format!(
                "set_rows: index {r} at {i} outside 0..{}",
                dst.ne[1]
            ));
        }
        rows.push(r);
    }
    let k = dst.ne[0] as usize;
    let f16 = dst.dtype() == Some(DType::F16);
    let es = if f16 { 2 } else { 4 };
    if dst_in.data != dst.data || dst_in.nb != dst.nb {
        for r in 0..dst.ne[1] {
            core::ptr::copy(row_ptr(&dst_in, r, 0, 0), row_ptr(&dst, r, 0, 0), es * k);
        }
    }
    let mut v = vec![0f32; k];
    for (i, &r) in rows.iter().enumerate() {
        read_into(&src, i as i64, 0, 0, &mut v);
        if f16 {
            // Packed f16 elements (checked by `layout`), rounded to nearest even.
            let d = row_ptr(&dst, r, 0, 0) as *mut u16;
            for (e, &x) in v.iter().enumerate() {
                d.add(e).write_unaligned(quant::f32_to_fp16(x));
            }
        } else {
            write_from(&dst, r, 0, 0, &v);
        }
    }
    Ok(())
}
