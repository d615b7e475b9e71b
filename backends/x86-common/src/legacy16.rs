//! Q4_1, Q5_0 and Q8_0 weights (AVX-512 and AVX2) repacked at load
//! (`prepare_weight`) into groups of 16 rows, so that one `vpdpbusd` (AVX2: `vpmaddubsw` and
//! `vpmaddwd`, 8 rows per register) with four broadcast activation bytes gives one of ggml's
//! eight lane sums for 16 rows at once: no per-row unpacking, scale conversion or broadcast,
//! and one product `dx · dy` per 16 rows instead of one per row.
//!
//! The chains are ggml's (x86 build; quant's reference and `simd::dot_q4_1` / `dot_q0`): per
//! block the eight exact lane sums `s_l` (lane `l` covers elements `4l .. 4l + 4`),
//! `lane[l] = fma(dx · dy, f32(s_l), lane[l])`; the result `hsum_float_8(lanes)`, plus for
//! Q4_1 `summs`, accumulated beside as `summs = fma(mx, sy, summs)`. Here a register holds
//! one lane (or the `summs`) of 16 rows, so every row runs exactly that chain: results are
//! bit-identical to the row-wise kernels for any number of columns (Q4_1 has one chain for
//! decode and prompts; Q8_0's tinyBLAS prompt chain equals its `vec_dot`, see quant's
//! `tinyblas.rs`).
//!
//! Layout of one 16-row group: per block, [`block_bytes`] bytes: code lines of 64 bytes, line
//! `t` holding code bytes `4t .. 4t + 4` of each row (rows in order), then the 16 rows' `d`
//! (f16). Q4_1: four lines (the low nibbles are lane `t`, the high nibbles lane `t + 4`), then
//! `d` and the 16 rows' `m` (f16). Q8_0: eight lines of `q + 128` (unsigned, as `vpdpbusd`
//! wants them; the activations' lane sums times 128 come off exactly), then `d`. Q5_0:
//! Q4_1's four nibble lines, then 64 bytes of fifth bits, byte `4r + e` holding
//! in bit `k` the fifth bit of row `r`'s element `4k + e` (lane `k`, so one shift and one
//! mask bring a lane's bits to bit 4 of its code bytes), then `d`. Groups follow each other,
//! so a weight streams front to back, and the size is the original's.

use abi::DType;

/// Rows per group.
pub const ROWS: usize = 16;

/// Formats the AVX-512 kernels take in this layout.
pub const FORMATS: &[DType] = &[DType::Q4_1, DType::Q5_0, DType::Q8_0];

/// Formats the AVX2 kernels take in this layout (the same bytes: Q8_0's codes, stored
/// `+ 128` for `vpdpbusd`, are flipped back there, see [`x86::group_avx2`]).
pub const AVX2_FORMATS: &[DType] = &[DType::Q4_1, DType::Q5_0, DType::Q8_0];

/// Bytes of one block of a 16-row group.
pub const fn block_bytes(dt: DType) -> usize {
    match dt {
        DType::Q4_1 => 5 * 64,
        DType::Q5_0 => 5 * 64 + 32,
        _ => 8 * 64 + 32,
    }
}

fn shape_fits(k: usize, n: usize) -> bool {
    k > 0 && k % 32 == 0 && n > 0 && n % ROWS == 0
}

/// Whether an `n x k` weight of `dt` can be repacked for the AVX-512 kernels.
pub fn fits(dt: DType, k: usize, n: usize) -> bool {
    FORMATS.contains(&dt) && shape_fits(k, n)
}

/// Whether the AVX2 kernels take this layout for an `n x k` weight of `dt`.
pub fn avx2_fits(dt: DType, k: usize, n: usize) -> bool {
    AVX2_FORMATS.contains(&dt) && shape_fits(k, n)
}

/// Whether the `x86-avx512` backend (`avx512`) or `x86-avx2` repacks an `n x k` weight of `dt`
/// into this layout.
pub fn fits_isa(avx512: bool, dt: DType, k: usize, n: usize) -> bool {
    match avx512 {
        true => fits(dt, k, n),
        false => avx2_fits(dt, k, n),
    }
}

/// Where a block's codes start in `dt`'s own layout, and how many 64-byte code lines a
/// 16-row group's block has.
fn code_lines(dt: DType) -> (usize, usize) {
    match dt {
        DType::Q8_0 => (2, 8),
        DType::Q5_0 => (6, 4),
        _ => (4, 4),
    }
}

/// Bytes of one activation block of `dt`'s `vec_dot` type (Q8_1 for Q4_1: `d`, `s`, codes;
/// else Q8_0: `d`, codes) and where its codes start.
#[inline(always)]
fn act_block(dt: DType) -> (usize, usize) {
    match dt {
        DType::Q4_1 => (36, 4),
        _ => (34, 2),
    }
}

/// A kernel's `FMT` (1: Q4_1, 5: Q5_0, 8: Q8_0) as its group block's bytes, the 64-byte lines
/// before the 16 rows' `d` (code lines, and Q5_0's fifth-bit plane), its activation block's
/// bytes and where their codes start.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn layout(fmt: u8) -> (usize, usize, usize, usize) {
    let (dt, lines) = match fmt {
        1 => (DType::Q4_1, 4),
        5 => (DType::Q5_0, 5),
        _ => (DType::Q8_0, 8),
    };
    let (yb, yq0) = act_block(dt);
    (block_bytes(dt), lines, yb, yq0)
}

/// Bytes of a repacked `n x k` weight.
pub fn repacked_bytes(dt: DType, k: usize, n: usize) -> usize {
    n / ROWS * (k / 32) * block_bytes(dt)
}

/// Repacks `n` rows of `k` elements (row `r` at `src[r * rs..]`) into `dst` (the caller
/// splits a weight into row ranges and drops a mapped source's pages as it goes, see
/// `matmul::prepare`).
pub fn repack(dt: DType, src: &[u8], rs: usize, k: usize, n: usize, dst: &mut [u8]) {
    assert!(fits(dt, k, n) || avx2_fits(dt, k, n));
    let nb = k / 32;
    let (bb, ob) = (dt.info().block_bytes as usize, block_bytes(dt));
    assert!(dst.len() >= repacked_bytes(dt, k, n));
    assert!(src.len() >= (n - 1) * rs + nb * bb);
    let (q8, q5) = (dt == DType::Q8_0, dt == DType::Q5_0);
    let (codes, lines) = code_lines(dt);
    for g in 0..n / ROWS {
        for i in 0..nb {
            let out = &mut dst[(g * nb + i) * ob..][..ob];
            for r in 0..ROWS {
                let b = &src[(g * ROWS + r) * rs + i * bb..][..bb];
                // Four code bytes at a time (a model's load repacks hundreds of MB).
                let flip = if q8 { 0x8080_8080u32 } else { 0 };
                for t in 0..lines {
                    let c = u32::from_le_bytes(b[codes + 4 * t..][..4].try_into().unwrap());
                    out[64 * t + 4 * r..][..4].copy_from_slice(&(c ^ flip).to_le_bytes());
                }
                let mut s = 64 * lines;
                if q5 {
                    let qh = u32::from_le_bytes(b[2..6].try_into().unwrap());
                    for e in 0..4 {
                        out[s + 4 * r + e] = plane_bits(qh, e);
                    }
                    s += 64;
                }
                out[s + 2 * r..][..2].copy_from_slice(&b[..2]);
                if dt == DType::Q4_1 {
                    out[s + 32 + 2 * r..][..2].copy_from_slice(&b[2..4]);
                }
            }
        }
    }
}

/// Bits `e, e + 4, .., e + 28` of a Q5_0 block's `qh` as one byte (bit `k`: element
/// `4k + e`'s fifth bit), the plane byte of [`repack`].
#[inline]
fn plane_bits(qh: u32, e: usize) -> u8 {
    // Gather every fourth bit: fold the nibbles' low bits together in three shift-or steps.
    let mut x = (qh >> e) & 0x1111_1111;
    x = (x | (x >> 3)) & 0x0303_0303;
    x = (x | (x >> 6)) & 0x000F_000F;
    ((x | (x >> 12)) & 0xFF) as u8
}

/// Row `r` of a repacked `n x k` weight of `dt` (at `w`) in the original layout, into `row`
/// (`k / 32` blocks of `dt`): [`repack`] undone, for `get_rows` on a repacked table.
pub fn unpack_row(dt: DType, w: &[u8], k: usize, r: usize, row: &mut [u8]) {
    let nb = k / 32;
    let (bb, ob) = (dt.info().block_bytes as usize, block_bytes(dt));
    let (g, rr) = (r / ROWS, r % ROWS);
    let (q8, q5) = (dt == DType::Q8_0, dt == DType::Q5_0);
    let (codes, lines) = code_lines(dt);
    for i in 0..nb {
        let src = &w[(g * nb + i) * ob..][..ob];
        let b = &mut row[i * bb..][..bb];
        for t in 0..lines {
            for j in 0..4 {
                let c = src[64 * t + 4 * rr + j];
                b[codes + 4 * t + j] = if q8 { c ^ 0x80 } else { c };
            }
        }
        let mut s = 64 * lines;
        if q5 {
            let mut qh = 0u32;
            for e in 0..4 {
                let plane = src[s + 4 * rr + e];
                for kk in 0..8 {
                    qh |= (((plane >> kk) & 1) as u32) << (4 * kk + e);
                }
            }
            b[2..6].copy_from_slice(&qh.to_le_bytes());
            s += 64;
        }
        b[..2].copy_from_slice(&src[s + 2 * rr..][..2]);
        if dt == DType::Q4_1 {
            b[2..4].copy_from_slice(&src[s + 32 + 2 * rr..][..2]);
        }
    }
}

/// Whether [`get_rows`] takes this (validated) call: ids in one packed row, rows out packed.
pub fn check_get_rows(
    inputs: &[abi::TensorDesc],
    outputs: &[abi::TensorDesc],
) -> Result<(), crate::Error> {
    let (w, ids, out) = (inputs[0], inputs[1], outputs[0]);
    let dt = w.dtype().unwrap_or(DType::F32);
    let (k, n) = (w.ne[0] as usize, w.ne[1] as usize);
    let plain = w.ndim <= 2
        && ids.dtype() == Some(DType::I32)
        && ids.nb[0] == 4
        && ids.ne[1..].iter().all(|&e| e == 1)
        && out.dtype() == Some(DType::F32)
        && out.is_contiguous()
        && out.ne[0] as usize == k
        && out.ne[1] == ids.ne[0];
    match (fits(dt, k, n) || avx2_fits(dt, k, n)) && plain {
        true => Ok(()),
        false => Err(crate::Error::Unsupported(
            "get_rows: not a plain call on a 16-row table".into(),
        )),
    }
}

/// `get_rows` on a repacked table (`inputs[0]`: its shape, `data` at the repacked bytes):
/// each row unpacked ([`unpack_row`]) and widened by quant's `dequantize_row`, the reference's
/// own, so the values are the table's bit for bit.
///
/// # Safety
/// A get_rows call [`check_get_rows`] takes, on valid host memory, whose table the x86
/// `prepare` repacked into this layout.
pub unsafe fn get_rows(
    inputs: &[abi::TensorDesc],
    outputs: &[abi::TensorDesc],
) -> Result<(), crate::Error> {
    use crate::Error;
    let (w, ids, out) = (inputs[0], inputs[1], outputs[0]);
    let dt = w.dtype().unwrap_or(DType::F32);
    let (k, n) = (w.ne[0] as usize, w.ne[1] as usize);
    let m = ids.ne[0] as usize;
    // SAFETY: the repacked table (the caller's contract) and the call's own operands.
    let table = core::slice::from_raw_parts(w.data as *const u8, repacked_bytes(dt, k, n));
    let mut row = vec![0u8; k / 32 * dt.info().block_bytes as usize];
    for i in 0..m {
        let id = (ids.data as *const i32).add(i).read_unaligned();
        if id < 0 || id as usize >= n {
            return Err(Error::Invalid(format!(
                "get_rows: id {id} at {i} outside 0..{n}"
            )));
        }
        unpack_row(dt, table, k, id as usize, &mut row);
        let dst = core::slice::from_raw_parts_mut((out.data as *mut f32).add(i * k), k);
        quant::dequantize_row(dt, &row, dst)
            .map_err(|e| Error::Unsupported(format!("get_rows: {e}")))?;
    }
    Ok(())
}

/// Per-block terms of a call's activation columns for [`x86::group_halves`], one 64-byte line
/// per column and block, `[column][block]`.
#[repr(C, align(64))]
#[derive(Clone, Copy, Default)]
pub struct Terms {
    /// Q5_0: `-16 x` each lane quad's activation sum, Q8_0 `-128 x` (their codes are stored
    /// `q + 16` and `q + 128`, so a lane's `vpdpbusd` started there ends at the exact signed
    /// sum); Q4_1: 0.
    pub offs: [i32; 8],
    /// The activation block's `d`, widened from f16.
    pub dy: f32,
    /// Q4_1 (a Q8_1 activation block): its `s`, widened from f16.
    pub sy: f32,
    _pad: [f32; 6],
}

/// [`Terms`] of `cols` activation rows of `dt`'s `vec_dot` type (Q8_1 for Q4_1, else Q8_0;
/// row `c` at `act[c * rb..]`, `nb` blocks), computed once per call for every row group, into
/// `buf` (grown as needed, kept by the caller between calls).
pub fn terms<'a>(
    dt: DType,
    act: &[u8],
    rb: usize,
    cols: usize,
    nb: usize,
    buf: &'a mut Vec<Terms>,
) -> &'a [Terms] {
    if buf.len() < cols * nb {
        buf.resize(cols * nb, Terms::default());
    }
    let (yb, yq0) = act_block(dt);
    let scale = match dt {
        DType::Q5_0 => -16,
        DType::Q8_0 => -128,
        _ => 0,
    };
    let h = |b: &[u8]| quant::fp16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    let terms = &mut buf[..cols * nb];
    for (c, t) in terms.chunks_exact_mut(nb).enumerate() {
        for (i, t) in t.iter_mut().enumerate() {
            let y = &act[c * rb + i * yb..][..yb];
            // Q4_1's offsets are 0: not summed (1.5% of a 16-sequence SmolLM2 step, on the
            // calling thread while the others wait).
            t.offs = [0; 8];
            if scale != 0 {
                for (l, o) in t.offs.iter_mut().enumerate() {
                    let q = &y[yq0 + 4 * l..][..4];
                    *o = scale * q.iter().map(|&v| v as i8 as i32).sum::<i32>();
                }
            }
            t.dy = h(y);
            t.sy = if dt == DType::Q4_1 { h(&y[2..]) } else { 0.0 };
        }
    }
    terms
}

/// Columns `0..cols` (activation rows of `dt`'s `vec_dot` type, column `c` at `a + c * as_`)
/// of the `ng` row groups at `w` (group `g` at `w + g * nb * block_bytes(dt)`):
/// `out[c * os + 16 g + r]`.
///
/// # Safety
/// The CPU runs AVX-512 F/BW/VL/VNNI; `w` holds `ng` repacked groups of `nb` blocks, each
/// activation row `nb` blocks; `out` covers every written element.
#[allow(clippy::too_many_arguments)]
pub unsafe fn columns(
    avx512: bool,
    dt: DType,
    w: *const u8,
    ng: usize,
    nb: usize,
    a: *const u8,
    as_: usize,
    cols: usize,
    terms: &[Terms],
    out: *mut f32,
    os: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if !avx512 {
        // AVX2 (see `avx2_fits`): runs of four columns, then one at a time.
        for g in 0..ng {
            let wg = w.add(g * nb * block_bytes(dt));
            let o = out.add(g * ROWS);
            let mut c = 0;
            if terms.len() >= cols * nb {
                while c + 4 <= cols {
                    let (a, o) = (a.add(c * as_), o.add(c * os));
                    let t = terms[c * nb..].as_ptr();
                    match dt {
                        DType::Q4_1 => x86::group_avx2_pairs::<1, 4>(wg, nb, a, as_, t, o, os),
                        DType::Q5_0 => x86::group_avx2_pairs::<5, 4>(wg, nb, a, as_, t, o, os),
                        _ => x86::group_avx2_pairs::<8, 4>(wg, nb, a, as_, t, o, os),
                    }
                    c += 4;
                }
            }
            macro_rules! run {
                ($n:literal) => {
                    while c + $n <= cols {
                        let (a, o) = (a.add(c * as_), o.add(c * os));
                        match dt {
                            DType::Q4_1 => x86::group_avx2::<1, $n>(wg, nb, a, as_, o, os),
                            DType::Q5_0 => x86::group_avx2::<5, $n>(wg, nb, a, as_, o, os),
                            _ => x86::group_avx2::<8, $n>(wg, nb, a, as_, o, os),
                        }
                        c += $n;
                    }
                };
            }
            run!(4);
            run!(1);
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    for g in 0..ng {
        let wg = w.add(g * nb * block_bytes(dt));
        let o = out.add(g * ROWS);
        let mut c = 0;
        // Two columns share each block's codes and scales: their 2 x 9 lane registers and
        // the eight code registers just fit (measured on SmolLM2's 576 x 1536 Q4_1, 16
        // columns, one thread: runs of 2 and 4 alike, 1.37x the row layout's column pairs;
        // 16 columns with their lanes in memory 1.18x, runs of 8 below).
        macro_rules! run {
            ($n:literal) => {
                while c + $n <= cols {
                    let (a, o) = (a.add(c * as_), o.add(c * os));
                    match dt {
                        DType::Q4_1 => x86::group::<1, $n>(wg, nb, a, as_, o, os, c == 0),
                        DType::Q5_0 => x86::group::<5, $n>(wg, nb, a, as_, o, os, c == 0),
                        _ => x86::group::<8, $n>(wg, nb, a, as_, o, os, c == 0),
                    }
                    c += $n;
                }
            };
        }
        // Four columns or more: runs of four columns in two passes of four lanes each
        // (unpacking shared by twice the columns; the activations' terms computed once per
        // call).
        if terms.len() >= cols * nb {
            while c + 4 <= cols {
                let (a, o) = (a.add(c * as_), o.add(c * os));
                let t = terms[c * nb..].as_ptr();
                match dt {
                    DType::Q4_1 => x86::group_halves::<1, 4>(wg, nb, a, as_, t, o, os, c == 0),
                    DType::Q5_0 => x86::group_halves::<5, 4>(wg, nb, a, as_, t, o, os, c == 0),
                    _ => x86::group_halves::<8, 4>(wg, nb, a, as_, t, o, os, c == 0),
                }
                c += 4;
            }
        }
        run!(2);
        run!(1);
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (avx512, dt, w, ng, nb, a, as_, cols, terms, out, os);
        unreachable!("repacked weights are x86-64 only")
    }
}

#[cfg(target_arch = "x86_64")]
pub mod x86 {
    use core::arch::x86_64::*;

    /// One column streams each weight once: lines are prefetched into L2 this far ahead, each
    /// code line's prefetch next to its load. (Zen 4, all of a block's prefetches at its
    /// start, SmolLM2 decode: 2 KiB 113-123 t/s, 4 KiB 95-116, 16 KiB 100-107, none 101-103.
    /// Sapphire Rapids, 2 rounds: prefetches beside the loads and 4 KiB ahead against all at
    /// the start 2 KiB ahead, SmolLM2 303-305 -> 329-331 t/s, Gemma 3 103-107 -> 116,
    /// Qwen2.5-0.5B's Q5_0 FFN 702-731 -> 647-650 ms per 128 steps: a burst of prefetches
    /// waits for fill buffers and holds up the loads behind it, see `q4k16`.)
    const PREFETCH: usize = 4096;

    #[inline(always)]
    unsafe fn h16(p: *const u8) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
            (p as *const u16).read_unaligned() as i32,
        )))
    }

    /// Lane `l`'s code bytes of 8 rows (half `h` of the group) of the Q4_1 or Q5_0 block at
    /// `p`; Q5_0's (`q50`) with their fifth bits at bit 4 (its codes are then `q + 16`).
    #[inline(always)]
    unsafe fn codes_avx2(p: *const u8, h: usize, l: usize, q50: bool) -> __m256i {
        let (m4, m10) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x10));
        let v = _mm256_loadu_si256(p.add(64 * (l % 4) + 32 * h) as *const __m256i);
        let q = match l < 4 {
            true => _mm256_and_si256(v, m4),
            false => _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4),
        };
        if !q50 {
            return q;
        }
        // Bit l of each plane byte to bit 4 (16-bit shifts: the mask drops what crosses a
        // byte).
        let pl = _mm256_loadu_si256(p.add(256 + 32 * h) as *const __m256i);
        let hb = match l {
            0 => _mm256_slli_epi16::<4>(pl),
            1 => _mm256_slli_epi16::<3>(pl),
            2 => _mm256_slli_epi16::<2>(pl),
            3 => _mm256_slli_epi16::<1>(pl),
            4 => pl,
            5 => _mm256_srli_epi16::<1>(pl),
            6 => _mm256_srli_epi16::<2>(pl),
            _ => _mm256_srli_epi16::<3>(pl),
        };
        _mm256_or_si256(q, _mm256_and_si256(hb, m10))
    }

    /// A lane's sums for 8 rows of signed Q8_0 codes `q` (`ax`: their magnitudes) and four
    /// broadcast activation bytes `yl`, as ggml's AVX2 `mul_sum_i8_pairs`: `|q|` times the
    /// activations with `q`'s sign, pairs at most 2·128·127 (exact), then summed by fours.
    #[inline(always)]
    unsafe fn q8_lane(ax: __m256i, q: __m256i, yl: __m256i) -> __m256i {
        let p = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(yl, q));
        _mm256_madd_epi16(p, _mm256_set1_epi16(1))
    }

    /// [`group`] with 256-bit registers (AVX2, no VNNI), for Q4_1 (`FMT` 1), Q5_0 (5) and
    /// Q8_0 (8): each half of the group (8 rows, bytes `32h .. 32h + 32` of every line) in its
    /// own pass, one register per lane of 8 rows; a lane's sums by `vpmaddubsw` (codes times
    /// activations, pairs at most 2·31·128: exact) and `vpmaddwd` by ones, Q5_0's minus 16
    /// times the activations' lane sum (its codes are `q + 16`: exact); Q8_0's stored `q + 128`
    /// back to `q` and multiplied as ggml's AVX2 `mul_sum_i8_pairs` does, `|q|` times the
    /// activations with `q`'s sign (pairs at most 2·128·127: exact); then the chain of
    /// [`group`] (ggml's `dot_q0` chain for Q5_0 and Q8_0, with no offsets term). Each half prefetches
    /// part of every block's lines one group ahead, so memory stays busy while the second half
    /// reads the group from L1.
    ///
    /// # Safety
    /// As [`super::columns`], on a CPU with AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn group_avx2<const FMT: u8, const C: usize>(
        w: *const u8,
        nb: usize,
        a: *const u8,
        as_: usize,
        out: *mut f32,
        os: usize,
    ) {
        let (q41, q80) = (FMT == 1, FMT == 8);
        let (bb, lines, yb, yq0) = super::layout(FMT);
        let dpos = 64 * lines;
        let nl = bb.div_ceil(64);
        let flip = _mm256_set1_epi8(-128);
        // Activation blocks: Q8_1 (d, s, codes) or Q8_0 (d, codes).
        let ones = _mm256_set1_epi16(1);
        for h in 0..2 {
            let mut lanes = [[_mm256_setzero_ps(); 8]; C];
            let mut summs = [_mm256_setzero_ps(); C];
            for i in 0..nb {
                let p = w.add(i * bb);
                if C == 1 {
                    for l in (0..nl).skip(h * nl.div_ceil(2)).take(nl.div_ceil(2)) {
                        let q = p.wrapping_add(nb * bb + 64 * l);
                        crate::kq512::prefetch(q);
                    }
                }
                let s = p.add(dpos);
                let dx = _mm256_cvtph_ps(_mm_loadu_si128(s.add(16 * h) as *const __m128i));
                let mx = if q41 {
                    _mm256_cvtph_ps(_mm_loadu_si128(s.add(32 + 16 * h) as *const __m128i))
                } else {
                    _mm256_setzero_ps()
                };
                for c in 0..C {
                    let y = a.add(c * as_ + i * yb);
                    let yq = y.add(yq0) as *const i32;
                    // Q5_0: 16 x each lane's activation sum, taken off its code products.
                    let mut off = [0i32; 8];
                    if q41 {
                        summs[c] = _mm256_fmadd_ps(mx, _mm256_set1_ps(h16(y.add(2))), summs[c]);
                    } else if !q80 {
                        let ys = _mm256_madd_epi16(
                            _mm256_maddubs_epi16(
                                _mm256_set1_epi8(1),
                                _mm256_loadu_si256(yq as *const __m256i),
                            ),
                            ones,
                        );
                        let o16 = _mm256_slli_epi32::<4>(ys);
                        _mm256_storeu_si256(off.as_mut_ptr() as *mut __m256i, o16);
                    }
                    let d = _mm256_mul_ps(dx, _mm256_set1_ps(h16(y)));
                    for l in 0..8 {
                        let yl = _mm256_set1_epi32(yq.add(l).read_unaligned());
                        if q80 {
                            let v = _mm256_loadu_si256(p.add(64 * l + 32 * h) as *const __m256i);
                            let q = _mm256_xor_si256(v, flip);
                            let s = q8_lane(_mm256_sign_epi8(q, q), q, yl);
                            lanes[c][l] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), lanes[c][l]);
                            continue;
                        }
                        let q = codes_avx2(p, h, l, !q41);
                        let mut s = _mm256_madd_epi16(_mm256_maddubs_epi16(q, yl), ones);
                        if !q41 {
                            s = _mm256_sub_epi32(s, _mm256_set1_epi32(off[l]));
                        }
                        lanes[c][l] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), lanes[c][l]);
                    }
                }
            }
            for c in 0..C {
                // hsum_float_8 lane by lane; Q4_1 then adds its offsets' sum (ggml's order),
                // Q5_0 and Q8_0 nothing (not even 0.0, which would turn a -0.0 into +0.0).
                let mut v = crate::hsum::hsum_float_8_x8(&lanes[c]);
                if q41 {
                    v = _mm256_add_ps(v, summs[c]);
                }
                _mm256_storeu_ps(out.add(c * os + 8 * h), v);
            }
        }
    }

    /// [`group_avx2`] for runs of columns: each half of the group in four passes over its
    /// blocks, lanes `2p, 2p + 1` in pass `p` (each lane's chain runs alone, so the split
    /// changes no result), so that a pass's two code registers and `2 C` lanes stay in the 16
    /// registers and each block's codes are unpacked once per run instead of once per column.
    /// `terms`: the run's first column's [`super::terms`] (columns `nb` apart).
    ///
    /// # Safety
    /// As [`super::columns`], on a CPU with AVX2, FMA and F16C; `terms` covers the columns.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn group_avx2_pairs<const FMT: u8, const C: usize>(
        w: *const u8,
        nb: usize,
        a: *const u8,
        as_: usize,
        terms: *const super::Terms,
        out: *mut f32,
        os: usize,
    ) {
        let (q41, q50, q80) = (FMT == 1, FMT == 5, FMT == 8);
        let (bb, lines, yb, yq0) = super::layout(FMT);
        let dpos = 64 * lines;
        let ones = _mm256_set1_epi16(1);
        let flip = _mm256_set1_epi8(-128);
        let mut lanes = [[_mm256_setzero_ps(); 8]; C];
        for h in 0..2 {
            let mut summs = [_mm256_setzero_ps(); C];
            for pr in 0..4 {
                let mut acc = [[_mm256_setzero_ps(); 2]; C];
                for i in 0..nb {
                    let p = w.add(i * bb);
                    // The pass's two lanes of 8 rows: codes (Q8_0: signed, and their
                    // magnitudes in `ax`).
                    let mut q = [_mm256_setzero_si256(); 2];
                    let mut ax = [_mm256_setzero_si256(); 2];
                    for t in 0..2 {
                        let l = 2 * pr + t;
                        if q80 {
                            let v = _mm256_loadu_si256(p.add(64 * l + 32 * h) as *const __m256i);
                            q[t] = _mm256_xor_si256(v, flip);
                            ax[t] = _mm256_sign_epi8(q[t], q[t]);
                            continue;
                        }
                        q[t] = codes_avx2(p, h, l, q50);
                    }
                    let sc = p.add(dpos);
                    let dx = _mm256_cvtph_ps(_mm_loadu_si128(sc.add(16 * h) as *const __m128i));
                    if q41 && pr == 0 {
                        let mx =
                            _mm256_cvtph_ps(_mm_loadu_si128(sc.add(32 + 16 * h) as *const __m128i));
                        for (c, sm) in summs.iter_mut().enumerate() {
                            let tm = &*terms.add(c * nb + i);
                            *sm = _mm256_fmadd_ps(mx, _mm256_set1_ps(tm.sy), *sm);
                        }
                    }
                    for c in 0..C {
                        let tm = &*terms.add(c * nb + i);
                        let yq = a.add(c * as_ + i * yb + yq0) as *const i32;
                        let d = _mm256_mul_ps(dx, _mm256_set1_ps(tm.dy));
                        for t in 0..2 {
                            let l = 2 * pr + t;
                            let yl = _mm256_set1_epi32(yq.add(l).read_unaligned());
                            let s = match q80 {
                                true => q8_lane(ax[t], q[t], yl),
                                false => _mm256_madd_epi16(_mm256_maddubs_epi16(q[t], yl), ones),
                            };
                            // Q5_0: its offsets (-16 x the lane's activation sum).
                            let s = match q50 {
                                true => _mm256_add_epi32(s, _mm256_set1_epi32(tm.offs[l])),
                                false => s,
                            };
                            acc[c][t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc[c][t]);
                        }
                    }
                }
                for c in 0..C {
                    lanes[c][2 * pr] = acc[c][0];
                    lanes[c][2 * pr + 1] = acc[c][1];
                }
            }
            for c in 0..C {
                // As `group_avx2`.
                let mut v = crate::hsum::hsum_float_8_x8(&lanes[c]);
                if q41 {
                    v = _mm256_add_ps(v, summs[c]);
                }
                _mm256_storeu_ps(out.add(c * os + 8 * h), v);
            }
        }
    }

    /// 16 rows x `C` columns of one row group of Q4_1 (`FMT` 1), Q5_0 (5) or Q8_0 (8):
    /// `out[c * os + r]`. `first`: the group's first run of columns (for `C > 1`, it
    /// prefetches the next group).
    ///
    /// # Safety
    /// As [`super::columns`].
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn group<const FMT: u8, const C: usize>(
        w: *const u8,
        nb: usize,
        a: *const u8,
        as_: usize,
        out: *mut f32,
        os: usize,
        first: bool,
    ) {
        #[allow(non_snake_case)]
        let (Q41, Q50) = (FMT == 1, FMT == 5);
        let (bb, lines, yb, yq0) = super::layout(FMT);
        // Activation blocks: Q8_1 (d, s, codes) or Q8_0 (d, codes).
        let m4 = _mm512_set1_epi8(0x0F);
        let m10 = _mm512_set1_epi8(0x10);
        let mut lanes = [[_mm512_setzero_ps(); 8]; C];
        let mut summs = [_mm512_setzero_ps(); C];
        // One column: each code line's prefetch goes with its load (below), the rest here.
        let pf1 = |p: *const u8, t: usize| {
            if C == 1 {
                crate::kq512::prefetch(p.wrapping_add(64 * t + PREFETCH));
            }
        };
        for i in 0..nb {
            let p = w.add(i * bb);
            if C == 1 {
                for l in lines..bb.div_ceil(64) {
                    crate::kq512::prefetch(p.wrapping_add(64 * l + PREFETCH));
                }
            } else if first {
                // Several columns: the group is read from memory once, by the first run of
                // columns, which asks for the next group's block as it reads its own; the
                // other runs find the group in L1/L2. (Zen 4, 16 sequences, SmolLM2 decode:
                // 6 of 7 interleaved rounds faster, the Q8_0 output layer 543-585 -> 497-510
                // ms; Qwen2.5-0.5B 2 of 3.)
                for l in 0..bb.div_ceil(64) {
                    crate::kq512::prefetch(p.wrapping_add(64 * l + nb * bb));
                }
            }
            let s = p.add(64 * lines);
            let dx = _mm512_cvtph_ps(_mm256_loadu_si256(s as *const __m256i));
            let mx = if Q41 {
                _mm512_cvtph_ps(_mm256_loadu_si256(s.add(32) as *const __m256i))
            } else {
                _mm512_setzero_ps()
            };
            let mut q = [_mm512_setzero_si512(); 8];
            if Q41 || Q50 {
                for t in 0..4 {
                    pf1(p, t);
                    let v = _mm512_loadu_si512(p.add(64 * t) as *const __m512i);
                    q[t] = _mm512_and_si512(v, m4);
                    q[t + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
                }
            }
            if Q50 {
                // Fifth bits: bit l of each plane byte to bit 4 of lane l's codes (16-bit
                // shifts: the mask drops what crosses a byte); the codes are then q + 16.
                pf1(p, 4);
                let pl = _mm512_loadu_si512(p.add(256) as *const __m512i);
                for l in 0..8 {
                    q[l] = _mm512_or_si512(q[l], _mm512_and_si512(fifth(pl, l), m10));
                }
            } else if !Q41 {
                for (t, q) in q.iter_mut().enumerate() {
                    pf1(p, t);
                    *q = _mm512_loadu_si512(p.add(64 * t) as *const __m512i);
                }
            }
            for c in 0..C {
                let y = a.add(c * as_ + i * yb);
                let yq = y.add(yq0) as *const i32;
                // Q8_0's codes are stored + 128 (Q5_0's are q + 16): each lane starts at
                // -128 (-16) x its activations' sum, so that it ends at the exact signed sum.
                let mut init = [0i32; 8];
                if Q41 {
                    summs[c] = _mm512_fmadd_ps(mx, _mm512_set1_ps(h16(y.add(2))), summs[c]);
                } else {
                    let ys = _mm256_dpbusd_epi32(
                        _mm256_setzero_si256(),
                        _mm256_set1_epi8(1),
                        _mm256_loadu_si256(yq as *const __m256i),
                    );
                    let off = if Q50 {
                        _mm256_slli_epi32::<4>(ys)
                    } else {
                        _mm256_slli_epi32::<7>(ys)
                    };
                    let neg = _mm256_sub_epi32(_mm256_setzero_si256(), off);
                    _mm256_storeu_si256(init.as_mut_ptr() as *mut __m256i, neg);
                }
                let d = _mm512_mul_ps(dx, _mm512_set1_ps(h16(y)));
                for l in 0..8 {
                    let s = _mm512_dpbusd_epi32(
                        _mm512_set1_epi32(init[l]),
                        q[l],
                        _mm512_set1_epi32(yq.add(l).read_unaligned()),
                    );
                    lanes[c][l] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), lanes[c][l]);
                }
            }
        }
        for c in 0..C {
            // hsum_float_8 lane by lane; Q4_1 then adds its offsets' sum (ggml's order), Q5_0
            // and Q8_0 nothing (not even 0.0, which would turn a -0.0 into +0.0).
            let mut v = crate::hsum::hsum_float_8_x16(&lanes[c]);
            if Q41 {
                v = _mm512_add_ps(v, summs[c]);
            }
            _mm512_storeu_ps(out.add(c * os), v);
        }
    }

    /// Bit `l` of each fifth-bit plane byte at bit 4 (other bits: whatever crossed in; the
    /// caller masks), as in [`group`].
    #[inline(always)]
    unsafe fn fifth(pl: __m512i, l: usize) -> __m512i {
        match l {
            0 => _mm512_slli_epi16::<4>(pl),
            1 => _mm512_slli_epi16::<3>(pl),
            2 => _mm512_slli_epi16::<2>(pl),
            3 => _mm512_slli_epi16::<1>(pl),
            4 => pl,
            5 => _mm512_srli_epi16::<1>(pl),
            6 => _mm512_srli_epi16::<2>(pl),
            _ => _mm512_srli_epi16::<3>(pl),
        }
    }

    /// [`group`] in two passes over the group's blocks, lanes 0-3 then lanes 4-7 (each
    /// lane's chain runs alone, so the split changes no result): a pass unpacks only its four
    /// lanes' codes and keeps `4 C` lanes in registers, so runs of four columns share each
    /// unpacking where [`group`] fits two. `terms`: the run's first column's
    /// [`super::terms`] (columns `nb` apart), so that a block's offsets, `d` (and Q4_1's `s`)
    /// come from one line, with no f16 conversion per row group.
    ///
    /// # Safety
    /// As [`super::columns`]; `terms` covers the run's columns.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn group_halves<const FMT: u8, const C: usize>(
        w: *const u8,
        nb: usize,
        a: *const u8,
        as_: usize,
        terms: *const super::Terms,
        out: *mut f32,
        os: usize,
        first: bool,
    ) {
        #[allow(non_snake_case)]
        let (Q41, Q50) = (FMT == 1, FMT == 5);
        let (bb, lines, yb, yq0) = super::layout(FMT);
        let m4 = _mm512_set1_epi8(0x0F);
        let m10 = _mm512_set1_epi8(0x10);
        // The first pass's lanes: not an array zeroed up front and copied into, which the
        // compiler made a memset and a memmove per call (~3% of Qwen2.5-0.5B's prompt time).
        let mut half0 = core::mem::MaybeUninit::<[[__m512; 4]; C]>::uninit();
        let mut summs = [_mm512_setzero_ps(); C];
        for h in 0..2 {
            let mut acc = [[_mm512_setzero_ps(); 4]; C];
            for i in 0..nb {
                let p = w.add(i * bb);
                if first && h == 0 {
                    // As `group`: the first run reads the group from memory and asks for
                    // the next group's block.
                    for l in 0..bb.div_ceil(64) {
                        crate::kq512::prefetch(p.wrapping_add(64 * l + nb * bb));
                    }
                }
                let mut q = [_mm512_setzero_si512(); 4];
                for (t, q) in q.iter_mut().enumerate() {
                    if !Q41 && !Q50 {
                        *q = _mm512_loadu_si512(p.add(64 * (4 * h + t)) as *const __m512i);
                        continue;
                    }
                    let v = _mm512_loadu_si512(p.add(64 * t) as *const __m512i);
                    *q = match h {
                        0 => _mm512_and_si512(v, m4),
                        _ => _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4),
                    };
                    if Q50 {
                        let pl = _mm512_loadu_si512(p.add(256) as *const __m512i);
                        let hb = _mm512_and_si512(fifth(pl, 4 * h + t), m10);
                        *q = _mm512_or_si512(*q, hb);
                    }
                }
                let s = p.add(64 * lines);
                let dx = _mm512_cvtph_ps(_mm256_loadu_si256(s as *const __m256i));
                if Q41 && h == 0 {
                    let mx = _mm512_cvtph_ps(_mm256_loadu_si256(s.add(32) as *const __m256i));
                    for (c, sm) in summs.iter_mut().enumerate() {
                        let tm = &*terms.add(c * nb + i);
                        *sm = _mm512_fmadd_ps(mx, _mm512_set1_ps(tm.sy), *sm);
                    }
                }
                for c in 0..C {
                    let yq = a.add(c * as_ + i * yb + yq0) as *const i32;
                    let tm = &*terms.add(c * nb + i);
                    let off = tm.offs.as_ptr().add(4 * h);
                    let d = _mm512_mul_ps(dx, _mm512_set1_ps(tm.dy));
                    for t in 0..4 {
                        let init = match Q41 {
                            true => _mm512_setzero_si512(),
                            false => _mm512_set1_epi32(off.add(t).read()),
                        };
                        let s = _mm512_dpbusd_epi32(
                            init,
                            q[t],
                            _mm512_set1_epi32(yq.add(4 * h + t).read_unaligned()),
                        );
                        acc[c][t] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), acc[c][t]);
                    }
                }
            }
            if h == 0 {
                half0.write(acc);
                continue;
            }
            // SAFETY: written by the first pass.
            let a0 = half0.assume_init_ref();
            for c in 0..C {
                // As `group`: hsum_float_8 lane by lane, then Q4_1's offsets' sum.
                let (x, y) = (&a0[c], &acc[c]);
                let l = [x[0], x[1], x[2], x[3], y[0], y[1], y[2], y[3]];
                let mut v = crate::hsum::hsum_float_8_x16(&l);
                if Q41 {
                    v = _mm512_add_ps(v, summs[c]);
                }
                _mm512_storeu_ps(out.add(c * os), v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// The shift-or gather equals the bit-by-bit definition.
    #[test]
    fn plane_bits_gathers_every_fourth_bit() {
        let mut x = 0x9E37_79B9u32;
        for _ in 0..1000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            for e in 0..4 {
                let mut want = 0u8;
                for k in 0..8 {
                    want |= (((x >> (4 * k + e)) & 1) as u8) << k;
                }
                assert_eq!(super::plane_bits(x, e), want, "{x:#x} {e}");
            }
        }
    }
}
