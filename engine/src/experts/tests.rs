//! The cache on a synthetic file: every byte is a function of its offset, so a slot's bytes
//! say exactly which part of the file they came from.

use super::*;

/// Byte `i` of the synthetic file.
fn byte(i: u64) -> u8 {
    (i.wrapping_mul(2654435761) >> 13) as u8
}

struct Fixture {
    path: std::path::PathBuf,
    layers: Vec<LayerExperts>,
}

/// `n_layers` layers of `n_expert` experts; each part an F32 matrix of `[k, n]` (stride
/// k * n * 4), laid out part by part (all gates of a layer, then all ups, then all downs).
fn fixture(name: &str, n_layers: usize, n_expert: usize, k: i64, n: i64) -> Fixture {
    fixture_of(name, n_expert, &vec![(k, n); n_layers])
}

/// As [`fixture`], layer `l`'s parts `[k, n] = shapes[l]`.
fn fixture_of(name: &str, n_expert: usize, shapes: &[(i64, i64)]) -> Fixture {
    let mut layers = Vec::new();
    let mut at = 64u64;
    for (l, &(k, n)) in shapes.iter().enumerate() {
        let stride = (k * n * 4) as u64;
        let parts = std::array::from_fn(|_| {
            let s = Span {
                offset: at,
                stride,
                bytes: stride,
                dtype: DType::F32,
                ne: [k, n],
            };
            at += stride * n_expert as u64;
            s
        });
        layers.push(LayerExperts {
            name: format!("blk.{l}.ffn_gate_exps.weight"),
            parts,
            n_expert,
            router: 0,
        });
    }
    write_fixture(name, at, layers)
}

fn write_fixture(name: &str, len: u64, layers: Vec<LayerExperts>) -> Fixture {
    let dir = std::env::temp_dir().join(format!("mollm-experts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let bytes: Vec<u8> = (0..len).map(byte).collect();
    std::fs::write(&path, bytes).unwrap();
    Fixture { path, layers }
}

/// As a `.mollm` package lays experts out: per expert one 4096-aligned block holding its gate,
/// up and down (each 64-aligned, of `[k, n]`, `[k, n]` and `[n, k]` F32), blocks one after
/// the other.
fn interleaved(name: &str, n_layers: usize, n_expert: usize, k: i64, n: i64) -> Fixture {
    let m = (k * n * 4) as u64;
    let deltas = [
        0,
        m.next_multiple_of(64),
        (2 * m.next_multiple_of(64)).next_multiple_of(64),
    ];
    let block = (deltas[2] + m).next_multiple_of(4096);
    let mut layers = Vec::new();
    let mut at = 4096u64;
    for l in 0..n_layers {
        let parts = std::array::from_fn(|p| Span {
            offset: at + deltas[p],
            stride: block,
            bytes: m,
            dtype: DType::F32,
            ne: if p == 2 { [n, k] } else { [k, n] },
        });
        layers.push(LayerExperts {
            name: format!("blk.{l}.ffn_gate_exps.weight"),
            parts,
            n_expert,
            router: 0,
        });
        at += block * n_expert as u64;
    }
    write_fixture(name, at, layers)
}

fn slot_bytes(w: &Weight) -> &[u8] {
    let n = (w.desc.numel().unwrap() * 4) as usize; // F32 parts
                                                    // SAFETY: a pinned slot of the cache under test.
    unsafe { std::slice::from_raw_parts(w.desc.data, n) }
}

fn check_expert(f: &Fixture, layer: usize, e: usize, w: &[Weight; 3]) {
    #[allow(clippy::needless_range_loop)]
    for p in 0..3 {
        let s = f.layers[layer].parts[p];
        let want: Vec<u8> = (0..s.bytes)
            .map(|i| byte(s.offset + e as u64 * s.stride + i))
            .collect();
        assert_eq!(
            slot_bytes(&w[p]),
            &want[..],
            "layer {layer} expert {e} part {p}"
        );
        assert!(w[p].cache_slot);
        assert_eq!(w[p].desc.ne[..2], s.ne);
    }
}

fn cache(f: &Fixture, slots: usize, policy: Policy) -> ExpertCache {
    let probe = ExpertCache::new(&f.path, f.layers.clone(), 1, policy).unwrap();
    let c = ExpertCache::new(&f.path, f.layers.clone(), slots * probe.slot_bytes, policy).unwrap();
    assert_eq!(c.n_slots(), slots);
    c
}

#[test]
fn reads_the_exact_bytes_and_coalesces_adjacent_experts() {
    for direct in [false, true] {
        exact_bytes(direct);
    }
}

/// Buffered: adjacent experts coalesced. Direct: one aligned read per part (the file system
/// of the temp dir takes O_DIRECT here; where it does not, the cache says it reads buffered).
fn exact_bytes(direct: bool) {
    let f = fixture(&format!("exact-{direct}"), 2, 8, 16, 8);
    let mut c = cache(&f, 8, Policy::LeastStale);
    c.set_direct(direct);
    c.begin_layer(0, false);
    let got = c.acquire(0, &[1, 2, 3, 6]).unwrap();
    assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), [1, 2, 3, 6]);
    for (e, w) in &got {
        check_expert(&f, 0, *e, w);
    }
    let st = c.stats().prefill.clone();
    assert_eq!((st.acquires, st.misses, st.hits), (4, 4, 0));
    if c.direct() {
        assert!(direct);
        assert_eq!(st.reads, 12);
    } else {
        // Per part: experts 1-3 in one call, 6 in another.
        assert_eq!(st.reads, 6);
    }
    assert_eq!(st.bytes_read, 4 * 3 * 16 * 8 * 4);
    c.release();
    c.begin_layer(1, true);
    let got = c.acquire(1, &[0]).unwrap();
    check_expert(&f, 1, 0, &got[0].1);
    c.release();
    // Back to layer 0 (a new pass): hits, and the bytes are still right.
    c.begin_layer(0, true);
    let got = c.acquire(0, &[2, 6]).unwrap();
    for (e, w) in &got {
        check_expert(&f, 0, *e, w);
    }
    assert_eq!(c.stats().decode.hits, 2);
    assert_eq!(c.stats().per_layer, vec![(2, 4), (0, 1)]);
}

/// Runs `passes` passes over every layer, each layer routing to `route(layer)`; returns the
/// decode hits.
fn cycle(
    c: &mut ExpertCache,
    f: &Fixture,
    passes: usize,
    route: &dyn Fn(usize) -> Vec<usize>,
) -> u64 {
    for _ in 0..passes {
        for l in 0..f.layers.len() {
            c.begin_layer(l, true);
            let r = route(l);
            let mut done = 0;
            while done < r.len() {
                let got = c.acquire(l, &r[done..]).unwrap();
                for (e, w) in &got {
                    check_expert(f, l, *e, w);
                }
                done += got.len();
                c.release();
            }
        }
    }
    c.stats().decode.hits
}

#[test]
fn least_stale_beats_lru_on_a_cycle_larger_than_the_cache() {
    // 4 layers x 2 experts per token = 8 experts a pass, 6 slots: LRU evicts each entry just
    // before its next use; the least-stale policy keeps most of them.
    let f = fixture("cycle", 4, 4, 8, 8);
    let route = |l: usize| vec![l % 4, (l + 1) % 4];
    let lru = cycle(&mut cache(&f, 6, Policy::Lru), &f, 10, &route);
    let ls = cycle(&mut cache(&f, 6, Policy::LeastStale), &f, 10, &route);
    assert_eq!(lru, 0, "LRU on a cycle of 8 over 6 slots never hits");
    assert!(ls >= 30, "least-stale kept too little: {ls} hits of 80");
}

#[test]
fn next_use_keeps_the_experts_a_layer_uses_most() {
    // One layer; every run uses expert 0 or 1 (alternating) and one of 2..8 (in turn): 3
    // slots. Least-stale evicts by the last route, so the 0/1 alternation always misses; the
    // next-use policy sees 0 and 1 used every other run and the rest every sixth, and keeps 0
    // and 1.
    let f = fixture("popular", 1, 8, 8, 8);
    let route = |pass: usize| -> Vec<usize> {
        let mut r = vec![pass % 2, 2 + pass % 6];
        r.sort();
        r
    };
    let run = |policy: Policy| -> u64 {
        let mut c = cache(&f, 3, policy);
        for pass in 0..12 {
            c.begin_layer(0, true);
            for (e, w) in c.acquire(0, &route(pass)).unwrap() {
                check_expert(&f, 0, e, &w);
            }
            c.release();
        }
        c.stats().decode.hits
    };
    let (next_use, least_stale) = (run(Policy::NextUse), run(Policy::LeastStale));
    assert!(next_use >= 7, "next-use: {next_use} hits of 24");
    assert!(
        next_use >= least_stale + 6 && least_stale <= 2,
        "next-use {next_use} hits, least-stale {least_stale}"
    );
}

#[test]
fn slots_come_in_each_layers_size() {
    // Layer 0's parts are [8, 8] F32 (a slot of 3 x 8 KiB regions), layer 1's [32, 64] (3 x
    // 12 KiB): a budget of ten large slots makes six of each size (twelve), not ten.
    let f = fixture_of("sizes", 8, &[(8, 8), (32, 64)]);
    let (small, large) = (3 * 8192, 3 * 12288);
    assert_eq!(slot_lengths(&[small, large], 10 * large).len(), 12);
    assert_eq!(slot_lengths(&[large, large], 10 * large), vec![large; 10]);
    // Less than one large slot still makes one.
    assert_eq!(slot_lengths(&[small, large], small), vec![large]);
    for policy in [Policy::NextUse, Policy::LeastStale, Policy::Lru] {
        let mut c = ExpertCache::new(&f.path, f.layers.clone(), 10 * large, policy).unwrap();
        assert_eq!(c.n_slots(), 12);
        // Both layers cycle through all their experts, three at a time: every slot is
        // reused many times, each expert lands in a slot its layer fits, with its bytes.
        for pass in 0..12 {
            for l in 0..2 {
                c.begin_layer(l, true);
                let route: Vec<usize> = (0..3).map(|i| (pass * 3 + i + l) % 8).collect();
                let mut route = route;
                route.sort();
                route.dedup();
                for (e, w) in c.acquire(l, &route).unwrap() {
                    check_expert(&f, l, e, &w);
                    let s = c.map[&(l, e)];
                    assert!(c.slot_len[s] >= c.slot_layout[l].bytes, "{policy:?}");
                }
                c.release();
            }
        }
        assert!(c.stats().decode.evictions > 20, "{policy:?}");
    }
}

#[test]
fn stale_routes_go_first() {
    // Layer 0 routes to 0,1 on the first pass and 2,3 after: the stale 0,1 are evicted before
    // layer 1's current experts.
    let f = fixture("stale", 2, 4, 8, 8);
    let mut c = cache(&f, 4, Policy::LeastStale);
    let route = |l: usize, pass: usize| -> Vec<usize> {
        if l == 0 && pass > 0 {
            vec![2, 3]
        } else {
            vec![0, 1]
        }
    };
    for pass in 0..3 {
        for l in 0..2 {
            c.begin_layer(l, true);
            c.acquire(l, &route(l, pass)).unwrap();
            c.release();
        }
    }
    // Pass 0: 4 misses. Pass 1: layer 0 misses 2,3 (evicting its own stale 0,1), layer 1 hits.
    // Pass 2: all hit.
    assert_eq!(c.stats().decode.hits, 2 + 4);
    assert_eq!(c.stats().decode.misses, 6);
}

#[test]
fn a_route_larger_than_the_cache_runs_in_waves() {
    let f = fixture("waves", 1, 8, 8, 8);
    let mut c = cache(&f, 3, Policy::LeastStale);
    let all: Vec<usize> = (0..8).collect();
    let n = cycle(&mut c, &f, 2, &|_| all.clone());
    // Every acquire returns at most 3; everything is read correctly (checked in `cycle`).
    assert!(n <= 6, "{n}");
    assert_eq!(c.stats().decode.acquires, 16);
}

#[test]
fn a_truncated_file_is_an_error_naming_the_offset_and_nothing_stale_stays() {
    for direct in [false, true] {
        truncated(direct);
    }
}

fn truncated(direct: bool) {
    let f = fixture(&format!("short-{direct}"), 1, 4, 8, 8);
    let mut c = cache(&f, 4, Policy::LeastStale);
    c.set_direct(direct);
    // Cut the file inside expert 3's down matrix.
    let down = f.layers[0].parts[2];
    let cut = down.offset + 3 * down.stride + 10;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&f.path)
        .unwrap();
    file.set_len(cut).unwrap();
    c.begin_layer(0, true);
    let e = c.acquire(0, &[2, 3]).unwrap_err().to_string();
    assert!(e.contains("ends before offset"), "{e}");
    // Nothing half-read is kept: asking again reads again (and fails again), expert 1 is fine.
    assert!(c.acquire(0, &[3]).is_err());
    c.release();
    let got = c.acquire(0, &[1]).unwrap();
    check_expert(&f, 0, 1, &got[0].1);
}

#[test]
fn spans_outside_the_file_or_overlapping_are_refused() {
    let f = fixture("bad", 2, 4, 8, 8);
    let mut past = f.layers.clone();
    past[1].n_expert = 9;
    let e = ExpertCache::new(&f.path, past, 1 << 20, Policy::Lru)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("past the end of the file"), "{e}");
    let mut overlap = f.layers.clone();
    overlap[1].parts[0].offset = overlap[0].parts[2].offset + 8;
    let e = ExpertCache::new(&f.path, overlap, 1 << 20, Policy::Lru)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("overlap"), "{e}");
    let mut wrong = f.layers.clone();
    wrong[0].parts[1].bytes += 4;
    let e = ExpertCache::new(&f.path, wrong, 1 << 20, Policy::Lru)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("part 1"), "{e}");
    // Experts closer together than one matrix.
    let mut close = f.layers.clone();
    close[0].parts[2].stride -= 4;
    let e = ExpertCache::new(&f.path, close, 1 << 20, Policy::Lru)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("part 2") && e.contains("apart"), "{e}");
}

/// Interleaved experts (a `.mollm` package): one read fetches an expert's gate, up and down,
/// direct or buffered, and the bytes of each part are exact.
#[test]
fn an_interleaved_expert_is_one_read() {
    for direct in [false, true] {
        let f = interleaved(&format!("inter-{direct}"), 2, 6, 16, 24);
        let mut c = cache(&f, 4, Policy::LeastStale);
        c.set_direct(direct);
        c.begin_layer(0, false);
        let got = c.acquire(0, &[1, 2, 5]).unwrap();
        for (e, w) in &got {
            check_expert(&f, 0, *e, w);
        }
        let st = c.stats().prefill.clone();
        // Blocks have gaps (alignment), so adjacent experts are not merged: one read each.
        assert_eq!((st.misses, st.reads), (3, 3), "direct {direct}");
        c.release();
        c.begin_layer(1, false);
        let got = c.acquire(1, &[0, 5]).unwrap();
        for (e, w) in &got {
            check_expert(&f, 1, *e, w);
        }
        c.release();
    }
    // The same experts stored part by part take a read per part.
    let f = fixture("inter-gguf", 1, 6, 16, 24);
    let mut c = cache(&f, 4, Policy::LeastStale);
    c.set_direct(false);
    c.begin_layer(0, false);
    c.acquire(0, &[1, 5]).unwrap();
    assert_eq!(c.stats().prefill.reads, 6);
}

#[test]
fn prefetched_experts_are_hits_with_the_exact_bytes() {
    let f = fixture("prefetch", 2, 8, 16, 8);
    let mut c = cache(&f, 8, Policy::LeastStale);
    c.begin_layer(0, true);
    c.acquire(0, &[0]).unwrap();
    // While layer 0 computes: layer 1 is predicted to use 3 and 5.
    c.prefetch(1, &[(3, 0), (5, 1)]);
    c.wait_idle();
    c.release();
    c.begin_layer(1, true);
    let got = c.acquire(1, &[3, 4]).unwrap();
    for (e, w) in &got {
        check_expert(&f, 1, *e, w);
    }
    let st = c.stats().decode;
    assert_eq!(st.prefetches, 2);
    // Layer 0's expert missed; layer 1's 3 was prefetched (a hit), 4 was not predicted.
    assert_eq!((st.hits, st.misses), (1, 2));
    assert_eq!((st.prefetch_useful, st.prefetch_unused), (1, 1));
    assert_eq!((st.predicted, st.predicted_used), (2, 1));
    assert_eq!(st.bytes_read, 4 * 3 * 16 * 8 * 4);
    assert!(st.prefetch_bytes == 2 * 3 * 16 * 8 * 4, "{st:?}");
    c.release();
    // The unused prefetch (5) is the first to go; the others stay.
    c.begin_layer(0, true);
    for e in 4..8 {
        c.acquire(0, &[e]).unwrap();
        c.release();
    }
    c.begin_layer(1, true);
    let got = c.acquire(1, &[3, 4]).unwrap();
    for (e, w) in &got {
        check_expert(&f, 1, *e, w);
    }
    assert_eq!(c.stats().per_layer[1], (3, 1));
}

#[test]
fn prefetch_spares_pinned_experts_and_the_last_route_of_its_layer() {
    let f = fixture("spare", 2, 4, 8, 8);
    let mut c = cache(&f, 4, Policy::LeastStale);
    for l in 0..2 {
        c.begin_layer(l, true);
        c.acquire(l, &[0, 1]).unwrap();
        c.release();
    }
    // Layer 0 holds its two; layer 1's last route fills the rest: no room for a prediction.
    c.begin_layer(0, true);
    c.acquire(0, &[0, 1]).unwrap();
    c.prefetch(1, &[(2, 0), (3, 1)]);
    assert_eq!(c.stats().decode.prefetches, 0);
    c.release();
    c.begin_layer(1, true);
    c.acquire(1, &[0, 1]).unwrap();
    assert_eq!(c.stats().decode.misses, 4);
}

#[test]
fn a_prediction_rank_that_proves_useless_stops_being_prefetched() {
    let f = fixture("ranks", 2, 8, 8, 8);
    let mut c = cache(&f, 3, Policy::LeastStale);
    for pass in 0..40 {
        c.begin_layer(0, true);
        c.acquire(0, &[0]).unwrap();
        // Rank 0 is always right; rank 1 always wrong.
        c.prefetch(1, &[(1, 0), (2 + pass % 6, 1)]);
        // (Reads done before the layer runs: none cancelled, whatever the disk's latency.)
        c.wait_idle();
        c.release();
        c.begin_layer(1, true);
        let got = c.acquire(1, &[1]).unwrap();
        check_expert(&f, 1, 1, &got[0].1);
        c.release();
    }
    let st = c.stats();
    assert_eq!(st.ranks, vec![(40, 40, true), (40, 0, false)]);
    // Expert 1 once; rank 1 until it had been judged on 32 predictions.
    assert_eq!(st.decode.prefetches, 1 + 32);
    assert_eq!(st.decode.misses, 1);
}
