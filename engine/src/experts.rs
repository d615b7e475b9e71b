//! Routed experts streamed from the model file through one bounded cache.
//!
//! Dense weights stay in the file's memory map. With a cache, a MoE layer's routed experts are
//! never read through the map: each expert the router picks is read with `preadv` from the
//! file into a slot of one cache shared by all layers (a slot holds one expert's gate, up and
//! down matrices next to each other). Misses of one layer that lie next to each other in the
//! file (experts `e`, `e + 1`, ... of one stacked tensor) are read with one call scattering
//! into their slots, and the page cache is told to drop what was read (`POSIX_FADV_DONTNEED`),
//! so it does not hold a second copy and the budget is the memory the experts really take.
//!
//! A layer takes its route in waves: as many of its experts as the free and evictable slots
//! hold (at least one) are pinned, read where missing, computed, and released; a route larger
//! than the cache works, slower (said once on stderr).
//!
//! Eviction ([`Policy::LeastStale`], the default): free slots first; then entries the last pass
//! of their layer did not use (stale routes); then the entry whose next use is farthest, taking
//! each layer's last route as its next one (Belady's rule on the layer cycle: experts of layers
//! already run this pass are needed next pass, those of layers still to come sooner); the
//! oldest use breaks ties. [`Policy::Lru`] evicts the least recently used (for comparisons:
//! on a cycle of layers larger than the cache it misses every time).
//!
//! Slot weights are never offered to a backend's `prepare_weight` (the next tenant of the slot
//! would run a stale repack): the kernels run on the file's layout, bit for bit the same.

use crate::error::{EngineError, Result};
use crate::tensor::Weight;
use abi::{DType, TensorDesc};
use std::collections::HashMap;
use std::fs::File;
use std::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    LeastStale,
    Lru,
}

impl Policy {
    pub fn parse(s: &str) -> Option<Policy> {
        match s {
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

/// One stacked expert tensor in the file: expert `e` is `stride` bytes at
/// `offset + e * stride`, a `[ne[0], ne[1]]` matrix of `dtype`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Span {
    pub offset: u64,
    pub stride: u64,
    pub dtype: DType,
    pub ne: [i64; 2],
}

/// The routed experts of one MoE layer: gate, up and down.
#[derive(Clone, Debug)]
pub struct LayerExperts {
    /// Names it in errors (the gate tensor's name).
    pub name: String,
    pub parts: [Span; 3],
    pub n_expert: usize,
}

impl LayerExperts {
    fn bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.stride).sum()
    }
}

/// The MoE layers of `program` as the cache sees them (the experts' byte ranges in the
/// file), and each MoE node's cache layer by its gate weight's index.
pub fn layers_of(
    program: &crate::graph::Program,
    gguf: &loader::GgufFile,
) -> Result<(Vec<LayerExperts>, HashMap<usize, usize>)> {
    use crate::graph::program::{Kind, Src};
    let mut layers = Vec::new();
    let mut by_gate = HashMap::new();
    for node in &program.nodes {
        if !matches!(node.kind, Kind::Moe { .. }) {
            continue;
        }
        let mut parts = Vec::new();
        let mut n_expert = 0;
        for src in &node.inputs[2..5] {
            let Src::Weight(j) = *src else {
                unreachable!("compile checks moe weights")
            };
            let name = &program.weight_names[j];
            let t = gguf.tensor(name).ok_or_else(|| {
                EngineError::Invalid(format!("expert tensor {name} is not in the file"))
            })?;
            let ne = program.weights[j].ne();
            n_expert = ne[2] as usize;
            parts.push(Span {
                offset: t.offset,
                stride: t.size / ne[2].max(1) as u64,
                dtype: t.dtype,
                ne: [ne[0], ne[1]],
            });
        }
        if let Src::Weight(j) = node.inputs[2] {
            by_gate.insert(j, layers.len());
            layers.push(LayerExperts {
                name: program.weight_names[j].clone(),
                parts: [parts[0], parts[1], parts[2]],
                n_expert,
            });
        }
    }
    Ok((layers, by_gate))
}

/// Bytes of all routed experts of `layers`.
pub fn expert_bytes(layers: &[LayerExperts]) -> u64 {
    layers.iter().map(|l| l.bytes() * l.n_expert as u64).sum()
}

/// `MemAvailable` of /proc/meminfo, in bytes.
pub fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Counters of one phase (prefill: steps with a prompt chunk; decode: the others).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PhaseStats {
    /// Experts a layer asked for.
    pub acquires: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub bytes_read: u64,
    /// `preadv` calls (adjacent misses share one).
    pub reads: u64,
    pub read_ms: f64,
    /// Of `read_ms`, the time a layer waited with nothing left to compute.
    pub wait_ms: f64,
}

impl PhaseStats {
    pub fn hit_rate(&self) -> f64 {
        if self.acquires == 0 {
            0.0
        } else {
            self.hits as f64 / self.acquires as f64
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExpertStats {
    pub slots: usize,
    pub slot_bytes: usize,
    pub policy: String,
    pub prefill: PhaseStats,
    pub decode: PhaseStats,
    /// Per MoE layer: (hits, misses), both phases.
    pub per_layer: Vec<(u64, u64)>,
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
    /// (layer, expert) held, if any.
    owner: Option<(usize, usize)>,
    pinned: bool,
    tick: u64,
    pass: u64,
}

pub struct ExpertCache {
    file: std::sync::Arc<File>,
    path: String,
    layers: Vec<LayerExperts>,
    /// Offsets of gate, up and down inside a slot, per layer.
    part_off: Vec<[usize; 3]>,
    slot_bytes: usize,
    mem: SlotMem,
    slots: Vec<SlotState>,
    map: HashMap<(usize, usize), usize>,
    policy: Policy,
    tick: u64,
    pass: u64,
    cur_layer: usize,
    decode: bool,
    warned_small: bool,
    io_workers: usize,
    stats: ExpertStats,
}

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
        let bad = |msg: String| EngineError::Model {
            file: label.clone(),
            msg,
        };
        let mut ranges = Vec::new();
        for l in &layers {
            for (pi, p) in l.parts.iter().enumerate() {
                let end = (l.n_expert as u64)
                    .checked_mul(p.stride)
                    .and_then(|b| b.checked_add(p.offset));
                let want = p.dtype.row_bytes(p.ne[0] as u64);
                let mat = want.and_then(|r| r.checked_mul(p.ne[1] as u64));
                if mat != Some(p.stride) {
                    return Err(bad(format!(
                        "{} part {pi}: experts of {} bytes for a {:?} {} matrix",
                        l.name, p.stride, p.ne, p.dtype
                    )));
                }
                match end {
                    Some(e) if e <= file_len => ranges.push((p.offset, e, l.name.clone())),
                    _ => {
                        return Err(bad(format!(
                            "{} part {pi}: experts at {}..+{}x{} lie past the end of the file ({file_len} bytes)",
                            l.name, p.offset, l.n_expert, p.stride
                        )))
                    }
                }
            }
        }
        ranges.sort();
        for w in ranges.windows(2) {
            if w[1].0 < w[0].1 {
                return Err(bad(format!(
                    "expert ranges overlap: {} ({}..{}) and {} ({}..{})",
                    w[0].2, w[0].0, w[0].1, w[1].2, w[1].0, w[1].1
                )));
            }
        }
        let part_off: Vec<[usize; 3]> = layers
            .iter()
            .map(|l| {
                let o1 = (l.parts[0].stride as usize).next_multiple_of(64);
                let o2 = (o1 + l.parts[1].stride as usize).next_multiple_of(64);
                [0, o1, o2]
            })
            .collect();
        let slot_bytes = layers
            .iter()
            .zip(&part_off)
            .map(|(l, o)| o[2] + l.parts[2].stride as usize)
            .max()
            .unwrap_or(0)
            .next_multiple_of(4096)
            .max(4096);
        let n_slots = (bytes / slot_bytes).max(1);
        let mem = SlotMem::new(n_slots * slot_bytes)?;
        Ok(ExpertCache {
            file: std::sync::Arc::new(file),
            path: label,
            stats: ExpertStats {
                slots: n_slots,
                slot_bytes,
                policy: format!("{policy:?}"),
                per_layer: vec![(0, 0); layers.len()],
                ..Default::default()
            },
            layers,
            part_off,
            slot_bytes,
            mem,
            slots: vec![SlotState::default(); n_slots],
            map: HashMap::new(),
            policy,
            tick: 0,
            pass: 0,
            cur_layer: usize::MAX,
            decode: false,
            warned_small: false,
            io_workers: 4,
        })
    }

    pub fn stats(&self) -> &ExpertStats {
        &self.stats
    }

    pub fn n_slots(&self) -> usize {
        self.slots.len()
    }

    /// Layer `layer` starts; a layer at or before the previous one starts a new pass.
    pub fn begin_layer(&mut self, layer: usize, decode: bool) {
        if self.cur_layer == usize::MAX || layer <= self.cur_layer {
            self.pass += 1;
        }
        self.cur_layer = layer;
        self.decode = decode;
    }

    /// Pins as many of `need` (experts of `layer`, in order) as the cache can hold at once (at
    /// least one), reading the missing ones; returns them with their weights (gate, up, down).
    /// [`ExpertCache::release`] unpins them.
    pub fn acquire(&mut self, layer: usize, need: &[usize]) -> Result<Vec<(usize, [Weight; 3])>> {
        let wave = self.plan(layer, need)?;
        let t0 = Instant::now();
        let r = self.reader().run(&wave.jobs);
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        self.finish(&wave, r, ms, ms)?;
        Ok(wave
            .items
            .iter()
            .map(|it| (it.expert, it.weights))
            .collect())
    }

    /// [`ExpertCache::acquire`] without the reads: the slots are pinned and assigned, and the
    /// wave's `jobs` say what to read (by [`Reader::run`], on any thread, while the hits
    /// compute); [`ExpertCache::finish`] then records the outcome. Until then the misses'
    /// slots hold no valid data.
    pub fn plan(&mut self, layer: usize, need: &[usize]) -> Result<Wave> {
        let mut got = Vec::new();
        let mut misses = Vec::new();
        for &e in need {
            if e >= self.layers[layer].n_expert {
                return Err(EngineError::Invalid(format!(
                    "{}: expert {e} of {}",
                    self.layers[layer].name, self.layers[layer].n_expert
                )));
            }
            let (slot, miss) = match self.map.get(&(layer, e)) {
                Some(&s) => (s, false),
                None => match self.victim(layer) {
                    Some(s) => {
                        if let Some(old) = self.slots[s].owner.take() {
                            self.map.remove(&old);
                            self.phase().evictions += 1;
                        }
                        misses.push((e, s));
                        (s, true)
                    }
                    None => break,
                },
            };
            self.tick += 1;
            let st = &mut self.slots[slot];
            st.pinned = true;
            st.tick = self.tick;
            st.pass = self.pass;
            got.push((e, slot, miss));
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
        let jobs = self.jobs(layer, &mut misses);
        Ok(Wave {
            layer,
            items: got
                .into_iter()
                .map(|(expert, slot, miss)| WaveItem {
                    expert,
                    slot,
                    miss,
                    weights: self.weights(layer, slot),
                })
                .collect(),
            jobs,
        })
    }

    /// Records how the reads of `wave` went (`read_ms` spent reading, `wait_ms` of it the
    /// layer waited for): the misses become entries, or on an error go back empty with every
    /// slot of the wave unpinned (nothing half-read stays).
    pub fn finish(
        &mut self,
        wave: &Wave,
        read: Result<()>,
        read_ms: f64,
        wait_ms: f64,
    ) -> Result<()> {
        let misses = wave.items.iter().filter(|it| it.miss);
        if let Err(e) = read {
            for it in &wave.items {
                self.slots[it.slot].pinned = false;
                if it.miss {
                    self.slots[it.slot].owner = None;
                }
            }
            return Err(e);
        }
        for it in misses {
            self.slots[it.slot].owner = Some((wave.layer, it.expert));
            self.map.insert((wave.layer, it.expert), it.slot);
        }
        let bytes: u64 = wave
            .jobs
            .iter()
            .flat_map(|j| &j.1)
            .map(|b| b.1 as u64)
            .sum();
        let calls = wave.jobs.len() as u64;
        let ph = self.phase();
        ph.bytes_read += bytes;
        ph.reads += calls;
        ph.read_ms += read_ms;
        ph.wait_ms += wait_ms;
        Ok(())
    }

    /// What reads the file (a handle that may go to another thread).
    pub fn reader(&self) -> Reader {
        Reader {
            file: self.file.clone(),
            path: self.path.clone(),
            io_workers: self.io_workers,
        }
    }

    /// Unpins every slot.
    pub fn release(&mut self) {
        for s in &mut self.slots {
            s.pinned = false;
        }
    }

    fn phase(&mut self) -> &mut PhaseStats {
        if self.decode {
            &mut self.stats.decode
        } else {
            &mut self.stats.prefill
        }
    }

    fn weights(&self, layer: usize, slot: usize) -> [Weight; 3] {
        let l = &self.layers[layer];
        std::array::from_fn(|p| {
            // SAFETY: inside the slot (slot_bytes covers every part of every layer).
            let ptr = unsafe {
                self.mem
                    .ptr
                    .add(slot * self.slot_bytes + self.part_off[layer][p])
            };
            Weight {
                desc: TensorDesc::contiguous(ptr, l.parts[p].dtype, &l.parts[p].ne),
                file_mapped: false,
                cache_slot: true,
            }
        })
    }

    /// The slot to fill for an expert of `layer`: a free one, else the policy's victim among
    /// the unpinned; `None` when every slot is pinned.
    fn victim(&self, layer: usize) -> Option<usize> {
        let n_layers = self.layers.len() as u64;
        let cur = layer as u64;
        let mut best: Option<(usize, (u8, u64, u64))> = None;
        for (i, s) in self.slots.iter().enumerate() {
            if s.pinned {
                continue;
            }
            let Some((l, _)) = s.owner else {
                return Some(i);
            };
            let l = l as u64;
            let key = match self.policy {
                Policy::Lru => (0, 0, u64::MAX - s.tick),
                Policy::LeastStale => {
                    // The pass that last ran layer l: this one if l is at or before the current
                    // layer, the previous one otherwise.
                    let last_run = if l <= cur { self.pass } else { self.pass - 1 };
                    let stale = (s.pass < last_run) as u8;
                    let dist = if l < cur || (l == cur && s.pass == self.pass) {
                        n_layers - cur + l
                    } else {
                        l - cur
                    };
                    (stale, dist, u64::MAX - s.tick)
                }
            };
            if best.is_none_or(|(_, k)| key > k) {
                best = Some((i, key));
            }
        }
        best.map(|(i, _)| i)
    }

    /// The reads of `misses` (expert, slot) of `layer`: per part, runs of adjacent experts as
    /// one job each, (file offset, [(slot address, bytes)]).
    fn jobs(&self, layer: usize, misses: &mut [(usize, usize)]) -> Vec<Job> {
        misses.sort_unstable();
        let mut jobs: Vec<Job> = Vec::new();
        for p in 0..3 {
            let span = self.layers[layer].parts[p];
            let mut i = 0;
            while i < misses.len() {
                let mut j = i + 1;
                while j < misses.len() && misses[j].0 == misses[j - 1].0 + 1 && j - i < 512 {
                    j += 1;
                }
                let offset = span.offset + misses[i].0 as u64 * span.stride;
                let bufs = misses[i..j]
                    .iter()
                    .map(|&(_, s)| {
                        let at = s * self.slot_bytes + self.part_off[layer][p];
                        (self.mem.ptr as usize + at, span.stride as usize)
                    })
                    .collect();
                jobs.push((offset, bufs));
                i = j;
            }
        }
        jobs
    }

    /// Reads of one layer run on up to `n` threads at once (default 4).
    pub fn set_io_workers(&mut self, n: usize) {
        self.io_workers = n.max(1);
    }
}

/// One read: a file offset and the slot memory it fills, in order (addresses as integers so
/// that a wave can cross to a reading thread).
pub type Job = (u64, Vec<(usize, usize)>);

/// Experts a layer holds pinned for one wave of its route.
pub struct Wave {
    layer: usize,
    pub items: Vec<WaveItem>,
    jobs: Vec<Job>,
}

impl Wave {
    /// The reads that fill the wave's misses.
    pub fn jobs(&self) -> &[Job] {
        &self.jobs
    }
}

pub struct WaveItem {
    pub expert: usize,
    slot: usize,
    /// Not in the cache before this wave: valid once the wave's reads are done.
    pub miss: bool,
    pub weights: [Weight; 3],
}

// SAFETY: a wave's weights point into pinned slots of a cache that outlives it.
unsafe impl Send for Wave {}
unsafe impl Sync for Wave {}

/// Reads a wave's jobs on up to `io_workers` threads at once.
pub struct Reader {
    file: std::sync::Arc<File>,
    path: String,
    io_workers: usize,
}

impl Reader {
    /// Runs `jobs` (the device sees several requests at once), dropping what was read from
    /// the page cache; the first error wins.
    pub fn run(&self, jobs: &[Job]) -> Result<()> {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let failed = std::sync::Mutex::new(None);
        let work = || loop {
            let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some((offset, bufs)) = jobs.get(k) else {
                return;
            };
            let ptrs: Vec<(*mut u8, usize)> =
                bufs.iter().map(|&(a, n)| (a as *mut u8, n)).collect();
            match read_into(&self.file, &self.path, *offset, &ptrs) {
                Ok(()) => drop_cached(&self.file, *offset, bufs.iter().map(|b| b.1 as u64).sum()),
                Err(e) => {
                    failed
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert(e);
                    return;
                }
            }
        };
        let n = self.io_workers.clamp(1, jobs.len().max(1));
        if n == 1 {
            work();
        } else {
            std::thread::scope(|sc| {
                for _ in 0..n {
                    sc.spawn(work);
                }
            });
        }
        match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Fills `bufs` in order from `file` at `offset` (`preadv`, resumed after short reads and
/// interruptions); the end of the file before the last byte is an error naming the offset.
fn read_into(file: &File, path: &str, offset: u64, bufs: &[(*mut u8, usize)]) -> Result<()> {
    let total: usize = bufs.iter().map(|b| b.1).sum();
    let mut done = 0usize;
    let mut retried = false;
    while done < total {
        // The iovecs of what is still missing.
        let mut iov = Vec::with_capacity(bufs.len());
        let mut skip = done;
        for &(p, n) in bufs {
            if skip >= n {
                skip -= n;
                continue;
            }
            iov.push(libc::iovec {
                // SAFETY: inside the buffer.
                iov_base: unsafe { p.add(skip) } as *mut libc::c_void,
                iov_len: n - skip,
            });
            skip = 0;
        }
        let at = offset + done as u64;
        // SAFETY: every iovec covers memory of a pinned slot; the fd is open.
        let r = unsafe {
            libc::preadv(
                std::os::fd::AsRawFd::as_raw_fd(file),
                iov.as_ptr(),
                iov.len().min(1024) as libc::c_int,
                at as libc::off_t,
            )
        };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            // One retry of a failed read (a transient device error), then the error.
            if !retried {
                retried = true;
                continue;
            }
            return Err(EngineError::Model {
                file: path.to_string(),
                msg: format!("reading {} expert bytes at offset {at}: {e}", total - done),
            });
        }
        if r == 0 {
            return Err(EngineError::Model {
                file: path.to_string(),
                msg: format!(
                    "the file ends before offset {} (reading experts at {at}: truncated?)",
                    offset + total as u64
                ),
            });
        }
        done += r as usize;
    }
    Ok(())
}

/// Tells the kernel the page cache need not keep what was just read.
fn drop_cached(file: &File, offset: u64, len: u64) {
    // SAFETY: advice only; errors are harmless.
    unsafe {
        libc::posix_fadvise(
            std::os::fd::AsRawFd::as_raw_fd(file),
            offset as libc::off_t,
            len as libc::off_t,
            libc::POSIX_FADV_DONTNEED,
        );
    }
}

#[cfg(test)]
mod tests;
