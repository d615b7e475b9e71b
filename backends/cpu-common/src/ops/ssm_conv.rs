//! ssm_conv: each channel's taps over its window, the reference's sum (`ssm_conv_dot`: rounded
//! products added in order, the last `taps mod 4` fused).

#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use super::*;

/// Output row `(t, s)`: channel `i` is the dot of `sx[t..t + taps, i, s]` with `c[.., i]`.
/// Each output is one sequential chain, so the ISA frame only makes `mul_add` one FMA
/// instruction (the portable variant calls libm's `fmaf`, which rounds the same).
#[inline(always)]
pub(crate) unsafe fn ssm_conv_row_body(
    sx: &TensorDesc,
    c: &TensorDesc,
    t: i64,
    s: i64,
    y: &mut [f32],
) {
    let taps = c.ne[0] as usize;
    for (i, o) in y.iter_mut().enumerate() {
        let i = i as i64;
        let win = (row_ptr(sx, i, s, 0) as *const f32).add(t as usize);
        let w = row_ptr(c, i, 0, 0) as *const f32;
        *o = ssm_conv_dot(
            core::slice::from_raw_parts(win, taps),
            core::slice::from_raw_parts(w, taps),
        );
    }
}
isa_dispatch!(ssm_conv_row =>
    ssm_conv_row_body(sx: &TensorDesc, c: &TensorDesc, t: i64, s: i64, y: &mut [f32]));

pub(crate) unsafe fn ssm_conv(
    isa: Isa,
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
) {
    let (sx, c, out) = (inputs[0], inputs[1], outputs[0]);
    let n = out.ne[0] as usize;
    // One output row per (token, sequence), as the reference; the rows are independent.
    for_rows(host, out.nrows(), out.ne[0] * c.ne[0], |r| {
        let (t, s, _) = split_row(&out, r);
        let mut y = vec![0f32; n];
        match isa {
            // Four channels' chains in the lanes of NEON registers (`crate::arm::ssm_conv`).
            #[cfg(neon)]
            Isa::Neon => crate::arm::ssm_conv::row(&sx, &c, t, s, &mut y),
            _ => ssm_conv_row(isa, &sx, &c, t, s, &mut y),
        }
        write_from(&out, t, s, 0, &y);
    });
}
