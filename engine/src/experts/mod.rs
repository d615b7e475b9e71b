//! Routed experts streamed from the model file through one bounded cache.
//!
//! Dense weights stay in the file's memory map. With a cache, a MoE layer's routed experts are
//! never read through the map: each expert the router picks is read with `preadv` from the
//! file into a slot of one cache shared by all layers (a slot holds one expert's gate, up and
//! down matrices). A `.mollm` package stores the three next to each other, so one read fetches
//! the expert; a GGUF stacks each matrix apart, one read each. Misses of one layer that lie
//! next to each other in the file (experts `e`, `e + 1`, ... with nothing between them) are
//! read with one call scattering into their slots, and the page cache is told to drop what was read (`POSIX_FADV_DONTNEED`),
//! so it does not hold a second copy and the budget is the memory the experts really take.
//!
//! Reads run on a pool of I/O workers (`--io-workers`, see [`io`]); a layer's misses are
//! queued ahead of every prefetch and it waits for each expert alone, in the order it computes
//! them: the experts already cached first, then each missing one as soon as its read is done.
//! A layer takes its route in waves: as many of its experts as the free and evictable slots
//! hold (at least one) are pinned, read where missing, computed, and released; a route larger
//! than the cache works, slower (said once on stderr).
//!
//! Next-layer prefetch: while layer L computes, its FFN input times layer L+1's router
//! predicts L+1's route (each token's top experts, ranked); the predicted experts not cached
//! are read behind the demand reads into free slots or stale entries (a guess never displaces
//! a route the policy keeps), and stay until L+1 runs. Then the prediction is scored per rank: a rank whose predictions L+1 mostly
//! does not use stops being prefetched; queued reads of experts L+1 did not need are dropped.
//! While decoding, prefetch backs off where passes run faster without it (the demand reads
//! alone keep the disk busy): see [`backoff`].
//!
//! Eviction ([`Policy::NextUse`], the default): free slots first; then the entry whose next use
//! is expected farthest away, in layer runs: the layers until its own runs again, plus a pass
//! of layers for each run it is expected to sit out, from the share of its layer's runs that
//! used it (counts halved every [`RATE_WINDOW`] runs) and a bonus for an expert its layer's
//! last run used (routes repeat from one token to the next); the oldest use breaks ties. That
//! is Belady's rule (evict what is needed farthest in the future) with the future estimated:
//! replayed on routes of the benchmark model (`scripts/moe_cache_bound.py`), it hits
//! 43-82% where [`Policy::LeastStale`] hits 34-73% and Belady's own (the future known) 56-89%.
//! [`Policy::LeastStale`] evicts entries the last pass of their layer did not use (stale
//! routes) first, then the one whose layer runs farthest ahead, taking each layer's last route
//! as its next one. [`Policy::Lru`] evicts the least recently used (for comparisons: on a
//! cycle of layers larger than the cache it misses every time).
//!
//! Repacks live in the slots: a backend with a private layout for a slot's matrix (ABI 1.5
//! `prepare_weight_into`) repacks it in place once the matrix has made a few calls on the
//! file's layout (see the executor's `SLOT_REPACK_AFTER`), into the room the slot leaves it
//! (a region has a margin of 1/32 of its K-quant matrices, whose layouts are a little larger
//! than the file's), and the executor drops that repack when the slot gets another expert
//! ([`ExpertCache::retired`]): a reused slot never runs a stale repack.

use crate::error::{EngineError, Result};
use crate::tensor::Weight;
use abi::{DType, TensorDesc};
use std::collections::HashMap;
use std::fs::File;
use std::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    NextUse,
    LeastStale,
    Lru,
}

impl Policy {
    pub fn parse(s: &str) -> Option<Policy> {
        match s {
            "next-use" => Some(Policy::NextUse),
            "least-stale" => Some(Policy::LeastStale),
            "lru" => Some(Policy::Lru),
            _ => None,
        }
    }
}

/// How a session holds routed experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertMemory {
    /// In the memory map with everything else (fully resident once touched).
    Resident,
    /// A cache of this many bytes.
    Cache { bytes: usize, policy: Policy },
    /// Resident when the whole file fits in the memory available (with the KV cache and a
    /// margin); otherwise a cache of what is left after the dense weights and the KV cache.
    Auto { policy: Policy },
}

/// Memory kept free beside the model (activations, the process itself).
pub const MARGIN: u64 = 512 << 20;

/// `MemAvailable` of /proc/meminfo, in bytes.
pub fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Slot memory: page-aligned, zeroed lazily by the kernel (untouched slots cost nothing).
struct SlotMem {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl SlotMem {
    fn new(bytes: usize) -> Result<SlotMem> {
        let layout = std::alloc::Layout::from_size_align(bytes.max(4096), 4096)
            .map_err(|e| EngineError::Invalid(format!("expert cache of {bytes} bytes: {e}")))?;
        // SAFETY: a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(EngineError::Invalid(format!(
                "expert cache: cannot allocate {} MiB",
                bytes >> 20
            )));
        }
        Ok(SlotMem { ptr, layout })
    }
}

impl Drop for SlotMem {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

#[derive(Clone, Copy, Default)]
struct SlotState {
    /// (layer, expert) held, if any (its data valid once no read into the slot is pending).
    owner: Option<(usize, usize)>,
    pinned: bool,
    /// Filled by a prefetch its layer has not run since: kept from eviction until it does.
    prefetched: bool,
    tick: u64,
    pass: u64,
}

/// [`Policy::NextUse`]: a layer's use counts are halved once it has run this many times, so
/// that the rates follow what the recent tokens route to (replayed routes of the benchmark
/// model: 64 to 1024 runs within 0.5 points of each other).
pub const RATE_WINDOW: f32 = 64.0;

/// [`Policy::NextUse`]: the chance added to an expert's use rate when its layer's last run
/// used it (0.1 to 0.4 replayed within 1.5 points; without it, real text hit 1-4 points less).
const RECENT_BONUS: f32 = 0.2;

/// A layer's runs and, per expert, the runs that used it ([`Policy::NextUse`]).
#[derive(Clone, Default)]
struct Rates {
    runs: f32,
    uses: Vec<f32>,
}

/// A prediction rank is prefetched while at least this share of its predictions is used
/// (judged once it has [`RANK_MIN_SAMPLES`]; counts are halved past 1024, so it can recover).
const RANK_MIN_USED: f64 = 0.4;
const RANK_MIN_SAMPLES: u64 = 32;

pub struct ExpertCache {
    // Declared first so it drops first: its workers write into `mem`.
    io: io::IoPool,
    file: std::sync::Arc<File>,
    path: String,
    layers: Vec<LayerExperts>,
    /// Per layer: where its expert's reads go in a slot.
    slot_layout: Vec<SlotLayout>,
    /// The largest slot's bytes.
    slot_bytes: usize,
    /// Each slot's place in `mem`, and its bytes (see [`slot_lengths`]).
    slot_off: Vec<usize>,
    slot_len: Vec<usize>,
    mem: SlotMem,
    slots: Vec<SlotState>,
    map: HashMap<(usize, usize), usize>,
    policy: Policy,
    prefetch: bool,
    /// Prefetch backs off while decoding where passes run faster without it.
    auto: bool,
    backoff: backoff::Backoff,
    /// When the current pass began, and whether it decodes.
    pass_start: Option<(Instant, bool)>,
    /// Reads through O_DIRECT where the file system allows it.
    direct: bool,
    tick: u64,
    pass: u64,
    cur_layer: usize,
    /// (pass, layer) whose predictions were last settled.
    settled: (u64, usize),
    /// Per layer: the (expert, rank) predicted for its next run.
    predicted: Vec<Vec<(usize, usize)>>,
    /// Per rank: (predicted, used).
    ranks: Vec<(u64, u64)>,
    /// Per layer: how often its experts are used ([`Policy::NextUse`]).
    rates: Vec<Rates>,
    decode: bool,
    warned_small: bool,
    stats: ExpertStats,
    /// Slots whose tenant changed, for the executor ([`ExpertCache::retired`]).
    retired: Retired,
}

/// Address ranges of slots whose bytes changed tenant (see [`ExpertCache::retired`]).
pub use crate::exec::Retired;

// SAFETY: the slot memory is owned by the cache and only handed out as weights while pinned.
unsafe impl Send for ExpertCache {}

impl ExpertCache {
    /// A cache of `bytes` over the experts of `layers` in the file at `path`. Refuses spans
    /// outside the file or overlapping each other, naming the tensors.
    pub fn new(
        path: &std::path::Path,
        layers: Vec<LayerExperts>,
        bytes: usize,
        policy: Policy,
    ) -> Result<ExpertCache> {
        let label = path.display().to_string();
        let file = File::open(path).map_err(|e| EngineError::Model {
            file: label.clone(),
            msg: format!("expert cache: cannot open: {e}"),
        })?;
        let file_len = file.metadata().map(|m| m.len()).unwrap_or(0);
        check_spans(&layers, file_len).map_err(|e| EngineError::Model {
            file: label.clone(),
            msg: e.to_string(),
        })?;
        // Each segment in a region of its own, aligned, with room for a direct read's rounding.
        let mut slot_bytes = io::ALIGN as usize;
        let slot_layout: Vec<SlotLayout> = layers
            .iter()
            .map(|l| {
                let (segs, part) = l.segments();
                let mut at = 0;
                let region_len: Vec<usize> = segs
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        let len = s.len + repack_margin(l, &part, i);
                        (len.next_multiple_of(io::ALIGN) + io::ALIGN) as usize
                    })
                    .collect();
                let region = region_len
                    .iter()
                    .map(|n| {
                        let r = at;
                        at += n;
                        r
                    })
                    .collect();
                slot_bytes = slot_bytes.max(at);
                SlotLayout {
                    bytes: at,
                    segs,
                    region,
                    region_len,
                    part,
                }
            })
            .collect();
        let slot_len = slot_lengths(
            &slot_layout.iter().map(|l| l.bytes).collect::<Vec<_>>(),
            bytes,
        );
        let slot_off: Vec<usize> = slot_len
            .iter()
            .scan(0, |at, &n| {
                let o = *at;
                *at += n;
                Some(o)
            })
            .collect();
        let n_slots = slot_len.len();
        let mem = SlotMem::new(slot_len.iter().sum())?;
        let file = std::sync::Arc::new(file);
        Ok(ExpertCache {
            io: io::IoPool::new(file.clone(), label.clone(), n_slots, 4, true),
            file,
            path: label,
            stats: ExpertStats {
                slots: n_slots,
                slot_bytes,
                policy: format!("{policy:?}"),
                prefetch: true,
                prefetch_auto: true,
                per_layer: vec![(0, 0); layers.len()],
                ..Default::default()
            },
            predicted: vec![Vec::new(); layers.len()],
            rates: layers
                .iter()
                .map(|l| Rates {
                    runs: 0.0,
                    uses: vec![0.0; l.n_expert],
                })
                .collect(),
            layers,
            slot_layout,
            slot_bytes,
            slot_off,
            slot_len,
            mem,
            slots: vec![SlotState::default(); n_slots],
            map: HashMap::new(),
            policy,
            prefetch: true,
            auto: true,
            backoff: Default::default(),
            pass_start: None,
            direct: true,
            tick: 0,
            pass: 0,
            cur_layer: usize::MAX,
            settled: (u64::MAX, 0),
            ranks: Vec::new(),
            decode: false,
            warned_small: false,
            retired: Default::default(),
        })
    }

    /// Asks the kernel to start reading everything in the file but the routed experts (the
    /// dense weights the first step faults in through the memory map), on a thread of its
    /// own: the first token does not wait for them a page fault at a time.
    pub fn read_ahead_dense(&self) {
        let mut ranges: Vec<(u64, u64)> = self
            .layers
            .iter()
            .zip(&self.slot_layout)
            .flat_map(|(l, sl)| {
                sl.segs
                    .iter()
                    .map(|s| (s.offset, s.offset + s.stride * l.n_expert as u64))
            })
            .collect();
        ranges.sort_unstable();
        let len = self.file.metadata().map(|m| m.len()).unwrap_or(0);
        let mut gaps = Vec::new();
        let mut at = 0;
        for (a, b) in ranges.into_iter().chain([(len, len)]) {
            if a > at {
                gaps.push((at, a - at));
            }
            at = at.max(b);
        }
        let file = self.file.clone();
        std::thread::spawn(move || {
            for (off, n) in gaps {
                // SAFETY: advice only; errors are harmless.
                unsafe {
                    libc::posix_fadvise(
                        std::os::fd::AsRawFd::as_raw_fd(&*file),
                        off as libc::off_t,
                        n as libc::off_t,
                        libc::POSIX_FADV_WILLNEED,
                    );
                }
            }
        });
    }

    /// The counters so far (the I/O workers' included).
    pub fn stats(&self) -> ExpertStats {
        let mut s = self.stats.clone();
        s.direct = self.direct && self.io.direct();
        (s.decode_passes, s.backoff_passes) = (self.backoff.passes, self.backoff.passes_off);
        let io = self.io.counters();
        for (ph, c) in [&mut s.prefill, &mut s.decode].into_iter().zip(io) {
            ph.reads = c.reads;
            ph.bytes_read = c.bytes;
            ph.prefetch_bytes = c.prefetch_bytes;
            ph.read_ms = c.read_ns as f64 / 1e6;
        }
        s.ranks = (0..self.ranks.len())
            .map(|r| (self.ranks[r].0, self.ranks[r].1, self.rank_on(r)))
            .collect();
        s
    }

    pub fn n_slots(&self) -> usize {
        self.slots.len()
    }

    /// The number of MoE layers (cache layers are numbered in the order they run).
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// The router weight (program index) of MoE layer `layer`.
    pub fn router(&self, layer: usize) -> usize {
        self.layers[layer].router
    }

    /// Next-layer prefetch on or off (`--no-prefetch`).
    pub fn set_prefetch(&mut self, on: bool) {
        self.prefetch = on;
        self.stats.prefetch = on;
    }

    /// With prefetch on, whether it backs off while decoding where it does not pay (the
    /// default; `--prefetch on` keeps it on).
    pub fn set_prefetch_auto(&mut self, on: bool) {
        self.auto = on;
        self.stats.prefetch_auto = on;
    }

    /// Whether layers predict their successor's experts (prefetch on; while the back-off holds
    /// prefetch off, predictions are still made and scored, their reads skipped).
    pub fn prefetching(&self) -> bool {
        self.prefetch
    }

    /// Whether predicted experts are read now.
    fn prefetch_now(&self) -> bool {
        self.prefetch && (!self.auto || !self.decode || self.backoff.prefetch())
    }

    /// Reads run on `n` worker threads (default 4).
    pub fn set_io_workers(&mut self, n: usize) {
        if n.max(1) != self.io.workers() {
            self.io = io::IoPool::new(
                self.file.clone(),
                self.path.clone(),
                self.slots.len(),
                n.max(1),
                self.direct,
            );
        }
    }

    /// Reads through O_DIRECT (the default, where the file system allows it) or buffered.
    /// Only between steps (no read may be in flight).
    pub fn set_direct(&mut self, on: bool) {
        self.direct = on;
        self.io = io::IoPool::new(
            self.file.clone(),
            self.path.clone(),
            self.slots.len(),
            self.io.workers(),
            on,
        );
    }

    /// Whether reads go through O_DIRECT now.
    pub fn direct(&self) -> bool {
        self.io.direct()
    }

    /// Layer `layer` starts; a layer at or before the previous one starts a new pass.
    pub fn begin_layer(&mut self, layer: usize, decode: bool) {
        if self.cur_layer == usize::MAX || layer <= self.cur_layer {
            self.pass += 1;
            let now = Instant::now();
            // A decode pass after a decode pass: the previous one is timed for the back-off.
            if let Some((t0, true)) = self.pass_start {
                if decode && self.prefetch && self.auto {
                    self.backoff.pass_done(now.duration_since(t0).as_secs_f64());
                }
            }
            self.pass_start = Some((now, decode));
        }
        self.cur_layer = layer;
        self.decode = decode;
    }

    /// Pins `need` (experts of `layer`, in order) as far as the cache holds them at once (at
    /// least one), waits for their reads and returns them with their weights (gate, up,
    /// down). [`ExpertCache::release`] unpins them.
    pub fn acquire(&mut self, layer: usize, need: &[usize]) -> Result<Vec<(usize, [Weight; 3])>> {
        let wave = self.plan(layer, need)?;
        let mut first_err = None;
        for i in 0..wave.items.len() {
            if let Err(e) = self.wait(&wave, i) {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(wave
                .items
                .iter()
                .map(|it| (it.expert, it.weights))
                .collect()),
        }
    }

    /// Pins as many of `need` (experts of `layer`, in the order the layer computes them) as
    /// the cache holds at once (at least one), and queues the reads of those missing (ahead of
    /// any prefetch). An item's weights are valid once [`ExpertCache::wait`] returned for it;
    /// [`ExpertCache::release`] unpins them.
    pub fn plan(&mut self, layer: usize, need: &[usize]) -> Result<Wave> {
        if let Some(&e) = need.iter().find(|&&e| e >= self.layers[layer].n_expert) {
            return Err(EngineError::Invalid(format!(
                "{}: expert {e} of {}",
                self.layers[layer].name, self.layers[layer].n_expert
            )));
        }
        if self.settled != (self.pass, layer) {
            self.settled = (self.pass, layer);
            self.settle(layer, need);
        }
        let mut got = Vec::new();
        let mut misses = Vec::new();
        for &e in need {
            let slot = match self.map.get(&(layer, e)) {
                Some(&s) => {
                    if self.slots[s].prefetched {
                        self.slots[s].prefetched = false;
                        self.phase().prefetch_useful += 1;
                    }
                    // A prefetch still queued becomes a demand read.
                    self.io.promote(s);
                    s
                }
                None => match self.victim(layer, false) {
                    Some(s) => {
                        self.assign(s, layer, e);
                        misses.push((e, s));
                        s
                    }
                    None => break,
                },
            };
            self.tick += 1;
            let st = &mut self.slots[slot];
            st.pinned = true;
            st.tick = self.tick;
            st.pass = self.pass;
            got.push((e, slot));
        }
        if got.len() < need.len() && !self.warned_small {
            self.warned_small = true;
            eprintln!(
                "warning: the expert cache ({} slots of {} KiB) holds fewer experts than {} needs at once ({}): it runs in waves, slower",
                self.slots.len(),
                self.slot_bytes >> 10,
                self.layers[layer].name,
                need.len()
            );
        }
        let n_miss = misses.len() as u64;
        {
            let ph = self.phase();
            ph.acquires += got.len() as u64;
            ph.misses += n_miss;
            ph.hits += got.len() as u64 - n_miss;
        }
        self.stats.per_layer[layer].0 += got.len() as u64 - n_miss;
        self.stats.per_layer[layer].1 += n_miss;
        let reqs = self.reqs(layer, &mut misses, false, None);
        self.io.submit(reqs);
        Ok(Wave {
            items: got
                .into_iter()
                .map(|(expert, slot)| WaveItem {
                    expert,
                    slot,
                    weights: self.weights(layer, expert, slot),
                })
                .collect(),
        })
    }

    /// Whether item `i` of `wave` can compute without waiting.
    pub fn ready(&self, wave: &Wave, i: usize) -> bool {
        !self.io.busy(wave.items[i].slot)
    }

    /// Waits for item `i` of `wave` (counted as the layer's wait). A failed read is an error
    /// naming the file and offset, and its slot goes back empty: nothing half-read stays.
    pub fn wait(&mut self, wave: &Wave, i: usize) -> Result<()> {
        let slot = wave.items[i].slot;
        let t0 = Instant::now();
        let busy = self.io.busy(slot);
        let r = self.io.wait(slot);
        if busy {
            self.phase().wait_ms += t0.elapsed().as_secs_f64() * 1e3;
            crate::trace::span(
                "wait",
                || format!("wait L{} e{}", self.cur_layer, wave.items[i].expert),
                t0,
                String::new,
            );
        }
        if r.is_err() {
            self.free(slot);
        }
        r
    }

    /// Queues reads of `preds` ((expert, rank) predicted for `layer`'s next run, best first)
    /// behind every demand read, into free slots or stale entries (never pinned, prefetched or
    /// being read, nor any entry its layer used on its last run); ranks whose
    /// predictions prove useless are skipped. The prediction is checked when `layer` runs.
    pub fn prefetch(&mut self, layer: usize, preds: &[(usize, usize)]) {
        let max_rank = preds.iter().map(|p| p.1 + 1).max().unwrap_or(0);
        if self.ranks.len() < max_rank {
            self.ranks.resize(max_rank, (0, 0));
        }
        self.predicted[layer] = preds.to_vec();
        if !self.prefetch_now() {
            return;
        }
        let mut misses = Vec::new();
        for &(e, rank) in preds {
            if e >= self.layers[layer].n_expert || !self.rank_on(rank) {
                continue;
            }
            if self.map.contains_key(&(layer, e)) {
                continue;
            }
            let Some(s) = self.victim(layer, true) else {
                break;
            };
            self.assign(s, layer, e);
            self.tick += 1;
            let st = &mut self.slots[s];
            st.prefetched = true;
            st.tick = self.tick;
            misses.push((e, s));
        }
        if misses.is_empty() {
            return;
        }
        self.phase().prefetches += misses.len() as u64;
        let flow = crate::trace::flow_start(&format!("predict L{layer}"));
        let reqs = self.reqs(layer, &mut misses, true, flow);
        self.io.submit(reqs);
    }

    /// Waits until no read is queued or running (tests: a deterministic point).
    #[cfg(test)]
    pub(crate) fn wait_idle(&self) {
        for s in 0..self.slots.len() {
            let _ = self.io.wait(s);
        }
    }

    /// Unpins every slot.
    pub fn release(&mut self) {
        for s in &mut self.slots {
            s.pinned = false;
        }
    }

    /// The predictions for `layer` meet its route `need`: per rank, how many were used; queued
    /// prefetches of experts it does not need are dropped, and prefetched entries it does not
    /// need lose their protection (they go first).
    fn settle(&mut self, layer: usize, need: &[usize]) {
        let r = &mut self.rates[layer];
        r.runs += 1.0;
        for &e in need {
            r.uses[e] += 1.0;
        }
        if r.runs >= RATE_WINDOW {
            r.runs /= 2.0;
            r.uses.iter_mut().for_each(|u| *u /= 2.0);
        }
        let preds = std::mem::take(&mut self.predicted[layer]);
        for &(e, rank) in &preds {
            let used = need.contains(&e);
            let r = &mut self.ranks[rank];
            r.0 += 1;
            r.1 += used as u64;
            if r.0 > 1024 {
                *r = (r.0 / 2, r.1 / 2);
            }
            let ph = self.phase();
            ph.predicted += 1;
            ph.predicted_used += used as u64;
        }
        let slots = &self.slots;
        let cancelled = self.io.cancel(|r| {
            r.what.0 == layer
                && r.slots.iter().all(|&s| {
                    slots[s]
                        .owner
                        .is_none_or(|(l, e)| l != layer || !need.contains(&e))
                })
        });
        for s in cancelled {
            // Incomplete: out of the map now, reusable once no read into it runs.
            if self.slots[s].owner.is_some() {
                self.free(s);
            }
        }
        let mut unused = 0;
        for st in &mut self.slots {
            if let Some((l, e)) = st.owner {
                if st.prefetched && l == layer && !need.contains(&e) {
                    st.prefetched = false;
                    st.pass = 0;
                    unused += 1;
                }
            }
        }
        self.phase().prefetch_unused += unused;
    }

    fn rank_on(&self, rank: usize) -> bool {
        match self.ranks.get(rank) {
            Some(&(n, used)) if n >= RANK_MIN_SAMPLES => used as f64 >= RANK_MIN_USED * n as f64,
            _ => true,
        }
    }

    /// Gives slot `s` to expert `e` of `layer` (its data arrives with the read queued next).
    fn assign(&mut self, s: usize, layer: usize, e: usize) {
        self.retire(s);
        if let Some(old) = self.slots[s].owner.take() {
            self.map.remove(&old);
            if self.slots[s].prefetched {
                self.phase().prefetch_unused += 1;
            }
            self.phase().evictions += 1;
        }
        self.io.clear_error(s);
        self.slots[s].owner = Some((layer, e));
        self.slots[s].prefetched = false;
        self.map.insert((layer, e), s);
    }

    /// Slot `s` goes back empty.
    fn free(&mut self, s: usize) {
        self.retire(s);
        if let Some(old) = self.slots[s].owner.take() {
            self.map.remove(&old);
        }
        if std::mem::take(&mut self.slots[s].prefetched) {
            self.phase().prefetch_unused += 1;
        }
    }

    fn phase(&mut self) -> &mut PhaseStats {
        if self.decode {
            &mut self.stats.decode
        } else {
            &mut self.stats.prefill
        }
    }

    /// Where part `p` of `expert` of `layer` starts in its region of a slot: its offset in
    /// the file modulo [`io::ALIGN`] (so that a direct read of the aligned range around it
    /// lands it there).
    fn head(&self, layer: usize, expert: usize, seg: usize) -> usize {
        let s = self.slot_layout[layer].segs[seg];
        ((s.offset + expert as u64 * s.stride) % io::ALIGN) as usize
    }

    /// Address of segment `seg`'s region in `slot`.
    fn region(&self, layer: usize, slot: usize, seg: usize) -> usize {
        self.mem.ptr as usize + self.slot_off[slot] + self.slot_layout[layer].region[seg]
    }

    fn weights(&self, layer: usize, expert: usize, slot: usize) -> [Weight; 3] {
        let l = &self.layers[layer];
        let sl = &self.slot_layout[layer];
        std::array::from_fn(|p| {
            // Inside the slot: a slot an expert of this layer takes covers all its regions.
            let (seg, delta) = sl.part[p];
            let head = self.head(layer, expert, seg);
            let ptr = (self.region(layer, slot, seg) + head + delta as usize) as *mut u8;
            // A repack may take the bytes up to the next part of the segment, or to the end
            // of the region.
            let next = sl
                .part
                .iter()
                .filter(|&&(s, d)| s == seg && d > delta)
                .map(|&(_, d)| head + d as usize)
                .min()
                .unwrap_or(sl.region_len[seg]);
            Weight {
                desc: TensorDesc::contiguous(ptr, l.parts[p].dtype, &l.parts[p].ne),
                file_mapped: false,
                cache_slot: true,
                room: next - head - delta as usize,
            }
        })
    }

    /// Address range of slot `s`.
    pub fn slot_range(&self, s: usize) -> std::ops::Range<usize> {
        let base = self.mem.ptr as usize + self.slot_off[s];
        base..base + self.slot_len[s]
    }

    /// Where the cache lists the address ranges of slots that got another expert (or went
    /// empty): whatever was made of their bytes (a backend's repack) is stale. The executor
    /// drains it before it looks a slot's repack up.
    pub fn retired(&self) -> Retired {
        self.retired.clone()
    }

    fn retire(&mut self, s: usize) {
        let r = self.slot_range(s);
        self.retired
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(r);
    }

    /// The slot to fill for an expert of `layer`: a free one, else the policy's victim among
    /// those not pinned, not being read and not prefetched for a layer still to run; `None`
    /// when there is none. For a prefetch, only free slots and stale entries.
    fn victim(&self, layer: usize, for_prefetch: bool) -> Option<usize> {
        let n_layers = self.layers.len() as u64;
        let (target, cur) = (layer as u64, self.cur_layer as u64);
        let busy = self.io.busy_slots();
        let need = self.slot_layout[layer].bytes;
        let mut best: Option<(usize, (u8, u64, u64))> = None;
        for (i, s) in self.slots.iter().enumerate() {
            if s.pinned || s.prefetched || busy[i] || self.slot_len[i] < need {
                continue;
            }
            let Some((owner_layer, owner_expert)) = s.owner else {
                return Some(i);
            };
            let l = owner_layer as u64;
            // The pass that last ran layer l: this one if l is at or before the layer running
            // now, the previous one otherwise.
            let last_run = if l <= cur {
                self.pass
            } else {
                self.pass.saturating_sub(1)
            };
            let stale = (s.pass < last_run) as u8;
            // A guess never displaces a route the policy keeps: only free slots and stale
            // entries (not used on their layer's last run) take prefetches. (With a cache
            // smaller than a pass's routes, prefetching over kept routes cost more reads than
            // it saved.)
            if for_prefetch && stale == 0 {
                continue;
            }
            // Layer runs until l runs again (layers before the target run next pass).
            let dist = if l < target || (l == target && s.pass == self.pass) {
                n_layers - target + l
            } else {
                l - target
            };
            let key = match self.policy {
                Policy::Lru => (0, 0, u64::MAX - s.tick),
                Policy::LeastStale => (stale, dist, u64::MAX - s.tick),
                Policy::NextUse => {
                    let r = &self.rates[owner_layer];
                    let rate = r.uses[owner_expert] / r.runs.max(1.0);
                    let p = (rate + if stale == 0 { RECENT_BONUS } else { 0.0 }).min(1.0);
                    // Expected layer runs to its next use: the distance to its layer, then a
                    // pass for every run of its layer it is expected to miss (in 1/256ths of
                    // a run; an expert never used is farthest).
                    let miss = if p > 0.0 { 1.0 / p - 1.0 } else { 1e9 };
                    let runs = dist as f64 + n_layers as f64 * miss as f64;
                    (
                        0,
                        (runs * 256.0).min(u64::MAX as f64 / 2.0) as u64,
                        u64::MAX - s.tick,
                    )
                }
            };
            if best.is_none_or(|(_, k)| key > k) {
                best = Some((i, key));
            }
        }
        best.map(|(i, _)| i)
    }

    /// The reads of `misses` (expert, slot) of `layer`, in expert order, an expert's three
    /// parts next to each other (so that the first experts are ready first). Direct: one
    /// aligned read per part. Buffered: per part, a run of adjacent experts in one call.
    fn reqs(
        &self,
        layer: usize,
        misses: &mut [(usize, usize)],
        prefetch: bool,
        flow: Option<u64>,
    ) -> Vec<io::Req> {
        misses.sort_unstable();
        let direct = self.direct && self.io.direct();
        let mut out = Vec::new();
        let mut i = 0;
        while i < misses.len() {
            let segs = &self.slot_layout[layer].segs;
            // Adjacent experts share a read where nothing lies between them.
            let gapless = segs.iter().all(|s| s.stride == s.len);
            let mut j = i + 1;
            while !direct
                && gapless
                && j < misses.len()
                && misses[j].0 == misses[j - 1].0 + 1
                && j - i < 512
            {
                j += 1;
            }
            let run = &misses[i..j];
            for (p, seg) in segs.iter().enumerate() {
                let at = seg.offset + run[0].0 as u64 * seg.stride;
                let len = seg.len as usize;
                let (job, need) = if direct {
                    let head = self.head(layer, run[0].0, p);
                    let n = (head + len).next_multiple_of(io::ALIGN as usize);
                    let buf = (self.region(layer, run[0].1, p), n);
                    ((at - head as u64, vec![buf]), head + len)
                } else {
                    let bufs: Vec<(usize, usize)> = run
                        .iter()
                        .map(|&(e, s)| (self.region(layer, s, p) + self.head(layer, e, p), len))
                        .collect();
                    ((at, bufs), len * run.len())
                };
                out.push(io::Req {
                    job,
                    need,
                    bytes: len * run.len(),
                    direct,
                    slots: run.iter().map(|m| m.1).collect(),
                    what: (layer, run[0].0, p),
                    decode: self.decode,
                    prefetch,
                    flow,
                });
            }
            i = j;
        }
        out
    }
}

/// Experts a layer holds pinned for one wave of its route.
pub struct Wave {
    pub items: Vec<WaveItem>,
}

pub struct WaveItem {
    pub expert: usize,
    slot: usize,
    pub weights: [Weight; 3],
}

pub mod backoff;
pub(crate) mod io;
mod layout;
mod stats;

pub use layout::*;
pub use stats::*;
#[cfg(test)]
mod tests;
