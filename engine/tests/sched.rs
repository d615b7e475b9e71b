//! The scheduler's cancel and log-probabilities, on the small random Qwen3 checkpoint: a
//! cancelled request (queued or running) gives its KV pages back at once and sends nothing
//! more, the others go on with the tokens they produce alone; log-probabilities are of the
//! raw logits and rank the chosen token first under greedy decoding; a constrained sequence
//! writes only what its constraint allows and stops when it is complete, and its neighbours
//! in the batch produce what they produce alone.

#[path = "common/random.rs"]
mod random;

use engine::kv::KV_PAGE;
use engine::sched::{Event, Request, SchedOptions, Scheduler};
use engine::{ConstraintError, TokenConstraint};
use engine::{Model, Sampler, SamplerParams, Session, SessionOptions};

fn model() -> Model {
    Model::load(&random::random_checkpoint("qwen3-random.gguf")).unwrap()
}

fn session(m: &Model, pages: usize) -> Session<'_> {
    Session::new(
        m,
        &SessionOptions {
            n_ctx: 1024,
            n_batch: 16,
            n_threads: 2,
            kv_pool_rows: pages * KV_PAGE,
            ..Default::default()
        },
    )
    .unwrap()
}

fn sched(parallel: usize) -> Scheduler {
    Scheduler::new(SchedOptions {
        parallel,
        n_batch: 16,
        max_seq: 4096,
        prefix_cache: true,
    })
}

fn req(id: usize, seed: u32, max_tokens: usize, logprobs: Option<usize>) -> Request {
    Request {
        id,
        prompt: (0..20)
            .map(|i| (i * 977 + seed * 31) % 40_000 + 5)
            .collect(),
        max_tokens,
        sampler: Sampler::new(SamplerParams::default()),
        stop_at_eog: false,
        logprobs,
        constraint: None,
    }
}

/// Runs until idle; per request id, the tokens it produced (and whether it finished).
fn drain(sc: &mut Scheduler, s: &mut Session, n: usize) -> Vec<(Vec<u32>, bool)> {
    let mut out = vec![(Vec::new(), false); n];
    let mut ev = Vec::new();
    while !sc.is_idle() {
        ev.clear();
        sc.step(s, &mut ev).unwrap();
        for e in ev.drain(..) {
            match e {
                Event::Token { id, token, .. } => out[id].0.push(token),
                Event::Done { id, .. } => out[id].1 = true,
                Event::Failed { id, msg } => panic!("request {id} failed: {msg}"),
            }
        }
    }
    out
}

#[test]
fn cancel_frees_pages_and_leaves_the_others_as_they_are_alone() {
    let m = model();
    let mut s = session(&m, 4);
    // Alone: what request 1 produces.
    let mut sc = sched(4);
    sc.submit(req(1, 2, 12, None));
    let alone = drain(&mut sc, &mut s, 2)[1].0.clone();
    assert_eq!(alone.len(), 12);

    // Together with request 0, which is cancelled after a few steps; request 2 is cancelled
    // while still queued (parallel 2).
    let mut sc = sched(2);
    sc.submit(req(0, 1, 200, None));
    sc.submit(req(1, 2, 12, None));
    sc.submit(req(2, 3, 12, None));
    let free0 = s.kv_pool().available_pages();
    let mut ev = Vec::new();
    let mut got: Vec<Vec<u32>> = vec![Vec::new(); 3];
    for _ in 0..4 {
        ev.clear();
        sc.step(&mut s, &mut ev).unwrap();
        for e in ev.drain(..) {
            if let Event::Token { id, token, .. } = e {
                got[id].push(token);
            }
        }
    }
    assert_eq!(sc.load(), (2, 1));
    assert!(s.kv_pool().available_pages() < free0);
    assert_eq!(sc.cancel(2), Some(0), "queued request found");
    assert!(sc.cancel(0).is_some(), "running request found");
    assert_eq!(sc.cancel(0), None, "a second cancel finds nothing");
    assert_eq!(sc.load(), (1, 0));
    let rest = drain(&mut sc, &mut s, 3);
    assert!(rest[0].0.is_empty() && !rest[0].1, "nothing after cancel");
    assert!(
        rest[2].0.is_empty() && got[2].is_empty(),
        "the queued one never ran"
    );
    got[1].extend(&rest[1].0);
    assert_eq!(
        got[1], alone,
        "a cancelled neighbour changed a sequence's tokens"
    );
    // Everything is back: free pages, or cached prefix pages nobody holds.
    assert_eq!(s.kv_pool().available_pages(), free0);
}

#[test]
fn logprobs_are_of_the_raw_logits_and_greedy_picks_the_top_one() {
    let m = model();
    let mut s = session(&m, 4);
    let mut sc = sched(2);
    sc.submit(req(0, 5, 6, Some(3)));
    sc.submit(req(1, 6, 6, None));
    let mut ev = Vec::new();
    let mut seen = 0;
    while !sc.is_idle() {
        ev.clear();
        sc.step(&mut s, &mut ev).unwrap();
        for e in ev.drain(..) {
            if let Event::Token {
                id,
                token,
                logprobs,
            } = e
            {
                if id == 1 {
                    assert!(logprobs.is_none());
                    continue;
                }
                let lp = logprobs.expect("asked for");
                seen += 1;
                assert_eq!(lp.top.len(), 3);
                assert_eq!(lp.top[0].0, token, "greedy takes the most likely token");
                assert_eq!(lp.top[0].1, lp.logprob);
                assert!(lp.logprob <= 0.0 && lp.logprob > -50.0);
                assert!(lp.top[0].1 >= lp.top[1].1 && lp.top[1].1 >= lp.top[2].1);
            }
        }
    }
    assert_eq!(seen, 6);
}

#[test]
fn token_logprobs_normalise() {
    let logits = [1.0f32, 3.0, 2.0, 3.0];
    let lp = engine::sched::TokenLogprobs::new(&logits, 2, 4);
    let total: f64 = lp.top.iter().map(|&(_, l)| (l as f64).exp()).sum();
    assert!((total - 1.0).abs() < 1e-6, "sum {total}");
    // Ties by token id, lower first.
    assert_eq!(
        lp.top.iter().map(|t| t.0).collect::<Vec<_>>(),
        vec![1, 3, 2, 0]
    );
    assert_eq!(lp.logprob, lp.top[2].1);
}

/// Allows exactly `want`, one token after another, then is complete.
struct Exactly {
    want: Vec<u32>,
    at: usize,
}

impl TokenConstraint for Exactly {
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), ConstraintError> {
        let next = *self
            .want
            .get(self.at)
            .ok_or_else(|| ConstraintError("past the end".into()))?;
        for (i, l) in logits.iter_mut().enumerate() {
            if i as u32 != next {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }
    fn accept(&mut self, token: u32) -> Result<(), ConstraintError> {
        match self.want.get(self.at) {
            Some(&t) if t == token => {
                self.at += 1;
                Ok(())
            }
            _ => Err(ConstraintError(format!("token {token} was not allowed"))),
        }
    }
    fn finished(&self) -> bool {
        self.at == self.want.len()
    }
}

#[test]
fn a_constrained_sequence_writes_its_language_and_its_neighbours_are_unchanged() {
    let m = model();
    let mut s = session(&m, 8);
    let mut sc = sched(4);
    sc.submit(req(1, 2, 12, None));
    let alone = drain(&mut sc, &mut s, 2)[1].0.clone();

    let want = vec![7u32, 8, 9, 1000, 7];
    let mut sc = sched(4);
    sc.submit(req(0, 1, 40, None));
    let mut constrained = req(1, 9, 40, None);
    // Sampled, with a penalty: the mask still decides.
    constrained.sampler = Sampler::new(SamplerParams {
        temperature: 1.0,
        repeat_penalty: 1.3,
        seed: 3,
        ..Default::default()
    });
    constrained.constraint = Some(Box::new(Exactly {
        want: want.clone(),
        at: 0,
    }));
    sc.submit(constrained);
    sc.submit(req(2, 2, 12, None));
    let out = drain(&mut sc, &mut s, 3);
    assert_eq!(
        out[1],
        (want, true),
        "stopped when complete, not at max_tokens"
    );
    assert_eq!(
        out[2].0, alone,
        "a constrained neighbour changed a sequence's tokens"
    );
    assert_eq!(out[0].0.len(), 40);

    // A constraint that fails ends its sequence alone, with its message.
    let mut sc = sched(2);
    let mut bad = req(0, 1, 40, None);
    bad.constraint = Some(Box::new(Exactly {
        want: vec![],
        at: 0,
    }));
    sc.submit(bad);
    sc.submit(req(1, 2, 12, None));
    let mut ev = Vec::new();
    let mut failed = None;
    let mut got = Vec::new();
    while !sc.is_idle() {
        ev.clear();
        sc.step(&mut s, &mut ev).unwrap();
        for e in ev.drain(..) {
            match e {
                Event::Failed { id, msg } => failed = Some((id, msg)),
                Event::Token { id: 1, token, .. } => got.push(token),
                _ => {}
            }
        }
    }
    let (id, msg) = failed.expect("the failing constraint's sequence failed");
    assert_eq!(id, 0);
    assert!(msg.contains("past the end"), "{msg}");
    assert_eq!(got, alone);
}
