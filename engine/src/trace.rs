//! A Chrome / Perfetto trace of a run (`--trace FILE.json`, the JSON trace event format):
//! graph layers and expert acquires on the engine thread, each expert read on its I/O worker's
//! thread, and a flow from every next-layer prediction to the reads it queued.
//!
//! Process-wide (like the file it writes): off until [`start`], then every event is kept in
//! memory (at most [`MAX_EVENTS`]; past that they are counted and dropped, and the file says
//! so) until [`write`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

pub const MAX_EVENTS: usize = 2_000_000;

static ON: AtomicBool = AtomicBool::new(false);
static NEXT_FLOW: AtomicU64 = AtomicU64::new(1);
static TRACER: OnceLock<Tracer> = OnceLock::new();

struct Tracer {
    t0: Instant,
    events: Mutex<Vec<Event>>,
    dropped: AtomicU64,
}

struct Event {
    ph: char,
    name: String,
    cat: &'static str,
    /// 0: the engine thread; 1 + i: I/O worker i.
    tid: usize,
    ts: f64,
    dur: f64,
    id: u64,
    args: String,
}

/// Starts recording (from now on, [`enabled`] is true).
pub fn start() {
    TRACER.get_or_init(|| Tracer {
        t0: Instant::now(),
        events: Mutex::new(Vec::new()),
        dropped: AtomicU64::new(0),
    });
    ON.store(true, Ordering::Release);
}

pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

fn push(ev: Event) {
    let Some(t) = TRACER.get() else { return };
    let mut v = t.events.lock().unwrap_or_else(|p| p.into_inner());
    if v.len() >= MAX_EVENTS {
        t.dropped.fetch_add(1, Ordering::Relaxed);
    } else {
        v.push(ev);
    }
}

fn us(at: Instant) -> f64 {
    TRACER
        .get()
        .map(|t| at.saturating_duration_since(t.t0).as_secs_f64() * 1e6)
        .unwrap_or(0.0)
}

/// A complete event from `start` to now on the engine thread (`args`: a JSON object's body;
/// `name` and `args` are only formatted while tracing).
pub fn span(
    cat: &'static str,
    name: impl FnOnce() -> String,
    start: Instant,
    args: impl FnOnce() -> String,
) {
    if !enabled() {
        return;
    }
    let ts = us(start);
    push(Event {
        ph: 'X',
        name: name(),
        cat,
        tid: 0,
        ts,
        dur: us(Instant::now()) - ts,
        id: 0,
        args: args(),
    });
}

/// The start of a flow on the engine thread, now; its id for the reads it leads to.
pub fn flow_start(name: &str) -> Option<u64> {
    if !enabled() {
        return None;
    }
    let id = NEXT_FLOW.fetch_add(1, Ordering::Relaxed);
    push(Event {
        ph: 's',
        name: name.to_string(),
        cat: "prefetch",
        tid: 0,
        ts: us(Instant::now()),
        dur: 0.0,
        id,
        args: String::new(),
    });
    Some(id)
}

/// What an expert read was, for its span: the (layer, expert, part) it started with, whether
/// it was a prefetch, how many experts it covered, its file offset and its flow.
pub(crate) struct ReadSpan {
    pub what: (usize, usize, usize),
    pub prefetch: bool,
    pub experts: usize,
    pub offset: u64,
    /// The flow from the prediction that asked for it, if any.
    pub flow: Option<u64>,
}

/// One expert read on I/O worker `worker`, from `start` to now (and the end of its flow).
pub(crate) fn read(worker: usize, req: ReadSpan, start: Instant, bytes: u64) {
    if !enabled() {
        return;
    }
    let (layer, expert, part) = req.what;
    let kind = if req.prefetch { "prefetch" } else { "demand" };
    let ts = us(start);
    push(Event {
        ph: 'X',
        name: format!(
            "{kind} L{layer} e{expert} {}",
            ["gate", "up", "down"][part % 3]
        ),
        cat: kind,
        tid: 1 + worker,
        ts,
        dur: us(Instant::now()) - ts,
        id: 0,
        args: format!(
            "\"bytes\":{bytes},\"experts\":{},\"offset\":{}",
            req.experts, req.offset
        ),
    });
    if let Some(id) = req.flow {
        push(Event {
            ph: 'f',
            name: "prefetch".into(),
            cat: "prefetch",
            tid: 1 + worker,
            ts,
            dur: 0.0,
            id,
            args: String::new(),
        });
    }
}

/// Writes what was recorded to `path` as a JSON trace (and keeps recording).
pub fn write(path: &std::path::Path) -> std::io::Result<()> {
    use std::io::Write;
    let Some(t) = TRACER.get() else {
        return Err(std::io::Error::other("tracing was not started"));
    };
    let events = t.events.lock().unwrap_or_else(|p| p.into_inner());
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(out, "{{\"displayTimeUnit\":\"ms\",\"traceEvents\":[")?;
    let mut tids: Vec<usize> = events.iter().map(|e| e.tid).collect();
    tids.sort_unstable();
    tids.dedup();
    if tids.first() != Some(&0) {
        tids.insert(0, 0);
    }
    for (i, tid) in tids.iter().enumerate() {
        let name = if *tid == 0 {
            "engine".to_string()
        } else {
            format!("io worker {}", tid - 1)
        };
        let sep = if i == 0 { "" } else { "," };
        writeln!(
            out,
            "{sep}{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":1,\"tid\":{tid},\"args\":{{\"name\":\"{name}\"}}}}"
        )?;
    }
    for e in events.iter() {
        let mut s = format!(
            ",{{\"ph\":\"{}\",\"name\":{},\"cat\":\"{}\",\"pid\":1,\"tid\":{},\"ts\":{:.3}",
            e.ph,
            json_str(&e.name),
            e.cat,
            e.tid,
            e.ts
        );
        match e.ph {
            'X' => s += &format!(",\"dur\":{:.3}", e.dur.max(0.0)),
            's' => s += &format!(",\"id\":{}", e.id),
            'f' => s += &format!(",\"id\":{},\"bp\":\"e\"", e.id),
            _ => {}
        }
        if !e.args.is_empty() {
            s += &format!(",\"args\":{{{}}}", e.args);
        }
        s += "}";
        writeln!(out, "{s}")?;
    }
    let dropped = t.dropped.load(Ordering::Relaxed);
    writeln!(
        out,
        "],\"otherData\":{{\"dropped_events\":{dropped},\"max_events\":{MAX_EVENTS}}}}}"
    )?;
    out.flush()
}

fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}
