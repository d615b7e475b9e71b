//! Typed op calls. Every op the model graphs run goes through here and, from here, through the
//! ABI function table of the backend chosen for it.

use crate::backend::Backend;
use crate::error::{EngineError, Result};
use crate::tensor::{Act, Weight};
use abi::{DType, Op, OpParams, TensorDesc};

/// Rotary embedding settings of one layer: the `rope` op's attributes.
pub use abi::RopeAttrs as RopeParams;

/// Counts of op calls, for tests and diagnostics.
#[derive(Default, Debug, Clone)]
pub struct OpStats {
    pub calls: [u64; 16],
    pub nanos: [u64; 16],
    /// Per (op, first operand's format, backend): calls and nanoseconds, so a profile shows
    /// which calls fell back to which backend.
    pub detail: std::collections::BTreeMap<(&'static str, String, String), (u64, u64)>,
}

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

pub struct Exec {
    /// In priority order; each call goes to the first that supports it.
    backends: Vec<Backend>,
    /// No fallback: every call needs a backend whose `supports` accepts it
    /// (`--require-native`). Otherwise the last backend takes whatever the others decline.
    strict: bool,
    stats: std::cell::RefCell<OpStats>,
    /// MOLLM_TRACE=1: print every op's output summary to stderr (compare with llama.cpp's
    /// eval-callback output when chasing a numerics difference).
    trace: bool,
    /// Weights prepared by a backend, by data address: (backend index, descriptor).
    prepared: std::cell::RefCell<AddrMap<Option<(usize, TensorDesc)>>>,
    /// Expert-cache slot weights a backend repacked in place, by data address (`None`: none
    /// would); an entry goes when its slot gets another expert.
    slot_prepared: std::cell::RefCell<AddrMap<Option<(usize, TensorDesc)>>>,
    /// Uses of a cache slot's matrix on the file's layout before it is repacked in place
    /// (MOLLM_SLOT_REPACK_AFTER, default [`SLOT_REPACK_AFTER`]); `None`: never
    /// (MOLLM_SLOT_REPACK=0).
    slot_repack_after: Option<u32>,
    /// Uses of slot weights on the file's layout so far (a repack comes after
    /// [`SLOT_REPACK_AFTER`]).
    slot_seen: std::cell::RefCell<AddrMap<u32>>,
    /// The expert cache's slots that changed tenant (their repacks are stale).
    retired: crate::experts::Retired,
    /// Offer weights to `prepare_weight` (off with MOLLM_REPACK=0).
    repack: bool,
    /// MOLLM_PROFILE=1: time every call, per op and per format and backend
    /// ([`OpStats::detail`]); MOLLM_PROFILE=2 also splits them by the first input's shape;
    /// 0: calls are not timed.
    profile: u8,
    /// The graph executor's activation memory (see [`Exec::arena`]).
    arena: std::cell::RefCell<ArenaMem>,
    /// Routed experts read from the file into a bounded cache (`None`: from the memory map),
    /// and the cache layer of each MoE node, by its gate weight's index in the program.
    experts: std::cell::RefCell<Option<crate::experts::ExpertCache>>,
    expert_layers: std::collections::HashMap<usize, usize>,
    /// Posts the weights of the next matrix product to the pool's idle workers (see
    /// [`Exec::warm_weight`]); `None`: no pool workers, or off (MOLLM_WARM=0).
    warmer: Option<crate::pool::Warmer>,
    /// The backend whose device memory holds the activations and the KV cache
    /// ([`Exec::use_device_memory`]); `None`: host memory.
    device: Option<usize>,
    /// Waits for the device: copies of device tensors into host memory (the logits, the
    /// operands of ops the device declines) and host calls the device takes (each waits for
    /// its result); and steps run, for profiles and tests.
    round_trips: std::cell::Cell<u64>,
    steps: std::cell::Cell<u64>,
}

/// Activation memory: a host buffer a backend lent (`buffer_alloc` + `buffer_host_ptr`), or
/// the engine's own when none does.
enum ArenaMem {
    None,
    Backend {
        backend: usize,
        handle: u64,
        ptr: *mut u8,
        size: usize,
    },
    Own(Vec<AlignedLine>),
    /// Device memory (`data` of a tensor there is its offset).
    Device {
        backend: usize,
        handle: u64,
        size: usize,
    },
}

#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct AlignedLine([u8; 64]);

impl ArenaMem {
    fn size(&self) -> usize {
        match self {
            ArenaMem::None => 0,
            ArenaMem::Backend { size, .. } | ArenaMem::Device { size, .. } => *size,
            ArenaMem::Own(v) => v.len() * 64,
        }
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

/// Bytes from a tensor's first element to one past its last.
fn span_bytes(d: &TensorDesc) -> usize {
    let Some(dt) = d.dtype() else { return 0 };
    let blocks = [
        d.ne[0] / dt.info().block_len as i64,
        d.ne[1],
        d.ne[2],
        d.ne[3],
    ];
    if blocks.iter().any(|&n| n <= 0) {
        return 0;
    }
    (0..4).map(|i| (blocks[i] - 1) * d.nb[i]).sum::<i64>() as usize + dt.info().block_bytes as usize
}

/// `bytes` bytes at `data` (an address, or an offset in `buffer`) as one I32 row.
pub(crate) fn flat(data: *mut u8, buffer: u64, bytes: usize) -> TensorDesc {
    let mut d = TensorDesc::contiguous(data, DType::I32, &[(bytes / 4) as i64]);
    d.buffer = buffer;
    d
}

/// Drops the process's resident pages of a weight a backend repacked: the executor no
/// longer reads them (they come back from the model file if a fallback ever does), so the
/// repacked copy does not double the memory the weights take.
fn release_pages(w: &TensorDesc) {
    let Some(bytes) = w.numel().and_then(|n| {
        let dt = w.dtype()?;
        Some(n as usize / dt.info().block_len as usize * dt.info().block_bytes as usize)
    }) else {
        return;
    };
    #[cfg(unix)]
    {
        const PAGE: usize = 4096;
        let start = (w.data as usize).next_multiple_of(PAGE);
        let end = (w.data as usize + bytes) / PAGE * PAGE;
        if end > start {
            // SAFETY: the range lies inside the weight's read-only file mapping; MADV_DONTNEED
            // on such a mapping only drops pages, which later reads fault back in.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
        }
    }
}

impl Drop for Exec {
    fn drop(&mut self) {
        for (bi, d) in self.prepared.get_mut().values().flatten() {
            self.backends[*bi].free_buffer(d.buffer);
        }
        for (bi, d) in self.slot_prepared.get_mut().values().flatten() {
            self.backends[*bi].free_buffer(d.buffer);
        }
        let a = std::mem::replace(self.arena.get_mut(), ArenaMem::None);
        self.free_arena(a);
    }
}

/// Calls a cache slot's matrix makes on the file's layout before it is repacked in place: a
/// repack on the engine thread costs about seven one-token GEMVs (SmolLM2-MoE: 0.47 ms a
/// 0.66 MB matrix), so only an expert that stays in its slot long enough earns it back.
const SLOT_REPACK_AFTER: u32 = 8;

/// The most bytes of a weight posted for warming: what a worker's L2 takes beside its work
/// (the next product starts long before that much streams in a decode gap).
const WARM_MAX: usize = 1 << 20;

/// Maps keyed by a weight's address, looked up once or twice per matrix product: hashed with
/// one multiplication instead of SipHash (the addresses are the engine's own, not input).
type AddrMap<V> = std::collections::HashMap<usize, V, std::hash::BuildHasherDefault<AddrHash>>;

#[derive(Default)]
struct AddrHash(u64);

impl std::hash::Hasher for AddrHash {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_usize(&mut self, x: usize) {
        // Fibonacci hashing: the high bits mix every bit of the address.
        self.0 = (x as u64)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(32);
    }
}

/// A call's inputs, outputs and attributes.
pub(crate) type Call<'a> = (&'a [TensorDesc], &'a [TensorDesc], &'a OpParams);

impl Exec {
    pub fn new(backends: Vec<Backend>) -> Result<Exec> {
        Self::with_fallback(backends, true)
    }

    /// `fallback == false`: a call that no backend declares is an error instead of going to
    /// the last backend.
    pub fn with_fallback(backends: Vec<Backend>, fallback: bool) -> Result<Exec> {
        if backends.is_empty() {
            return Err(EngineError::Invalid("no backend available".into()));
        }
        let trace = abi::settings::TRACE.on(false);
        Ok(Exec {
            backends,
            strict: !fallback,
            stats: Default::default(),
            trace,
            prepared: Default::default(),
            slot_prepared: Default::default(),
            slot_seen: Default::default(),
            slot_repack_after: abi::settings::SLOT_REPACK.on(true).then(|| {
                abi::settings::SLOT_REPACK_AFTER
                    .int_or(SLOT_REPACK_AFTER as u64)
                    .try_into()
                    .unwrap_or(SLOT_REPACK_AFTER)
            }),
            retired: Default::default(),
            repack: abi::settings::REPACK.on(true),
            experts: Default::default(),
            warmer: None,
            device: None,
            round_trips: Default::default(),
            steps: Default::default(),
            expert_layers: Default::default(),
            profile: abi::settings::profile_level(),
            arena: std::cell::RefCell::new(ArenaMem::None),
        })
    }

    /// At least `bytes` of 64-byte aligned activation memory, valid until a later call asks
    /// for more (or the executor drops): its address, and its buffer handle (0: host memory).
    /// In device memory where [`Exec::use_device_memory`] chose a backend (the address is then
    /// null: tensors there carry offsets); else allocated through the first backend that lends
    /// host buffers, so that the memory is the backend's; the engine's own otherwise. Grows,
    /// never shrinks: a steady-state step allocates nothing.
    pub(crate) fn arena(&self, bytes: usize) -> Result<(*mut u8, u64)> {
        let bytes = bytes.max(64);
        let mut a = self.arena.borrow_mut();
        if a.size() < bytes {
            let old = std::mem::replace(&mut *a, ArenaMem::None);
            self.free_arena(old);
            *a = match self.device {
                Some(bi) => ArenaMem::Device {
                    backend: bi,
                    handle: self.backends[bi].device_alloc(bytes)?,
                    size: bytes,
                },
                None => self
                    .backends
                    .iter()
                    .enumerate()
                    .find_map(|(i, b)| {
                        b.host_buffer(bytes).map(|(handle, ptr)| ArenaMem::Backend {
                            backend: i,
                            handle,
                            ptr,
                            size: bytes,
                        })
                    })
                    .unwrap_or_else(|| {
                        ArenaMem::Own(vec![AlignedLine([0; 64]); bytes.div_ceil(64)])
                    }),
            };
        }
        Ok(match &mut *a {
            ArenaMem::None => unreachable!("sized above"),
            ArenaMem::Backend { ptr, .. } => (*ptr, 0),
            ArenaMem::Own(v) => (v.as_mut_ptr() as *mut u8, 0),
            ArenaMem::Device { handle, .. } => (core::ptr::null_mut(), *handle),
        })
    }

    /// Holds the activations and the KV cache in the device memory of the first backend when
    /// it has its own (ABI 1.7) and `p` suits: ops then pass device tensors, with no host
    /// round trip between them, and a step waits once, for its logits. Off with
    /// MOLLM_DEVICE_MEMORY=0, and for MoE programs (their routing reads host memory). The
    /// backend's name where it is on.
    pub fn use_device_memory(&mut self, p: &crate::graph::Program) -> Option<&str> {
        use crate::graph::program::Kind;
        let moe = p
            .nodes
            .iter()
            .any(|n| matches!(n.kind, Kind::Moe { .. } | Kind::SharedExpert { .. }));
        let off = !abi::settings::DEVICE_MEMORY.on(true);
        if moe || off || !self.backends[0].has_device_memory() || self.experts.borrow().is_some() {
            return None;
        }
        self.device = Some(0);
        Some(self.backends[0].name())
    }

    /// `size` bytes of device memory of the backend [`Exec::use_device_memory`] chose: its
    /// handle (freed with the backend).
    pub(crate) fn device_alloc(&self, size: usize) -> Result<u64> {
        let bi = self
            .device
            .ok_or_else(|| EngineError::Invalid("no device memory".into()))?;
        self.backends[bi].device_alloc(size)
    }

    /// `buffer_copy` on the device backend; a copy into host memory counts as a round trip.
    pub(crate) fn device_copy(&self, dst: &TensorDesc, src: &TensorDesc) -> Result<()> {
        let bi = self
            .device
            .ok_or_else(|| EngineError::Invalid("no device memory".into()))?;
        if dst.buffer == 0 && src.buffer != 0 {
            self.round_trips.set(self.round_trips.get() + 1);
        }
        self.backends[bi].copy(dst, src)
    }

    /// A step ran (for the round trips a step makes, see [`Exec::arena_report`]).
    pub(crate) fn count_step(&self) {
        self.steps.set(self.steps.get() + 1);
    }

    /// (host round trips, steps) so far.
    pub fn round_trips(&self) -> (u64, u64) {
        (self.round_trips.get(), self.steps.get())
    }

    /// A call some of whose operands lie in device memory, which the device backend declined:
    /// those operands are copied into host memory (whole spans, so strided caches too), the
    /// call goes to the backends as a host call, and its outputs are copied back.
    fn staged(
        &self,
        op: Op,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        params: OpParams,
        first: Option<(usize, &[TensorDesc])>,
    ) -> Result<()> {
        // (device tensor, its host copy); the same tensor twice (set_rows in place) shares one.
        let mut copies: Vec<(TensorDesc, TensorDesc, Vec<AlignedLine>)> = Vec::new();
        let mut host = |d: &TensorDesc, read: bool| -> Result<TensorDesc> {
            if d.buffer == 0 {
                return Ok(*d);
            }
            if let Some((_, h, _)) = copies
                .iter()
                .find(|(x, _, _)| x.buffer == d.buffer && x.data == d.data && x.nb == d.nb)
            {
                return Ok(*h);
            }
            let span = span_bytes(d).next_multiple_of(4);
            let mut mem = vec![AlignedLine([0; 64]); span.div_ceil(64)];
            let mut h = *d;
            h.buffer = 0;
            h.data = mem.as_mut_ptr() as *mut u8;
            if read {
                self.device_copy(&flat(h.data, 0, span), &flat(d.data, d.buffer, span))?;
            }
            copies.push((*d, h, mem));
            Ok(h)
        };
        let ins = inputs
            .iter()
            .map(|d| host(d, true))
            .collect::<Result<Vec<_>>>()?;
        let outs = outputs
            .iter()
            .map(|d| host(d, false))
            .collect::<Result<Vec<_>>>()?;
        // The backend's own weight stays (operand 0); the rest are the host copies.
        let first = first.map(|(bi, f)| {
            let mut v = ins.clone();
            v[0] = f[0];
            (bi, v)
        });
        self.call_with(
            op,
            &ins,
            &outs,
            params,
            first.as_ref().map(|(b, v)| (*b, &v[..])),
        )?;
        for (d, h, _) in &copies {
            if outputs
                .iter()
                .any(|o| o.buffer == d.buffer && o.data == d.data)
            {
                let span = span_bytes(d).next_multiple_of(4);
                self.device_copy(&flat(d.data, d.buffer, span), &flat(h.data, 0, span))?;
            }
        }
        Ok(())
    }

    /// The backend whose buffer holds the activation arena (`None`: the engine's memory, or
    /// no arena yet).
    pub fn arena_backend(&self) -> Option<&str> {
        match &*self.arena.borrow() {
            ArenaMem::Backend { backend, .. } => Some(self.backends[*backend].name()),
            _ => None,
        }
    }

    /// One line on where the activation arena lives, for MOLLM_PROFILE reports.
    pub fn arena_report(&self) -> String {
        let mib = self.arena.borrow().size() as f64 / (1 << 20) as f64;
        if let ArenaMem::Device { backend, .. } = &*self.arena.borrow() {
            let (trips, steps) = self.round_trips();
            return format!(
                "activation arena: {mib:.1} MiB of {}'s device memory, with the KV cache; {trips} \
                 host round trips in {steps} steps",
                self.backends[*backend].name()
            );
        }
        match self.arena_backend() {
            Some(b) => format!("activation arena: {mib:.1} MiB, a host buffer of {b}"),
            None => format!("activation arena: {mib:.1} MiB of the engine's memory"),
        }
    }

    fn free_arena(&self, a: ArenaMem) {
        if let ArenaMem::Backend {
            backend, handle, ..
        }
        | ArenaMem::Device {
            backend, handle, ..
        } = a
        {
            self.backends[backend].free_buffer(handle);
        }
    }

    pub fn backend_names(&self) -> Vec<&str> {
        self.backends.iter().map(|b| b.name()).collect()
    }

    pub fn stats(&self) -> OpStats {
        self.stats.borrow().clone()
    }

    fn call(
        &self,
        op: Op,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        params: OpParams,
    ) -> Result<()> {
        self.call_with(op, inputs, outputs, params, None)
    }

    fn record(
        &self,
        op: Op,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        b: &Backend,
        t0: Option<std::time::Instant>,
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
        if let (2, Some(t)) = (self.profile, inputs.first()) {
            dt = format!("{dt} {:?}", &t.ne[..t.ndim as usize]);
        }
        let arena = match &*self.arena.borrow() {
            ArenaMem::Device { handle, .. } => *handle,
            _ => 0,
        };
        match inputs.first().map(|t| t.buffer) {
            Some(0) | None => {}
            Some(h) if h == arena => dt.push_str(" (device)"),
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

    /// The start of a call, where calls are timed (MOLLM_PROFILE; a decode step makes hundreds
    /// of calls, so the clock is not read otherwise).
    fn clock(&self) -> Option<std::time::Instant> {
        (self.profile > 0).then(std::time::Instant::now)
    }

    /// [`Exec::call`], first offering backend `first.0` the inputs `first.1` (a weight it
    /// prepared); the plain inputs go the usual way if it declines.
    fn call_with(
        &self,
        op: Op,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        params: OpParams,
        first: Option<(usize, &[TensorDesc])>,
    ) -> Result<()> {
        let t0 = self.clock();
        // Operands in device memory: the device backend takes the call as it is, or it is
        // staged through host memory.
        if let Some(bi) = self
            .device
            .filter(|_| inputs.iter().chain(outputs).any(|t| t.buffer != 0))
        {
            let b = &self.backends[bi];
            let ins = match first {
                Some((fb, f)) if fb == bi => f,
                _ => inputs,
            };
            if b.try_compute(op, ins, outputs, params)? {
                self.record(op, ins, outputs, b, t0);
                return Ok(());
            }
            return self.staged(op, inputs, outputs, params, first);
        }
        // A host call the device takes waits for its result: a round trip.
        let waited = |bi: usize| {
            if self.device == Some(bi) {
                self.round_trips.set(self.round_trips.get() + 1);
            }
        };
        if let Some((bi, ins)) = first {
            let b = &self.backends[bi];
            if b.try_compute(op, ins, outputs, params)? {
                waited(bi);
                self.record(op, ins, outputs, b, t0);
                return Ok(());
            }
        }
        let last = self.backends.len() - 1;
        // With device memory, a host call of an op other than a product or a lookup (the
        // sampler's argmax over logits already read back) would upload and wait again: the
        // backends after the device take it.
        let skip = self
            .device
            .filter(|&d| !self.strict && d != last && !matches!(op, Op::MatMul | Op::GetRows));
        for (i, b) in self.backends.iter().enumerate() {
            if Some(i) == skip {
                continue;
            }
            if i == last && !self.strict {
                b.compute(op, inputs, outputs, params)?;
                waited(i);
                self.record(op, inputs, outputs, b, t0);
                return Ok(());
            }
            if b.try_compute(op, inputs, outputs, params)? {
                waited(i);
                self.record(op, inputs, outputs, b, t0);
                return Ok(());
            }
        }
        Err(EngineError::Invalid(format!(
            "no native backend takes this {} call ({}), and --require-native forbids the reference fallback",
            op.name(),
            inputs
                .iter()
                .map(|t| t.dtype().map(|d| d.to_string()).unwrap_or_else(|| "?".into()))
                .collect::<Vec<_>>()
                .join(", ")
        )))
    }

    /// Whether call `a` goes to the backend that call `b` goes to (the first that takes it;
    /// the fallback, where there is one, when no other does). For a call that several
    /// one-sequence calls can replace: it is made only where it lands on the same backend.
    pub(crate) fn same_taker(&self, op: Op, a: Call, b: Call) -> bool {
        let taker = |(ins, outs, p): Call| {
            self.backends
                .iter()
                .position(|bk| bk.supports(op, ins, outs, p))
                .or((!self.strict).then_some(self.backends.len() - 1))
        };
        let (ta, tb) = (taker(a), taker(b));
        ta.is_some() && ta == tb
    }

    /// One op on descriptors the caller owns (the graph executor's arena).
    pub(crate) fn call_desc(
        &self,
        op: Op,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        params: OpParams,
    ) -> Result<()> {
        self.call(op, inputs, outputs, params)
    }

    /// Routes the MoE layers' experts through `cache`; `layers` maps each MoE node's gate
    /// weight (index in the program) to its cache layer.
    pub fn set_expert_cache(
        &mut self,
        cache: crate::experts::ExpertCache,
        layers: std::collections::HashMap<usize, usize>,
    ) {
        // Repacks in the slots of a cache this one replaces are gone with it.
        for (bi, d) in self.slot_prepared.get_mut().drain().filter_map(|(_, p)| p) {
            self.backends[bi].free_buffer(d.buffer);
        }
        self.slot_seen.get_mut().clear();
        self.retired = cache.retired();
        self.experts = std::cell::RefCell::new(Some(cache));
        self.expert_layers = layers;
    }

    /// Lets [`Exec::warm_weight`] post to `pool`'s idle workers (unless MOLLM_WARM=0).
    pub fn set_warmer(&mut self, pool: &crate::pool::Pool) {
        self.warmer = abi::settings::WARM.on(true).then(|| pool.warmer());
    }

    /// The memory a product with `w` reads first (up to [`WARM_MAX`] bytes of the copy a
    /// backend prepared in host memory, or of the weight itself), posted to the pool's idle
    /// workers: the serial ops before that product run while the weight streams into their
    /// caches, instead of the memory bus idling (a decode step's gaps: norms, rope, attention).
    pub(crate) fn warm_weight(&self, w: &Weight) {
        let Some(warmer) = &self.warmer else { return };
        if w.cache_slot {
            return;
        }
        let d = match self.prepared.borrow().get(&(w.desc.data as usize)) {
            // A device backend's copy is not in host memory (its descriptor keeps the host
            // address of the original, which the product does not read).
            Some(Some((_, d))) if d.data == w.desc.data => return,
            Some(Some((_, d))) => *d,
            _ => w.desc,
        };
        let bytes = (d.ne[1].max(1) * d.nb[1]).clamp(0, WARM_MAX as i64) as usize;
        warmer.warm(d.data, bytes);
    }

    /// The cache layer of the MoE node whose gate weight is `gate`, when a cache is on.
    pub(crate) fn expert_layer(&self, gate: usize) -> Option<usize> {
        self.expert_layers.get(&gate).copied()
    }

    pub(crate) fn with_experts<R>(
        &self,
        f: impl FnOnce(&mut crate::experts::ExpertCache) -> Result<R>,
    ) -> Result<R> {
        match self.experts.borrow_mut().as_mut() {
            Some(c) => f(c),
            None => Err(EngineError::Invalid("no expert cache".into())),
        }
    }

    /// The expert cache's counters, when there is one.
    pub fn expert_stats(&self) -> Option<crate::experts::ExpertStats> {
        self.experts.borrow().as_ref().map(|c| c.stats())
    }

    /// `out = w x` into the caller's memory, on the weight's prepared copy where a backend
    /// made one; `params` carries mat_mul's `chain_cols`.
    pub(crate) fn matmul_desc(
        &self,
        w: &Weight,
        x: TensorDesc,
        out: TensorDesc,
        params: OpParams,
    ) -> Result<()> {
        let prepared = self.prepared(w)?;
        if let (Some((bi, d)), true) = (prepared, w.cache_slot) {
            // Repacked in place: the file's layout is gone, so no other backend can take the
            // call (the one that repacked it takes every call it prepared for).
            let (t0, b) = (self.clock(), &self.backends[bi]);
            let ins = [d, x];
            if b.try_compute(Op::MatMul, &ins, &[out], params)? {
                self.record(Op::MatMul, &ins, &[out], b, t0);
                return Ok(());
            }
            return Err(EngineError::Invalid(format!(
                "an expert repacked in its cache slot by backend {} is refused by it: {} (MOLLM_REPACK=0 runs the file's layout)",
                b.name(),
                b.last_error()
            )));
        }
        let ins = prepared.map(|(_, d)| [d, x]);
        let first = prepared.zip(ins.as_ref()).map(|((bi, _), i)| (bi, &i[..]));
        self.call_with(Op::MatMul, &[w.desc, x], &[out], params, first)
    }

    /// `get_rows` on a weight table. A table a backend repacked for `mat_mul` (a tied
    /// embedding) is read from the repack where that backend takes the call: the file's pages
    /// of it were dropped ([`release_pages`]), and reading rows there would map them back in,
    /// 64 KiB around each row. Elsewhere, from the file.
    pub(crate) fn table_rows(
        &self,
        w: &Weight,
        ins: &[TensorDesc],
        out: TensorDesc,
        params: OpParams,
    ) -> Result<()> {
        let prepared = match w.cache_slot {
            true => None,
            false => self
                .prepared
                .borrow()
                .get(&(w.desc.data as usize))
                .copied()
                .flatten(),
        };
        // get_rows takes the table and the ids (its schema).
        let with = prepared.map(|(bi, d)| (bi, [d, ins[1]]));
        let first = with.as_ref().map(|(bi, i)| (*bi, &i[..]));
        self.call_with(Op::GetRows, ins, &[out], params, first)
    }

    /// A cache slot's weight repacked in place by the first backend that has a layout for it
    /// in the room the slot leaves, once it has made `after` calls on the file's layout (both
    /// layouts compute the same bits; see [`SLOT_REPACK_AFTER`]); once per tenant of the slot:
    /// repacks of slots that got another expert are dropped first.
    fn slot_prepared(&self, w: &Weight, after: u32) -> Option<(usize, TensorDesc)> {
        let mut map = self.slot_prepared.borrow_mut();
        let mut seen = self.slot_seen.borrow_mut();
        let key = w.desc.data as usize;
        if let Some(p) = map.get(&key) {
            return *p;
        }
        let uses = seen.entry(key).or_insert(0);
        *uses += 1;
        if *uses <= after {
            return None;
        }
        // The repack starts at the next 64-byte boundary (a GGUF's experts are 32-aligned).
        let dst = key.next_multiple_of(64);
        let cap = w.room.saturating_sub(dst - key);
        let p = self.backends.iter().enumerate().find_map(|(i, b)| {
            if b.is_refused(Op::MatMul) || cap == 0 {
                return None;
            }
            b.prepare_weight_into(&w.desc, dst as *mut u8, cap)
                .map(|d| (i, d))
        });
        map.insert(key, p);
        p
    }

    /// Forgets what was made of the bytes of slots that changed tenant (always, so that the
    /// cache's list stays short whether or not slots are repacked).
    fn drop_retired(&self) {
        let retired = std::mem::take(&mut *self.retired.lock().unwrap_or_else(|e| e.into_inner()));
        if retired.is_empty() {
            return;
        }
        let mut map = self.slot_prepared.borrow_mut();
        let mut seen = self.slot_seen.borrow_mut();
        for range in retired {
            seen.retain(|addr, _| !range.contains(addr));
            map.retain(|&addr, p| {
                let stale = range.contains(&addr);
                if let (true, Some((bi, d))) = (stale, p) {
                    self.backends[*bi].free_buffer(d.buffer);
                }
                !stale
            });
        }
    }

    fn prepared(&self, w: &Weight) -> Result<Option<(usize, TensorDesc)>> {
        if w.cache_slot {
            self.drop_retired();
            if !self.repack {
                return Ok(None);
            }
            return Ok(self
                .slot_repack_after
                .and_then(|after| self.slot_prepared(w, after)));
        }
        if !self.repack {
            return Ok(None);
        }
        let key = w.desc.data as usize;
        if let Some(p) = self.prepared.borrow().get(&key) {
            return Ok(*p);
        }
        let mut p = None;
        for (i, b) in self.backends.iter().enumerate() {
            if b.is_refused(Op::MatMul) {
                continue;
            }
            if let Some(d) = b.prepare_weight(&w.desc, w.file_mapped)? {
                p = Some((i, d));
                break;
            }
        }
        if p.is_some() && w.file_mapped {
            release_pages(&w.desc);
        }
        self.prepared.borrow_mut().insert(key, p);
        Ok(p)
    }

    /// `w x (+ b)`: a linear layer with an optional bias.
    pub fn glu(&self, gate: &Act, up: &Act, act: i64) -> Result<Act> {
        let mut out = Act::zeros(&gate.ne);
        let p = abi::GluAttrs { act }.to_params();
        self.call(Op::Glu, &[gate.desc(), up.desc()], &[out.desc_mut()], p)?;
        Ok(out)
    }

    pub fn softmax(&self, x: &Act, scale: f32) -> Result<Act> {
        let mut out = Act::zeros(&x.ne);
        let p = abi::SoftmaxAttrs { scale }.to_params();
        self.call(Op::Softmax, &[x.desc()], &[out.desc_mut()], p)?;
        Ok(out)
    }

    /// Index of the largest value of each row.
    pub fn argmax(&self, x: &Act) -> Result<Vec<i32>> {
        let mut out = vec![0i32; x.nrows()];
        let od = TensorDesc::contiguous(
            out.as_mut_ptr() as *mut u8,
            DType::I32,
            &[x.ne[1], x.ne[2], x.ne[3]],
        );
        self.call(Op::Argmax, &[x.desc()], &[od], OpParams::default())?;
        Ok(out)
    }
}
