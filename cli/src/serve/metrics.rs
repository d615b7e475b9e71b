//! `/metrics` in Prometheus' text format: counters and gauges as atomics, two latency
//! histograms. Names follow vLLM's where one exists (`mollm:` prefix).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

/// Bucket upper bounds in seconds.
const TTFT_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
const ITL_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_us: AtomicU64,
    n: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_us: AtomicU64::new(0),
            n: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, secs: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| secs <= b) {
            self.counts[i].fetch_add(1, Relaxed);
        }
        self.sum_us.fetch_add((secs * 1e6) as u64, Relaxed);
        self.n.fetch_add(1, Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cum = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            cum += c.load(Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cum}");
        }
        let n = self.n.load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {n}");
        let _ = writeln!(out, "{name}_sum {}", self.sum_us.load(Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {n}");
    }
}

pub struct Metrics {
    /// (route, status) -> count.
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    pub prompt_tokens: AtomicU64,
    pub cached_tokens: AtomicU64,
    pub generation_tokens: AtomicU64,
    pub running: AtomicU64,
    pub queued: AtomicU64,
    pub kv_pages_used: AtomicU64,
    pub kv_pages_total: AtomicU64,
    pub steps: AtomicU64,
    pub ttft: Histogram,
    pub itl: Histogram,
}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics {
            requests: Mutex::new(BTreeMap::new()),
            prompt_tokens: AtomicU64::new(0),
            cached_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            running: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            kv_pages_used: AtomicU64::new(0),
            kv_pages_total: AtomicU64::new(0),
            steps: AtomicU64::new(0),
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
        }
    }

    pub fn request(&self, route: &str, status: u16) {
        let mut m = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry((route.to_string(), status)).or_default() += 1;
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP mollm:requests_total HTTP requests answered, by route and status.\n# TYPE mollm:requests_total counter"
        );
        for ((route, status), n) in self
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = writeln!(
                out,
                "mollm:requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
            );
        }
        let mut one = |name: &str, kind: &str, help: &str, v: f64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        };
        let g = |a: &AtomicU64| a.load(Relaxed) as f64;
        one(
            "mollm:prompt_tokens_total",
            "counter",
            "Prompt tokens of requests handed to the engine.",
            g(&self.prompt_tokens),
        );
        one(
            "mollm:prompt_tokens_cached_total",
            "counter",
            "Prompt tokens whose keys and values came from the prefix cache.",
            g(&self.cached_tokens),
        );
        one(
            "mollm:generation_tokens_total",
            "counter",
            "Tokens generated.",
            g(&self.generation_tokens),
        );
        one(
            "mollm:num_requests_running",
            "gauge",
            "Sequences being computed.",
            g(&self.running),
        );
        one(
            "mollm:num_requests_waiting",
            "gauge",
            "Requests queued for a slot or KV pages.",
            g(&self.queued),
        );
        one(
            "mollm:kv_cache_pages_used",
            "gauge",
            "KV cache pages held by sequences.",
            g(&self.kv_pages_used),
        );
        one(
            "mollm:kv_cache_pages_total",
            "gauge",
            "KV cache pages in the pool (256 positions each).",
            g(&self.kv_pages_total),
        );
        let total = g(&self.kv_pages_total);
        one(
            "mollm:kv_cache_usage_perc",
            "gauge",
            "Share of the KV cache pool held by sequences (0-1).",
            if total > 0.0 {
                g(&self.kv_pages_used) / total
            } else {
                0.0
            },
        );
        one(
            "mollm:engine_steps_total",
            "counter",
            "Batched engine steps run.",
            g(&self.steps),
        );
        self.ttft.render(
            &mut out,
            "mollm:time_to_first_token_seconds",
            "From the request's arrival to its first generated token.",
        );
        self.itl.render(
            &mut out,
            "mollm:inter_token_latency_seconds",
            "Between consecutive generated tokens of a sequence.",
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_requests_labelled() {
        let m = Metrics::new();
        m.ttft.observe(0.02);
        m.ttft.observe(0.2);
        m.ttft.observe(100.0);
        m.request("/v1/chat/completions", 200);
        m.request("/v1/chat/completions", 200);
        m.request("/v1/chat/completions", 400);
        let t = m.render();
        assert!(t.contains("mollm:time_to_first_token_seconds_bucket{le=\"0.025\"} 1\n"));
        assert!(t.contains("mollm:time_to_first_token_seconds_bucket{le=\"0.25\"} 2\n"));
        assert!(t.contains("mollm:time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\n"));
        assert!(t.contains("mollm:time_to_first_token_seconds_count 3\n"));
        assert!(
            t.contains("mollm:requests_total{route=\"/v1/chat/completions\",status=\"200\"} 2\n")
        );
        assert!(
            t.contains("mollm:requests_total{route=\"/v1/chat/completions\",status=\"400\"} 1\n")
        );
    }
}
