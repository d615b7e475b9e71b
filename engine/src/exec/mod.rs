//! Typed op calls. Every op the model graphs run goes through here and, from here, through the
//! ABI function table of the backend chosen for it.

use crate::backend::Backend;
use crate::error::{EngineError, Result};
use crate::tensor::{Act, Weight};
use abi::{DType, Op, OpParams, TensorDesc};

/// Rotary embedding settings of one layer: the `rope` op's attributes.
pub use abi::RopeAttrs as RopeParams;

mod memory;
mod prepared;
mod profile;

pub use prepared::Retired;
pub use profile::OpStats;

/// The executor: each call goes to the first backend that takes it. Its state by concern:
/// the profiler ([`profile`]), the weights backends prepared ([`prepared`]), the activation
/// and device memory ([`memory`]); the expert cache belongs to the MoE runner
/// ([`crate::graph::moe::Experts`]).
pub struct Exec {
    /// In priority order; each call goes to the first that supports it.
    backends: Vec<Backend>,
    /// No fallback: every call needs a backend whose `supports` accepts it
    /// (`--require-native`). Otherwise the last backend takes whatever the others decline.
    strict: bool,
    profiler: profile::Profiler,
    weights: prepared::Prepared,
    memory: memory::Memory,
    /// Posts the weights of the next matrix product to the pool's idle workers (see
    /// [`Exec::warm_weight`]); `None`: no pool workers, or off (MOLLM_WARM=0).
    warmer: Option<crate::pool::Warmer>,
}

impl Drop for Exec {
    fn drop(&mut self) {
        self.weights.free(&self.backends);
        let a = self.memory.take_arena();
        self.free_arena(a);
    }
}

/// The most bytes of a weight posted for warming: what a worker's L2 takes beside its work
/// (the next product starts long before that much streams in a decode gap).
const WARM_MAX: usize = 1 << 20;

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
        Ok(Exec {
            backends,
            strict: !fallback,
            profiler: profile::Profiler::from_settings(),
            weights: prepared::Prepared::from_settings(),
            memory: memory::Memory::new(),
            warmer: None,
        })
    }

    pub fn backend_names(&self) -> Vec<&str> {
        self.backends.iter().map(|b| b.name()).collect()
    }

    pub fn stats(&self) -> OpStats {
        self.profiler.stats()
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
        let arena = self.memory.device_arena();
        self.profiler.record(op, inputs, outputs, b, t0, arena);
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
        let t0 = self.profiler.clock();
        // Operands in device memory: the device backend takes the call as it is, or it is
        // staged through host memory.
        if let Some(bi) = self
            .memory
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
        let waited = |bi: usize| self.memory.waited(bi);
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
            .memory
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
        let d = match self.weights.made(w) {
            // A device backend's copy is not in host memory (its descriptor keeps the host
            // address of the original, which the product does not read).
            Some((_, d)) if d.data == w.desc.data => return,
            Some((_, d)) => d,
            None => w.desc,
        };
        let bytes = (d.ne[1].max(1) * d.nb[1]).clamp(0, WARM_MAX as i64) as usize;
        warmer.warm(d.data, bytes);
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
            let (t0, b) = (self.profiler.clock(), &self.backends[bi]);
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
        let prepared = self.weights.made(w);
        // get_rows takes the table and the ids (its schema).
        let with = prepared.map(|(bi, d)| (bi, [d, ins[1]]));
        let first = with.as_ref().map(|(bi, i)| (*bi, &i[..]));
        self.call_with(Op::GetRows, ins, &[out], params, first)
    }

    /// `act(gate) * up`, elementwise (`act`: the glu op's activation).
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
