//! A loaded model and a conversation state on it: KV cache, prompt processing in chunks,
//! token-by-token generation.

use crate::backend::Backend;
use crate::error::{EngineError, Result};
use crate::exec::Exec;
use crate::graph::moe::Experts;
use crate::graph::{Program, Runner, SeqStep};
use crate::kv::{KvCache, KvPool};
use crate::model::HParams;
use crate::pool::Pool;
use crate::sampler::Sampler;
use crate::tensor::Act;
use abi::DType;
use loader::{ChatTemplate, ModelFile, Tokenizer};
use std::path::Path;
use std::time::Instant;

/// A model ready to run: its program (graph bound to the weights), tokenizer, chat template.
/// Weights stay in the file's memory map. Shareable across threads: nothing in it changes
/// after loading.
pub struct Model {
    // Declared before `gguf`: the program's weights point into its memory map.
    pub program: Program,
    /// The graph cut at its final hidden states, for embeddings (`None` where the graph names
    /// none: a package made before mollm had embeddings).
    pub embed_program: Option<Program>,
    pub hp: HParams,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
    pub gguf: ModelFile,
    pub load_ms: f64,
}

/// Cold starts: asks the kernel, from a thread of its own, to read the dense weights' bytes
/// now, while the tokenizer and the graph are built (the repacks would otherwise fault them in
/// one readahead window at a time, the disk idle in between). Routed experts (`*_exps`) are
/// left to the expert cache, and nothing is asked when the dense bytes would take more than
/// half the memory available.
fn read_ahead(gguf: &ModelFile) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        if !gguf.path.is_file() {
            return;
        }
        let mut ranges: Vec<(u64, u64)> = (gguf.tensors.iter())
            .filter(|t| !t.name.contains("_exps"))
            .map(|t| (t.offset, t.offset + t.size))
            .collect();
        ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (a, b) in ranges {
            match merged.last_mut() {
                Some(last) if a <= last.1 + (1 << 20) => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        let total: u64 = merged.iter().map(|(a, b)| b - a).sum();
        if total == 0 || crate::experts::mem_available().is_none_or(|m| total > m / 2) {
            return;
        }
        let path = gguf.path.clone();
        let spawned = std::thread::Builder::new()
            .name("mollm-readahead".into())
            .spawn(move || {
                let Ok(f) = std::fs::File::open(&path) else {
                    return;
                };
                for (a, b) in merged {
                    // SAFETY: advice on a file this thread opened; it changes no data.
                    unsafe {
                        libc::posix_fadvise(
                            f.as_raw_fd(),
                            a as libc::off_t,
                            (b - a) as libc::off_t,
                            libc::POSIX_FADV_WILLNEED,
                        )
                    };
                }
            });
        // Advice only: a load without the thread reads the same bytes, later.
        drop(spawned);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = gguf;
}

impl Model {
    pub fn load(path: &Path) -> Result<Model> {
        let t0 = Instant::now();
        let gguf = loader::open_model(path)?;
        read_ahead(&gguf);
        // A package carries its graph: it runs as written, whatever its architecture string
        // (provenance only). Other files get theirs from the architecture's builder.
        let (hp, graph) = match gguf.get_str(loader::package::GRAPH_KEY)? {
            Some(text) => {
                let file = gguf.path.display().to_string();
                let g = crate::graph::GraphFile::from_json(text.as_bytes(), &file)?;
                (HParams::from_graph(&g, &gguf)?, g)
            }
            None => {
                crate::model::check_architecture(&gguf)?;
                let hp = HParams::from_gguf(&gguf)?;
                let g = crate::model::build_graph(&gguf, &hp)?;
                (hp, g)
            }
        };
        let file = gguf.path.display().to_string();
        let weights = |name: &str| crate::model::file_weight(&gguf, name);
        let embed_program = match graph.embedding() {
            Some(g) => Some(crate::graph::compile(g, &weights, &file)?),
            None => None,
        };
        let program = crate::model::bind(&gguf, graph)?;
        let tokenizer = Tokenizer::from_gguf(&gguf)?;
        let chat_template = ChatTemplate::from_gguf(&gguf)?;
        Ok(Model {
            program,
            embed_program,
            hp,
            tokenizer,
            chat_template,
            gguf,
            load_ms: t0.elapsed().as_secs_f64() * 1e3,
        })
    }

    /// How the model pools embeddings: as its file says, else the mean (llama-server's
    /// `--pooling mean`, for decoders that name none).
    pub fn pooling(&self) -> crate::embed::Pooling {
        (self.hp.pooling_type)
            .and_then(crate::embed::Pooling::from_llama)
            .unwrap_or(crate::embed::Pooling::Mean)
    }

    /// Refuses logits of a model that has none (an embedding model), saying what it is for.
    pub fn check_logits(&self) -> Result<()> {
        if self.program.has_logits() {
            return Ok(());
        }
        Err(EngineError::Model {
            file: self.gguf.path.display().to_string(),
            msg: format!(
                "a {} model computes embeddings, not next-token logits: use `mollm embed` or the server's /v1/embeddings",
                self.hp.arch
            ),
        })
    }

    pub fn file_name(&self) -> String {
        self.gguf
            .path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

/// Which backends run the ops.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    /// The best available for each op: conforming native plugins by score, then the reference.
    Auto,
    Named(String),
}

impl BackendChoice {
    pub fn parse(s: &str) -> BackendChoice {
        match s {
            "auto" => BackendChoice::Auto,
            other => BackendChoice::Named(other.to_string()),
        }
    }
}

/// Backends built into this binary. Native plugins join this list through the registry.
pub const BUILTIN_BACKENDS: &[&str] = &["reference"];

/// The backends for a session and whether the last one is a fallback for every call.
fn open_backends(opts: &SessionOptions, pool: &Pool) -> Result<(Vec<Backend>, bool)> {
    let choice = &opts.backend;
    match &opts.plugins {
        Some(p) => crate::registry::select(choice, p, pool),
        None => match choice {
            BackendChoice::Auto => Ok((vec![Backend::open(&reference::HEADER, pool.host_api())?], true)),
            BackendChoice::Named(n) if n == "reference" => {
                Ok((vec![Backend::open(&reference::HEADER, pool.host_api())?], true))
            }
            BackendChoice::Named(n) => Err(EngineError::Invalid(format!(
                "backend '{n}' is not available: plugins are not enabled for this session, built in: {:?}",
                BUILTIN_BACKENDS
            ))),
        },
    }
}

#[derive(Clone, Debug)]
pub struct SessionOptions {
    pub n_ctx: usize,
    /// Prompt tokens processed per forward pass.
    pub n_batch: usize,
    pub n_threads: usize,
    pub backend: BackendChoice,
    pub kv_dtype: DType,
    /// Native backend plugins (discovery, conformance gate, `--require-native`); `None` = the
    /// built-in reference only.
    pub plugins: Option<crate::registry::PluginOptions>,
    /// Positions the shared KV pool holds for all sequences together; 0: `n_ctx` (the
    /// session's own sequence alone).
    pub kv_pool_rows: usize,
    /// Logit rows one step may produce (the activation arena is sized for it): 1 for
    /// generation, a whole batch for perplexity. A step that needs more grows it.
    pub max_outputs: usize,
    /// Where routed experts live (MoE models; see [`crate::experts`]).
    pub experts: crate::experts::ExpertMemory,
    /// Threads the expert reads run on.
    pub io_workers: usize,
    /// Next-layer expert prefetch (with a cache).
    pub prefetch: bool,
    /// With prefetch, back off while decoding where it does not pay (see
    /// `experts::backoff`); false keeps it on.
    pub prefetch_auto: bool,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            n_ctx: 4096,
            n_batch: 512,
            n_threads: 0,
            backend: BackendChoice::Auto,
            kv_dtype: DType::F32,
            plugins: None,
            kv_pool_rows: 0,
            max_outputs: 1,
            experts: crate::experts::ExpertMemory::Auto {
                policy: crate::experts::Policy::NextUse,
            },
            io_workers: 4,
            prefetch: true,
            prefetch_auto: true,
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct Timings {
    pub prefill_ms: f64,
    pub prefill_tokens: usize,
    pub decode_ms: f64,
    pub decode_tokens: usize,
}

impl Timings {
    pub fn prefill_tps(&self) -> f64 {
        rate(self.prefill_tokens, self.prefill_ms)
    }
    pub fn decode_tps(&self) -> f64 {
        rate(self.decode_tokens, self.decode_ms)
    }
}

fn rate(n: usize, ms: f64) -> f64 {
    if ms > 0.0 {
        n as f64 * 1e3 / ms
    } else {
        0.0
    }
}

/// A sequence of its own on a session's model and backends, for batched steps
/// ([`Session::step`]): its KV cache and the tokens in it. It can move between threads.
pub struct Sequence {
    pub kv: KvCache,
    pub history: Vec<u32>,
}

impl Sequence {
    /// Forgets everything after `n` tokens (the next step writes from there); returns the
    /// tokens kept (none, short of the whole history, for a model with recurrent state: see
    /// [`crate::kv`]).
    pub fn truncate(&mut self, n: usize) -> usize {
        let kept = self.kv.truncate(n.min(self.history.len()));
        self.history.truncate(kept);
        kept
    }

    /// A copy that continues independently from the same state (sharing cache pages until
    /// either writes to them).
    pub fn fork(&self) -> Sequence {
        Sequence {
            kv: self.kv.fork(),
            history: self.history.clone(),
        }
    }
}

/// One sequence's share of a batched step: `tokens` appended to it, logits for the last
/// `n_out` of them.
pub struct Work<'a> {
    pub seq: &'a mut Sequence,
    pub tokens: &'a [u32],
    pub n_out: usize,
}

pub struct Session<'m> {
    model: &'m Model,
    step_tokens: Vec<u32>,
    exec: Exec,
    /// The MoE runner's expert cache, where routed experts are streamed from the file.
    experts: Option<Experts>,
    runner: Runner,
    /// Steps of the embedding program ([`Model::embed_program`]), made at the first use.
    embed_runner: Option<Runner>,
    /// The session's own sequence (`eval`, `generate`).
    kv: KvCache,
    /// Every sequence's keys and values.
    kv_pool: KvPool,
    n_batch: usize,
    /// Tokens whose keys and values are in the cache, in order.
    history: Vec<u32>,
    /// Whether `generate` ends at an end-of-generation token (benchmarks turn this off).
    pub stop_at_eog: bool,
    /// Declared last: backends hold the pool's host API until `exec` drops.
    pool: Pool,
}

/// The expert cache `opts` ask for on `model` (none for a dense model, or when the experts
/// stay resident), with each MoE node's cache layer.
fn expert_cache(
    model: &Model,
    opts: &SessionOptions,
    kv_bytes: u64,
) -> Result<
    Option<(
        crate::experts::ExpertCache,
        std::collections::HashMap<usize, usize>,
    )>,
> {
    use crate::experts::{ExpertCache, ExpertMemory, MARGIN};
    let (layers, by_gate) = crate::experts::layers_of(&model.program, &model.gguf)?;
    if layers.is_empty() || !model.gguf.is_file_mapped() {
        return Ok(None);
    }
    let file = model.gguf.path.display().to_string();
    let total = std::fs::metadata(&model.gguf.path).map_or(0, |m| m.len());
    let dense = total.saturating_sub(crate::experts::expert_bytes(&layers));
    let (bytes, policy) = match opts.experts {
        ExpertMemory::Resident => return Ok(None),
        ExpertMemory::Cache { bytes, policy } => {
            // Refused before anything runs: a cache the machine cannot hold beside the dense
            // weights and the KV cache would only swap (or be killed).
            if let Some(avail) = crate::experts::mem_available() {
                let need = dense + kv_bytes + bytes as u64;
                if need > avail {
                    return Err(EngineError::Model {
                        file,
                        msg: format!(
                            "an expert cache of {} MiB does not fit: with the dense weights ({} MiB) and the KV cache ({} MiB) it needs {} MiB, {} MiB are available",
                            bytes >> 20,
                            dense >> 20,
                            kv_bytes >> 20,
                            need >> 20,
                            avail >> 20
                        ),
                    });
                }
            }
            (bytes as u64, policy)
        }
        ExpertMemory::Auto { policy } => {
            let Some(avail) = crate::experts::mem_available() else {
                return Ok(None);
            };
            if total + kv_bytes + MARGIN <= avail {
                return Ok(None);
            }
            let left = avail.saturating_sub(dense + kv_bytes + MARGIN);
            if left == 0 {
                return Err(EngineError::Model {
                    file,
                    msg: format!(
                        "the dense weights ({} MiB) and the KV cache ({} MiB) leave no room for experts in the {} MiB available (--expert-cache MB sets a budget)",
                        dense >> 20,
                        kv_bytes >> 20,
                        avail >> 20
                    ),
                });
            }
            (left, policy)
        }
    };
    let mut cache = ExpertCache::new(&model.gguf.path, layers, bytes as usize, policy)?;
    cache.set_io_workers(opts.io_workers);
    cache.set_prefetch(opts.prefetch);
    cache.set_prefetch_auto(opts.prefetch_auto);
    cache.read_ahead_dense();
    Ok(Some((cache, by_gate)))
}

/// More compute threads than this many per core only add switching; far more cannot start.
pub const MAX_THREADS_PER_CORE: usize = 4;
/// Most prompt tokens a step may take (`--batch`): the activation arena grows with it.
pub const MAX_BATCH: usize = 1 << 16;

/// Refuses, with one line naming the flag, a session this machine cannot hold: more threads
/// than it can run, a batch beyond [`MAX_BATCH`], or a KV cache larger than the memory
/// available (checked before anything is allocated, so an absurd `--ctx` is an error, not an
/// abort in the allocator).
fn check_resources(model: &Model, opts: &SessionOptions) -> Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let most = cores * MAX_THREADS_PER_CORE;
    if opts.n_threads > most {
        return Err(EngineError::Invalid(format!(
            "--threads {}: this machine has {cores} cores; at most {most} threads ({MAX_THREADS_PER_CORE} a core)",
            opts.n_threads
        )));
    }
    if opts.n_batch > MAX_BATCH {
        return Err(EngineError::Invalid(format!(
            "--batch {}: at most {MAX_BATCH} tokens a step",
            opts.n_batch
        )));
    }
    let rows = if opts.kv_pool_rows > 0 {
        opts.kv_pool_rows
    } else {
        opts.n_ctx.max(1)
    };
    let bytes = kv_bytes(&model.program, opts.kv_dtype, rows);
    let avail = crate::experts::mem_available();
    if bytes.is_none_or(|b| avail.is_some_and(|a| b > a)) {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let need = bytes.map_or("more than 2^64 bytes".into(), |b| {
            format!("{:.1} GiB", gib(b))
        });
        let have = avail.map_or(String::new(), |a| {
            format!(", this machine has {:.1} GiB available", gib(a))
        });
        return Err(EngineError::Invalid(format!(
            "--ctx {rows}: the KV cache would take {need}{have}: lower --ctx (or use --kv-type f16)"
        )));
    }
    Ok(())
}

/// Bytes of a KV pool of `rows` positions (whole pages) for `p`'s cached layers; `None` past
/// 2^64.
pub fn kv_bytes(p: &crate::graph::Program, dtype: DType, rows: usize) -> Option<u64> {
    let rows =
        (rows.max(1).div_ceil(crate::kv::KV_PAGE) as u64).checked_mul(crate::kv::KV_PAGE as u64)?;
    let per_row: u64 = p
        .kv_layers
        .iter()
        .map(|&[d, h]| 2 * d as u64 * h as u64 * dtype.info().block_bytes as u64)
        .sum();
    per_row.checked_mul(rows)
}

impl<'m> Session<'m> {
    pub fn new(model: &'m Model, opts: &SessionOptions) -> Result<Session<'m>> {
        check_resources(model, opts)?;
        let pool = Pool::new(opts.n_threads).map_err(|e| EngineError::Invalid(e.to_string()))?;
        let (backends, fallback) = open_backends(opts, &pool)?;
        let mut exec = Exec::with_fallback(backends, fallback)?;
        exec.set_warmer(&pool);
        let n_ctx = opts.n_ctx.max(1);
        let n_batch = opts.n_batch.max(1);
        let rows = if opts.kv_pool_rows > 0 {
            opts.kv_pool_rows
        } else {
            n_ctx
        };
        let mut kv_pool = KvPool::new(&model.program.kv_spec(), opts.kv_dtype, rows, n_batch);
        if exec
            .use_device_memory(model.program.runs_host_code())
            .is_some()
        {
            kv_pool.to_device(&exec)?;
        }
        let kv = kv_pool.sequence(n_ctx);
        let runner = Runner::new(&model.program, n_batch, opts.max_outputs.clamp(1, n_batch));
        let experts = expert_cache(model, opts, kv_pool.bytes())?.map(|(cache, layers)| {
            let x = Experts::new(cache, layers);
            exec.watch_slots(x.retired());
            x
        });
        Ok(Session {
            model,
            step_tokens: Vec::new(),
            exec,
            experts,
            runner,
            embed_runner: None,
            kv,
            kv_pool,
            n_batch,
            history: Vec::with_capacity(n_ctx),
            stop_at_eog: true,
            pool,
        })
    }

    pub fn model(&self) -> &'m Model {
        self.model
    }

    pub fn n_ctx(&self) -> usize {
        self.kv.n_ctx
    }
    pub fn n_threads(&self) -> usize {
        self.pool.n_threads()
    }
    /// The session's compute pool as host services (`parallel_for` on its threads): for work
    /// that must run on the threads decoding runs on, between steps (`bench --probe-between`).
    pub fn host_api(&self) -> abi::HostApi {
        self.pool.host_api()
    }
    pub fn backend_names(&self) -> Vec<&str> {
        self.exec.backend_names()
    }
    pub fn exec(&self) -> &Exec {
        &self.exec
    }
    /// The expert cache's counters, when routed experts stream from the file.
    pub fn expert_stats(&self) -> Option<crate::experts::ExpertStats> {
        self.experts.as_ref().map(|x| x.stats())
    }
    pub fn history(&self) -> &[u32] {
        &self.history
    }

    /// A new, empty sequence that may grow to `n_ctx` tokens (its pages come from the
    /// session's pool as it grows).
    pub fn new_sequence(&self, n_ctx: usize) -> Sequence {
        Sequence {
            kv: self.kv_pool.sequence(n_ctx.max(1)),
            history: Vec::with_capacity(n_ctx),
        }
    }

    /// A new sequence for `prompt` that already holds the longest run of whole prompt chunks
    /// another sequence computed, or else the longest prefix of a kept short prompt whose rows
    /// are provably those it would compute (see [`crate::kv`]); the rest of the prompt is
    /// still to be fed, in chunks that end where chunks from its start would
    /// ([`chunk_end`]). Its results are those of a sequence that computed everything
    /// itself.
    pub fn new_sequence_for(&mut self, prompt: &[u32], n_ctx: usize) -> Sequence {
        let mut seq = self.new_sequence(n_ctx);
        let mut n = self.kv_pool.reuse_prefix(&mut seq.kv, prompt);
        if n == 0 {
            n = self.kv_pool.reuse_partial(&mut seq.kv, prompt);
        }
        seq.history.extend_from_slice(&prompt[..n]);
        seq
    }

    /// The shared KV pool (sizes, free pages).
    pub fn kv_pool(&self) -> &KvPool {
        &self.kv_pool
    }

    /// Sizes the activation arena for steps of up to `max_tokens` tokens and `max_outputs`
    /// logit rows (what a batch scheduler will ask for at most).
    pub fn reserve_step(&mut self, max_tokens: usize, max_outputs: usize) {
        if max_tokens > self.runner.max_tokens() || max_outputs > self.runner.max_outputs() {
            self.runner = Runner::new(
                &self.model.program,
                max_tokens.max(self.runner.max_tokens()),
                max_outputs.max(self.runner.max_outputs()),
            );
        }
    }

    /// One batched step over several sequences: each `Work`'s tokens are appended to its
    /// sequence; returns the logits, `n_vocab` values per row, the rows of each `Work` in order.
    /// A sequence's results do not depend on the other sequences of the step.
    pub fn step(&mut self, work: &mut [Work]) -> Result<&[f32]> {
        self.model.check_logits()?;
        let t: usize = work.iter().map(|w| w.tokens.len()).sum();
        let o: usize = work.iter().map(|w| w.n_out).sum();
        self.reserve_step(t, o);
        self.step_tokens.clear();
        for w in work.iter() {
            self.step_tokens.extend_from_slice(w.tokens);
        }
        let mut seqs: Vec<SeqStep> = work
            .iter_mut()
            .map(|w| SeqStep {
                n_tokens: w.tokens.len(),
                n_out: w.n_out,
                kv: &mut w.seq.kv,
            })
            .collect();
        let out = self.runner.step(
            &self.model.program,
            &self.exec,
            &mut self.kv_pool,
            self.experts.as_mut(),
            &self.step_tokens,
            &mut seqs,
        )?;
        for w in work.iter_mut() {
            let start = w.seq.history.len();
            w.seq.history.extend_from_slice(w.tokens);
            self.kv_pool.finish(&mut w.seq.kv, start, &w.seq.history);
        }
        Ok(out)
    }

    /// One normalized embedding per input: its tokens' final hidden states pooled by `how`.
    /// Inputs share steps of up to the session's batch size (each in a sequence of its own,
    /// dropped after); an input of a non-causal model (an encoder) must fit one step, a
    /// decoder's longer ones go in chunks. The session's own context is left as it is.
    pub fn embed(
        &mut self,
        inputs: &[Vec<u32>],
        how: crate::embed::Pooling,
    ) -> Result<Vec<Vec<f32>>> {
        let model = self.model;
        let p = model.embed_program.as_ref().ok_or_else(|| EngineError::Model {
            file: model.gguf.path.display().to_string(),
            msg: "its graph names no hidden states to pool (a package made before mollm had embeddings: convert it again)".into(),
        })?;
        let n_embd = p.nodes[p.output].shape[0].c as usize;
        let nb = self.n_batch;
        let encoder = p.non_causal;
        for (i, x) in inputs.iter().enumerate() {
            if x.is_empty() {
                return Err(EngineError::Invalid(format!("input {i} has no tokens")));
            }
            if encoder && x.len() > nb {
                return Err(EngineError::Invalid(format!(
                    "input {i} has {} tokens; this encoder takes an input in one step of at most {nb} (raise --batch)",
                    x.len()
                )));
            }
        }
        let runner = self
            .embed_runner
            .get_or_insert_with(|| Runner::new(p, nb, nb));
        let mut out = Vec::with_capacity(inputs.len());
        let mut rows: Vec<f32> = Vec::new();
        let mut i = 0;
        while i < inputs.len() {
            // Inputs whole into this step while they fit (a longer one alone, in chunks).
            // Each takes whole cache pages while the step lasts.
            let mut j = i;
            let (mut t, mut pages) = (0, 0);
            let free = self.kv_pool.available_pages();
            while j < inputs.len() && t + inputs[j].len() <= nb {
                let need = inputs[j].len().div_ceil(crate::kv::KV_PAGE);
                if j > i && pages + need > free {
                    break;
                }
                t += inputs[j].len();
                pages += need;
                j += 1;
            }
            if j == i {
                let x = &inputs[i];
                let mut seq = self.kv_pool.sequence(x.len());
                rows.clear();
                for chunk in x.chunks(nb) {
                    let n = chunk.len();
                    let mut s = [SeqStep {
                        kv: &mut seq,
                        n_tokens: n,
                        n_out: n,
                    }];
                    let r = runner.step(
                        p,
                        &self.exec,
                        &mut self.kv_pool,
                        self.experts.as_mut(),
                        chunk,
                        &mut s,
                    )?;
                    rows.extend_from_slice(r);
                }
                out.push(crate::embed::vector(&rows, n_embd, how));
                i += 1;
                continue;
            }
            let batch = &inputs[i..j];
            let mut kvs: Vec<KvCache> = batch
                .iter()
                .map(|x| self.kv_pool.sequence(x.len()))
                .collect();
            self.step_tokens.clear();
            for x in batch {
                self.step_tokens.extend_from_slice(x);
            }
            let mut seqs: Vec<SeqStep> = kvs
                .iter_mut()
                .zip(batch)
                .map(|(kv, x)| SeqStep {
                    kv,
                    n_tokens: x.len(),
                    n_out: x.len(),
                })
                .collect();
            let r = runner.step(
                p,
                &self.exec,
                &mut self.kv_pool,
                self.experts.as_mut(),
                &self.step_tokens,
                &mut seqs,
            )?;
            let mut at = 0;
            for x in batch {
                let part = &r[at * n_embd..(at + x.len()) * n_embd];
                out.push(crate::embed::vector(part, n_embd, how));
                at += x.len();
            }
            i = j;
        }
        Ok(out)
    }

    /// Drops the cached state after `n` tokens; returns the tokens kept (none, short of the
    /// whole history, for a model with recurrent state: see [`crate::kv`]).
    pub fn truncate(&mut self, n: usize) -> usize {
        let kept = self.kv.truncate(n.min(self.history.len()));
        self.history.truncate(kept);
        kept
    }

    /// Appends `tokens` to the context, `n_batch` at a time, and returns the logits after the
    /// last one (`want_logits`), or `None`.
    pub fn eval(&mut self, tokens: &[u32], want_logits: bool) -> Result<Option<Vec<f32>>> {
        let from = if want_logits {
            tokens.len().saturating_sub(1)
        } else {
            tokens.len()
        };
        let out = self.eval_from(tokens, from)?;
        Ok(want_logits.then_some(out))
    }

    /// Appends `tokens` to the context, `n_batch` at a time, and returns the logits after each
    /// of `tokens[from..]`, row after row (`n_vocab` values each): what perplexity scores.
    pub fn eval_from(&mut self, tokens: &[u32], from: usize) -> Result<Vec<f32>> {
        let mut logits = Vec::new();
        self.eval_into(tokens, from, &mut logits)?;
        Ok(logits)
    }

    /// [`Session::eval_from`] into `logits` (cleared first; no allocation once it has room).
    pub fn eval_into(&mut self, tokens: &[u32], from: usize, logits: &mut Vec<f32>) -> Result<()> {
        logits.clear();
        self.model.check_logits()?;
        let need = self.history.len() + tokens.len();
        if need > self.kv.n_ctx {
            return Err(EngineError::ContextFull {
                need,
                n_ctx: self.kv.n_ctx,
            });
        }
        let n_vocab = self.model.hp.n_vocab as u32;
        if let Some(&bad) = tokens.iter().find(|&&t| t >= n_vocab) {
            return Err(EngineError::Invalid(format!(
                "token id {bad} outside the vocabulary of {n_vocab}"
            )));
        }
        for (i, chunk) in tokens.chunks(self.n_batch).enumerate() {
            let start = i * self.n_batch;
            let n_out = (start + chunk.len()).saturating_sub(from.max(start));
            if n_out > self.runner.max_outputs() {
                self.runner = Runner::new(&self.model.program, self.n_batch, n_out);
            }
            let mut seq = [SeqStep {
                kv: &mut self.kv,
                n_tokens: chunk.len(),
                n_out,
            }];
            let out = self.runner.step(
                &self.model.program,
                &self.exec,
                &mut self.kv_pool,
                self.experts.as_mut(),
                chunk,
                &mut seq,
            )?;
            logits.extend_from_slice(out);
            let start = self.history.len();
            self.history.extend_from_slice(chunk);
            self.kv_pool.finish(&mut self.kv, start, &self.history);
        }
        Ok(())
    }

    /// Picks the next token from `logits`: greedy through the backend's argmax, otherwise the
    /// sampler's draw.
    pub fn pick(&self, sampler: &mut Sampler, logits: &mut Vec<f32>) -> Result<u32> {
        sampler.apply_penalties(logits);
        if sampler.is_greedy() {
            let n = logits.len() as i64;
            let act = Act::from_vec(std::mem::take(logits), &[n, 1]);
            let best = self.exec.argmax(&act)?;
            *logits = act.data;
            return Ok(best[0] as u32);
        }
        Ok(sampler.sample(logits))
    }

    /// The first largest element of each `n`-long row of `logits` (the greedy pick from raw
    /// logits), in one backend call: rows on its threads.
    pub fn argmax_rows(&self, logits: &mut Vec<f32>, n: usize) -> Result<Vec<i32>> {
        let rows = (logits.len() / n.max(1)) as i64;
        let act = Act::from_vec(std::mem::take(logits), &[n as i64, rows]);
        let best = self.exec.argmax(&act);
        *logits = act.data;
        best
    }

    /// Processes `prompt` (appended to what the session holds), then generates up to
    /// `max_tokens`, calling `on_token` with each; generation stops at an end-of-generation
    /// token (which is reported and kept), when `on_token` returns false, or when the context
    /// is full.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        max_tokens: usize,
        sampler: &mut Sampler,
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<(Vec<u32>, Timings)> {
        let mut timings = Timings::default();
        if prompt.is_empty() {
            return Err(EngineError::Invalid(
                "empty prompt: nothing to continue from".into(),
            ));
        }
        for &t in prompt {
            sampler.accept(t);
        }
        let t0 = Instant::now();
        let mut logits = Vec::new();
        self.eval_into(prompt, prompt.len() - 1, &mut logits)?;
        timings.prefill_ms = t0.elapsed().as_secs_f64() * 1e3;
        timings.prefill_tokens = prompt.len();

        let mut out = Vec::new();
        let t1 = Instant::now();
        while out.len() < max_tokens {
            let tok = self.pick(sampler, &mut logits)?;
            sampler.accept(tok);
            out.push(tok);
            let go_on = on_token(tok);
            let eog = self.stop_at_eog && self.model.tokenizer.is_eog(tok);
            if !go_on || eog || out.len() >= max_tokens {
                break;
            }
            if self.history.len() >= self.kv.n_ctx {
                break;
            }
            self.eval_into(&[tok], 0, &mut logits)?;
            timings.decode_tokens += 1;
        }
        timings.decode_ms = t1.elapsed().as_secs_f64() * 1e3;
        Ok((out, timings))
    }
}

/// Where the prompt chunk starting at position `fed` ends (at most `len`): chunks are cut every
/// `n_batch` positions from the sequence's start, whatever was reused before `fed`, so that each
/// is the chunk the sequence would compute alone.
pub fn chunk_end(n_batch: usize, fed: usize, len: usize) -> usize {
    let nb = n_batch.max(1);
    ((fed / nb + 1) * nb).min(len)
}
