//! The expert cache's counters: per phase (prefill, decode), and the snapshot `stats()` gives.

/// Counters of one phase (prefill: steps with a prompt chunk; decode: the others).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PhaseStats {
    /// Experts a layer asked for.
    pub acquires: u64,
    /// Of `acquires`, already in the cache (or being prefetched into it).
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    /// Bytes read from the file (demand and prefetch).
    pub bytes_read: u64,
    /// `preadv` calls (adjacent experts share one).
    pub reads: u64,
    /// Time the I/O workers spent reading, summed over workers.
    pub read_ms: f64,
    /// Time a layer waited for a read with nothing left to compute.
    pub wait_ms: f64,
    /// Experts read ahead for the next layer, and their bytes.
    pub prefetches: u64,
    pub prefetch_bytes: u64,
    /// Prefetched experts their layer then used, and those it did not.
    pub prefetch_useful: u64,
    pub prefetch_unused: u64,
    /// Next-layer predictions (every rank, prefetched or not), and how many the layer used.
    pub predicted: u64,
    pub predicted_used: u64,
}

impl PhaseStats {
    pub fn hit_rate(&self) -> f64 {
        ratio(self.hits, self.acquires)
    }

    /// Of the experts predicted for a layer, the share it used.
    pub fn accuracy(&self) -> f64 {
        ratio(self.predicted_used, self.predicted)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExpertStats {
    pub slots: usize,
    pub slot_bytes: usize,
    pub policy: String,
    pub prefetch: bool,
    /// Prefetch backs off while decoding where it does not pay ([`backoff`]).
    pub prefetch_auto: bool,
    /// Decode passes, and of them those the back-off ran without prefetch.
    pub decode_passes: u64,
    pub backoff_passes: u64,
    /// Reads go through O_DIRECT.
    pub direct: bool,
    pub prefill: PhaseStats,
    pub decode: PhaseStats,
    /// Per MoE layer: (hits, misses), both phases.
    pub per_layer: Vec<(u64, u64)>,
    /// Per prediction rank (0: the router's first choice): (predicted, used), and whether the
    /// rank is prefetched now (a rank whose predictions prove useless is not).
    pub ranks: Vec<(u64, u64, bool)>,
}
