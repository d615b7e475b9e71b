//! glu: SwiGLU (SIMD exps, the scalar twin on the tail) and GeGLU (ggml's f16 table).

#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use super::*;

/// SwiGLU row: whole 16-blocks through `ggml_v_silu`, the tail through `ggml_silu_f32`.
#[inline(always)]
pub(super) unsafe fn swiglu_row_body(isa: Isa, x: &mut [f32], g: &[f32]) {
    let k = x.len();
    let full = k & !15;
    // v_silu(x) * g = (x / (1 + v_expf(0 - x))) * g, the exps 16 lanes at a time.
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
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

/// [`swiglu_row_body`]'s 16-blocks in registers (the divisions and products 16 lanes at a
/// time: the same IEEE operations in the same order); returns how far it went.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn swiglu_avx512(x: &mut [f32], g: &[f32]) -> usize {
    use core::arch::x86_64::*;
    let full = x.len().min(g.len()) & !15;
    let mut nx = [0f32; 16];
    let mut e = [0f32; 16];
    for i in (0..full).step_by(16) {
        let xv = _mm512_loadu_ps(x.as_ptr().add(i));
        _mm512_storeu_ps(nx.as_mut_ptr(), _mm512_sub_ps(_mm512_setzero_ps(), xv));
        expf16_avx512(&nx, 0.0, &mut e);
        let den = _mm512_add_ps(_mm512_set1_ps(1.0), _mm512_loadu_ps(e.as_ptr()));
        let r = _mm512_mul_ps(_mm512_div_ps(xv, den), _mm512_loadu_ps(g.as_ptr().add(i)));
        _mm512_storeu_ps(x.as_mut_ptr().add(i), r);
    }
    full
}

/// [`swiglu_avx512`] with AVX2 (eight lanes at a time).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn swiglu_avx2(x: &mut [f32], g: &[f32]) -> usize {
    use core::arch::x86_64::*;
    let full = x.len().min(g.len()) & !15;
    let mut nx = [0f32; 8];
    let mut e = [0f32; 8];
    for i in (0..full).step_by(8) {
        let xv = _mm256_loadu_ps(x.as_ptr().add(i));
        _mm256_storeu_ps(nx.as_mut_ptr(), _mm256_sub_ps(_mm256_setzero_ps(), xv));
        expf8_avx2(&nx, 0.0, &mut e);
        let den = _mm256_add_ps(_mm256_set1_ps(1.0), _mm256_loadu_ps(e.as_ptr()));
        let r = _mm256_mul_ps(_mm256_div_ps(xv, den), _mm256_loadu_ps(g.as_ptr().add(i)));
        _mm256_storeu_ps(x.as_mut_ptr().add(i), r);
    }
    full
}

/// ggml's f16 GELU table widened to f32 (exact), for the SIMD rows' gathers.
#[cfg(target_arch = "x86_64")]
fn gelu_table_f32() -> &'static [f32] {
    static T: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        gelu_table()
            .iter()
            .map(|&h| quant::fp16_to_f32(h))
            .collect()
    })
}

/// GeGLU row through ggml's f16 GELU table.
#[inline(always)]
pub(super) unsafe fn geglu_row_body(isa_: Isa, x: &mut [f32], g: &[f32], t: &[u16]) {
    #[allow(unused_mut)]
    let mut i0 = 0;
    #[cfg(not(target_arch = "x86_64"))]
    let _ = isa_;
    #[cfg(target_arch = "x86_64")]
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

/// [`geglu_row_body`]'s whole 16-blocks: `vcvtps2ph` (round to nearest even, what
/// `f32_to_fp16` does) gives the table index, a gather the widened entry; 0 at or below -10,
/// `x` itself at or above 10, as the scalar row. Returns how far it went.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn geglu_avx512(x: &mut [f32], g: &[f32], t: &[f32]) -> usize {
    use core::arch::x86_64::*;
    let full = x.len().min(g.len()) & !15;
    for i in (0..full).step_by(16) {
        let v = _mm512_loadu_ps(x.as_ptr().add(i));
        let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
        let tv = _mm512_i32gather_ps::<4>(_mm512_cvtepu16_epi32(h), t.as_ptr());
        let hi = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(v, _mm512_set1_ps(10.0));
        let gl = _mm512_mask_blend_ps(hi, tv, v);
        let r = _mm512_mul_ps(gl, _mm512_loadu_ps(g.as_ptr().add(i)));
        let lo = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(v, _mm512_set1_ps(-10.0));
        _mm512_storeu_ps(
            x.as_mut_ptr().add(i),
            _mm512_mask_blend_ps(lo, r, _mm512_setzero_ps()),
        );
    }
    full
}

/// [`geglu_avx512`] with AVX2 (eight lanes at a time).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn geglu_avx2(x: &mut [f32], g: &[f32], t: &[f32]) -> usize {
    use core::arch::x86_64::*;
    let full = x.len().min(g.len()) & !7;
    for i in (0..full).step_by(8) {
        let v = _mm256_loadu_ps(x.as_ptr().add(i));
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
        let tv = _mm256_i32gather_ps::<4>(t.as_ptr(), _mm256_cvtepu16_epi32(h));
        let hi = _mm256_cmp_ps::<_CMP_GE_OQ>(v, _mm256_set1_ps(10.0));
        let gl = _mm256_blendv_ps(tv, v, hi);
        let r = _mm256_mul_ps(gl, _mm256_loadu_ps(g.as_ptr().add(i)));
        let lo = _mm256_cmp_ps::<_CMP_LE_OQ>(v, _mm256_set1_ps(-10.0));
        _mm256_storeu_ps(
            x.as_mut_ptr().add(i),
            _mm256_blendv_ps(r, _mm256_setzero_ps(), lo),
        );
    }
    full
}

pub(super) unsafe fn glu(
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
