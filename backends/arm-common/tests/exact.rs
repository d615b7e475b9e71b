//! Every integer path of the ARM `vec_dot` kernels against the reference (`quant::vec_dot`),
//! bit for bit, on seeded random blocks of every format, including rows of one block, odd
//! block counts, long rows and extreme values. Paths this CPU cannot run are skipped (on x86
//! only the scalar twin runs; under `qemu-aarch64 -cpu max` all three do, and with
//! `-cpu cortex-a53` the NEON baseline without dotprod).

use abi::DType;
use mollm_arm_common::simd::{vec_dot, vec_dot_scalar, FORMATS};
use mollm_arm_common::IntPath;

const ALL_PATHS: [IntPath; 4] = [
    IntPath::Scalar,
    IntPath::Neon,
    IntPath::Dotprod,
    IntPath::I8mm,
];

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

fn row(dt: DType, vals: &[f32]) -> Vec<u8> {
    let mut b = vec![0u8; quant::row_bytes(dt, vals.len()).unwrap()];
    quant::quantize_row(dt, vals, &mut b).unwrap();
    b
}

#[test]
fn every_path_matches_the_reference_bit_for_bit() {
    let paths: Vec<IntPath> = ALL_PATHS.into_iter().filter(|p| p.available()).collect();
    eprintln!("paths on this CPU: {paths:?}");
    let mut rng = Lcg(7);
    for &dt in FORMATS {
        for &blocks in &[1usize, 3, 18, 64] {
            for trial in 0..8 {
                let n = 32 * blocks;
                let scale = [1.0f32, 1e-3, 300.0, 1.0][trial % 4];
                let w: Vec<f32> = (0..n).map(|_| rng.next() * scale).collect();
                let mut x: Vec<f32> = (0..n).map(|_| rng.next() * 4.0).collect();
                if trial == 3 {
                    // Saturated activations: every byte at an extreme.
                    x.iter_mut()
                        .enumerate()
                        .for_each(|(i, v)| *v = if i % 2 == 0 { 127.0 } else { -128.0 });
                }
                let wq = row(dt, &w);
                let mut act = vec![0u8; quant::row_bytes(quant::vec_dot_type(dt), n).unwrap()];
                quant::quantize_activations(dt, &x, &mut act).unwrap();
                let want = quant::vec_dot(dt, n, &wq, &act);
                if mollm_arm_common::simd::has_kernel(quant::Kernel::TinyBlas, dt) {
                    let mut act_t = act.clone();
                    quant::quantize_activations_for(quant::Kernel::TinyBlas, dt, &x, &mut act_t)
                        .unwrap();
                    assert_eq!(act_t, act, "{dt}: tinyBLAS takes the same activations");
                    let t = quant::dot_with(quant::Kernel::TinyBlas, dt, n, &wq, &act);
                    assert_eq!(
                        t.to_bits(),
                        want.to_bits(),
                        "{dt}: tinyBLAS = vec_dot per element"
                    );
                }
                assert_eq!(
                    vec_dot_scalar(dt, &wq, &act).to_bits(),
                    want.to_bits(),
                    "{dt} scalar twin, {blocks} blocks"
                );
                for &p in &paths {
                    // SAFETY: `p` is available on this CPU.
                    let got = unsafe { vec_dot(p, dt, &wq, &act) };
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{dt} {p:?}, {blocks} blocks, trial {trial}: {got} vs {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn header_is_well_formed_and_scores_by_architecture() {
    let h = &mollm_arm_common::HEADER_NEON;
    h.check_layout().unwrap();
    // SAFETY: a static NUL-terminated name.
    let name = unsafe { core::ffi::CStr::from_ptr(h.name) };
    assert_eq!(name.to_str().unwrap(), "arm-neon");
    assert_eq!(h.cpu_features, abi::cpu::ARM_NEON);
    // SAFETY: a static table.
    let t = unsafe { &*h.table };
    let s = (t.score.unwrap())();
    assert_eq!(s > 0, cfg!(target_arch = "aarch64"));

    let h = &mollm_arm_common::HEADER_I8MM;
    h.check_layout().unwrap();
    // SAFETY: as above.
    let name = unsafe { core::ffi::CStr::from_ptr(h.name) };
    assert_eq!(name.to_str().unwrap(), "arm-i8mm");
    assert_ne!(h.cpu_features & abi::cpu::ARM_I8MM, 0);
    let t = unsafe { &*h.table };
    let s_i8mm = (t.score.unwrap())();
    // Opens exactly where the SMMLA path runs, and then outranks arm-neon.
    assert_eq!(s_i8mm > 0, IntPath::I8mm.available());
    assert!(s_i8mm == 0 || s_i8mm > s);
}

/// The K-quant and repack chains: every kernel of Q4_K, Q6_K and the Q4_0 repack chain on
/// every available integer path, against `quant::dot_with` (the reference), bit for bit; odd
/// weight rows are random bytes (any scale, min and code).
#[test]
fn k_quant_chains_match_the_reference_bit_for_bit() {
    use mollm_arm_common::kquants;
    use quant::Kernel;
    let paths: Vec<IntPath> = ALL_PATHS.into_iter().filter(|p| p.available()).collect();
    let mut rng = Lcg(11);
    let mut checked = 0;
    for dt in [DType::Q4_K, DType::Q6_K, DType::Q4_0] {
        let bl = dt.info().block_len as usize;
        for &blocks in &[1usize, 3, 6] {
            let n = bl * blocks;
            for trial in 0..6 {
                let w: Vec<f32> = (0..n).map(|_| rng.next() * 0.7).collect();
                let mut wq = row(dt, &w);
                if trial % 2 == 1 {
                    for b in wq.iter_mut() {
                        *b = (rng.next() * 127.0 + 128.0) as u8;
                    }
                    if dt == DType::Q6_K || dt == DType::Q4_0 {
                        // keep the f16 scales finite
                        let bb = dt.info().block_bytes as usize;
                        let off = if dt == DType::Q6_K { 208 } else { 0 };
                        for blk in wq.chunks_exact_mut(bb) {
                            blk[off..off + 2].copy_from_slice(&0x2E66u16.to_le_bytes());
                        }
                    } else {
                        for blk in wq.chunks_exact_mut(144) {
                            blk[0..2].copy_from_slice(&0x2E66u16.to_le_bytes());
                            blk[2..4].copy_from_slice(&0x2A00u16.to_le_bytes());
                        }
                    }
                }
                let x: Vec<f32> = (0..n).map(|_| rng.next() * 3.0).collect();
                for kernel in [
                    Kernel::VecDot,
                    Kernel::RepackGemv,
                    Kernel::RepackGemm,
                    Kernel::Tiled,
                ] {
                    if !kquants::has_kernel(kernel, dt) {
                        continue;
                    }
                    let vt = quant::vec_dot_type(dt);
                    let mut act = vec![0u8; quant::row_bytes(vt, n).unwrap()];
                    quant::quantize_activations_for(kernel, dt, &x, &mut act).unwrap();
                    let want = quant::dot_with(kernel, dt, n, &wq, &act);
                    for &p in &paths {
                        // SAFETY: `p` is available on this CPU.
                        let got = unsafe { kquants::dot(p, kernel, dt, &wq, &act) };
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{dt} {kernel:?} {p:?}, {blocks} blocks, trial {trial}: {got} vs {want}"
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    eprintln!("{checked} outputs bit-identical");
}

/// The 2×2 tiles (SMMLA on the I8mm path) of every chain that has one: each of the four
/// outputs equals `quant::dot_with` on its row and column, bit for bit, on every available
/// path (weights as in the test above; the two rows and two columns differ).
#[test]
fn tiles_match_the_reference_bit_for_bit() {
    use mollm_arm_common::kquants;
    use quant::Kernel;
    let paths: Vec<IntPath> = ALL_PATHS.into_iter().filter(|p| p.available()).collect();
    eprintln!("paths on this CPU: {paths:?}");
    let mut rng = Lcg(23);
    let mut checked = 0;
    for dt in [DType::Q4_K, DType::Q6_K, DType::Q4_0] {
        let bl = dt.info().block_len as usize;
        for &blocks in &[1usize, 2, 9] {
            let n = bl * blocks;
            for trial in 0..4 {
                let scale = [0.7f32, 1e-3, 40.0, 1.0][trial];
                let rows: Vec<Vec<u8>> = (0..2)
                    .map(|_| row(dt, &(0..n).map(|_| rng.next() * scale).collect::<Vec<_>>()))
                    .collect();
                let xs: Vec<Vec<f32>> = (0..2)
                    .map(|_| (0..n).map(|_| rng.next() * 3.0).collect())
                    .collect();
                for kernel in [Kernel::RepackGemv, Kernel::RepackGemm, Kernel::Tiled] {
                    if !kquants::has_tile(kernel, dt) {
                        continue;
                    }
                    let vt = quant::vec_dot_type(dt);
                    let acts: Vec<Vec<u8>> = xs
                        .iter()
                        .map(|x| {
                            let mut a = vec![0u8; quant::row_bytes(vt, n).unwrap()];
                            quant::quantize_activations_for(kernel, dt, x, &mut a).unwrap();
                            a
                        })
                        .collect();
                    for &p in &paths {
                        // SAFETY: `p` is available on this CPU.
                        let got = unsafe {
                            kquants::tile(p, kernel, dt, [&rows[0], &rows[1]], [&acts[0], &acts[1]])
                        };
                        for (t, g) in got.iter().enumerate() {
                            let want = quant::dot_with(kernel, dt, n, &rows[t / 2], &acts[t % 2]);
                            assert_eq!(
                                g.to_bits(),
                                want.to_bits(),
                                "{dt} {kernel:?} {p:?} tile element {t}, {blocks} blocks, trial {trial}: {g} vs {want}"
                            );
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    eprintln!("{checked} tile outputs bit-identical");
    assert!(checked > 0);
}

/// SMMLA's integer tile against its twin on extreme codes (every i8 value on both sides).
#[test]
fn smmla_tile_equals_its_twin() {
    use mollm_arm_common::mmla::{pair_halves, pair_halves_by_quads};
    let mut rng = Lcg(5);
    let v: Vec<Vec<i8>> = (0..4)
        .map(|k| {
            (0..256)
                .map(|i| match k {
                    0 => -128,
                    1 => 127,
                    _ => (rng.next() * 128.0) as i8 ^ (i as i8),
                })
                .collect()
        })
        .collect();
    for path in ALL_PATHS.into_iter().filter(|p| p.available()) {
        for (a, y) in [(0, 0), (0, 1), (2, 3), (3, 1)] {
            let (ra, ry) = ([&v[a][..], &v[2][..]], [&v[y][..], &v[3][..]]);
            // SAFETY: `path` is available on this CPU.
            let (got, want) = unsafe {
                (
                    pair_halves::<16>(path, ra, ry),
                    pair_halves_by_quads::<16>(IntPath::Scalar, ra, ry),
                )
            };
            assert_eq!(got, want, "{path:?}");
        }
    }
}

/// Q4_K weights repacked at load (row pairs, decoded scales, interleaved nibbles): the codes
/// come back unchanged, and the repack GEMV/GEMM chains on the prepared pairs equal the
/// reference on the file's rows, bit for bit, on every available path (SMMLA straight from
/// the layout on I8mm), for one column (passed twice) and for two.
#[test]
fn repacked_q4k_pairs_match_the_reference_bit_for_bit() {
    use mollm_arm_common::repack;
    use quant::{Block, BlockQ4K, Kernel};
    let dt = DType::Q4_K;
    let paths: Vec<IntPath> = ALL_PATHS.into_iter().filter(|p| p.available()).collect();
    let mut rng = Lcg(31);
    let mut checked = 0;
    for &blocks in &[1usize, 4] {
        let k = 256 * blocks;
        let n = 8;
        let mut w = Vec::new();
        for _ in 0..n {
            w.extend(row(
                dt,
                &(0..k).map(|_| rng.next() * 0.5).collect::<Vec<_>>(),
            ));
        }
        let rb = w.len() / n;
        let mut prep = vec![0u8; repack::repacked_bytes(k, n)];
        repack::repack(&w, rb, k, n, &mut prep);
        let pair_bytes = repack::repacked_bytes(k, 2);
        for pair in 0..n / 2 {
            for b in 0..blocks {
                let c =
                    repack::unpack_pair(&prep[pair * pair_bytes + b * repack::PAIR_BLOCK + 48..]);
                for r in 0..2 {
                    let x = BlockQ4K::read(&w[(2 * pair + r) * rb + b * 144..][..144]);
                    assert_eq!(c[r], x.unpack(), "pair {pair} block {b} row {r}");
                }
            }
        }
        let xs: Vec<Vec<f32>> = (0..2)
            .map(|_| (0..k).map(|_| rng.next() * 2.0).collect())
            .collect();
        for kernel in [Kernel::RepackGemv, Kernel::RepackGemm] {
            let acts: Vec<Vec<u8>> = xs
                .iter()
                .map(|x| {
                    let mut a = vec![0u8; quant::row_bytes(DType::Q8_K, k).unwrap()];
                    quant::quantize_activations_for(kernel, dt, x, &mut a).unwrap();
                    a
                })
                .collect();
            for &p in &paths {
                for pair in 0..n / 2 {
                    let pw = &prep[pair * pair_bytes..(pair + 1) * pair_bytes];
                    for cols in [[0usize, 1], [1, 1]] {
                        // SAFETY: `p` is available on this CPU.
                        let got = unsafe {
                            repack::tile(p, kernel, pw, [&acts[cols[0]], &acts[cols[1]]])
                        };
                        for (t, g) in got.iter().enumerate() {
                            let wr = &w[(2 * pair + t / 2) * rb..][..rb];
                            let want = quant::dot_with(kernel, dt, k, wr, &acts[cols[t % 2]]);
                            assert_eq!(
                                g.to_bits(),
                                want.to_bits(),
                                "{kernel:?} {p:?} pair {pair} element {t}"
                            );
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    eprintln!("{checked} repacked outputs bit-identical");
}
