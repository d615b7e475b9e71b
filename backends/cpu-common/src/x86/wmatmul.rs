//! AVX2 / AVX-512 VNNI dot products of one packed W4G32 / W4G128 / W8PC row with `C` quantized
//! activation columns at once, bit-identical to `quant::mollm::vec_dot` (and to
//! [`super::wmatmul`]'s portable chain).
//!
//! Per group: the row's codes are unpacked from the nibbles once and multiplied into each
//! column (AVX2: `maddubs` on the unsigned codes, then `madd`; VNNI: `vpdpbusd`), the 4-bit
//! codes' offset removed as `8·Σa` (W8PC: ggml's sign trick instead); eight groups' sums are
//! transposed into one vector so that group `g` lands in lane `g % 8`, then one vector
//! `fma(dw·da, isum, lanes)` per eight groups (the reference's lanes exactly; a last partial
//! chunk only touches its lanes) and `hsum_float_8`. `C = 4` is the prompt GEMM tile (the
//! unpacked group serves four columns), `C = 1` the decode GEMV.

use core::arch::x86_64::*;

/// Which integer instructions: AVX2 (`maddubs` + `madd`) or AVX-512 VNNI (`vpdpbusd`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    Avx2,
    Avx512,
}

const W4G32: u8 = 0;
const W4G128: u8 = 1;
const W8PC: u8 = 2;

/// Sums each of the eight vectors' eight i32 lanes: lane j of the result is Σ v[j].
#[inline(always)]
unsafe fn transpose_sum(v: &[__m256i; 8]) -> __m256i {
    let t0 = _mm256_hadd_epi32(v[0], v[1]);
    let t1 = _mm256_hadd_epi32(v[2], v[3]);
    let t2 = _mm256_hadd_epi32(v[4], v[5]);
    let t3 = _mm256_hadd_epi32(v[6], v[7]);
    let u0 = _mm256_hadd_epi32(t0, t1);
    let u1 = _mm256_hadd_epi32(t2, t3);
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(u0, u1),
        _mm256_permute2x128_si256::<0x31>(u0, u1),
    )
}

#[inline(always)]
unsafe fn hsum8(v: __m256) -> f32 {
    let mut l = [0f32; 8];
    _mm256_storeu_ps(l.as_mut_ptr(), v);
    let r = [l[4] + l[0], l[5] + l[1], l[6] + l[2], l[7] + l[3]];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// One group of the row, ready to multiply: codes in activation order, 32 bytes per vector
/// (W4G32: one; W4G128: four, for activation bytes 0, 32, 64, 96; W8PC: the raw int8 weights).
#[inline(always)]
unsafe fn unpack<const F: u8>(q: *const u8) -> [__m256i; 4] {
    let z = _mm256_setzero_si256();
    match F {
        W4G32 => {
            let b = _mm_loadu_si128(q as *const __m128i);
            let m = _mm_set1_epi8(0x0F);
            let codes = _mm256_set_m128i(
                _mm_and_si128(_mm_srli_epi16::<4>(b), m),
                _mm_and_si128(b, m),
            );
            [codes, z, z, z]
        }
        W4G128 => {
            let m = _mm256_set1_epi8(0x0F);
            let b0 = _mm256_loadu_si256(q as *const __m256i);
            let b1 = _mm256_loadu_si256(q.add(32) as *const __m256i);
            [
                _mm256_and_si256(b0, m),
                _mm256_and_si256(b1, m),
                _mm256_and_si256(_mm256_srli_epi16::<4>(b0), m),
                _mm256_and_si256(_mm256_srli_epi16::<4>(b1), m),
            ]
        }
        _ => [_mm256_loadu_si256(q as *const __m256i), z, z, z],
    }
}

/// The eight i32 partial sums of one unpacked group times activations `a`.
#[inline(always)]
unsafe fn mul<const F: u8, const VNNI: bool>(u: &[__m256i; 4], a: *const i8) -> __m256i {
    let al = |o: usize| _mm256_loadu_si256(a.add(o) as *const __m256i);
    let ones = _mm256_set1_epi16(1);
    let z = _mm256_setzero_si256();
    match (F, VNNI) {
        (W4G32, false) => _mm256_madd_epi16(_mm256_maddubs_epi16(u[0], al(0)), ones),
        (W4G32, true) => _mm256_dpbusd_epi32(z, u[0], al(0)),
        (W4G128, false) => {
            // |each| <= 2·15·128: four of them fit in i16.
            let s = _mm256_add_epi16(
                _mm256_add_epi16(
                    _mm256_maddubs_epi16(u[0], al(0)),
                    _mm256_maddubs_epi16(u[1], al(32)),
                ),
                _mm256_add_epi16(
                    _mm256_maddubs_epi16(u[2], al(64)),
                    _mm256_maddubs_epi16(u[3], al(96)),
                ),
            );
            _mm256_madd_epi16(s, ones)
        }
        (W4G128, true) => {
            let acc = _mm256_dpbusd_epi32(z, u[0], al(0));
            let acc = _mm256_dpbusd_epi32(acc, u[1], al(32));
            let acc = _mm256_dpbusd_epi32(acc, u[2], al(64));
            _mm256_dpbusd_epi32(acc, u[3], al(96))
        }
        (_, false) => {
            let a = al(0);
            let p = _mm256_maddubs_epi16(_mm256_sign_epi8(u[0], u[0]), _mm256_sign_epi8(a, u[0]));
            _mm256_madd_epi16(p, ones)
        }
        (_, true) => {
            let a = al(0);
            _mm256_dpbusd_epi32(z, _mm256_sign_epi8(u[0], u[0]), _mm256_sign_epi8(a, u[0]))
        }
    }
}

/// `C` outputs: packed weight `row` of `dt` (`k = a[c].len()`), activation codes `a[c]` with
/// their per-group scales `ad[c]` and sums `asum[c]` (Q8_0 groups of 32, A8G128 of 128).
///
/// # Safety
/// The CPU runs `isa` (AVX2 + FMA + F16C; AVX-512 F/BW/VL/VNNI); slices sized for `k`.
#[inline(always)]
pub unsafe fn dot<const C: usize>(
    isa: Isa,
    dt: abi::DType,
    row: &[u8],
    a: [&[i8]; C],
    ad: [&[f32]; C],
    asum: [&[i32]; C],
) -> [f32; C] {
    use abi::DType;
    match (isa, dt) {
        (Isa::Avx2, DType::W4G32) => dot_avx2::<W4G32, C>(row, a, ad, asum),
        (Isa::Avx2, DType::W4G128) => dot_avx2::<W4G128, C>(row, a, ad, asum),
        (Isa::Avx2, _) => dot_avx2::<W8PC, C>(row, a, ad, asum),
        (Isa::Avx512, DType::W4G32) => dot_vnni::<W4G32, C>(row, a, ad, asum),
        (Isa::Avx512, DType::W4G128) => dot_vnni::<W4G128, C>(row, a, ad, asum),
        (Isa::Avx512, _) => dot_vnni::<W8PC, C>(row, a, ad, asum),
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_avx2<const F: u8, const C: usize>(
    row: &[u8],
    a: [&[i8]; C],
    ad: [&[f32]; C],
    asum: [&[i32]; C],
) -> [f32; C] {
    dot_body::<F, false, C>(row, a, ad, asum)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot_vnni<const F: u8, const C: usize>(
    row: &[u8],
    a: [&[i8]; C],
    ad: [&[f32]; C],
    asum: [&[i32]; C],
) -> [f32; C] {
    dot_body::<F, true, C>(row, a, ad, asum)
}

#[inline(always)]
unsafe fn codes_at<const F: u8>(rp: *const u8, g: usize) -> *const u8 {
    match F {
        W4G32 => rp.add(18 * g + 2),
        W4G128 => rp.add(66 * g + 2),
        _ => rp.add(68 * (g / 2) + 4 + 32 * (g % 2)),
    }
}

#[inline(always)]
unsafe fn scale<const F: u8>(rp: *const u8, g: usize) -> f32 {
    match F {
        W4G32 => quant::fp16_to_f32(core::ptr::read_unaligned(rp.add(18 * g) as *const u16)),
        W4G128 => quant::fp16_to_f32(core::ptr::read_unaligned(rp.add(66 * g) as *const u16)),
        _ => core::ptr::read_unaligned(rp.add(68 * (g / 2)) as *const f32),
    }
}

#[inline(always)]
unsafe fn scales8<const F: u8>(rp: *const u8, g0: usize) -> __m256 {
    match F {
        // Each block's own scale (a converted row repeats one value; the reference reads it
        // per block either way).
        W8PC => _mm256_setr_ps(
            scale::<F>(rp, g0),
            scale::<F>(rp, g0 + 1),
            scale::<F>(rp, g0 + 2),
            scale::<F>(rp, g0 + 3),
            scale::<F>(rp, g0 + 4),
            scale::<F>(rp, g0 + 5),
            scale::<F>(rp, g0 + 6),
            scale::<F>(rp, g0 + 7),
        ),
        _ => {
            let stride = if F == W4G32 { 18 } else { 66 };
            let mut h = [0u16; 8];
            for (j, v) in h.iter_mut().enumerate() {
                *v = core::ptr::read_unaligned(rp.add(stride * (g0 + j)) as *const u16);
            }
            _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr() as *const __m128i))
        }
    }
}

/// One chunk of `n` (<= 8) groups from `g0`: updates every column's lanes.
#[inline(always)]
unsafe fn chunk<const F: u8, const VNNI: bool, const C: usize, const FULL: bool>(
    rp: *const u8,
    g0: usize,
    n: usize,
    a: &[&[i8]; C],
    ad: &[&[f32]; C],
    asum: &[&[i32]; C],
    lanes: &mut [__m256; C],
) {
    let gl = if F == W4G128 { 128 } else { 32 };
    let mut v = [[_mm256_setzero_si256(); 8]; C];
    for j in 0..8 {
        // Always eight slots (the array stays in registers); a partial chunk leaves zeros.
        if FULL || j < n {
            let u = unpack::<F>(codes_at::<F>(rp, g0 + j));
            for c in 0..C {
                v[c][j] = mul::<F, VNNI>(&u, a[c].as_ptr().add(gl * (g0 + j)));
            }
        }
    }
    if FULL {
        let dw = scales8::<F>(rp, g0);
        for c in 0..C {
            let mut isum = transpose_sum(&v[c]);
            if F != W8PC {
                let s = _mm256_loadu_si256(asum[c].as_ptr().add(g0) as *const __m256i);
                isum = _mm256_sub_epi32(isum, _mm256_slli_epi32::<3>(s));
            }
            let d = _mm256_mul_ps(dw, _mm256_loadu_ps(ad[c].as_ptr().add(g0)));
            lanes[c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), lanes[c]);
        }
        return;
    }
    // The last, partial chunk: groups g0..g0+n in lanes 0..n, the other lanes kept as they
    // are (as the reference leaves them). `ad` and `asum` are zero-padded to whole chunks.
    let mut m = [0i32; 8];
    m[..n].fill(-1);
    let dw = match F {
        W8PC => {
            let mut d = [0f32; 8];
            for (j, v) in d.iter_mut().enumerate().take(n) {
                *v = scale::<F>(rp, g0 + j);
            }
            _mm256_loadu_ps(d.as_ptr())
        }
        _ => {
            let stride = if F == W4G32 { 18 } else { 66 };
            let mut h = [0u16; 8];
            for (j, v) in h.iter_mut().enumerate().take(n) {
                *v = core::ptr::read_unaligned(rp.add(stride * (g0 + j)) as *const u16);
            }
            _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr() as *const __m128i))
        }
    };
    let mask = _mm256_castsi256_ps(_mm256_loadu_si256(m.as_ptr() as *const __m256i));
    for c in 0..C {
        let mut isum = transpose_sum(&v[c]);
        if F != W8PC {
            let s = _mm256_loadu_si256(asum[c].as_ptr().add(g0) as *const __m256i);
            isum = _mm256_sub_epi32(isum, _mm256_slli_epi32::<3>(s));
        }
        let d = _mm256_mul_ps(dw, _mm256_loadu_ps(ad[c].as_ptr().add(g0)));
        let next = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), lanes[c]);
        lanes[c] = _mm256_blendv_ps(lanes[c], next, mask);
    }
}

/// Closures do not inherit the callers' target features, so everything here is an
/// `#[inline(always)]` function, compiled inside the `#[target_feature]` frame.
#[inline(always)]
unsafe fn dot_body<const F: u8, const VNNI: bool, const C: usize>(
    row: &[u8],
    a: [&[i8]; C],
    ad: [&[f32]; C],
    asum: [&[i32]; C],
) -> [f32; C] {
    let k = a[0].len();
    let ngroups = k / if F == W4G128 { 128 } else { 32 };
    let rp = row.as_ptr();
    let mut lanes = [_mm256_setzero_ps(); C];
    let full = ngroups / 8 * 8;
    for g0 in (0..full).step_by(8) {
        chunk::<F, VNNI, C, true>(rp, g0, 8, &a, &ad, &asum, &mut lanes);
    }
    if full < ngroups {
        chunk::<F, VNNI, C, false>(rp, full, ngroups - full, &a, &ad, &asum, &mut lanes);
    }
    let mut out = [0f32; C];
    for c in 0..C {
        out[c] = hsum8(lanes[c]);
    }
    out
}
