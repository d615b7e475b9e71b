//! What the executor records of each call: per-op counts and times (MOLLM_PROFILE) and the
//! per-op output trace (MOLLM_TRACE), apart from the calls themselves.

use crate::backend::Backend;
use abi::{DType, Op, TensorDesc};

/// Counts of op calls, for tests and diagnostics (indexed by op id: room for 32, as the
/// backends' `refused` bits).
#[derive(Default, Debug, Clone)]
pub struct OpStats {
    pub calls: [u64; 32],
    pub nanos: [u64; 32],
    /// Per (op, first operand's format, backend): calls and nanoseconds, so a profile shows
    /// which calls fell back to which backend.
    pub detail: std::collections::BTreeMap<(&'static str, String, String), (u64, u64)>,
}

const _: () = assert!(
    Op::ALL.len() <= 32,
    "OpStats and Backend::refused hold 32 ops"
);

impl OpStats {
    /// One line per op that ran: calls and total time.
    pub fn report(&self) -> String {
        let mut lines = Vec::new();
        for op in Op::ALL {
            let i = *op as usize;
            if self.calls[i] > 0 {
                lines.push(format!(
                    "{:<10} {:>8} calls {:>10.1} ms",
                    op.name(),
                    self.calls[i],
                    self.nanos[i] as f64 / 1e6
                ));
                for ((o, dt, b), (n, ns)) in &self.detail {
                    if *o == op.name() {
                        lines.push(format!(
                            "  {dt:<8} {b:<12} {n:>8} calls {:>10.1} ms",
                            *ns as f64 / 1e6
                        ));
                    }
                }
            }
        }
        lines.join("\n")
    }
}

/// The executor's recorder, read from the settings once.
pub(super) struct Profiler {
    stats: std::cell::RefCell<OpStats>,
    /// MOLLM_TRACE=1: print every op's output summary to stderr (compare with llama.cpp's
    /// eval-callback output when chasing a numerics difference).
    trace: bool,
    /// MOLLM_PROFILE=1: time every call, per op and per format and backend
    /// ([`OpStats::detail`]); MOLLM_PROFILE=2 also splits them by the first input's shape;
    /// 0: calls are not timed.
    level: u8,
}

impl Profiler {
    pub(super) fn from_settings() -> Profiler {
        Profiler {
            stats: Default::default(),
            trace: abi::settings::TRACE.on(false),
            level: abi::settings::profile_level(),
        }
    }

    pub(super) fn stats(&self) -> OpStats {
        self.stats.borrow().clone()
    }

    /// The start of a call, where calls are timed (MOLLM_PROFILE; a decode step makes hundreds
    /// of calls, so the clock is not read otherwise).
    pub(super) fn clock(&self) -> Option<std::time::Instant> {
        (self.level > 0).then(std::time::Instant::now)
    }

    /// A call that `b` ran, started at `t0`; `device_arena` is the activation arena's buffer
    /// handle when it is in device memory (0 otherwise), to tell device operands apart.
    pub(super) fn record(
        &self,
        op: Op,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        b: &Backend,
        t0: Option<std::time::Instant>,
        device_arena: u64,
    ) {
        if self.trace {
            trace(op, &outputs[0]);
        }
        let Some(t0) = t0 else { return };
        let mut st = self.stats.borrow_mut();
        let ns = t0.elapsed().as_nanos() as u64;
        st.calls[op as usize] += 1;
        st.nanos[op as usize] += ns;
        let mut dt = inputs
            .first()
            .and_then(|t| t.dtype())
            .map(|d| d.to_string())
            .unwrap_or_default();
        if let (2, Some(t)) = (self.level, inputs.first()) {
            dt = format!("{dt} {:?}", &t.ne[..t.ndim as usize]);
        }
        match inputs.first().map(|t| t.buffer) {
            Some(0) | None => {}
            Some(h) if h == device_arena => dt.push_str(" (device)"),
            Some(_) if matches!(op, Op::MatMul | Op::GetRows) => dt.push_str(" (repacked)"),
            Some(_) => dt.push_str(" (device)"),
        }
        let e = st
            .detail
            .entry((op.name(), dt, b.name().to_string()))
            .or_default();
        e.0 += 1;
        e.1 += ns;
    }
}

fn trace(op: Op, t: &TensorDesc) {
    if t.dtype() != Some(DType::F32) || !t.is_contiguous() {
        eprintln!("trace {:<10} {:?}", op.name(), t.ne);
        return;
    }
    let n = t.numel().unwrap_or(0) as usize;
    // SAFETY: the op just wrote this contiguous f32 output.
    let v = unsafe { std::slice::from_raw_parts(t.data as *const f32, n) };
    let sum: f64 = v.iter().map(|&x| x as f64).sum();
    if let Some(dir) = abi::settings::TRACE_DIR.get() {
        static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let i = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        let _ = std::fs::write(format!("{dir}/{i:05}_{}.f32", op.name()), bytes);
    }
    let head: Vec<String> = v.iter().take(3).map(|x| format!("{x:.4}")).collect();
    let tail: Vec<String> = v
        .iter()
        .skip(n.saturating_sub(3))
        .map(|x| format!("{x:.4}"))
        .collect();
    eprintln!(
        "trace {:<10} {:?} [{} ... {}] sum = {sum:.6}",
        op.name(),
        t.ne,
        head.join(", "),
        tail.join(", ")
    );
}
