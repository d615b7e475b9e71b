//! glu: SwiGLU (SIMD exps, the scalar twin on the tail) and GeGLU (ggml's f16 table).

#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use super::*;
#[cfg(x86)]
use crate::x86::glu::*;

/// SwiGLU row: whole 16-blocks through `ggml_v_silu`, the tail through `ggml_silu_f32`.
#[inline(always)]
pub(crate) unsafe fn swiglu_row_body(isa: Isa, x: &mut [f32], g: &[f32]) {
    let k = x.len();
    let full = k & !15;
    // v_silu(x) * g = (x / (1 + v_expf(0 - x))) * g, the exps 16 lanes at a time.
    let mut i = 0;
    #[cfg(x86)]
    match isa {
        Isa::Avx512 => i = swiglu_avx512(x, g),
        Isa::Avx2 => i = swiglu_avx2(x, g),
        _ => {}
    }
    while i < full {
        let mut nx = [0f32; 16];
        for l in 0..16 {
            nx[l] = 0.0 - x[i + l];
        }
        let mut e = [0f32; 16];
        expf16(isa, &nx, 0.0, &mut e);
        for l in 0..16 {
            x[i + l] = x[i + l] / (1.0 + e[l]) * g[i + l];
        }
        i += 16;
    }
    for i in full..k {
        x[i] = silu_scalar(x[i]) * g[i];
    }
}
isa_dispatch!(swiglu_row => swiglu_row_body(isa_: Isa, x: &mut [f32], g: &[f32]));

/// GeGLU row through ggml's f16 GELU table.
#[inline(always)]
pub(crate) unsafe fn geglu_row_body(isa_: Isa, x: &mut [f32], g: &[f32], t: &[u16]) {
    #[allow(unused_mut)]
    let mut i0 = 0;
    #[cfg(not(x86))]
    let _ = isa_;
    #[cfg(x86)]
    match isa_ {
        Isa::Avx512 => i0 = geglu_avx512(x, g, gelu_table_f32()),
        Isa::Avx2 => i0 = geglu_avx2(x, g, gelu_table_f32()),
        _ => {}
    }
    for i in i0..x.len() {
        let v = x[i];
        x[i] = if v <= -10.0 {
            0.0
        } else {
            let gl = if v >= 10.0 {
                v
            } else {
                quant::fp16_to_f32(t[quant::f32_to_fp16(v) as usize])
            };
            gl * g[i]
        };
    }
}
isa_dispatch!(geglu_row => geglu_row_body(isa_: Isa, x: &mut [f32], g: &[f32], t: &[u16]));

pub(crate) unsafe fn glu(
    isa: Isa,
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    act: i64,
) {
    let (gate, up, out) = (inputs[0], inputs[1], outputs[0]);
    let k = gate.ne[0] as usize;
    let table = if act == abi::GLU_SILU {
        None
    } else {
        Some(gelu_table())
    };
    for_rows(host, gate.nrows(), gate.ne[0], |r| {
        let (i1, i2, i3) = split_row(&gate, r);
        // The gate row copied into the output row and worked on there, `up` read in place,
        // unless the output row overlaps `up`'s (then through buffers, as written below).
        let (up_p, op) = (
            row_ptr(&up, i1, i2, i3) as *const f32,
            row_ptr(&out, i1, i2, i3) as *mut f32,
        );
        let apart =
            (op as usize + 4 * k <= up_p as usize) || (up_p as usize + 4 * k <= op as usize);
        if apart {
            core::ptr::copy(row_ptr(&gate, i1, i2, i3) as *const f32, op, k);
            let x = core::slice::from_raw_parts_mut(op, k);
            let g = core::slice::from_raw_parts(up_p, k);
            match table {
                None => swiglu_row(isa, isa, x, g),
                Some(t) => geglu_row(isa, isa, x, g, t),
            }
            return;
        }
        let mut x = vec![0f32; k];
        let mut g = vec![0f32; k];
        read_into(&gate, i1, i2, i3, &mut x);
        read_into(&up, i1, i2, i3, &mut g);
        match table {
            None => swiglu_row(isa, isa, &mut x, &g),
            Some(t) => geglu_row(isa, isa, &mut x, &g, t),
        }
        write_from(&out, i1, i2, i3, &x);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SwiGLU rows (SIMD exps) equal the scalar twin `v_silu(x) * g` (and `silu_scalar` on
    /// the tail) bit for bit.
    #[test]
    fn swiglu_matches_scalar_twin() {
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        let mut rnd = |scale: f32| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
        };
        for isa in [Isa::Portable, Isa::Avx2, Isa::Avx512] {
            if !isa.detected() {
                continue;
            }
            for k in [16usize, 64, 69, 1536] {
                for scale in [1.0f32, 20.0, 300.0] {
                    let x: Vec<f32> = (0..k).map(|_| rnd(scale)).collect();
                    let g: Vec<f32> = (0..k).map(|_| rnd(4.0)).collect();
                    let mut got = x.clone();
                    unsafe { swiglu_row(isa, isa, &mut got, &g) };
                    for i in 0..k {
                        let want = if i < k & !15 {
                            v_silu(x[i]) * g[i]
                        } else {
                            silu_scalar(x[i]) * g[i]
                        };
                        assert_eq!(
                            got[i].to_bits(),
                            want.to_bits(),
                            "{isa:?} x={} g={}",
                            x[i],
                            g[i]
                        );
                    }
                }
            }
        }
    }

    /// GeGLU rows (SIMD table gathers) equal the scalar row bit for bit: random values across
    /// the table's range and beyond, the ±10 edges, infinities and NaN, odd tails.
    #[test]
    fn geglu_matches_scalar_row() {
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        let mut rnd = |scale: f32| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
        };
        let t = gelu_table();
        for isa in [Isa::Avx2, Isa::Avx512] {
            if !isa.detected() {
                continue;
            }
            for k in [16usize, 40, 69, 1536] {
                let mut x: Vec<f32> = (0..k).map(|_| rnd(30.0)).collect();
                let edges = [
                    10.0f32,
                    -10.0,
                    9.999,
                    -9.999,
                    f32::INFINITY,
                    f32::NEG_INFINITY,
                ];
                for (j, e) in edges.iter().enumerate() {
                    x[(7 * j) % k] = *e;
                }
                x[k / 2] = f32::NAN;
                x[k - 1] = -0.0;
                let g: Vec<f32> = (0..k).map(|_| rnd(4.0)).collect();
                let mut want = x.clone();
                unsafe { geglu_row_body(Isa::Portable, &mut want, &g, t) };
                let mut got = x.clone();
                unsafe { geglu_row(isa, isa, &mut got, &g, t) };
                for i in 0..k {
                    assert_eq!(
                        got[i].to_bits(),
                        want[i].to_bits(),
                        "{isa:?} x={} g={}",
                        x[i],
                        g[i]
                    );
                }
            }
        }
    }
}
