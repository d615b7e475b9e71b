//! mollm's W4G32 / W4G128 / W8PC weights repacked at load (`prepare_weight`) into groups of 16
//! rows, so that one 64-byte line holds four code bytes of each of the 16 rows and `vpdpbusd`
//! with four broadcast activation bytes puts every row's integer sum in its own 32-bit lane:
//! no per-row unpacking into activation order, no horizontal sums, one load (and for f16 one
//! conversion) for 16 rows' scales.
//!
//! The float chain is the reference's (`quant::mollm::vec_dot`) in every lane: activation
//! group `g`'s exact integer sum, `lane[g % 8] = fma(dw · da, isum, lane[g % 8])`, then
//! `hsum_float_8` of the eight lanes, so results are bit-identical to it (and to the row-wise
//! kernels of `mollm_cpu_common::wmatmul`).
//!
//! Layout of one 16-row group, `stride` bytes (a 64-byte multiple), for `ng` activation
//! groups of `G` elements (W4G128: 128; W4G32 and W8PC: 32, Q8_0's):
//! - codes, for each group `g` in turn, 64-byte lines; line `t` holds four code bytes of each
//!   row (rows in order). 4-bit formats: `G/8` lines, bytes `4t .. 4t + 4` of the group's
//!   packed codes, so the low nibbles are elements `4t .. 4t + 4` and the high nibbles
//!   elements `G/2 + 4t ..` (codes `q + 8`). W8PC: 8 lines, elements `4t .. 4t + 4` as
//!   `q + 128` (unsigned, as `vpdpbusd` wants them);
//! - then the scales, `[g][row]`: f16 (32 bytes per group) for the 4-bit formats, the f32
//!   scale of the block holding the group for W8PC (64 bytes per group), zero-padded to the
//!   stride.

use crate::par::SyncPtr;
use abi::{DType, HostApi, TensorDesc};
use mollm_cpu_common::wmatmul::Acts;
use mollm_cpu_common::Error;

/// Rows per group.
pub const ROWS: usize = 16;
/// Tasks per pool thread.
const TASKS_PER_THREAD: usize = 2;

const W4G32: u8 = 0;
const W4G128: u8 = 1;
const W8PC: u8 = 2;

fn fmt(dt: DType) -> Option<u8> {
    match dt {
        DType::W4G32 => Some(W4G32),
        DType::W4G128 => Some(W4G128),
        DType::W8PC => Some(W8PC),
        _ => None,
    }
}

/// Activation group length.
const fn group_len(f: u8) -> usize {
    if f == W4G128 {
        128
    } else {
        32
    }
}

/// 64-byte code lines per activation group.
const fn lines(f: u8) -> usize {
    if f == W8PC {
        8
    } else {
        group_len(f) / 8
    }
}

/// Scale bytes per activation group (16 rows).
const fn scale_bytes(f: u8) -> usize {
    if f == W8PC {
        64
    } else {
        32
    }
}

/// Bytes of one repacked 16-row group of `k` elements per row.
fn stride(f: u8, k: usize) -> usize {
    let ng = k / group_len(f);
    (ng * (64 * lines(f) + scale_bytes(f))).div_ceil(64) * 64
}

/// Whether an `n x k` weight of `dt` can be repacked.
pub fn fits(dt: DType, k: usize, n: usize) -> bool {
    let Some(bl) = fmt(dt).map(|_| dt.info().block_len as usize) else {
        return false;
    };
    k > 0 && k % bl == 0 && n > 0 && n % ROWS == 0
}

/// Bytes of a repacked `n x k` weight.
pub fn repacked_bytes(dt: DType, k: usize, n: usize) -> usize {
    n / ROWS * stride(fmt(dt).expect("a mollm format"), k)
}

/// Repacks `n` rows of `k` elements (row `r` at `src[r * rs..]`) into `dst`.
pub fn repack(dt: DType, src: &[u8], rs: usize, k: usize, n: usize, dst: &mut [u8]) {
    let f = fmt(dt).expect("a mollm format");
    assert!(fits(dt, k, n));
    let (g, st) = (group_len(f), stride(f, k));
    let ng = k / g;
    let row_bytes = quant::row_bytes(dt, k).expect("whole blocks");
    let codes = 64 * lines(f);
    assert!(dst.len() >= n / ROWS * st);
    assert!(src.len() >= (n - 1) * rs + row_bytes);
    for rg in 0..n / ROWS {
        let out = &mut dst[rg * st..(rg + 1) * st];
        for r in 0..ROWS {
            let row = &src[(rg * ROWS + r) * rs..][..row_bytes];
            for gi in 0..ng {
                let (packed, scale): (&[u8], &[u8]) = match f {
                    W8PC => {
                        let b = &row[68 * (gi / 2)..][..68];
                        (&b[4 + 32 * (gi % 2)..][..32], &b[..4])
                    }
                    _ => {
                        let bb = 2 + g / 2;
                        let b = &row[bb * gi..][..bb];
                        (&b[2..], &b[..2])
                    }
                };
                for t in 0..lines(f) {
                    let o = gi * codes + 64 * t + 4 * r;
                    for j in 0..4 {
                        let c = packed[4 * t + j];
                        out[o + j] = if f == W8PC { c ^ 0x80 } else { c };
                    }
                }
                let sb = scale_bytes(f) / ROWS;
                let o = ng * codes + scale_bytes(f) * gi + sb * r;
                out[o..o + sb].copy_from_slice(scale);
            }
        }
    }
}

/// mat_mul on a repacked weight (`inputs[0].data`), any number of activation columns.
///
/// # Safety
/// A validated mat_mul whose weight is [`repack`]ed (`fits`), on valid host memory; the CPU
/// runs AVX-512 F/BW/VL/VNNI.
pub unsafe fn run(
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
) -> Result<(), Error> {
    let (w, x, out) = (&inputs[0], &inputs[1], &outputs[0]);
    let dt = w.dtype().expect("validated");
    let (k, n, cols) = (w.ne[0] as usize, w.ne[1] as usize, x.nrows() as usize);
    if cols == 0 {
        return Ok(());
    }
    let f = fmt(dt).expect("checked by check_prepared");
    let acts = match quantize_acts(dt, x) {
        Some(a) => a,
        None => Acts::quantize(dt, x)?,
    };
    let st = stride(f, k);
    let (wp, op) = (SyncPtr(w.data as *mut u8), SyncPtr(out.data));
    let out = *out;
    let acts = &acts;
    let groups = n / ROWS;
    // A few long contiguous runs per thread: the hardware prefetchers lose their stream at
    // every jump (measured on Qwen2.5-1.5B decode, 2 threads: tasks of four 16-row groups
    // streamed at ~22 GB/s, two runs per thread at up to ~32, this machine's ceiling).
    let tasks = (host.n_threads.max(1) as usize * TASKS_PER_THREAD).min(groups);
    let per = groups.div_ceil(tasks);
    crate::par::parallel_for(host, groups.div_ceil(per) as u32, |t| {
        let g0 = t as usize * per;
        for rg in g0..(g0 + per).min(groups) {
            let wg = wp.0.wrapping_add(rg * st) as *const u8;
            let put = |c: usize, v: &[f32; ROWS]| {
                let (i1, i2, i3) = acts.col_index[c];
                let base = i1 * out.nb[1] + i2 * out.nb[2] + i3 * out.nb[3];
                for (i, &v) in v.iter().enumerate() {
                    let off = (rg * ROWS + i) as i64 * out.nb[0] + base;
                    // SAFETY: each (row, column) is written by exactly one task.
                    unsafe { (op.0.wrapping_offset(off as isize) as *mut f32).write_unaligned(v) };
                }
            };
            let mut c = 0;
            while c + 4 <= cols {
                // SAFETY: the caller's contract; columns c..c+4 exist.
                let v = unsafe { tile::<4>(f, wg, k, acts, c) };
                for (j, v) in v.iter().enumerate() {
                    put(c + j, v);
                }
                c += 4;
            }
            for c in c..cols {
                // SAFETY: as above.
                let [v] = unsafe { tile::<1>(f, wg, k, acts, c) };
                put(c, &v);
            }
        }
    });
    Ok(())
}

/// [`Acts::quantize`] with AVX-512 for contiguous columns (`None`: strided ones, which take
/// the scalar path). Same codes, scales and sums: per group `d = amax/127`, codes
/// `round_ties_even(v · 127/amax)`; the Q8_0 scale (W4G32, W8PC) rounded through f16, the
/// A8G128 one (W4G128) kept in f32. A group whose `127/amax` is not finite (subnormal amax) is done the
/// scalar way, so that the saturating casts agree too.
///
/// # Safety
/// As [`run`].
pub unsafe fn quantize_acts(dt: DType, x: &TensorDesc) -> Option<Acts> {
    #[cfg(target_arch = "x86_64")]
    {
        if x.nb[0] != 4 {
            return None;
        }
        let mut a = Acts::zeroed(dt, x);
        let (k, ga, gpad) = (x.ne[0] as usize, a.ga, a.gpad);
        let groups = k / ga;
        for c in 0..a.col_index.len() {
            let col = core::slice::from_raw_parts(a.column(x, c) as *const f32, k);
            x86::quantize_col(
                ga,
                quant::vec_dot_type(dt) == DType::Q8_0,
                col,
                &mut a.aq[c * k..(c + 1) * k],
                &mut a.ad[c * gpad..c * gpad + groups],
                &mut a.asum[c * gpad..c * gpad + groups],
            );
        }
        Some(a)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (dt, x);
        None
    }
}

/// 16 rows x `C` columns (from `c0`) on one repacked row group.
///
/// # Safety
/// As [`run`].
unsafe fn tile<const C: usize>(
    f: u8,
    w: *const u8,
    k: usize,
    acts: &Acts,
    c0: usize,
) -> [[f32; ROWS]; C] {
    #[cfg(target_arch = "x86_64")]
    {
        let a: [*const i8; C] = core::array::from_fn(|j| acts.aq.as_ptr().add((c0 + j) * k));
        let ad: [*const f32; C] =
            core::array::from_fn(|j| acts.ad.as_ptr().add((c0 + j) * acts.gpad));
        let asum: [*const i32; C] =
            core::array::from_fn(|j| acts.asum.as_ptr().add((c0 + j) * acts.gpad));
        let ng = k / group_len(f);
        match f {
            W4G128 => x86::tile::<W4G128, C>(w, ng, a, ad, asum),
            W4G32 => x86::tile::<W4G32, C>(w, ng, a, ad, asum),
            _ => x86::tile::<W8PC, C>(w, ng, a, ad, asum),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (f, w, k, acts, c0);
        unreachable!("repacked weights are x86-64 only")
    }
}

#[cfg(target_arch = "x86_64")]
pub mod x86 {
    use super::{group_len, lines, scale_bytes, ROWS, W8PC};
    use core::arch::x86_64::*;

    /// Decode (one column) streams each weight once: lines are prefetched into L2 this far
    /// ahead (measured on Qwen2.5-1.5B, 2 threads: 34 t/s without, 33-39 with 8-32 KiB, best
    /// at 16 KiB; into L1 1 KiB ahead did nothing). Prompt tiles reuse each row group from
    /// cache and are left to the hardware prefetchers.
    const PREFETCH: usize = 16384;

    /// 16 rows x `C` columns: `w` one repacked row group of `ng` activation groups of
    /// format `F`; `a[c]` activation codes, `ad[c]` / `asum[c]` per-group scales and code sums.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL/VNNI; pointers valid for `ng` groups.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn tile<const F: u8, const C: usize>(
        w: *const u8,
        ng: usize,
        a: [*const i8; C],
        ad: [*const f32; C],
        asum: [*const i32; C],
    ) -> [[f32; ROWS]; C] {
        let codes = 64 * lines(F);
        let scales = w.add(ng * codes);
        // The codes' offset: 4-bit codes are q + 8, W8PC's stored q + 128.
        let offset = if F == W8PC { 128 } else { 8 };
        let mut lanes = [[_mm512_setzero_ps(); 8]; C];
        for g0 in (0..ng).step_by(8) {
            for j in 0..8 {
                let gi = g0 + j;
                if gi >= ng {
                    break;
                }
                let isum = group::<F, C>(w.add(gi * codes), gi * group_len(F), &a);
                let sp = scales.add(gi * scale_bytes(F));
                let dw = if F == W8PC {
                    _mm512_loadu_ps(sp as *const f32)
                } else {
                    _mm512_cvtph_ps(_mm256_loadu_si256(sp as *const __m256i))
                };
                for c in 0..C {
                    let s = _mm512_sub_epi32(isum[c], _mm512_set1_epi32(offset * *asum[c].add(gi)));
                    let d = _mm512_mul_ps(dw, _mm512_set1_ps(*ad[c].add(gi)));
                    lanes[c][j] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), lanes[c][j]);
                }
            }
        }
        let mut out = [[0f32; ROWS]; C];
        for c in 0..C {
            // hsum_float_8, lane by lane.
            let v = crate::hsum::hsum_float_8_x16(&lanes[c]);
            _mm512_storeu_ps(out[c].as_mut_ptr(), v);
        }
        out
    }

    /// Quantizes one contiguous column in groups of `ga` (see `super::quantize_acts`);
    /// `f16_scale`: Q8_0 (the scale goes through f16), else A8G128.
    ///
    /// # Safety
    /// AVX-512 F/BW; `x.len() == q.len()`, one `d`/`sum` per group.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    pub unsafe fn quantize_col(
        ga: usize,
        f16_scale: bool,
        x: &[f32],
        q: &mut [i8],
        d: &mut [f32],
        sum: &mut [i32],
    ) {
        let abs = _mm512_set1_epi32(0x7FFF_FFFF);
        for (g, (xg, qg)) in x.chunks_exact(ga).zip(q.chunks_exact_mut(ga)).enumerate() {
            let mut m = _mm512_setzero_ps();
            for v in xg.chunks_exact(16) {
                let a = _mm512_castsi512_ps(_mm512_and_si512(
                    _mm512_castps_si512(_mm512_loadu_ps(v.as_ptr())),
                    abs,
                ));
                m = _mm512_max_ps(m, a);
            }
            let amax = _mm512_reduce_max_ps(m);
            let dg = amax / 127.0;
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            d[g] = if f16_scale {
                quant::fp16_to_f32(quant::f32_to_fp16(dg))
            } else {
                dg
            };
            if !id.is_finite() || amax.is_nan() {
                let mut s = 0;
                for (o, &v) in qg.iter_mut().zip(xg) {
                    *o = (v * id).round_ties_even() as i8;
                    s += *o as i32;
                }
                sum[g] = s;
                continue;
            }
            let idv = _mm512_set1_ps(id);
            let mut acc = _mm512_setzero_si512();
            for (v, o) in xg.chunks_exact(16).zip(qg.chunks_exact_mut(16)) {
                // Round to nearest, ties to even (the default MXCSR mode), like the reference.
                let i = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(v.as_ptr()), idv));
                acc = _mm512_add_epi32(acc, i);
                _mm_storeu_si128(o.as_mut_ptr() as *mut __m128i, _mm512_cvtsepi32_epi8(i));
            }
            sum[g] = _mm512_reduce_add_epi32(acc);
        }
    }

    /// One group's exact integer sums (codes still offset), 16 rows per vector, for each
    /// column. Two chains per column (four for one column) keep `vpdpbusd`'s latency hidden.
    #[inline(always)]
    unsafe fn group<const F: u8, const C: usize>(
        code: *const u8,
        e0: usize,
        a: &[*const i8; C],
    ) -> [__m512i; C] {
        let m = _mm512_set1_epi8(0x0F);
        let mut acc = [[_mm512_setzero_si512(); 4]; C];
        for t in 0..lines(F) {
            let v = _mm512_load_si512(code.add(64 * t) as *const __m512i);
            if C == 1 {
                crate::kq512::prefetch(code.add(64 * t + PREFETCH));
            }
            let act = |c: usize, e: usize| {
                _mm512_set1_epi32((a[c].add(e0 + e) as *const i32).read_unaligned())
            };
            if F == W8PC {
                let p = if C == 1 { t & 3 } else { t & 1 };
                for c in 0..C {
                    acc[c][p] = _mm512_dpbusd_epi32(acc[c][p], v, act(c, 4 * t));
                }
            } else {
                let lo = _mm512_and_si512(v, m);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m);
                let p = if C == 1 { 2 * (t & 1) } else { 0 };
                for c in 0..C {
                    acc[c][p] = _mm512_dpbusd_epi32(acc[c][p], lo, act(c, 4 * t));
                    acc[c][p + 1] =
                        _mm512_dpbusd_epi32(acc[c][p + 1], hi, act(c, group_len(F) / 2 + 4 * t));
                }
            }
        }
        core::array::from_fn(|c| {
            let x = &acc[c];
            _mm512_add_epi32(_mm512_add_epi32(x[0], x[1]), _mm512_add_epi32(x[2], x[3]))
        })
    }
}
