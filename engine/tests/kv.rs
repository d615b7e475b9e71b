//! The shared KV pool: a prompt prefix reused from another sequence gives the same logits,
//! bit for bit, as computing it; cached pages nobody holds are evicted least recently
//! released first; an exhausted pool is a clear error. On the small random Qwen3 checkpoint
//! (2 layers), so that prompts of several pages run quickly on the reference backend.

#[path = "common/random.rs"]
mod random;

use engine::kv::KV_PAGE;
use engine::{Model, Sequence, Session, SessionOptions, Work};

fn model() -> Model {
    Model::load(&random::random_checkpoint("qwen3-random.gguf")).unwrap()
}

/// Prompt chunk: 16 tokens, so whole pages (256) are the sharing unit.
const NB: usize = 16;

fn opts(pool_pages: usize) -> SessionOptions {
    SessionOptions {
        n_ctx: 2048,
        n_batch: NB,
        n_threads: 2,
        kv_pool_rows: pool_pages * KV_PAGE,
        ..Default::default()
    }
}

/// `n` token ids, different for each `seed`.
fn toks(seed: u64, n: usize) -> Vec<u32> {
    (0..n as u64)
        .map(|i| ((i * 2_654_435_761 + seed * 7919) % 49_000 + 10) as u32)
        .collect()
}

/// Feeds the rest of `prompt` in chunks of NB from the sequence's start (as the scheduler
/// does: a chunk after a reused prefix ends where it would have) and returns the logits after
/// its last token.
fn feed(s: &mut Session, seq: &mut Sequence, prompt: &[u32]) -> engine::Result<Vec<f32>> {
    assert_eq!(&prompt[..seq.history.len()], &seq.history[..]);
    let mut logits = Vec::new();
    let mut at = seq.history.len();
    while at < prompt.len() {
        let end = engine::session::chunk_end(NB, at, prompt.len());
        let n_out = (end == prompt.len()) as usize;
        let out = s.step(&mut [Work {
            seq,
            tokens: &prompt[at..end],
            n_out,
        }])?;
        if n_out == 1 {
            logits = out.to_vec();
        }
        at = end;
    }
    Ok(logits)
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn a_reused_prefix_gives_the_logits_of_computing_it() {
    let m = model();
    let mut s = Session::new(&m, &opts(8)).unwrap();
    let base = toks(1, 300);
    let mut a = s.new_sequence_for(&base, 1024);
    assert_eq!(a.history.len(), 0, "nothing is cached yet");
    feed(&mut s, &mut a, &base).unwrap();

    // Shares 280 tokens with `a`: the first whole page (256) is reused.
    let mut pb = base[..280].to_vec();
    pb.extend(toks(2, 40));
    let mut b = s.new_sequence_for(&pb, 1024);
    assert_eq!(b.history.len(), KV_PAGE);
    let lb = feed(&mut s, &mut b, &pb).unwrap();
    let mut c = s.new_sequence(1024);
    let lc = feed(&mut s, &mut c, &pb).unwrap();
    assert!(same_bits(&lb, &lc), "reused prefix changed the logits");

    // Decoding together, the two stay identical.
    for tok in [11u32, 42, 7] {
        let out = s
            .step(&mut [
                Work {
                    seq: &mut b,
                    tokens: &[tok],
                    n_out: 1,
                },
                Work {
                    seq: &mut c,
                    tokens: &[tok],
                    n_out: 1,
                },
            ])
            .unwrap();
        let v = out.len() / 2;
        assert!(same_bits(&out[..v], &out[v..]));
    }

    // The last prompt token is always computed; a different first token shares nothing.
    assert_eq!(s.new_sequence_for(&base[..KV_PAGE], 1024).history.len(), 0);
    let mut other = base.clone();
    other[0] += 1;
    assert_eq!(s.new_sequence_for(&other, 1024).history.len(), 0);
    // Generated tokens are never published: a prompt that continues `b` with them reuses
    // only the page of whole prompt chunks.
    assert_eq!(s.new_sequence_for(&b.history, 1024).history.len(), KV_PAGE);
}

#[test]
fn cached_pages_are_evicted_least_recently_released_first() {
    let m = model();
    let mut s = Session::new(&m, &opts(4)).unwrap();
    let (pa, pb) = (toks(1, 300), toks(2, 300));
    for p in [&pa, &pb] {
        let mut q = s.new_sequence(1024);
        feed(&mut s, &mut q, p).unwrap();
    }
    // Dropped: their whole first pages stay cached, the partial second pages are free.
    assert_eq!(s.kv_pool().cached_pages(), 2);
    assert_eq!(s.kv_pool().available_pages(), 4);
    // Three fresh pages: the two free ones and the least recently released cached one (a's).
    let mut e = s.new_sequence(1024);
    feed(&mut s, &mut e, &toks(3, 600)).unwrap();
    assert_eq!(e.kv.n_pages(), 3);
    assert_eq!(s.kv_pool().cached_pages(), 1);
    drop(e);
    assert_eq!(s.new_sequence_for(&pb, 1024).history.len(), KV_PAGE);
    assert_eq!(s.new_sequence_for(&pa, 1024).history.len(), 0);

    // A sequence that needs more than the pool: a clear error, and the pool stays usable.
    let mut big = s.new_sequence(2048);
    let err = feed(&mut s, &mut big, &toks(4, 1100))
        .unwrap_err()
        .to_string();
    assert!(err.contains("KV cache pool is full"), "{err}");
    drop(big);
    assert_eq!(s.kv_pool().available_pages(), 4);
    let mut q = s.new_sequence(1024);
    feed(&mut s, &mut q, &toks(5, 40)).unwrap();
}

/// Short prompts (one chunk each) that share a system prompt: a later one copies the shared
/// rows another computed, as far as they are provably what it would compute itself, and its
/// logits are bit for bit those of computing everything.
#[test]
fn a_shared_system_prompt_is_reused_from_a_short_prompt() {
    let m = model();
    let mut o = opts(8);
    o.n_batch = 64;
    let mut s = Session::new(&m, &o).unwrap();
    let system = toks(5, 24);
    let prompt = |seed: u64, n: usize| {
        let mut p = system.clone();
        p.extend(toks(seed, n));
        p
    };
    let pa = prompt(6, 20);
    let mut a = s.new_sequence_for(&pa, 256);
    assert_eq!(a.history.len(), 0, "nothing is cached yet");
    feed(&mut s, &mut a, &pa).unwrap();
    drop(a);

    // A longer user part, a short one, and a prompt past one chunk (its first chunk still
    // ends at 64, with the shared rows before it).
    for (seed, n) in [(7u64, 30usize), (8, 3), (9, 100)] {
        let pb = prompt(seed, n);
        let mut b = s.new_sequence_for(&pb, 256);
        let reused = b.history.len();
        assert!(
            (8..=24).contains(&reused),
            "{n}-token user part: {reused} rows reused"
        );
        let lb = feed(&mut s, &mut b, &pb).unwrap();
        let mut c = s.new_sequence(256);
        let lc = feed(&mut s, &mut c, &pb).unwrap();
        assert!(same_bits(&lb, &lc), "reused rows changed the logits");
    }

    // A prompt with another first token shares nothing.
    let mut other = pa.clone();
    other[0] += 1;
    assert_eq!(s.new_sequence_for(&other, 256).history.len(), 0);
}
