//! argmax: the first largest element of each row, NaN skipped.

#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use super::*;

/// The index of the first largest element, NaN skipped; 0 when every element is NaN (the
/// reference's scan).
pub(crate) fn first_max(v: &[f32]) -> usize {
    max_and_first(v).1.unwrap_or(0)
}

/// The largest value (NaN skipped, -inf when there is none) and the index of its first
/// occurrence (None when every element is NaN). The largest value first, in 16 lanes
/// (`f32::max` passes over a NaN), then the first element equal to it: the scan's index,
/// vectorized (a 49152-token vocabulary per decoding sequence per step).
pub(crate) fn max_and_first(v: &[f32]) -> (f32, Option<usize>) {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut chunks = v.chunks_exact(16);
    for c in &mut chunks {
        for j in 0..16 {
            lanes[j] = lanes[j].max(c[j]);
        }
    }
    let m = lanes
        .iter()
        .chain(chunks.remainder())
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    (m, v.iter().position(|&e| e == m))
}

/// Rows at least this long are split across the threads (two passes over 192 KiB of
/// logits took ~10 us on one thread, a fraction of a percent of a decode step each).
pub(crate) const SPLIT: usize = 32768;
/// Most pieces a row is split into.
pub(crate) const PIECES: usize = 8;

/// [`first_max`] of `v` in `n` pieces on the threads: the largest of the pieces' maxima,
/// then the first piece holding it (its first occurrence is the row's first).
pub(crate) unsafe fn first_max_split(host: &HostApi, v: &[f32], n: usize) -> usize {
    let per = v.len().div_ceil(n);
    let mut found = [(f32::NEG_INFINITY, None::<usize>); PIECES];
    let out = SyncPtr(found.as_mut_ptr() as *mut u8);
    parallel_for(host, n as u32, |i| {
        let i = i as usize;
        let piece = &v[(i * per).min(v.len())..((i + 1) * per).min(v.len())];
        let r = max_and_first(piece);
        // SAFETY: each task writes its own entry of `found`, which outlives parallel_for.
        (out.0 as *mut (f32, Option<usize>))
            .add(i)
            .write((r.0, r.1.map(|j| i * per + j)));
    });
    let m = found[..n].iter().fold(f32::NEG_INFINITY, |a, f| a.max(f.0));
    found[..n]
        .iter()
        .find(|f| f.0 == m && f.1.is_some())
        .and_then(|f| f.1)
        .unwrap_or(0)
}

pub(crate) unsafe fn argmax(host: &HostApi, inputs: &[TensorDesc], outputs: &[TensorDesc]) {
    let (x, out) = (inputs[0], outputs[0]);
    let k = x.ne[0] as usize;
    let threads = host.n_threads.max(1) as i64;
    // Row r's output element.
    let out_at = |r: i64| {
        let (i1, i2, i3) = split_row(&x, r);
        out.data
            .wrapping_offset((i1 * out.nb[0] + i2 * out.nb[1] + i3 * out.nb[2]) as isize)
            as *mut i32
    };
    if k >= SPLIT && x.nb[0] == 4 && x.nrows() >= threads && threads > 1 {
        // As many long packed rows as threads or more (the logits of a batched decode step):
        // whole rows on the threads, read in place.
        let rows: Vec<(SyncPtr, SyncPtr)> = (0..x.nrows())
            .map(|r| {
                let (i1, i2, i3) = split_row(&x, r);
                (
                    SyncPtr(row_ptr(&x, i1, i2, i3)),
                    SyncPtr(out_at(r) as *mut u8),
                )
            })
            .collect();
        parallel_for(host, rows.len() as u32, |r| {
            let (v, o) = &rows[r as usize];
            // SAFETY: a packed row of k f32 inside the input, and its own output element.
            unsafe {
                let v = core::slice::from_raw_parts(v.0 as *const f32, k);
                (o.0 as *mut i32).write(first_max(v) as i32);
            }
        });
        return;
    }
    // Packed rows are read where they are; others through one copy per call.
    let mut copy = Vec::new();
    let pieces = match k >= SPLIT {
        true => (host.n_threads.max(1) as usize).min(PIECES),
        false => 1,
    };
    for r in 0..x.nrows() {
        let (i1, i2, i3) = split_row(&x, r);
        let v: &[f32] = if x.nb[0] == 4 {
            core::slice::from_raw_parts(row_ptr(&x, i1, i2, i3) as *const f32, k)
        } else {
            copy.resize(k, 0f32);
            read_into(&x, i1, i2, i3, &mut copy);
            &copy
        };
        let idx = match pieces {
            1 => first_max(v),
            n => first_max_split(host, v, n),
        };
        out_at(r).write(idx as i32);
    }
}

#[cfg(test)]
mod first_max_tests {
    use super::first_max;

    /// The reference's scan: the first strictly larger element wins, NaN skipped.
    fn scan(v: &[f32]) -> usize {
        let mut best: Option<(usize, f32)> = None;
        for (i, &e) in v.iter().enumerate() {
            if !e.is_nan() && best.map_or(true, |(_, b)| e > b) {
                best = Some((i, e));
            }
        }
        best.map_or(0, |(i, _)| i)
    }

    #[test]
    fn equals_the_scan_on_ties_zeros_nans_and_infinities() {
        let (nan, inf) = (f32::NAN, f32::INFINITY);
        let cases: Vec<Vec<f32>> = vec![
            vec![],
            vec![nan; 40],
            vec![-inf; 33],
            vec![nan, -inf, 3.0, nan],
            vec![-0.0, 0.0, -0.0],
            (0..100).map(|i| ((i * 37) % 17) as f32).collect(),
            (0..49)
                .map(|i| {
                    if i == 47 {
                        inf
                    } else if i % 5 == 0 {
                        nan
                    } else {
                        -(i as f32)
                    }
                })
                .collect(),
            (0..64).map(|i| if i < 20 { 1.0 } else { 2.0 }).collect(),
        ];
        for v in &cases {
            assert_eq!(first_max(v), scan(v), "{v:?}");
        }
        let mut x = 12345u32;
        for n in [1usize, 15, 16, 17, 100, 49152] {
            let v: Vec<f32> = (0..n)
                .map(|_| {
                    x = x.wrapping_mul(1664525).wrapping_add(1013904223);
                    ((x >> 20) % 64) as f32 - 32.0
                })
                .collect();
            assert_eq!(first_max(&v), scan(&v), "n = {n}");
        }
    }

    /// Split across threads, the first of the largest still wins: ties across pieces, NaN
    /// and -inf pieces, a maximum in the last piece, every split count.
    #[test]
    fn split_rows_give_the_scan_index() {
        let nan = f32::NAN;
        let n = 49157; // not a multiple of the pieces
        let mut cases: Vec<Vec<f32>> = Vec::new();
        cases.push((0..n).map(|i| ((i * 7919) % 1000) as f32).collect()); // ties everywhere
        let mut v = vec![nan; n];
        v[n - 1] = -1.0;
        cases.push(v); // NaN pieces, the only number last
        cases.push(vec![f32::NEG_INFINITY; n]);
        cases.push(vec![nan; n]);
        let mut v: Vec<f32> = (0..n).map(|i| -(i as f32)).collect();
        v[n / 2] = 5.0;
        v[n - 3] = 5.0;
        cases.push(v);
        for v in &cases {
            for threads in 1..=super::PIECES as u32 {
                let host = backend_kit::par::scoped_threads_host(threads);
                for pieces in 2..=super::PIECES {
                    // SAFETY: a plain slice; the host runs the tasks before returning.
                    let got = unsafe { super::first_max_split(&host, v, pieces) };
                    assert_eq!(got, scan(v), "{threads} threads, {pieces} pieces");
                }
            }
        }
    }
}
