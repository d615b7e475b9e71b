//! AVX2 dot products of one packed W4G32 / W4G128 / W8PC row with one quantized activation
//! column, bit-identical to `quant::mollm::vec_dot` (and to [`super::wmatmul`]'s portable
//! chain): the integer sum of each group straight from the packed nibbles
//! (`maddubs(code, a)` over unsigned codes, minus `8·Σa`; W8PC with ggml's sign trick), eight
//! groups' sums transposed into one vector so that group `g` lands in lane `g % 8`, then one
//! vector `fma(dw·da, isum, lanes)` per eight groups (the reference's lanes exactly) and
//! `hsum_float_8`.

use core::arch::x86_64::*;

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
unsafe fn ones() -> __m256i {
    _mm256_set1_epi16(1)
}

/// Σ code·a over one W4G32 group (codes 0..15, element j low nibble of byte j, j+16 high).
#[inline(always)]
unsafe fn w4g32_partials(q: *const u8, a: *const i8) -> __m256i {
    let b = _mm_loadu_si128(q as *const __m128i);
    let m = _mm_set1_epi8(0x0F);
    let lo = _mm_and_si128(b, m);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(b), m);
    let codes = _mm256_set_m128i(hi, lo);
    let p = _mm256_maddubs_epi16(codes, _mm256_loadu_si256(a as *const __m256i));
    _mm256_madd_epi16(p, ones())
}

/// Σ code·a over one W4G128 group (element j low nibble of byte j, j+64 high).
#[inline(always)]
unsafe fn w4g128_partials(q: *const u8, a: *const i8) -> __m256i {
    let m = _mm256_set1_epi8(0x0F);
    let b0 = _mm256_loadu_si256(q as *const __m256i);
    let b1 = _mm256_loadu_si256(q.add(32) as *const __m256i);
    let al = |o: usize| _mm256_loadu_si256(a.add(o) as *const __m256i);
    let p0 = _mm256_maddubs_epi16(_mm256_and_si256(b0, m), al(0));
    let p1 = _mm256_maddubs_epi16(_mm256_and_si256(b1, m), al(32));
    let p2 = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16::<4>(b0), m), al(64));
    let p3 = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16::<4>(b1), m), al(96));
    // |each| <= 2·15·128: four of them fit in i16.
    let s = _mm256_add_epi16(_mm256_add_epi16(p0, p1), _mm256_add_epi16(p2, p3));
    _mm256_madd_epi16(s, ones())
}

/// Σ w·a over 32 signed bytes (|w|, |a| <= 127): ggml's sign trick.
#[inline(always)]
unsafe fn i8_partials(w: *const u8, a: *const i8) -> __m256i {
    let w = _mm256_loadu_si256(w as *const __m256i);
    let a = _mm256_loadu_si256(a as *const __m256i);
    let p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
    _mm256_madd_epi16(p, ones())
}

#[inline(always)]
unsafe fn hsum8(v: __m256) -> f32 {
    let mut l = [0f32; 8];
    _mm256_storeu_ps(l.as_mut_ptr(), v);
    let r = [l[4] + l[0], l[5] + l[1], l[6] + l[2], l[7] + l[3]];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// Which integer kernel: AVX2 (maddubs + madd) or AVX-512 VNNI (vpdpbusd; W4G128 groups in
/// one zmm).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    Avx2,
    Avx512,
}

const W4G32: u8 = 0;
const W4G128: u8 = 1;
const W8PC: u8 = 2;

/// One output: packed weight `row` of `dt` (`k = a.len()`), activation codes `a` with their
/// per-group scales `ad` and sums `asum` (Q8_0 groups of 32, or A8G128 groups of 128).
///
/// # Safety
/// The CPU runs `isa` (AVX2 + FMA + F16C; AVX-512 F/BW/VL/VNNI); slices sized for `k`.
#[inline(always)]
pub unsafe fn dot(isa: Isa, dt: abi::DType, row: &[u8], a: &[i8], ad: &[f32], asum: &[i32]) -> f32 {
    use abi::DType;
    match (isa, dt) {
        (Isa::Avx2, DType::W4G32) => dot_avx2::<W4G32>(row, a, ad, asum),
        (Isa::Avx2, DType::W4G128) => dot_avx2::<W4G128>(row, a, ad, asum),
        (Isa::Avx2, _) => dot_avx2::<W8PC>(row, a, ad, asum),
        (Isa::Avx512, DType::W4G32) => dot_avx512::<W4G32>(row, a, ad, asum),
        (Isa::Avx512, DType::W4G128) => dot_avx512::<W4G128>(row, a, ad, asum),
        (Isa::Avx512, _) => dot_avx512::<W8PC>(row, a, ad, asum),
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_avx2<const F: u8>(row: &[u8], a: &[i8], ad: &[f32], asum: &[i32]) -> f32 {
    dot_body::<F, false>(row, a, ad, asum)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot_avx512<const F: u8>(row: &[u8], a: &[i8], ad: &[f32], asum: &[i32]) -> f32 {
    dot_body::<F, true>(row, a, ad, asum)
}

/// W4G128 with VNNI: one zmm of packed nibbles is the whole group.
#[inline(always)]
unsafe fn w4g128_partials_vnni(q: *const u8, a: *const i8) -> __m256i {
    let m = _mm512_set1_epi8(0x0F);
    let b = _mm512_loadu_si512(q as *const _);
    let lo = _mm512_and_si512(b, m);
    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(b), m);
    let acc = _mm512_dpbusd_epi32(
        _mm512_setzero_si512(),
        lo,
        _mm512_loadu_si512(a as *const _),
    );
    let acc = _mm512_dpbusd_epi32(acc, hi, _mm512_loadu_si512(a.add(64) as *const _));
    _mm256_add_epi32(
        _mm512_castsi512_si256(acc),
        _mm512_extracti64x4_epi64::<1>(acc),
    )
}

#[inline(always)]
unsafe fn w4g32_partials_vnni(q: *const u8, a: *const i8) -> __m256i {
    let b = _mm_loadu_si128(q as *const __m128i);
    let m = _mm_set1_epi8(0x0F);
    let codes = _mm256_set_m128i(
        _mm_and_si128(_mm_srli_epi16::<4>(b), m),
        _mm_and_si128(b, m),
    );
    _mm256_dpbusd_epi32(
        _mm256_setzero_si256(),
        codes,
        _mm256_loadu_si256(a as *const __m256i),
    )
}

#[inline(always)]
unsafe fn i8_partials_vnni(w: *const u8, a: *const i8) -> __m256i {
    let w = _mm256_loadu_si256(w as *const __m256i);
    let a = _mm256_loadu_si256(a as *const __m256i);
    _mm256_dpbusd_epi32(
        _mm256_setzero_si256(),
        _mm256_sign_epi8(w, w),
        _mm256_sign_epi8(a, w),
    )
}

#[inline(always)]
unsafe fn dot_body<const F: u8, const VNNI: bool>(
    row: &[u8],
    a: &[i8],
    ad: &[f32],
    asum: &[i32],
) -> f32 {
    let k = a.len();
    let ngroups = if F == W4G128 { k / 128 } else { k / 32 };
    let (rp, ap) = (row.as_ptr(), a.as_ptr());
    // Group g: its integer partials (8 lanes) and the 8·Σa correction of the 4-bit codes.
    let partials = |g: usize| -> __m256i {
        match (F, VNNI) {
            (W4G32, false) => w4g32_partials(rp.add(18 * g + 2), ap.add(32 * g)),
            (W4G32, true) => w4g32_partials_vnni(rp.add(18 * g + 2), ap.add(32 * g)),
            (W4G128, false) => w4g128_partials(rp.add(66 * g + 2), ap.add(128 * g)),
            (W4G128, true) => w4g128_partials_vnni(rp.add(66 * g + 2), ap.add(128 * g)),
            (_, false) => i8_partials(rp.add(68 * (g / 2) + 4 + 32 * (g % 2)), ap.add(32 * g)),
            (_, true) => i8_partials_vnni(rp.add(68 * (g / 2) + 4 + 32 * (g % 2)), ap.add(32 * g)),
        }
    };
    let scale = |g: usize| -> f32 {
        match F {
            W4G32 => quant::fp16_to_f32(u16::from_le_bytes([*rp.add(18 * g), *rp.add(18 * g + 1)])),
            W4G128 => {
                quant::fp16_to_f32(u16::from_le_bytes([*rp.add(66 * g), *rp.add(66 * g + 1)]))
            }
            _ => f32::from_le_bytes(core::ptr::read_unaligned(
                rp.add(68 * (g / 2)) as *const [u8; 4]
            )),
        }
    };
    let scales8 = |g0: usize| -> __m256 {
        match F {
            W8PC => {
                let s = scale(g0);
                _mm256_set1_ps(s)
            }
            _ => {
                let stride = if F == W4G32 { 18 } else { 66 };
                let mut h = [0u16; 8];
                for (j, v) in h.iter_mut().enumerate() {
                    *v = core::ptr::read_unaligned(rp.add(stride * (g0 + j)) as *const u16);
                }
                _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr() as *const __m128i))
            }
        }
    };
    let mut lanes = _mm256_setzero_ps();
    let full = ngroups / 8 * 8;
    for g0 in (0..full).step_by(8) {
        let v: [__m256i; 8] = core::array::from_fn(|j| partials(g0 + j));
        let mut isum = transpose_sum(&v);
        if F != W8PC {
            let s = _mm256_loadu_si256(asum.as_ptr().add(g0) as *const __m256i);
            isum = _mm256_sub_epi32(isum, _mm256_slli_epi32::<3>(s));
        }
        let d = _mm256_mul_ps(scales8(g0), _mm256_loadu_ps(ad.as_ptr().add(g0)));
        lanes = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), lanes);
    }
    if full < ngroups {
        let g0 = full;
        let n = ngroups - full;
        let mut v = [_mm256_setzero_si256(); 8];
        for (j, p) in v.iter_mut().enumerate().take(n) {
            *p = partials(g0 + j);
        }
        let mut isum = transpose_sum(&v);
        let (d, mask) = {
            // The last, partial chunk: groups g0..g0+n in lanes 0..n, the other lanes kept as
            // they are (as the reference leaves them).
            let mut dw = [0f32; 8];
            let mut da = [0f32; 8];
            let mut m = [0i32; 8];
            for j in 0..n {
                dw[j] = scale(g0 + j);
                da[j] = ad[g0 + j];
                m[j] = -1;
            }
            let d = _mm256_mul_ps(_mm256_loadu_ps(dw.as_ptr()), _mm256_loadu_ps(da.as_ptr()));
            (d, _mm256_loadu_si256(m.as_ptr() as *const __m256i))
        };
        if F != W8PC {
            let mut t = [0i32; 8];
            t[..n].copy_from_slice(&asum[g0..g0 + n]);
            let s = _mm256_loadu_si256(t.as_ptr() as *const __m256i);
            isum = _mm256_sub_epi32(isum, _mm256_slli_epi32::<3>(s));
        }
        let next = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), lanes);
        lanes = _mm256_blendv_ps(lanes, next, _mm256_castsi256_ps(mask));
    }
    hsum8(lanes)
}
