//! argmax per row.

use crate::tensor::{read_row, split_row, Result};
use abi::{HostApi, TensorDesc};

/// Index of the largest value; the first on ties; NaN is never chosen; an all-NaN (or empty)
/// row gives 0.
pub fn argmax_row(x: &[f32]) -> i32 {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in x.iter().enumerate() {
        if v.is_nan() {
            continue;
        }
        match best {
            Some((_, b)) if !(v > b) => {}
            _ => best = Some((i, v)),
        }
    }
    best.map_or(0, |(i, _)| i as i32)
}

/// # Safety
/// Validated call on valid memory.
pub unsafe fn run(_host: &HostApi, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    let (x, out) = (&inputs[0], &outputs[0]);
    for r in 0..x.nrows() {
        let (i1, i2, i3) = split_row(x, r);
        let v = argmax_row(&read_row(x, i1, i2, i3));
        let p = out
            .data
            .wrapping_offset((i1 * out.nb[0] + i2 * out.nb[1] + i3 * out.nb[2]) as isize)
            as *mut i32;
        p.write(v);
    }
    Ok(())
}
