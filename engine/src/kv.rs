//! The key/value cache: one pool of pages for every sequence of a session.
//!
//! The pool holds, per cached layer, a K and a V tensor `[head_dim, n_kv_heads, n_pages *
//! KV_PAGE]`, stored by KV head (each head's rows one after another, see
//! [`CacheTensor::desc`]). A sequence ([`KvCache`]) owns no memory: it is a block table (the pool page of
//! each of its pages) and a length, and attention reads it through the table (the ABI's
//! `block_table`). So one long sequence can use what idle ones do not, and sequences can share
//! pages:
//! - **Prefix reuse.** Every sequence cuts its prompt into chunks of `chunk` tokens from its
//!   start. Pages filled only by such whole chunks, from the sequence's start on, are
//!   published in units of `unit` tokens (the larger of a chunk and a page, when one divides
//!   the other) under a hash of the unit's tokens and of every token before it. A new sequence
//!   whose prompt starts with published units takes those pages instead of computing them.
//!   Only whole chunks are shared because the floats of a cache row depend on the chunk it was
//!   computed in (its kernels and attention length): a shared unit holds exactly what the
//!   sequence would have computed itself, so reuse keeps batch invariance. Rows computed one
//!   token at a time (generated tokens) are never shared.
//! - **Partial reuse.** A whole prompt shorter than a chunk keeps a copy of its rows (one
//!   published page); a later sequence sharing no whole unit copies the longest prefix of it
//!   whose rows are provably what it would compute itself (`KvSpec::allows`: the same kernel
//!   chain for every column, the same attention padding and p·V chain), then computes the
//!   rest of its first chunk as one call.
//! - **Fork** shares every page; **truncate** drops pages. A page is written only while one
//!   sequence holds it and it is not published: otherwise the writer copies it first.
//! - Pages nobody holds but that are published stay cached, and are evicted least recently
//!   released first when a page is needed.
//!
//! **Recurrent state.** A model with recurrent layers (a short convolution's window, a linear
//! recurrence's matrix) keeps, beside its pages, fixed-size state per sequence
//! ([`KvCache::states`]): zero for a new sequence, its own copy after a fork, never shared.
//! Such state summarizes every position so far and cannot be cut back, so truncating a
//! sequence of such a model anywhere but its end starts it over from position 0 (the caller
//! sees what is kept). Prefix reuse needs the state at the end of the reused prefix: when a
//! sequence publishes a unit, a snapshot of its states there is kept beside the pages (at most
//! `MOLLM_STATE_SNAPSHOTS_MB`, least recently used dropped first), and a new sequence takes
//! the published units only as far as a snapshot reaches, restoring it. Partial reuse does not
//! apply (a prefix's rows alone do not resume the state).

use crate::error::{EngineError, Result};
use abi::{DType, TensorDesc};
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

/// Cache rows come in pages of this many (llama.cpp's KV padding, and the sharing unit).
pub const KV_PAGE: usize = 256;

/// One pool tensor (K or V of one layer).
pub struct CacheTensor {
    /// `len` bytes from `off` (64-byte aligned: a row's vector loads never straddle two cache
    /// lines; the allocator gives large blocks 16 bytes past a page boundary).
    data: Vec<u8>,
    off: usize,
    len: usize,
    dtype: DType,
    ne: [i64; 4],
    /// In device memory instead ([`KvPool::to_device`]): the buffer's handle, and the byte
    /// ranges to copy within it (page copies of shared prefixes: `(from, to, bytes)`) before
    /// the next step reads it.
    device: u64,
    pending: Vec<(usize, usize, usize)>,
}

/// How many tokens `a` and `b` share from their start.
pub(crate) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl CacheTensor {
    fn new(dtype: DType, head_dim: usize, n_heads: usize, rows: usize) -> CacheTensor {
        // Zeroed memory from the allocator is mapped lazily: unused pages cost nothing. In
        // 4 KiB pages, not 2 MiB ones (MADV_HUGEPAGE): a decode step reads a few hundred bytes
        // from each of thousands of pages, so huge pages save TLB walks, but only 2-3% there
        // (SmolLM2, 16 sequences 512 deep: 312-319 against 305-311 t/s; Qwen2.5-1.5B at a
        // depth of 2048: equal). Their first touch is where rows are written, inside set_rows,
        // while the other threads wait, and on a VM it can cost ~20 ms per 2 MiB page: a
        // 2000-token prompt on Qwen2.5-1.5B spent 1.2-1.5 s in set_rows with them, 44 ms
        // without (Sapphire Rapids-class KVM guest, 2026-12-05).
        let len = head_dim * n_heads * rows * dtype.info().block_bytes as usize;
        let data = vec![0u8; len + 63];
        let off = (data.as_ptr() as usize).next_multiple_of(64) - data.as_ptr() as usize;
        CacheTensor {
            data,
            off,
            len,
            dtype,
            ne: [head_dim as i64, n_heads as i64, rows as i64, 1],
            device: 0,
            pending: Vec::new(),
        }
    }

    /// The pool as `[head_dim, n_heads, rows]`, what attention reads. Stored by KV head: head
    /// `h`'s rows one after another (`nb[2]` one row of one head, `nb[1]` all rows of a head),
    /// so that an attention task, which reads one KV head of one sequence, streams contiguous
    /// runs of a page's rows (`--bench ops`, attention_kv_layout: the 1.5B's decode attention
    /// 2048 deep 188 -> 164 us on AVX-512, 272 -> 206 on AVX2, against rows of all heads).
    pub fn desc(&self) -> TensorDesc {
        let mut d = TensorDesc::contiguous(self.base(), self.dtype, &self.ne);
        d.buffer = self.device;
        let row = d.nb[1];
        d.nb[1] = row * self.ne[2];
        d.nb[2] = row;
        d.nb[3] = row * self.ne[2] * self.ne[1];
        d
    }

    /// The pool as `[head_dim, n_heads * rows]`, what set_rows writes: row `h * rows + r` is
    /// head `h` at pool row `r` (see [`CacheTensor::desc`] and [`head_rows`]).
    pub fn desc_2d(&mut self) -> TensorDesc {
        let mut d = TensorDesc::contiguous(
            self.base(),
            self.dtype,
            &[self.ne[0], self.ne[1] * self.ne[2]],
        );
        d.buffer = self.device;
        d
    }

    /// The first byte: an address, or offset 0 of the device buffer.
    fn base(&self) -> *mut u8 {
        match self.device {
            0 => self.buf().as_ptr() as *mut u8,
            _ => core::ptr::null_mut(),
        }
    }

    /// Pool rows.
    pub fn rows(&self) -> usize {
        self.ne[2] as usize
    }

    fn buf(&self) -> &[u8] {
        &self.data[self.off..self.off + self.len]
    }

    fn buf_mut(&mut self) -> &mut [u8] {
        &mut self.data[self.off..self.off + self.len]
    }

    /// Bytes of one head's rows of one page.
    fn head_page_bytes(&self) -> usize {
        self.len / (self.ne[1] * self.ne[2]) as usize * KV_PAGE
    }

    fn copy_page(&mut self, from: usize, to: usize) {
        self.copy_rows(from, to, KV_PAGE);
    }

    /// The first `rows` rows of page `from` into page `to`, every head's.
    fn copy_rows(&mut self, from: usize, to: usize, rows: usize) {
        let n = self.head_page_bytes();
        let r = n / KV_PAGE * rows.min(KV_PAGE);
        let head = self.len / self.ne[1] as usize;
        for h in 0..self.ne[1] as usize {
            let base = h * head;
            if self.device != 0 {
                self.pending.push((base + from * n, base + to * n, r));
                continue;
            }
            self.buf_mut()
                .copy_within(base + from * n..base + from * n + r, base + to * n);
        }
    }
}

/// set_rows indices into [`CacheTensor::desc_2d`] for `kv_rows` (one pool row per token) and
/// `n_heads` heads, token by token: `out[t * n_heads + h] = h * rows + kv_rows[t]`, the row
/// of the `[head_dim, n_heads * tokens]` view of the tokens' keys or values.
pub fn head_rows(kv_rows: &[i32], n_heads: usize, rows: usize, out: &mut Vec<i32>) {
    out.clear();
    for &r in kv_rows {
        out.extend((0..n_heads).map(|h| (h * rows) as i32 + r));
    }
}

pub struct LayerCache {
    pub k: CacheTensor,
    pub v: CacheTensor,
}

/// Who holds which page (shared by the pool and its sequences, which release their pages
/// when dropped).
struct Pages {
    refs: Vec<u32>,
    key: Vec<Option<u128>>,
    /// Unheld, unpublished pages.
    free: Vec<u32>,
    /// Published pages, held or not.
    published: HashMap<u128, u32>,
    /// Unheld published pages by release order (the eviction order).
    lru: BTreeMap<u64, u32>,
    released_at: Vec<u64>,
    clock: u64,
    /// First chunks shorter than a unit, newest last (see [`KvPool::reuse_partial`]).
    partial: Vec<Partial>,
    /// Recurrent states at the end of published units, by unit key.
    snapshots: Snapshots,
}

/// Recurrent states kept at unit ends, within a byte budget, least recently used dropped first.
#[derive(Default)]
struct Snapshots {
    by_key: HashMap<u128, (Vec<Vec<f32>>, u64)>,
    lru: BTreeMap<u64, u128>,
    clock: u64,
    bytes: usize,
    cap: usize,
}

impl Snapshots {
    fn size(states: &[Vec<f32>]) -> usize {
        states.iter().map(|s| s.len() * 4).sum()
    }

    fn insert(&mut self, key: u128, states: &[Vec<f32>]) {
        let size = Self::size(states);
        if size == 0 || size > self.cap || self.by_key.contains_key(&key) {
            return;
        }
        while self.bytes + size > self.cap {
            let Some((_, old)) = self.lru.pop_first() else {
                break;
            };
            if let Some((s, _)) = self.by_key.remove(&old) {
                self.bytes -= Self::size(&s);
            }
        }
        self.clock += 1;
        self.lru.insert(self.clock, key);
        self.by_key.insert(key, (states.to_vec(), self.clock));
        self.bytes += size;
    }

    /// The states kept for `key`, now the most recently used.
    fn get(&mut self, key: u128) -> Option<&[Vec<f32>]> {
        let (_, used) = self.by_key.get(&key)?;
        self.lru.remove(used);
        self.clock += 1;
        self.lru.insert(self.clock, key);
        let e = self.by_key.get_mut(&key)?;
        e.1 = self.clock;
        Some(&e.0)
    }
}

/// A copy of the rows of a sequence's first prompt chunk (at most a page of them), kept in a
/// published page of its own.
struct Partial {
    key: u128,
    page: u32,
    /// The tokens of its rows.
    tokens: Vec<u32>,
    /// The length of the chunk they were computed in.
    chunk_len: usize,
}

/// First chunks kept for partial reuse (each a page while nobody evicts it).
const MAX_PARTIAL: usize = 64;
/// Shortest prefix worth a copy instead of computing it.
const MIN_PARTIAL: usize = 8;

impl Pages {
    fn alloc(&mut self) -> Option<u32> {
        let p = match self.free.pop() {
            Some(p) => p,
            None => {
                let (_, p) = self.lru.pop_first()?;
                let key = self.key[p as usize]
                    .take()
                    .expect("lru pages are published");
                self.published.remove(&key);
                p
            }
        };
        self.refs[p as usize] = 1;
        Some(p)
    }

    fn retain(&mut self, p: u32) {
        let i = p as usize;
        if self.refs[i] == 0 {
            self.lru.remove(&self.released_at[i]);
        }
        self.refs[i] += 1;
    }

    fn release(&mut self, p: u32) {
        let i = p as usize;
        self.refs[i] -= 1;
        if self.refs[i] > 0 {
            return;
        }
        if self.key[i].is_some() {
            self.clock += 1;
            self.released_at[i] = self.clock;
            self.lru.insert(self.clock, p);
        } else {
            self.free.push(p);
        }
    }

    /// Whether a writer must copy page `p` first.
    fn shared(&self, p: u32) -> bool {
        self.refs[p as usize] > 1 || self.key[p as usize].is_some()
    }

    fn publish(&mut self, p: u32, key: u128) {
        if self.key[p as usize].is_none() && !self.published.contains_key(&key) {
            self.key[p as usize] = Some(key);
            self.published.insert(key, p);
        }
    }
}

fn lock(p: &Mutex<Pages>) -> MutexGuard<'_, Pages> {
    // A panic while holding the lock leaves counts that are still consistent per call.
    p.lock().unwrap_or_else(|e| e.into_inner())
}

/// 128-bit key of `tokens` after the prefix whose key is `prev` (two independent SipHash
/// streams; a collision would need both to collide).
fn chain_key(prev: u128, tokens: &[u32], salt: u64) -> u128 {
    let half = |seed: u64| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (seed, salt, prev, tokens).hash(&mut h);
        h.finish() as u128
    };
    half(0x6d6f6c6c6d) << 64 | half(0x6b7663616368)
}

/// A sequence's cache: its pages in the pool and how many positions are filled.
pub struct KvCache {
    /// The pool page of each of its pages (the block table attention reads).
    table: Vec<i32>,
    /// The most positions it may hold.
    pub n_ctx: usize,
    /// Positions `0..n_past` are filled.
    pub n_past: usize,
    /// Positions `0..canon` were computed in whole prompt chunks from the start.
    canon: usize,
    /// Keys of the units of `0..canon` (see the module docs).
    units: Vec<u128>,
    /// Prompt chunk and sharing unit in tokens (`unit` 0: no sharing).
    chunk: usize,
    unit: usize,
    pages: Arc<Mutex<Pages>>,
    /// Its recurrent states (see the module docs), one buffer per state of the program.
    pub states: Vec<Vec<f32>>,
}

impl KvCache {
    /// Forgets everything after `n` positions, releasing the pages past them; returns the
    /// positions kept. With recurrent state, which cannot be cut back, anything short of the
    /// whole sequence keeps nothing.
    pub fn truncate(&mut self, n: usize) -> usize {
        let n = if !self.states.is_empty() && n < self.n_past {
            self.states.iter_mut().for_each(|s| s.fill(0.0));
            0
        } else {
            n
        };
        self.n_past = self.n_past.min(n);
        let keep = self.n_past.div_ceil(KV_PAGE);
        if self.table.len() > keep {
            let mut pages = lock(&self.pages);
            for &p in &self.table[keep..] {
                pages.release(p as u32);
            }
            self.table.truncate(keep);
        }
        if self.chunk > 0 {
            self.canon = self.canon.min(self.n_past) / self.chunk * self.chunk;
        }
        if self.unit > 0 {
            self.units.truncate(self.canon / self.unit);
        }
        self.n_past
    }

    /// A cache that continues independently from the same state, sharing every page until
    /// one of the two writes to it.
    pub fn fork(&self) -> KvCache {
        let mut pages = lock(&self.pages);
        for &p in &self.table {
            pages.retain(p as u32);
        }
        drop(pages);
        KvCache {
            table: self.table.clone(),
            n_ctx: self.n_ctx,
            n_past: self.n_past,
            canon: self.canon,
            units: self.units.clone(),
            chunk: self.chunk,
            unit: self.unit,
            pages: self.pages.clone(),
            states: self.states.clone(),
        }
    }

    /// Pages it holds.
    pub fn n_pages(&self) -> usize {
        self.table.len()
    }

    /// The pool page of each of its pages.
    pub fn table(&self) -> &[i32] {
        &self.table
    }

    /// Its block table, as attention takes it.
    pub fn table_desc(&self) -> TensorDesc {
        TensorDesc::contiguous(
            self.table.as_ptr() as *mut u8,
            DType::I32,
            &[self.table.len() as i64],
        )
    }

    /// The pool row of position `pos` (which must have a page).
    #[inline]
    pub fn row(&self, pos: usize) -> i32 {
        self.table[pos / KV_PAGE] * KV_PAGE as i32 + (pos % KV_PAGE) as i32
    }
}

impl Drop for KvCache {
    fn drop(&mut self) {
        let mut pages = lock(&self.pages);
        for &p in &self.table {
            pages.release(p as u32);
        }
    }
}

/// The pool: every sequence's K and V, and the page bookkeeping.
pub struct KvPool {
    pub layers: Vec<LayerCache>,
    n_pages: usize,
    chunk: usize,
    unit: usize,
    pages: Arc<Mutex<Pages>>,
    same: KvSpec,
}

/// What a pool needs to know of the program it caches for: the geometry of each cached layer
/// and what decides whether two prompt chunks compute the same rows (see [`KvSpec::allows`]).
#[derive(Clone, Debug, Default)]
pub struct KvSpec {
    /// Per cached layer: `[head_dim, n_head_kv]`.
    pub layers: Vec<[usize; 2]>,
    /// The weights token columns are multiplied with: `(format, k, n)`.
    pub mats: Vec<(DType, usize, usize)>,
    /// False where rows depend on the chunk in ways not modelled here (MoE routing groups), or
    /// where rows alone do not resume a sequence (recurrent state).
    pub chunks_comparable: bool,
    /// f32 values of each recurrent state a sequence keeps (none: a pure transformer).
    pub states: Vec<usize>,
}

/// A pool in device memory: allocations and copies in the memory of the backend that holds
/// the activations (the executor).
pub trait DeviceMemory {
    /// `bytes` of device memory: its buffer handle.
    fn alloc(&self, bytes: usize) -> Result<u64>;
    /// Copies `bytes` within `buffer` from offset `from` to offset `to`.
    fn copy_within(&self, buffer: u64, from: usize, to: usize, bytes: usize) -> Result<()>;
}

impl KvSpec {
    /// Whether rows `0..p` of a chunk of `a` tokens from position 0 equal those of a chunk of
    /// `b` tokens from position 0, and a chunk of positions `p..b` after them equals rows
    /// `p..b` of the `b` chunk: every matmul takes the same kernel chain for each of these
    /// columns (ggml picks chains by a call's column count and a column's place in it; each
    /// column's chain reads only that column), and attention pads to the same length and
    /// takes the same p·V chain (tinyBLAS's 16 lanes for two or more queries).
    fn allows(&self, a: usize, b: usize, p: usize) -> bool {
        // ggml's chain per column; f32/f16 weights take tinyBLAS from two columns on when
        // K % 16 == 0 and N % 4 == 0 (reference::ops::matmul), vec_dot otherwise.
        let kernel = |dt: DType, k: usize, n: usize, cols: usize, col: usize| match dt {
            DType::F32 | DType::F16 => (None, cols >= 2 && k % 16 == 0 && n % 4 == 0),
            _ => (Some(quant::matmul_kernel_in(dt, k, n, cols, col, 0)), false),
        };
        self.chunks_comparable
            && p >= 1
            && a >= p.max(2)
            && b >= p + 2
            && a.div_ceil(KV_PAGE) == b.div_ceil(KV_PAGE)
            && self.mats.iter().all(|&(dt, k, n)| {
                (0..p).all(|c| kernel(dt, k, n, a, c) == kernel(dt, k, n, b, c))
                    && (p..b).all(|c| kernel(dt, k, n, b - p, c - p) == kernel(dt, k, n, b, c))
            })
    }
}

impl KvPool {
    /// A pool of `rows` positions (rounded up to whole pages) for every cached layer of `p`;
    /// sequences cut their prompts into chunks of `chunk` tokens (see the module docs on what
    /// is shared).
    pub fn new(spec: &KvSpec, dtype: DType, rows: usize, chunk: usize) -> KvPool {
        let n_pages = rows.max(1).div_ceil(KV_PAGE);
        let layers = spec
            .layers
            .iter()
            .map(|&[d, h]| LayerCache {
                k: CacheTensor::new(dtype, d, h, n_pages * KV_PAGE),
                v: CacheTensor::new(dtype, d, h, n_pages * KV_PAGE),
            })
            .collect();
        let pages = Pages {
            refs: vec![0; n_pages],
            key: vec![None; n_pages],
            free: (0..n_pages as u32).rev().collect(),
            published: HashMap::new(),
            lru: BTreeMap::new(),
            released_at: vec![0; n_pages],
            clock: 0,
            partial: Vec::new(),
            snapshots: Snapshots {
                cap: abi::settings::STATE_SNAPSHOTS_MB.int_or(256) as usize * (1 << 20),
                ..Default::default()
            },
        };
        KvPool {
            layers,
            n_pages,
            chunk,
            unit: match chunk {
                0 => 0,
                c if c % KV_PAGE == 0 => c,
                c if KV_PAGE % c == 0 => KV_PAGE,
                _ => 0,
            },
            pages: Arc::new(Mutex::new(pages)),
            same: spec.clone(),
        }
    }

    /// Moves the pool into `device` (an empty pool: call before any sequence writes to it);
    /// its host memory is freed.
    pub fn to_device(&mut self, device: &dyn DeviceMemory) -> Result<()> {
        for l in &mut self.layers {
            for t in [&mut l.k, &mut l.v] {
                t.device = device.alloc(t.len)?;
                t.data = Vec::new();
                t.off = 0;
            }
        }
        Ok(())
    }

    /// Runs the page copies queued on a device pool (before a step reads it).
    pub fn flush_copies(&mut self, device: &dyn DeviceMemory) -> Result<()> {
        for l in &mut self.layers {
            for t in [&mut l.k, &mut l.v] {
                for (from, to, bytes) in t.pending.drain(..) {
                    device.copy_within(t.device, from, to, bytes)?;
                }
            }
        }
        Ok(())
    }

    /// Positions the pool holds in all.
    pub fn rows(&self) -> usize {
        self.n_pages * KV_PAGE
    }

    /// Bytes of keys and values the pool can hold.
    pub fn bytes(&self) -> u64 {
        self.layers.iter().map(|l| (l.k.len + l.v.len) as u64).sum()
    }

    /// Pages that can be handed out now: free ones and cached ones nobody holds.
    pub fn available_pages(&self) -> usize {
        let p = lock(&self.pages);
        p.free.len() + p.lru.len()
    }

    /// Cached pages nobody holds (what prefix reuse can still find).
    pub fn cached_pages(&self) -> usize {
        lock(&self.pages).lru.len()
    }

    /// An empty sequence that may grow to `n_ctx` positions.
    pub fn sequence(&self, n_ctx: usize) -> KvCache {
        KvCache {
            table: Vec::with_capacity(n_ctx.div_ceil(KV_PAGE)),
            n_ctx,
            n_past: 0,
            canon: 0,
            units: Vec::new(),
            chunk: self.chunk,
            unit: self.unit,
            pages: self.pages.clone(),
            states: self.same.states.iter().map(|&n| vec![0.0; n]).collect(),
        }
    }

    /// f32 values of recurrent state each sequence keeps.
    pub fn state_values(&self) -> usize {
        self.same.states.iter().sum()
    }

    /// Whether a sequence whose prompt is `len` tokens leaves rows for others to reuse once
    /// its first chunk has run: a short prompt's kept copy (partial reuse), or a first chunk
    /// that is a whole unit (published).
    pub fn shares_first_chunk(&self, len: usize) -> bool {
        if len < self.chunk {
            self.same.chunks_comparable
        } else {
            self.unit != 0 && self.unit == self.chunk
        }
    }

    pub fn owns(&self, kv: &KvCache) -> bool {
        Arc::ptr_eq(&self.pages, &kv.pages)
    }

    /// Takes the published pages of the whole units `prompt` starts with into the empty `kv`,
    /// leaving at least the last prompt token to compute; returns the positions now filled.
    pub fn reuse_prefix(&self, kv: &mut KvCache, prompt: &[u32]) -> usize {
        let u = self.unit;
        if u == 0 || kv.n_past != 0 || !self.owns(kv) {
            return kv.n_past;
        }
        let per = u / KV_PAGE;
        let mut pages = lock(&self.pages);
        let mut found = Vec::with_capacity(per);
        loop {
            let start = kv.units.len() * u;
            if start + u >= prompt.len() || start + u > kv.n_ctx {
                break;
            }
            let prev = kv.units.last().copied().unwrap_or(0);
            let key = chain_key(prev, &prompt[start..start + u], u as u64);
            found.clear();
            for i in 0..per {
                match pages.published.get(&chain_key(key, &[], i as u64)) {
                    Some(&p) => found.push(p),
                    None => break,
                }
            }
            if found.len() < per {
                break;
            }
            // Recurrent state: the unit resumes the sequence only with its snapshot.
            if !kv.states.is_empty() {
                match pages.snapshots.get(key) {
                    Some(st) => kv.states.clone_from_slice(st),
                    None => break,
                }
            }
            for &p in &found {
                pages.retain(p);
                kv.table.push(p as i32);
            }
            kv.units.push(key);
            kv.n_past = start + u;
            kv.canon = kv.n_past;
        }
        kv.n_past
    }

    /// For an empty `kv` whose prompt shares no whole unit: the longest prefix of `prompt`
    /// that a kept first chunk holds and that gives the rows this sequence would compute
    /// itself ([`KvSpec::allows`], with this sequence's first chunk `min(len, chunk)` long),
    /// copied into a page of its own; returns the positions now filled (0: none). Its next
    /// chunk must then end where its first chunk would have (see the scheduler).
    pub fn reuse_partial(&mut self, kv: &mut KvCache, prompt: &[u32]) -> usize {
        if self.chunk == 0 || kv.n_past != 0 || !kv.table.is_empty() || !self.owns(kv) {
            return kv.n_past;
        }
        let b = prompt.len().min(self.chunk);
        let mut pages = lock(&self.pages);
        let mut best: Option<(usize, u32)> = None;
        for r in pages.partial.iter().rev() {
            if pages.published.get(&r.key) != Some(&r.page) {
                continue; // evicted
            }
            let common = common_prefix(&r.tokens, prompt);
            let mut p = common.min(b.saturating_sub(2));
            while p >= MIN_PARTIAL && !self.same.allows(r.chunk_len, b, p) {
                p -= 1;
            }
            if p >= MIN_PARTIAL && best.map_or(true, |(bp, _)| p > bp) {
                best = Some((p, r.page));
            }
        }
        let Some((p, from)) = best else {
            return 0;
        };
        let Some(to) = pages.alloc() else {
            return 0;
        };
        drop(pages);
        for l in &mut self.layers {
            l.k.copy_rows(from as usize, to as usize, p);
            l.v.copy_rows(from as usize, to as usize, p);
        }
        kv.table.push(to as i32);
        kv.n_past = p;
        p
    }

    /// Keeps a copy of the rows of a sequence's first chunk of `n` tokens (`tokens`) for
    /// [`KvPool::reuse_partial`], in a published page nobody holds (evicted like any other).
    fn keep_partial(&mut self, kv: &KvCache, tokens: &[u32]) {
        let m = tokens.len().min(KV_PAGE);
        if m < MIN_PARTIAL || kv.table.is_empty() {
            return;
        }
        let key = chain_key(0, &tokens[..m], 0x7061_7274);
        let mut pages = lock(&self.pages);
        if pages.published.contains_key(&key) {
            return;
        }
        let Some(to) = pages.alloc() else {
            return;
        };
        let from = kv.table[0] as usize;
        for l in &mut self.layers {
            l.k.copy_rows(from, to as usize, m);
            l.v.copy_rows(from, to as usize, m);
        }
        pages.publish(to, key);
        pages.release(to);
        if pages.partial.len() == MAX_PARTIAL {
            pages.partial.remove(0);
        }
        pages.partial.push(Partial {
            key,
            page: to,
            tokens: tokens[..m].to_vec(),
            chunk_len: tokens.len(),
        });
    }

    /// Makes room in `kv` for `n` more positions: pages up to the new end, and a private copy
    /// of the page the first new position lands in if it is shared. Fails, changing nothing
    /// the sequence can see, when the pool has no page left.
    pub fn prepare(&mut self, kv: &mut KvCache, n: usize) -> Result<()> {
        if !self.owns(kv) {
            return Err(EngineError::Invalid(
                "a sequence of another session's cache".into(),
            ));
        }
        let need = (kv.n_past + n).div_ceil(KV_PAGE);
        let mut pages = lock(&self.pages);
        let full = |need: usize, held: usize| EngineError::KvFull {
            need: need * KV_PAGE,
            held: held * KV_PAGE,
            total: self.n_pages * KV_PAGE,
        };
        if n > 0 && kv.n_past % KV_PAGE != 0 {
            let i = kv.n_past / KV_PAGE;
            let old = kv.table[i] as u32;
            if pages.shared(old) {
                let new = pages.alloc().ok_or_else(|| full(need, kv.table.len()))?;
                for l in &mut self.layers {
                    l.k.copy_page(old as usize, new as usize);
                    l.v.copy_page(old as usize, new as usize);
                }
                pages.release(old);
                kv.table[i] = new as i32;
            }
        }
        while kv.table.len() < need {
            let p = pages.alloc().ok_or_else(|| full(need, kv.table.len()))?;
            kv.table.push(p as i32);
        }
        Ok(())
    }

    /// Records that positions `start..` of `kv` were just computed as one call for the last
    /// `n` tokens of `history` (the sequence's tokens so far): a whole chunk continuing the
    /// sequence's whole chunks extends them, and each unit they complete is published.
    pub fn finish(&mut self, kv: &mut KvCache, start: usize, history: &[u32]) {
        let n = history.len() - start;
        let (c, u) = (kv.chunk, kv.unit);
        // A whole prompt shorter than a chunk (a chat request: the system prompt is what
        // others share): its rows kept for partial reuse.
        if start == 0 && n >= 2 && n < c && kv.n_past == n && self.same.chunks_comparable {
            self.keep_partial(kv, history);
        }
        if c == 0 || n != c || start != kv.canon || kv.n_past != start + c {
            return;
        }
        kv.canon += c;
        if u == 0 || kv.canon % u != 0 {
            return;
        }
        let s0 = kv.canon - u;
        let prev = kv.units.last().copied().unwrap_or(0);
        let key = chain_key(prev, &history[s0..kv.canon], u as u64);
        kv.units.push(key);
        let mut pages = lock(&self.pages);
        for i in 0..u / KV_PAGE {
            let p = kv.table[s0 / KV_PAGE + i] as u32;
            pages.publish(p, chain_key(key, &[], i as u64));
        }
        if !kv.states.is_empty() {
            pages.snapshots.insert(key, &kv.states);
        }
    }

    /// Bytes of recurrent-state snapshots kept for prefix reuse.
    pub fn snapshot_bytes(&self) -> usize {
        lock(&self.pages).snapshots.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml's repacked Q4_K runs GEMM over a call's first `cols / 4 * 4` columns and GEMV over
    /// the rest: rows 0..40 of a 75-token chunk equal those of a 69-token one, and a chunk of
    /// 40..69 after them ends in GEMV exactly where the 69 does. At 41 the suffix's 28th column
    /// would be GEMM where the whole chunk's is GEMV.
    #[test]
    fn rows_are_shared_only_where_every_chain_is_the_same() {
        let q4k = KvSpec {
            layers: Vec::new(),
            mats: vec![(DType::Q4_K, 256, 64)],
            chunks_comparable: true,
            states: Vec::new(),
        };
        assert!(q4k.allows(75, 69, 40));
        assert!(!q4k.allows(75, 69, 41));
        assert!(
            !q4k.allows(75, 69, 68),
            "a one-query suffix takes another p·V chain"
        );
        // Attention padded to another length: 200 and 300 rows pad to 256 and 512.
        assert!(!q4k.allows(300, 200, 40));
        // tinyBLAS from two columns on (Q8_0): any split of two or more.
        let q8 = KvSpec {
            layers: Vec::new(),
            mats: vec![(DType::Q8_0, 64, 64), (DType::F32, 64, 64)],
            chunks_comparable: true,
            states: Vec::new(),
        };
        assert!(q8.allows(30, 69, 29) && q8.allows(69, 69, 67));
        assert!(!q8.allows(28, 69, 29), "the rows were never computed");
        // MoE programs: never.
        let moe = KvSpec {
            layers: Vec::new(),
            mats: Vec::new(),
            chunks_comparable: false,
            states: Vec::new(),
        };
        assert!(!moe.allows(75, 69, 40));
    }

    /// Rows of 64 f32 start on cache lines whatever address the allocator hands out, and the
    /// aligned view keeps the requested size (page copies stay inside it).
    #[test]
    fn cache_tensors_are_line_aligned() {
        for rows in [KV_PAGE, 3 * KV_PAGE] {
            let mut t = CacheTensor::new(DType::F32, 64, 3, rows);
            assert_eq!(t.desc().data as usize % 64, 0);
            assert_eq!(t.buf().len(), 64 * 3 * rows * 4);
            // Head 2's first element of page 0, and page 0's row 5 of head 0.
            let head = 64 * rows * 4;
            t.buf_mut()[2 * head..][..4].copy_from_slice(&1f32.to_le_bytes());
            t.buf_mut()[5 * 64 * 4..][..4].copy_from_slice(&2f32.to_le_bytes());
            let last = rows / KV_PAGE - 1;
            t.copy_page(0, last);
            let n = t.head_page_bytes();
            assert_eq!(n, KV_PAGE * 64 * 4);
            assert_eq!(t.buf()[2 * head + last * n..][..4], 1f32.to_le_bytes());
            assert_eq!(t.buf()[last * n + 5 * 64 * 4..][..4], 2f32.to_le_bytes());
            // The views agree: attention's (i, h, r) is set_rows' row h * rows + r.
            let (d, d2) = (t.desc(), t.desc_2d());
            let (h, r) = (2i64, 7i64);
            assert_eq!(
                d.data as usize + (h * d.nb[1] + r * d.nb[2]) as usize,
                d2.data as usize + ((h * rows as i64 + r) * d2.nb[1]) as usize
            );
            let mut idx = Vec::new();
            head_rows(&[7, 300], 3, rows, &mut idx);
            assert_eq!(idx[..3], [7, rows as i32 + 7, 2 * rows as i32 + 7]);
            assert_eq!(idx[3..], [300, rows as i32 + 300, 2 * rows as i32 + 300]);
        }
    }
}
