//! `mollm serve`: an OpenAI-compatible HTTP server on the batched engine. One engine thread
//! (`worker`) owns the session and runs continuous batching over every request in flight; the
//! HTTP side (axum on tokio, `routes`) validates each request once into a typed value
//! (`request`), submits it, and streams the answer back. The server listens at once and
//! answers `/health` with 503 while the model loads.

mod anthropic;
mod callstream;
mod conn;
mod embeddings;
mod error;
mod llama;
mod metrics;
mod request;
mod responses;
mod routes;
mod text;
mod tools;
mod worker;

use crate::common::{warm_up, CliResult, ModelArgs, SamplingArgs};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use clap::Args;
use engine::sched::{SchedOptions, Scheduler};
use engine::Model;
use error::ApiError;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use worker::Cmd;

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on (127.0.0.1: this machine only; 0.0.0.0 opens it to the network).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Most sequences computed at once (continuous batching); more requests wait in the queue.
    #[arg(long, default_value_t = 4)]
    pub parallel: usize,
    /// KV cache budget in tokens, one pool shared by all sequences [default: 4096 x
    /// --parallel, at most 65536]. A request's prompt + max_tokens must fit in it and in the
    /// model's training context.
    #[arg(long, short = 'c')]
    pub ctx: Option<usize>,
    /// Most requests waiting beyond --parallel; more get 429 with Retry-After.
    #[arg(long, default_value_t = 256)]
    pub queue: usize,
    /// Require `Authorization: Bearer KEY` on every route but /health.
    #[arg(long, env = "MOLLM_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// max_tokens of a request that does not set it (capped by what the context has left).
    #[arg(long, short = 'n', default_value_t = 1024)]
    pub max_tokens: usize,
    /// Largest request body in bytes (413 above).
    #[arg(long, default_value_t = 2 * 1024 * 1024)]
    pub max_body: usize,
    /// Compute every prompt in full instead of reusing cached prompt prefixes (the answers
    /// are the same either way).
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Seconds the requests running at SIGTERM/Ctrl-C may take to finish before they are
    /// cancelled (a second signal cancels them at once); the process exits at most a second
    /// after that.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=MAX_SECONDS))]
    pub shutdown_grace: u64,
    /// Seconds a client has to send a request's headers, from its connection opening or its
    /// previous answer (so an idle keep-alive connection closes after this long).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=MAX_SECONDS))]
    pub header_timeout: u64,
    /// Seconds a client has to send a request's body (408 past it), and that a response write
    /// may wait on a client that reads nothing (the connection ends).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=MAX_SECONDS))]
    pub io_timeout: u64,
    /// Most open connections; one more is answered 503 with Retry-After and closed.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub max_connections: u64,
    /// Let web pages from this origin call the server (CORS: `*` for any; default: none).
    /// Preflight requests are answered before the API key is checked, as browsers send them
    /// without it.
    #[arg(long, value_name = "ORIGIN")]
    pub cors: Option<String>,
    /// Refuse request fields this server does not know (400 naming the field) instead of
    /// ignoring them (each is logged once and listed in the response's
    /// `x-mollm-ignored-fields` header).
    #[arg(long)]
    pub strict: bool,
    /// How /v1/embeddings pools token states [default: the model's own (BERT's file says),
    /// else mean, as llama-server's `--pooling mean`].
    #[arg(long, value_parser = engine::embed::Pooling::NAMES)]
    pub pooling: Option<String>,
    /// Sampling defaults for requests that do not set a field (default: greedy).
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

/// The longest timeout or grace a flag takes (a day).
const MAX_SECONDS: u64 = 86_400;
/// Most sequences computed at once (`--parallel`): each has its own step state.
pub const MAX_PARALLEL: usize = 1024;

pub struct Ready {
    pub model: Arc<Model>,
    /// The vocabulary as constrained decoding sees it, built on the first request that asks
    /// for a format (or the reason it cannot be).
    vocab: OnceLock<Result<Arc<grammar::Vocab>, String>>,
    pub model_id: String,
    /// Longest sequence: the training context or the KV pool, whichever is smaller.
    pub max_seq: usize,
    /// Longest input /v1/embeddings takes: `max_seq`, and for an encoder (which takes an
    /// input in one step) the batch size.
    pub embed_max: usize,
    cmd: Mutex<std::sync::mpsc::Sender<Cmd>>,
}

impl Ready {
    /// The model's [`grammar::Vocab`], built once.
    pub fn vocab(&self) -> Result<Arc<grammar::Vocab>, String> {
        self.vocab
            .get_or_init(|| {
                grammar::Vocab::new(&self.model.tokenizer)
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
    }

    fn send(&self, c: Cmd) -> Result<(), ()> {
        self.cmd
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(c)
            .map_err(|_| ())
    }
}

pub struct App {
    ready: OnceLock<Ready>,
    metrics: Arc<metrics::Metrics>,
    api_key: Option<String>,
    defaults: SamplingArgs,
    parallel: usize,
    queue: usize,
    max_tokens: usize,
    /// Body limit in bytes (for the 413 message; the router enforces it).
    max_body: usize,
    /// Seconds running requests get after SIGTERM.
    grace: u64,
    limits: conn::Limits,
    /// Requests being validated and tokenized at once (one per core): the others wait.
    admissions: tokio::sync::Semaphore,
    next_id: AtomicUsize,
    /// Generation requests submitted and not yet answered (running + queued).
    inflight: AtomicUsize,
    stopping: AtomicBool,
    created: u64,
    /// `--strict`.
    strict: bool,
    /// `--cors`.
    cors: Option<axum::http::HeaderValue>,
    /// Unknown request fields already logged (each once).
    ignored_logged: Mutex<std::collections::BTreeSet<String>>,
}

pub fn serve(a: ServeArgs) -> CliResult {
    if a.parallel == 0 || a.parallel > MAX_PARALLEL {
        return Err(format!("--parallel {}: must be 1 to {MAX_PARALLEL}", a.parallel).into());
    }
    if a.ctx == Some(0) {
        return Err("--ctx must be at least 1".into());
    }
    if a.max_tokens == 0 {
        return Err("--max-tokens must be at least 1".into());
    }
    a.sampling.sampler()?; // the defaults of every request, checked once
    if a.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        return Err("--api-key (or MOLLM_API_KEY) is empty: give a key, or leave both out to serve without one".into());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(serve_async(a))
}

async fn serve_async(a: ServeArgs) -> CliResult {
    let addr = format!("{}:{}", a.host, a.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let local = listener.local_addr()?;
    eprintln!("mollm serve: listening on http://{local} (loading the model)");
    let app = Arc::new(App {
        ready: OnceLock::new(),
        metrics: Arc::new(metrics::Metrics::new()),
        api_key: a.api_key.as_deref().map(|k| k.trim().to_string()),
        defaults: a.sampling.clone(),
        strict: a.strict,
        cors: a
            .cors
            .as_deref()
            .map(axum::http::HeaderValue::from_str)
            .transpose()
            .map_err(|_| "--cors: not a valid origin header value".to_string())?,
        ignored_logged: Mutex::new(Default::default()),
        parallel: a.parallel,
        queue: a.queue,
        max_tokens: a.max_tokens,
        max_body: a.max_body,
        grace: a.shutdown_grace,
        limits: conn::Limits {
            header: Duration::from_secs(a.header_timeout),
            io: Duration::from_secs(a.io_timeout),
            max_connections: a.max_connections as usize,
        },
        admissions: tokio::sync::Semaphore::new(
            std::thread::available_parallelism().map_or(1, |n| n.get()),
        ),
        next_id: AtomicUsize::new(0),
        inflight: AtomicUsize::new(0),
        stopping: AtomicBool::new(false),
        created: routes::unix_now(),
    });

    let (load_tx, load_rx) = tokio::sync::oneshot::channel::<Result<String, String>>();
    let engine = std::thread::Builder::new()
        .name("mollm-engine".into())
        .spawn({
            let app = app.clone();
            move || {
                if let Err(e) = load_and_run(&a, &app, load_tx) {
                    eprintln!("error: {e}");
                }
            }
        })?;

    let router = router(app.clone());
    let mut conns = conn::Conns::new(app.limits);
    let mut signals = Signals::new()?;

    // Loading, then serving, until the model fails to load or the first signal.
    let mut load_rx = load_rx;
    let serving = async {
        tokio::select! {
            r = &mut load_rx => match r {
                Ok(Ok(msg)) => eprintln!("mollm serve: ready on http://{local}: {msg}"),
                Ok(Err(e)) => return Some(e),
                Err(_) => return Some("the engine thread ended while loading".to_string()),
            },
            _ = signals.recv() => return None,
        }
        signals.recv().await;
        None
    };
    let mut failed = None;
    conn::accept_until(&listener, &mut conns, &router, async {
        failed = serving.await;
    })
    .await;
    if failed.is_none() {
        drain(&app, &listener, &mut conns, &router, &mut signals).await;
    }
    drop(listener);
    if let Some(r) = app.ready.get() {
        let _ = r.send(Cmd::CancelAll);
        let _ = r.send(Cmd::Exit);
    }
    // Answers still being written get a moment; then whatever is left is dropped.
    conns
        .close(tokio::time::Instant::now() + Duration::from_millis(300))
        .await;
    // The engine ends after its current step; one that is mid-way through a long prompt chunk
    // is not waited for past the deadline (the process exit ends it). All the waits after the
    // grace period add up to under a second.
    let deadline = std::time::Instant::now() + Duration::from_millis(200);
    while !engine.is_finished() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if let Some(e) = failed {
        return Err(e.into());
    }
    eprintln!("mollm serve: stopped");
    Ok(())
}

/// SIGTERM and SIGINT (Ctrl-C), as one stream.
struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Signals {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    async fn recv(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// After the first signal: new requests get 503 with Retry-After (connections are still
/// accepted, so that a router sees the answer and moves on), queued ones are refused, and
/// running ones may finish within the grace period. Returns when none is left, or when the
/// grace period ends or a second signal comes (then they are cancelled and get 300 ms to end;
/// what is left after that is dropped).
async fn drain(
    app: &Arc<App>,
    listener: &tokio::net::TcpListener,
    conns: &mut conn::Conns,
    router: &Router,
    signals: &mut Signals,
) {
    app.stopping.store(true, SeqCst);
    let grace = Duration::from_secs(app.grace);
    eprintln!(
        "mollm serve: stopping (running requests get {} s to finish; a second signal ends them now)",
        app.grace
    );
    if let Some(r) = app.ready.get() {
        let _ = r.send(Cmd::Drain);
    }
    let idle = || async {
        while app.inflight.load(SeqCst) > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let mut cut_short = false;
    conn::accept_until(listener, conns, router, async {
        tokio::select! {
            _ = idle() => {}
            _ = tokio::time::sleep(grace) => cut_short = true,
            _ = signals.recv() => cut_short = true,
        }
    })
    .await;
    if !cut_short {
        return;
    }
    eprintln!("mollm serve: cancelling the requests still running");
    if let Some(r) = app.ready.get() {
        let _ = r.send(Cmd::CancelAll);
    }
    let hard = tokio::time::sleep(Duration::from_millis(300));
    conn::accept_until(listener, conns, router, async {
        tokio::select! {
            _ = idle() => {}
            _ = hard => {}
        }
    })
    .await;
}

fn load_and_run(
    a: &ServeArgs,
    app: &Arc<App>,
    load_tx: tokio::sync::oneshot::Sender<Result<String, String>>,
) -> CliResult {
    let mut quiet = a.model.clone();
    quiet.load.quiet = true;
    let loaded = (|| -> CliResult<_> {
        let (_path, model) = quiet.load()?;
        let model = Arc::new(model);
        let budget = a.ctx.unwrap_or((4096 * a.parallel).min(65536));
        Ok((model, budget))
    })();
    let (model, budget) = match loaded {
        Ok(x) => x,
        Err(e) => {
            let _ = load_tx.send(Err(e.to_string()));
            return Ok(());
        }
    };
    let m = model.clone();
    let session = (|| -> CliResult<_> {
        let mut s = quiet.session_with_pool(&m, 1, budget)?;
        let nb = a.model.batch.max(1);
        s.reserve_step(nb + a.parallel, a.parallel);
        warm_up(&mut s, &m, true)?;
        Ok(s)
    })();
    let session = match session {
        Ok(s) => s,
        Err(e) => {
            let _ = load_tx.send(Err(e.to_string()));
            return Ok(());
        }
    };
    let max_seq = m.hp.n_ctx_train.min(session.kv_pool().rows());
    let sched = Scheduler::new(SchedOptions {
        parallel: a.parallel,
        n_batch: a.model.batch.max(1),
        max_seq,
        prefix_cache: !a.no_prefix_cache,
    });
    let (tx, rx) = std::sync::mpsc::channel();
    let model_id = m.file_name();
    let msg = format!(
        "{model_id} ({}), --parallel {}, KV pool {} tokens, longest sequence {max_seq}",
        session.backend_names().join(","),
        a.parallel,
        session.kv_pool().rows()
    );
    let embed_max = match m.embed_program.as_ref().is_some_and(|p| p.non_causal) {
        true => max_seq.min(a.model.batch.max(1)),
        false => max_seq,
    };
    let pooling = match &a.pooling {
        Some(p) => engine::embed::Pooling::parse(p).expect("clap checked the name"),
        None => m.pooling(),
    };
    let _ = app.ready.set(Ready {
        model: model.clone(),
        vocab: OnceLock::new(),
        model_id,
        max_seq,
        embed_max,
        cmd: Mutex::new(tx),
    });
    let _ = load_tx.send(Ok(msg));
    worker::run(&m, session, sched, rx, app.metrics.clone(), pooling);
    Ok(())
}

const ROUTES: &[&str] = &[
    "/v1/models",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
    "/v1/embeddings",
    "/props",
    "/apply-template",
    "/infill",
    "/health",
    "/metrics",
    "/tokenize",
    "/detokenize",
];

fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/models", get(routes::models))
        .route("/v1/chat/completions", post(routes::chat))
        .route("/v1/completions", post(routes::completions))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/responses", post(responses::create))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/embeddings", post(embeddings::embeddings))
        .route("/props", get(llama::props))
        .route("/apply-template", post(llama::apply_template))
        .route("/infill", post(llama::infill))
        .route("/health", get(routes::health))
        .route("/metrics", get(routes::metrics))
        .route("/tokenize", post(routes::tokenize))
        .route("/detokenize", post(routes::detokenize))
        .fallback(routes::not_found)
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed().into_response() })
        .layer(DefaultBodyLimit::max(app.max_body))
        .layer(from_fn_with_state(app.clone(), conn::body_deadline))
        .layer(from_fn_with_state(app.clone(), draining))
        .layer(from_fn_with_state(app.clone(), auth))
        .layer(from_fn_with_state(app.clone(), cors))
        .layer(from_fn_with_state(app.clone(), count))
        .with_state(app)
}

/// `Authorization: Bearer KEY` (or Anthropic's `x-api-key: KEY`) on every route but /health,
/// when --api-key is set.
async fn auth(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    if let Some(key) = &app.api_key {
        if req.uri().path() != "/health" {
            let h = req.headers();
            let bearer = h
                .get(axum::http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "));
            let x_key = h.get("x-api-key").and_then(|v| v.to_str().ok());
            let ok = bearer.or(x_key).is_some_and(|k| k.trim() == key);
            if !ok {
                return ApiError::unauthorized().into_response();
            }
        }
    }
    next.run(req).await
}

/// `--cors ORIGIN`: preflight `OPTIONS` requests answered at once (204), every answer with
/// the origin allowed; without the flag nothing is added, and a preflight is a 405.
async fn cors(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let Some(origin) = app.cors.clone() else {
        return next.run(req).await;
    };
    use axum::http::{header, HeaderValue, Method, StatusCode};
    let preflight = req.method() == Method::OPTIONS;
    let mut r = if preflight {
        StatusCode::NO_CONTENT.into_response()
    } else {
        next.run(req).await
    };
    let h = r.headers_mut();
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, OPTIONS"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("authorization, content-type, x-api-key, anthropic-version"),
    );
    h.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static("x-mollm-ignored-fields"),
    );
    if preflight {
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static("600"),
        );
    }
    r
}

/// While draining, every route but /metrics answers 503 with Retry-After (a router moves on;
/// /health says the same), before reading the body.
async fn draining(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    if app.stopping.load(SeqCst) && req.uri().path() != "/metrics" {
        return ApiError::shutting_down().into_response();
    }
    next.run(req).await
}

/// Requests answered, by route and status, for /metrics.
async fn count(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let route = ROUTES
        .iter()
        .find(|r| **r == path)
        .copied()
        .unwrap_or("other");
    let r = next.run(req).await;
    app.metrics.request(route, r.status().as_u16());
    r
}
