//! add, mul, scale: element-wise rows (broadcasting `y` over `x`'s rows).

#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use super::*;

#[inline(always)]
pub(crate) unsafe fn add_row_body(x: &mut [f32], y: &[f32]) {
    for c in x.chunks_exact_mut(y.len()) {
        for (v, &w) in c.iter_mut().zip(y) {
            *v += w;
        }
    }
}
isa_dispatch!(add_row => add_row_body(x: &mut [f32], y: &[f32]));

#[inline(always)]
pub(crate) unsafe fn mul_row_body(x: &mut [f32], y: &[f32]) {
    for c in x.chunks_exact_mut(y.len()) {
        for (v, &w) in c.iter_mut().zip(y) {
            *v *= w;
        }
    }
}
isa_dispatch!(mul_row => mul_row_body(x: &mut [f32], y: &[f32]));

#[inline(always)]
pub(crate) unsafe fn scale_row_body(x: &mut [f32], s: f32) {
    for v in x.iter_mut() {
        *v *= s;
    }
}
isa_dispatch!(scale_row => scale_row_body(x: &mut [f32], s: f32));

/// Whether `n` floats at `p` and `n` at `q` do not overlap.
pub(crate) fn apart(p: *const f32, q: *const f32, n: usize) -> bool {
    let (p, q, bytes) = (p as usize, q as usize, n * 4);
    p.saturating_add(bytes) <= q || q.saturating_add(bytes) <= p
}

pub(crate) unsafe fn binary(
    isa: Isa,
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    mul: bool,
) {
    let (a, b, out) = (inputs[0], inputs[1], outputs[0]);
    let k = a.ne[0] as usize;
    let kb = b.ne[0] as usize;
    for_rows(host, a.nrows(), a.ne[0], |r| {
        let (i1, i2, i3) = split_row(&a, r);
        let pa = row_ptr(&a, i1, i2, i3) as *const f32;
        let pb = row_ptr(&b, i1 % b.ne[1], i2 % b.ne[2], i3 % b.ne[3]) as *const f32;
        let po = row_ptr(&out, i1, i2, i3) as *mut f32;
        // In the output row itself where that is `a`'s row or lies apart from both (a
        // decode step's residual adds): the same operations, without two row buffers.
        if k == kb && apart(po, pb, k) && (po as *const f32 == pa || apart(po, pa, k)) {
            core::ptr::copy(pa, po, k);
            let (x, y) = (
                core::slice::from_raw_parts_mut(po, k),
                core::slice::from_raw_parts(pb, k),
            );
            match mul {
                true => mul_row(isa, x, y),
                false => add_row(isa, x, y),
            }
            return;
        }
        let mut x = vec![0f32; k];
        let mut y = vec![0f32; kb];
        read_into(&a, i1, i2, i3, &mut x);
        read_into(&b, i1 % b.ne[1], i2 % b.ne[2], i3 % b.ne[3], &mut y);
        if mul {
            mul_row(isa, &mut x, &y);
        } else {
            add_row(isa, &mut x, &y);
        }
        write_from(&out, i1, i2, i3, &x);
    });
}

pub(crate) unsafe fn scale(
    isa: Isa,
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    s: f32,
) {
    let (x, out) = (inputs[0], outputs[0]);
    let k = x.ne[0] as usize;
    for_rows(host, x.nrows(), x.ne[0], |r| {
        let (i1, i2, i3) = split_row(&x, r);
        let (px, po) = (
            row_ptr(&x, i1, i2, i3) as *const f32,
            row_ptr(&out, i1, i2, i3) as *mut f32,
        );
        if po as *const f32 == px || apart(po, px, k) {
            core::ptr::copy(px, po, k);
            scale_row(isa, core::slice::from_raw_parts_mut(po, k), s);
            return;
        }
        let mut v = vec![0f32; k];
        read_into(&x, i1, i2, i3, &mut v);
        scale_row(isa, &mut v, s);
        write_from(&out, i1, i2, i3, &v);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// add, mul and scale give the same values whether the output row lies apart from the
    /// inputs, is the first input's row, is the second input's (add, mul) or overlaps one
    /// partly (one row: rows that overlap the next input row depend on the order rows run
    /// in, on every path): the copies' path and the in-place one agree.
    #[test]
    fn outputs_apart_in_place_and_overlapping_agree() {
        let host = backend_kit::par::serial_host();
        let (k, rows) = (24usize, 3usize);
        let vals = |seed: f32| -> Vec<f32> {
            (0..k * rows)
                .map(|i| (i as f32 * 0.37 + seed).sin() * 3.0)
                .collect()
        };
        let desc = |p: *mut f32, n: usize| {
            TensorDesc::contiguous(p as *mut u8, DType::F32, &[k as i64, n as i64])
        };
        for isa in [Isa::Portable, Isa::Avx2, Isa::Avx512] {
            if !isa.detected() {
                continue;
            }
            for (op, mul) in [(Op::Add, false), (Op::Mul, true)] {
                let (a0, b0) = (vals(0.1), vals(2.3));
                let want: Vec<f32> = a0
                    .iter()
                    .zip(&b0)
                    .map(|(x, y)| if mul { x * y } else { x + y })
                    .collect();
                // Apart; in a's rows; in b's rows; shifted by half a row over a.
                for case in 0..4 {
                    let mut buf = vec![0f32; 4 * k * rows];
                    let (pa, pb) = (buf.as_mut_ptr(), unsafe { buf.as_mut_ptr().add(k * rows) });
                    unsafe {
                        core::ptr::copy(a0.as_ptr(), pa, k * rows);
                        core::ptr::copy(b0.as_ptr(), pb, k * rows);
                    }
                    let po = unsafe {
                        match case {
                            0 => buf.as_mut_ptr().add(2 * k * rows),
                            1 => pa,
                            2 => pb,
                            _ => pa.add(k / 2),
                        }
                    };
                    let n = if case == 3 { 1 } else { rows };
                    let (ins, outs) = ([desc(pa, n), desc(pb, n)], [desc(po, n)]);
                    unsafe { run(isa, &host, op, &ins, &outs, &OpParams::default()).unwrap() };
                    let got = unsafe { core::slice::from_raw_parts(po, k * n) };
                    assert_eq!(got, &want[..k * n], "{isa:?} {op:?} case {case}");
                }
            }
            let x0 = vals(0.7);
            let want: Vec<f32> = x0.iter().map(|v| v * 0.625).collect();
            for case in 0..3 {
                let mut buf = vec![0f32; 3 * k * rows];
                let px = buf.as_mut_ptr();
                unsafe { core::ptr::copy(x0.as_ptr(), px, k * rows) };
                let po = unsafe {
                    match case {
                        0 => px.add(k * rows),
                        1 => px,
                        _ => px.add(k / 2),
                    }
                };
                let p = abi::ScaleAttrs { s: 0.625 }.to_params();
                let n = if case == 2 { 1 } else { rows };
                let (ins, outs) = ([desc(px, n)], [desc(po, n)]);
                unsafe { run(isa, &host, Op::Scale, &ins, &outs, &p).unwrap() };
                let got = unsafe { core::slice::from_raw_parts(po, k * n) };
                assert_eq!(got, &want[..k * n], "{isa:?} scale case {case}");
            }
        }
    }
}
