//! The engine thread: it owns the session (KV pool, backends, arena) and the scheduler, takes
//! commands from the HTTP side over a channel, runs batched steps while anything is queued or
//! running, and sends each request's tokens back as text (detokenized, stop strings applied)
//! on the request's own channel. The HTTP layer never touches the engine, and the engine never
//! waits on a client: a client that is gone is noticed when its channel is closed, and its
//! sequence is cancelled, its KV pages freed, at the next step.

use super::error::ApiError;
use super::metrics::Metrics;
use super::text::StopText;
use engine::kv::KV_PAGE;
use engine::sched::{Event, Finish, Request, Scheduler, TokenLogprobs};
use engine::{Model, Sampler, SamplerParams, Session};
use loader::StreamDecoder;
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

pub struct Job {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub params: SamplerParams,
    pub logprobs: Option<usize>,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    /// What the output must be; each choice runs its own matcher of it.
    pub grammar: Option<Arc<grammar::Grammar>>,
    pub arrived: Instant,
    pub tx: UnboundedSender<Out>,
}

/// Inputs to embed (tokens, each checked against the model's limits), and where the vectors go.
pub struct EmbedJob {
    pub inputs: Vec<Vec<u32>>,
    pub tx: tokio::sync::oneshot::Sender<Result<Vec<Vec<f32>>, ApiError>>,
}

pub enum Cmd {
    Submit(usize, Job),
    Embed(EmbedJob),
    Cancel(usize),
    /// Shutting down: queued requests are refused, running ones go on.
    Drain,
    /// End everything now.
    CancelAll,
    /// Leave once nothing runs.
    Exit,
}

/// One alternative of a token's log-probabilities, rendered.
pub struct Piece {
    pub text: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

pub struct TokenInfo {
    pub chosen: Piece,
    pub top: Vec<Piece>,
}

pub struct Usage {
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub completion_tokens: usize,
}

pub enum Out {
    /// One generated token: the text it made safe to show (often empty while a character or a
    /// possible stop string is incomplete), and its log-probabilities when asked for.
    Token {
        text: String,
        logprobs: Option<TokenInfo>,
    },
    Done {
        /// Text released at the end (what was held back for a stop string that never came).
        text: String,
        finish: Finish,
        /// The stop string that ended it, if one did.
        stop_sequence: Option<String>,
        usage: Usage,
    },
    /// The request failed or was ended (shutdown); nothing follows.
    Failed(ApiError),
}

struct Live<'m> {
    tx: UnboundedSender<Out>,
    dec: StreamDecoder<'m>,
    stop: StopText,
    logprobs: bool,
    arrived: Instant,
    last: Option<Instant>,
    generated: usize,
    prompt_tokens: usize,
}

fn piece(model: &Model, token: u32, logprob: f32) -> Piece {
    let bytes = model.tokenizer.token_to_piece(token, true);
    Piece {
        text: String::from_utf8_lossy(&bytes).into_owned(),
        bytes,
        logprob,
    }
}

fn info(model: &Model, token: u32, lp: &TokenLogprobs) -> TokenInfo {
    TokenInfo {
        chosen: piece(model, token, lp.logprob),
        top: lp.top.iter().map(|&(t, l)| piece(model, t, l)).collect(),
    }
}

/// Runs until the command channel is closed and nothing is left to do.
pub fn run(
    model: &Model,
    mut s: Session,
    mut sched: Scheduler,
    rx: Receiver<Cmd>,
    m: Arc<Metrics>,
    pooling: engine::embed::Pooling,
) {
    let mut live: HashMap<usize, Live> = HashMap::new();
    let mut events = Vec::new();
    let mut draining = false;
    let total_pages = s.kv_pool().rows() / KV_PAGE;
    m.kv_pages_total.store(total_pages as u64, Relaxed);
    let mut open = true;
    loop {
        // Wait for work when there is none; otherwise take what came and go on stepping.
        let mut cmds = Vec::new();
        if sched.is_idle() {
            if !open {
                break;
            }
            match rx.recv() {
                Ok(c) => cmds.push(c),
                Err(_) => break,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(c) => cmds.push(c),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        let mut embeds = Vec::new();
        for c in cmds {
            match c {
                Cmd::Embed(job) if draining => {
                    let _ = job.tx.send(Err(ApiError::shutting_down()));
                }
                Cmd::Embed(job) => embeds.push(job),
                Cmd::Submit(id, job) => {
                    if draining {
                        let _ = job.tx.send(Out::Failed(ApiError::shutting_down()));
                        continue;
                    }
                    m.prompt_tokens.fetch_add(job.prompt.len() as u64, Relaxed);
                    live.insert(
                        id,
                        Live {
                            tx: job.tx,
                            dec: StreamDecoder::new(&model.tokenizer, false),
                            stop: StopText::new(job.stop),
                            logprobs: job.logprobs.is_some(),
                            arrived: job.arrived,
                            last: None,
                            generated: 0,
                            prompt_tokens: job.prompt.len(),
                        },
                    );
                    sched.submit(Request {
                        id,
                        prompt: job.prompt,
                        max_tokens: job.max_tokens,
                        sampler: Sampler::new(job.params),
                        stop_at_eog: !job.ignore_eos,
                        logprobs: job.logprobs,
                        constraint: job
                            .grammar
                            .as_ref()
                            .map(|g| Box::new(g.constraint()) as engine::Constraint),
                    });
                }
                Cmd::Cancel(id) => {
                    sched.cancel(id);
                    live.remove(&id);
                }
                Cmd::Drain => draining = true,
                Cmd::Exit => open = false,
                Cmd::CancelAll => {
                    for id in sched.cancel_all() {
                        if let Some(l) = live.remove(&id) {
                            let _ = l.tx.send(Out::Failed(ApiError::shutting_down()));
                        }
                    }
                }
            }
        }
        if !embeds.is_empty() {
            embed(&mut s, embeds, pooling, &m);
        }
        // Clients that went away since the last step.
        let gone: Vec<usize> = live
            .iter()
            .filter(|(_, l)| l.tx.is_closed())
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            sched.cancel(id);
            live.remove(&id);
        }
        if draining {
            // Queued requests are refused; only those already running finish.
            let (_, queued) = sched.load();
            if queued > 0 {
                for id in sched.cancel_queued() {
                    if let Some(l) = live.remove(&id) {
                        let _ = l.tx.send(Out::Failed(ApiError::shutting_down()));
                    }
                }
            }
        }
        if sched.is_idle() {
            publish(&m, &sched, &s, total_pages);
            continue;
        }
        events.clear();
        if let Err(e) = sched.step(&mut s, &mut events) {
            let msg = format!("the engine failed: {e}");
            eprintln!("serve: {msg}");
            for id in sched.cancel_all() {
                if let Some(l) = live.remove(&id) {
                    let _ = l.tx.send(Out::Failed(ApiError::internal(msg.clone())));
                }
            }
            continue;
        }
        m.steps.fetch_add(1, Relaxed);
        let now = Instant::now();
        for e in events.drain(..) {
            match e {
                Event::Token {
                    id,
                    token,
                    logprobs,
                } => {
                    let Some(l) = live.get_mut(&id) else {
                        continue;
                    };
                    m.generation_tokens.fetch_add(1, Relaxed);
                    l.generated += 1;
                    match l.last {
                        None => m.ttft.observe((now - l.arrived).as_secs_f64()),
                        Some(t) => m.itl.observe((now - t).as_secs_f64()),
                    }
                    l.last = Some(now);
                    let (text, stopped) = if model.tokenizer.is_eog(token) {
                        (String::new(), false)
                    } else {
                        l.stop.push(&l.dec.push(token))
                    };
                    let lp = if l.logprobs {
                        logprobs.map(|lp| info(model, token, &lp))
                    } else {
                        None
                    };
                    let sent = l.tx.send(Out::Token { text, logprobs: lp }).is_ok();
                    if stopped || !sent {
                        let cached = sched.cancel(id).unwrap_or(0);
                        m.cached_tokens.fetch_add(cached as u64, Relaxed);
                        let l = live.remove(&id).expect("live");
                        let _ = l.tx.send(Out::Done {
                            text: String::new(),
                            finish: Finish::Stop,
                            stop_sequence: l.stop.matched().map(str::to_string),
                            usage: Usage {
                                prompt_tokens: l.prompt_tokens,
                                cached_tokens: cached,
                                completion_tokens: l.generated,
                            },
                        });
                    }
                }
                Event::Done {
                    id,
                    finish,
                    prompt_tokens,
                    cached_tokens,
                    tokens,
                    ..
                } => {
                    let Some(mut l) = live.remove(&id) else {
                        continue;
                    };
                    m.cached_tokens.fetch_add(cached_tokens as u64, Relaxed);
                    let (tail, stopped) = l.stop.push(&l.dec.finish());
                    let text = if stopped {
                        tail
                    } else {
                        tail + &l.stop.finish()
                    };
                    let _ = l.tx.send(Out::Done {
                        text,
                        finish: if stopped { Finish::Stop } else { finish },
                        stop_sequence: l.stop.matched().map(str::to_string),
                        usage: Usage {
                            prompt_tokens,
                            cached_tokens,
                            completion_tokens: tokens.len(),
                        },
                    });
                }
                Event::Failed { id, msg } => {
                    if let Some(l) = live.remove(&id) {
                        let _ = l.tx.send(Out::Failed(ApiError::bad_request(msg)));
                    }
                }
            }
        }
        publish(&m, &sched, &s, total_pages);
    }
}

/// The inputs of every embedding request that came since the last step, in shared steps
/// between two generation steps.
fn embed(s: &mut Session, mut jobs: Vec<EmbedJob>, pooling: engine::embed::Pooling, m: &Metrics) {
    // Each job's inputs move into one list; `counts` splits the vectors back.
    let counts: Vec<usize> = jobs.iter().map(|j| j.inputs.len()).collect();
    let all: Vec<Vec<u32>> = (jobs.iter_mut())
        .flat_map(|j| std::mem::take(&mut j.inputs))
        .collect();
    let n: usize = all.iter().map(Vec::len).sum();
    m.prompt_tokens.fetch_add(n as u64, Relaxed);
    match s.embed(&all, pooling) {
        Ok(mut vecs) => {
            for (j, count) in jobs.into_iter().zip(counts).rev() {
                let mine = vecs.split_off(vecs.len() - count);
                let _ = j.tx.send(Ok(mine));
            }
        }
        Err(e) => {
            let msg = format!("the engine failed: {e}");
            eprintln!("serve: {msg}");
            for j in jobs {
                let _ = j.tx.send(Err(ApiError::internal(msg.clone())));
            }
        }
    }
}

fn publish(m: &Metrics, sched: &Scheduler, s: &Session, total_pages: usize) {
    let (running, queued) = sched.load();
    m.running.store(running as u64, Relaxed);
    m.queued.store(queued as u64, Relaxed);
    let used = total_pages.saturating_sub(s.kv_pool().available_pages());
    m.kv_pages_used.store(used as u64, Relaxed);
}
