//! Session mechanics on a real model: chunked prompt processing agrees with one batch, the KV
//! cache continues a sequence exactly as re-processing it would, limits are enforced.

#[path = "common/smollm2.rs"]
mod smollm2;

use engine::{Sampler, SamplerParams, Session, SessionOptions};
use smollm2::smollm2;

fn opts(n_batch: usize) -> SessionOptions {
    SessionOptions {
        n_ctx: 256,
        n_batch,
        n_threads: 2,
        ..Default::default()
    }
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn chunked_prompt_matches_one_batch() {
    let Some(m) = smollm2() else { return };
    let ids = m
        .tokenizer
        .encode(
            "The quick brown fox jumps over the lazy dog because it was late for dinner",
            true,
            true,
        )
        .unwrap();
    let whole = Session::new(&m, &opts(512))
        .unwrap()
        .eval(&ids, true)
        .unwrap()
        .unwrap();
    let chunked = Session::new(&m, &opts(5))
        .unwrap()
        .eval(&ids, true)
        .unwrap()
        .unwrap();
    // Chunks change which kernel sums the products (as in llama.cpp), so only rounding differs.
    assert!(
        max_diff(&whole, &chunked) < 2e-2,
        "max diff {}",
        max_diff(&whole, &chunked)
    );
}

#[test]
fn kv_cache_continuation_equals_reprocessing() {
    let Some(m) = smollm2() else { return };
    let ids = m
        .tokenizer
        .encode("Rust is a language that", true, true)
        .unwrap();
    let mut s = Session::new(&m, &opts(512)).unwrap();
    let mut sampler = Sampler::new(SamplerParams::default());
    let (gen, _) = s.generate(&ids, 6, &mut sampler, |_| true).unwrap();
    assert_eq!(
        s.history().len(),
        ids.len() + gen.len() - 1,
        "the last token is sampled, not yet evaluated"
    );
    // Re-run everything in one go: the greedy continuation must be the same tokens.
    let mut all = ids.clone();
    all.extend_from_slice(&gen[..gen.len() - 1]);
    let mut fresh = Session::new(&m, &opts(512)).unwrap();
    let logits = fresh.eval(&all, true).unwrap().unwrap();
    let best = (0..logits.len())
        .max_by(|&a, &b| logits[a].total_cmp(&logits[b]).then(b.cmp(&a)))
        .unwrap();
    assert_eq!(best as u32, *gen.last().unwrap());
}

#[test]
fn truncate_and_regenerate_is_deterministic() {
    let Some(m) = smollm2() else { return };
    let ids = m.tokenizer.encode("Once upon a time", true, true).unwrap();
    let mut s = Session::new(&m, &opts(512)).unwrap();
    let run = |s: &mut Session| {
        let mut sampler = Sampler::new(SamplerParams::default());
        s.generate(&ids, 8, &mut sampler, |_| true).unwrap().0
    };
    let a = run(&mut s);
    s.truncate(0);
    let b = run(&mut s);
    assert_eq!(a, b);
}

#[test]
fn context_and_vocabulary_limits_are_errors() {
    let Some(m) = smollm2() else { return };
    let mut s = Session::new(
        &m,
        &SessionOptions {
            n_ctx: 8,
            n_threads: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let e = s.eval(&[1; 9], true).unwrap_err().to_string();
    assert!(e.contains("context is full"), "{e}");
    let e = s.eval(&[49152], true).unwrap_err().to_string();
    assert!(e.contains("49152"), "{e}");
    let mut sampler = Sampler::new(SamplerParams::default());
    let e = s
        .generate(&[], 4, &mut sampler, |_| true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("empty prompt"), "{e}");
}

/// Greedy continuation of `seq` by `n` tokens, one batched step each, alone.
fn greedy(s: &mut Session, seq: &mut engine::Sequence, first: u32, n: usize) -> Vec<u32> {
    let mut out = Vec::new();
    let mut tok = first;
    for _ in 0..n {
        let logits = s
            .step(&mut [engine::Work {
                seq,
                tokens: &[tok],
                n_out: 1,
            }])
            .unwrap()
            .to_vec();
        tok = logits
            .iter()
            .enumerate()
            .fold(
                (0, f32::NEG_INFINITY),
                |b, (i, &v)| if v > b.1 { (i, v) } else { b },
            )
            .0 as u32;
        out.push(tok);
    }
    out
}

#[test]
fn sequences_fork_and_truncate() {
    let Some(m) = smollm2() else { return };
    // Room for forks' copies of the shared last page.
    let mut o = opts(64);
    o.kv_pool_rows = 4 * engine::kv::KV_PAGE;
    let mut s = Session::new(&m, &o).unwrap();
    let ids = m
        .tokenizer
        .encode("The history of the city begins", true, true)
        .unwrap();
    let mut a = s.new_sequence(128);
    s.step(&mut [engine::Work {
        seq: &mut a,
        tokens: &ids,
        n_out: 0,
    }])
    .unwrap();
    let mut b = a.fork();
    assert_eq!(b.history, a.history);
    let ga = greedy(&mut s, &mut a, 11, 8);
    let gb = greedy(&mut s, &mut b, 11, 8);
    assert_eq!(ga, gb, "a fork continues exactly as the original");
    // Truncated back to the prompt, a sequence regenerates the same tokens.
    a.truncate(ids.len());
    assert_eq!(a.history.len(), ids.len());
    assert_eq!(greedy(&mut s, &mut a, 11, 8), ga);
    // A fork diverging does not touch the original's cache.
    let mut c = b.fork();
    c.truncate(ids.len());
    let gc = greedy(&mut s, &mut c, 42, 4);
    b.truncate(ids.len());
    assert_eq!(greedy(&mut s, &mut b, 11, 8), ga);
    assert_eq!(gc.len(), 4);
}
