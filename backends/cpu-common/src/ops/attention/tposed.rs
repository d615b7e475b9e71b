//! Prompt chunks on AVX-512 over K and V copied once per call into transposed 16-row blocks
//! (block `b` of KV head `hk`: element `e` of rows `16b .. 16b + 16` as one 64-byte line), so
//! that the 16 rows of a block sit in the 16 lanes of a register.
//!
//! Why: ggml's chains give every score its own 16 lanes (`ggml_vec_dot_f32`: element `e` in
//! lane `e % 16`) and every p·V output its own 16 (tinyBLAS: row `j` in lane `j % 16`), each
//! reduced by `reduce16` at the end. Row-major, a score is one register of lanes that then
//! has to be reduced across lanes (shuffles), and p·V walks V rows 16 apart (4-8 KiB strides
//! that alias in L1). Transposed, a chain's lane is a register of 16 rows: the scores' lanes
//! and `reduce16` become plain vertical FMAs and additions with 16 rows' results in one
//! register, and p·V multiplies one line of V by 16 consecutive probabilities. Each operation
//! of each chain is the same, with the same operands in the same order: the same bits.
//!
//! A prompt chunk's queries all read the same rows (each K and V row once per query and query
//! head), so the copy, one pass over the visible cache, is paid back many times; a decode
//! step's single query keeps the row-major kernels.

use super::*;
#[cfg(x86)]
use crate::x86::attention::tposed::*;

/// Fewest queries in a call for the transposed kernels: the copy reads each visible row
/// twice (K and V) and is shared by the call's queries.
pub(crate) const MIN_QUERIES: i64 = 8;

/// Queries per task at most: a task's queries share each block of K and V while it is in L1
/// (a 2048-row cache of a 128-wide head is 1 MiB of K and 1 MiB of V per KV head: streamed
/// once per query, that came from L3).
pub(crate) const QG: i64 = 8;

/// One 64-byte line: one element of 16 consecutive rows.
#[repr(C, align(64))]
#[derive(Clone, Copy, Default)]
pub(crate) struct Line(pub [f32; 16]);
const _: () = assert!(core::mem::size_of::<Line>() == 64);

thread_local! {
    /// The calling thread's copy buffer, kept between calls (a fresh one per call would fault
    /// in its pages every layer).
    static BUF: core::cell::Cell<Vec<Line>> = const { core::cell::Cell::new(Vec::new()) };
}

/// Whether call `a` takes the transposed kernels (the chains they implement: f32 K with
/// `ggml_vec_dot_f32` over whole 64-steps, or f16 K with tinyBLAS; tinyBLAS p·V).
pub(crate) fn eligible(a: &Attn) -> bool {
    let du = a.q.ne[0];
    cfg!(x86)
        && a.isa == Isa::Avx512
        && a.q.ne[2] >= MIN_QUERIES
        && a.kqv_tile
        && a.n_eff % 16 == 0
        && a.n_kv >= 1
        && a.positions.iter().all(|&p| p >= 0)
        && du % 16 == 0
        && if a.k_f16 { a.kq_tile } else { du % 64 == 0 }
}

/// Row blocks a call's queries can see: through its last visible row, rounded up to 16.
pub(crate) fn blocks(a: &Attn) -> usize {
    let pmax = a.positions.iter().copied().max().unwrap_or(-1);
    let last = (a.n_kv - 1).min(pmax);
    (round_up(last + 1, 16).min(a.n_eff) / 16) as usize
}

/// Query groups of a transposed call (tasks per KV head).
pub(crate) fn groups(a: &Attn) -> i64 {
    (a.q.ne[2] + QG - 1) / QG
}

/// Copies K and V of every eligible call in `parts` into transposed blocks (both threads) and
/// points the calls at them; runs `f`, then keeps the buffer for the next call.
pub(crate) unsafe fn with_transposed(host: &HostApi, parts: &mut [Attn], f: impl FnOnce(&[Attn])) {
    let mut buf = BUF.with(|c| c.take());
    // Per call: (first line of its K copy, blocks per KV head); V follows K.
    let mut spans = Vec::with_capacity(parts.len());
    let mut total = 0usize;
    for a in parts.iter() {
        let nb = if eligible(a) { blocks(a) } else { 0 };
        spans.push((total, nb));
        total += 2 * a.k.ne[1] as usize * nb * a.q.ne[0] as usize;
    }
    if total > 0 {
        if buf.len() < total {
            buf.resize(total, Line::default());
        }
        let base = buf.as_mut_ptr();
        for (a, &(off, nb)) in parts.iter_mut().zip(&spans) {
            if nb > 0 {
                let half = a.k.ne[1] as usize * nb * a.q.ne[0] as usize;
                a.kt = base.add(off);
                a.vt = base.add(off + half);
                a.tblocks = nb;
            }
        }
        // Tasks: (call, KV head, block), each writing its own block's lines.
        let count = |a: &Attn| a.k.ne[1] as usize * a.tblocks;
        part_tasks(host, parts, count, |a, t| {
            copy_block(a, t / a.tblocks, t % a.tblocks)
        });
    }
    f(parts);
    BUF.with(|c| c.set(buf));
}

/// Line of K element `e` of block `b` (KV head `hk`): a block's lines together, so that a
/// block's scores read 4-16 KiB in a row.
#[inline(always)]
pub(crate) fn k_line(a: &Attn, hk: usize, b: usize, e: usize) -> usize {
    (hk * a.tblocks + b) * a.q.ne[0] as usize + e
}

/// Line of V element `e` of block `b`: 16 outputs' lines of a block together and the blocks
/// of those 16 outputs in a row, so that p·V over 16 outputs streams one run of memory.
#[inline(always)]
pub(crate) fn v_line(a: &Attn, hk: usize, b: usize, e: usize) -> usize {
    ((hk * (a.q.ne[0] as usize / 16) + e / 16) * a.tblocks + b) * 16 + e % 16
}

/// Block `b` of KV head `hk`, K and V, transposed (f16 rows widened exactly).
pub(crate) unsafe fn copy_block(a: &Attn, hk: usize, b: usize) {
    let du = a.q.ne[0] as usize;
    for (src, f16, v) in [(&a.k, a.k_f16, false), (&a.v, a.v_f16, true)] {
        for r in 0..16 {
            let p = row_ptr(src, hk as i64, a.rows.get((16 * b + r) as i64), 0);
            for e in 0..du {
                let x = if f16 {
                    quant::fp16_to_f32((p as *const u16).add(e).read_unaligned())
                } else {
                    (p as *const f32).add(e).read()
                };
                match v {
                    false => (*a.kt.add(k_line(a, hk, b, e))).0[r] = x,
                    true => (*a.vt.add(v_line(a, hk, b, e))).0[r] = x,
                }
            }
        }
    }
}

/// Queries `QG * grp ..` (at most `QG`) of all query heads of KV head `hk`, as
/// `attn_task_body` computes each (the same scores, probabilities and p·V chains), on the
/// transposed K and V: the scores block by block with every query and head of the task on a
/// block while it is in L1, then each head's probabilities, then p·V in stretches of [`SB`]
/// blocks, 16 outputs at a time.
pub(crate) unsafe fn task(a: &Attn, hk: i64, grp: i64) {
    #[cfg(x86)]
    task512(a, hk, grp);
    #[cfg(not(x86))]
    unreachable!("transposed attention is x86-64 only: {} {hk} {grp}", a.n_kv);
}
