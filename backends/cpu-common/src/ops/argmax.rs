//! argmax: the first largest element of each row, NaN skipped.

#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use super::*;

/// The index of the first largest element, NaN skipped; 0 when every element is NaN (the
/// reference's scan). The largest value first, in 16 lanes (`f32::max` passes over a NaN),
/// then the first element equal to it: the same index, vectorized (a 49152-token
/// vocabulary per decoding sequence per step).
pub(super) fn first_max(v: &[f32]) -> usize {
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
    v.iter().position(|&e| e == m).unwrap_or(0)
}

pub(super) unsafe fn argmax(inputs: &[TensorDesc], outputs: &[TensorDesc]) {
    let (x, out) = (inputs[0], outputs[0]);
    let k = x.ne[0] as usize;
    let mut v = vec![0f32; k];
    for r in 0..x.nrows() {
        let (i1, i2, i3) = split_row(&x, r);
        read_into(&x, i1, i2, i3, &mut v);
        let idx = first_max(&v) as i32;
        let p = out
            .data
            .wrapping_offset((i1 * out.nb[0] + i2 * out.nb[1] + i3 * out.nb[2]) as isize)
            as *mut i32;
        p.write(idx);
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
}
