//! A continuous-batching scheduler over one [`Session`]: requests wait in a queue, at most
//! `parallel` run at once, each step carries one token of every decoding sequence and prompt
//! chunks of those still reading their prompt. The session's KV pool is shared: a sequence is
//! admitted when the pool can give it every page it may use (prompt + max tokens, in 256-row
//! pages, less the pages of a prompt prefix it reuses) on top of what the running ones may
//! still take, so a long request can use what idle ones do not; one that can never fit is
//! refused, the others wait.
//!
//! A sequence's prompt is cut into chunks of `n_batch` from its own start, whatever else runs,
//! so its tokens equal what it produces alone (see `graph::run` on batch invariance).

use crate::constraint::Constraint;
use crate::error::Result;
use crate::kv::{common_prefix, KV_PAGE};
use crate::sampler::Sampler;
use crate::session::{Sequence, Session, Work};
use std::collections::VecDeque;
use std::time::Instant;

pub struct Request {
    pub id: usize,
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampler: Sampler,
    pub stop_at_eog: bool,
    /// Report each generated token's log-probability and this many most likely alternatives
    /// (None: no log-probabilities).
    pub logprobs: Option<usize>,
    /// The language the output must stay in (None: free text); see [`crate::constraint`].
    pub constraint: Option<Constraint>,
}

/// Log-probabilities of one generated token, from the model's distribution (log-softmax of the
/// raw logits, before penalties and sampling filters: what OpenAI and vLLM report).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    pub logprob: f32,
    /// The most likely tokens, most likely first (ties by token id).
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprobs {
    /// Of `token` in `logits`, with the `k` most likely alternatives.
    pub fn new(logits: &[f32], token: u32, k: usize) -> TokenLogprobs {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
        let lse = max as f64 + sum.ln();
        let lp = |l: f32| (l as f64 - lse) as f32;
        let mut top: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
        if k > 0 {
            // One pass keeping the k best: k is at most 20, the vocabulary 10^5.
            for (i, &l) in logits.iter().enumerate() {
                if top.len() == k && l <= top[k - 1].1 {
                    continue;
                }
                let at = top.partition_point(|&(_, b)| b >= l);
                top.insert(at, (i as u32, l));
                top.truncate(k);
            }
        }
        TokenLogprobs {
            logprob: logits
                .get(token as usize)
                .map_or(f32::NEG_INFINITY, |&l| lp(l)),
            top: top.into_iter().map(|(t, l)| (t, lp(l))).collect(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-generation token.
    Stop,
    /// `max_tokens` reached.
    Length,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct SeqTimings {
    /// From submission to the start of its first step.
    pub queue_ms: f64,
    /// From its first step to its first token.
    pub prefill_ms: f64,
    /// From its first token to its last.
    pub decode_ms: f64,
}

#[derive(Debug)]
pub enum Event {
    Token {
        id: usize,
        token: u32,
        logprobs: Option<Box<TokenLogprobs>>,
    },
    Done {
        id: usize,
        finish: Finish,
        prompt_tokens: usize,
        /// Prompt tokens whose keys and values came from the prefix cache.
        cached_tokens: usize,
        tokens: Vec<u32>,
        timings: SeqTimings,
    },
    /// The request cannot run (it exceeds the KV budget, the context, ...); others go on.
    Failed { id: usize, msg: String },
}

pub struct SchedOptions {
    /// Most sequences in flight.
    pub parallel: usize,
    /// Prompt tokens per chunk (and per step, summed over the prompt chunks of a step).
    pub n_batch: usize,
    /// Longest sequence the model takes (its training context).
    pub max_seq: usize,
    /// Reuse cached prompt prefixes (see [`crate::kv`]); results are the same either way.
    pub prefix_cache: bool,
}

struct Active {
    req: Request,
    seq: Sequence,
    fed: usize,
    cached: usize,
    out: Vec<u32>,
    next: [u32; 1],
    reserved: usize,
    submitted: Instant,
    started: Instant,
    first: Option<Instant>,
}

pub struct Scheduler {
    opts: SchedOptions,
    queue: VecDeque<(Request, Instant)>,
    active: Vec<Active>,
    logits: Vec<f32>,
    row: Vec<f32>,
}

/// Shared prompt tokens (beyond what the prefix cache already gives) worth a step's wait for
/// a running request to compute them (see [`Scheduler::step`]).
const WAIT_FOR_PREFIX: usize = 16;

/// KV rows a request reserves.
fn need(r: &Request) -> usize {
    (r.prompt.len() + r.max_tokens).next_multiple_of(KV_PAGE)
}

impl Scheduler {
    pub fn new(opts: SchedOptions) -> Scheduler {
        Scheduler {
            opts,
            queue: VecDeque::new(),
            active: Vec::new(),
            logits: Vec::new(),
            row: Vec::new(),
        }
    }

    pub fn submit(&mut self, r: Request) {
        self.queue.push_back((r, Instant::now()));
    }

    /// Ends request `id` wherever it is (queued or running) and gives its KV pages back. None
    /// when there is no such request; else the prompt tokens it had from the prefix cache. No
    /// event follows for it.
    pub fn cancel(&mut self, id: usize) -> Option<usize> {
        if let Some(i) = self.queue.iter().position(|(r, _)| r.id == id) {
            self.queue.remove(i);
            return Some(0);
        }
        let i = self.active.iter().position(|a| a.req.id == id)?;
        // Dropping its sequence releases its pages.
        Some(self.active.swap_remove(i).cached)
    }

    /// Ends the requests still queued; their ids.
    pub fn cancel_queued(&mut self) -> Vec<usize> {
        self.queue.drain(..).map(|(r, _)| r.id).collect()
    }

    /// Ends every request, queued and running (after a failed step, or at shutdown); their ids.
    pub fn cancel_all(&mut self) -> Vec<usize> {
        let mut ids = self.cancel_queued();
        ids.extend(self.active.drain(..).map(|a| a.req.id));
        ids
    }

    pub fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.active.is_empty()
    }

    /// Sequences running now, and waiting.
    pub fn load(&self) -> (usize, usize) {
        (self.active.len(), self.queue.len())
    }

    /// Admits what fits, runs one step, and appends what happened to `events`. An error of the
    /// step itself (a backend failure) is returned: every sequence of the step is then lost.
    pub fn step(&mut self, s: &mut Session, events: &mut Vec<Event>) -> Result<()> {
        let n_vocab = s.model().hp.n_vocab;
        let budget = s.kv_pool().rows();
        while self.active.len() < self.opts.parallel.max(1) {
            let Some((r, _)) = self.queue.front() else {
                break;
            };
            let n = need(r);
            let fail = if r.prompt.is_empty() {
                Some("the prompt is empty".to_string())
            } else if r.prompt.len() + r.max_tokens > self.opts.max_seq {
                Some(format!(
                    "prompt ({}) + max_tokens ({}) exceed the model's context of {}",
                    r.prompt.len(),
                    r.max_tokens,
                    self.opts.max_seq
                ))
            } else if n > budget {
                Some(format!(
                    "needs {n} KV cache rows (prompt {} + max_tokens {}, in pages of {KV_PAGE}), the pool holds {budget}",
                    r.prompt.len(),
                    r.max_tokens,
                ))
            } else if let Some(&bad) = r.prompt.iter().find(|&&t| t as usize >= n_vocab) {
                Some(format!(
                    "token id {bad} outside the vocabulary of {n_vocab}"
                ))
            } else {
                None
            };
            if let Some(msg) = fail {
                let (r, _) = self.queue.pop_front().expect("front");
                events.push(Event::Failed { id: r.id, msg });
                continue;
            }
            // Pages the running sequences may still take, and this one's beyond a reused prefix.
            let owed: usize = self
                .active
                .iter()
                .map(|a| (a.reserved / KV_PAGE).saturating_sub(a.seq.kv.n_pages()))
                .sum();
            let n_ctx = r.prompt.len() + r.max_tokens;
            let seq = if self.opts.prefix_cache {
                s.new_sequence_for(&r.prompt, n_ctx)
            } else {
                s.new_sequence(n_ctx)
            };
            // A burst of requests sharing a prefix (a chat system prompt): while one of them
            // has not run its first chunk, the others wait a step, then take its rows from the
            // prefix cache instead of each computing them (the first chunk of a prompt is kept
            // for partial reuse, a whole first unit is published). Requests behind wait too.
            if self.opts.prefix_cache {
                let got = seq.history.len();
                let pool = s.kv_pool();
                let shares = |a: &Active| {
                    a.fed == a.cached
                        && a.fed < a.req.prompt.len()
                        && common_prefix(&a.req.prompt, &r.prompt) >= got + WAIT_FOR_PREFIX
                        && pool.shares_first_chunk(a.req.prompt.len())
                };
                if self.active.iter().any(shares) {
                    break;
                }
            }
            let fresh = (n / KV_PAGE).saturating_sub(seq.kv.n_pages());
            if owed + fresh > s.kv_pool().available_pages() {
                break; // waits for a running sequence to end (dropping `seq` returns its pages)
            }
            let (mut req, submitted) = self.queue.pop_front().expect("front");
            for &t in &req.prompt {
                req.sampler.accept(t);
            }
            let cached = seq.history.len();
            self.active.push(Active {
                seq,
                req,
                fed: cached,
                cached,
                out: Vec::new(),
                next: [0],
                reserved: n,
                submitted,
                started: Instant::now(),
                first: None,
            });
        }
        if self.active.is_empty() {
            return Ok(());
        }

        // Decoding sequences first (their single tokens share one matmul call), then prompt
        // chunks while the step's prompt budget lasts (always at least one).
        let nb = self.opts.n_batch.max(1);
        let mut order: Vec<usize> = (0..self.active.len())
            .filter(|&i| self.active[i].fed == self.active[i].req.prompt.len())
            .collect();
        let mut budget = nb;
        for i in 0..self.active.len() {
            let a = &self.active[i];
            if a.fed < a.req.prompt.len() {
                let len = crate::session::chunk_end(nb, a.fed, a.req.prompt.len()) - a.fed;
                if len <= budget || budget == nb {
                    budget = budget.saturating_sub(len);
                    order.push(i);
                }
            }
        }
        let mut slots: Vec<Option<&mut Active>> = self.active.iter_mut().map(Some).collect();
        let mut work: Vec<Work> = Vec::with_capacity(order.len());
        // The constraints of the sequences that pick a token after this step.
        let mut picking: Vec<&mut Constraint> = Vec::new();
        let mut meta: Vec<(usize, usize)> = Vec::with_capacity(order.len()); // (active index, n tokens)
        for &i in &order {
            let a = slots[i].take().expect("each sequence once");
            let Active {
                req,
                seq,
                fed,
                next,
                ..
            } = a;
            let (tokens, n_out): (&[u32], usize) = if *fed == req.prompt.len() {
                (&next[..], 1)
            } else {
                let end = crate::session::chunk_end(nb, *fed, req.prompt.len());
                (&req.prompt[*fed..end], (end == req.prompt.len()) as usize)
            };
            if let (1, Some(c)) = (n_out, req.constraint.as_mut()) {
                picking.push(c);
            }
            meta.push((i, tokens.len()));
            work.push(Work { seq, tokens, n_out });
        }
        let outs: Vec<usize> = work.iter().map(|w| w.n_out).collect();
        // Their masks are worked out on a thread of their own while the forward pass runs
        // (they depend only on the tokens already picked): what a mask costs hides in the
        // step instead of following it.
        let logits = std::thread::scope(|sc| {
            let ahead = (!picking.is_empty()).then(|| {
                sc.spawn(move || {
                    for c in picking {
                        c.prepare();
                    }
                })
            });
            let logits = s.step(&mut work);
            if let Some(h) = ahead {
                // A panic in a matcher is the constraint's failure, reported by `mask`.
                let _ = h.join();
            }
            logits
        })?;
        drop(work);
        self.logits.clear();
        self.logits.extend_from_slice(logits);

        // Greedy rows without penalties pick the argmax of the raw row: for two or more, one
        // backend call for every row (rows on the threads), instead of a call and a copy per
        // row (SmolLM2, 16 sequences: 16 calls of ~32 us a step on one thread).
        let plain = |r: &Request| {
            r.sampler.is_greedy() && !r.sampler.has_penalties() && r.constraint.is_none()
        };
        let n_plain = meta
            .iter()
            .zip(&outs)
            .filter(|&(&(i, _), &o)| o == 1 && plain(&self.active[i].req))
            .count();
        let best = match n_plain >= 2 {
            true => Some(s.argmax_rows(&mut self.logits, n_vocab)?),
            false => None,
        };

        let now = Instant::now();
        let mut row = 0;
        let mut done = Vec::new();
        let mut failed: Vec<(usize, String)> = Vec::new();
        for (&(i, n), &n_out) in meta.iter().zip(&outs) {
            let a = &mut self.active[i];
            a.fed = (a.fed + n).min(a.req.prompt.len());
            if n_out == 0 {
                continue;
            }
            let r = row;
            row += 1;
            // Log-probabilities come from the raw row, which picking may change (penalties).
            let raw = &self.logits[r * n_vocab..(r + 1) * n_vocab];
            let tok = match best.as_ref().filter(|_| plain(&a.req)) {
                Some(b) => b[r] as u32,
                None => {
                    self.row.clear();
                    self.row.extend_from_slice(raw);
                    if let Some(c) = a.req.constraint.as_mut() {
                        if let Err(e) = c.mask(&mut self.row) {
                            failed.push((i, e.to_string()));
                            continue;
                        }
                    }
                    s.pick(&mut a.req.sampler, &mut self.row)?
                }
            };
            if let Some(c) = a.req.constraint.as_mut() {
                if let Err(e) = c.accept(tok) {
                    failed.push((i, e.to_string()));
                    continue;
                }
            }
            let logprobs = a
                .req
                .logprobs
                .map(|k| Box::new(TokenLogprobs::new(raw, tok, k)));
            a.req.sampler.accept(tok);
            a.first.get_or_insert(now);
            a.out.push(tok);
            a.next = [tok];
            events.push(Event::Token {
                id: a.req.id,
                token: tok,
                logprobs,
            });
            let eog = a.req.stop_at_eog && s.model().tokenizer.is_eog(tok);
            let complete = a.req.constraint.as_ref().is_some_and(|c| c.finished());
            if eog || complete || a.out.len() >= a.req.max_tokens {
                let length = !eog && !complete;
                done.push((i, if length { Finish::Length } else { Finish::Stop }));
            }
        }
        // A constraint that fails ends its sequence alone, with its message.
        failed.sort_by(|a, b| b.0.cmp(&a.0));
        for (i, msg) in failed {
            done.retain(|d| d.0 != i);
            for d in done.iter_mut().filter(|d| d.0 == self.active.len() - 1) {
                d.0 = i;
            }
            let a = self.active.swap_remove(i);
            events.push(Event::Failed {
                id: a.req.id,
                msg: format!("constrained decoding: {msg}"),
            });
        }
        done.sort_by(|a, b| b.0.cmp(&a.0));
        for (i, finish) in done {
            let a = self.active.swap_remove(i);
            let first = a.first.unwrap_or(now);
            let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
            events.push(Event::Done {
                id: a.req.id,
                finish,
                prompt_tokens: a.req.prompt.len(),
                cached_tokens: a.cached,
                tokens: a.out,
                timings: SeqTimings {
                    queue_ms: ms(a.started - a.submitted),
                    prefill_ms: ms(first - a.started),
                    decode_ms: ms(now - first),
                },
            });
        }
        Ok(())
    }
}
