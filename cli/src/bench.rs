//! `mollm bench`: prompt processing (pp) and generation (tg) measured separately, the way
//! llama-bench does, so its numbers sit next to llama-bench's and its JSON reads in the same
//! scripts.
//!
//! pp N: an empty context, N random token ids (BOS first when the model adds one) evaluated in
//! --batch chunks, logits of the last; tokens/s = N / time. tg N: an empty context, N single-
//! token steps (BOS or a random id first, then random ids, as llama-bench feeds them: no
//! sampling in the timed loop); tokens/s = N / time. Each row: --warmup untimed runs, then
//! --reps timed ones; mean ± sample standard deviation and median of the per-run tokens/s.

use crate::common::{
    human_bytes, human_count, model_n_params, model_size, model_type, peak_rss_bytes, CliResult,
    ModelArgs,
};
use clap::Args;
use engine::sampler::Rng;
use engine::{Model, Session};
use std::time::Instant;

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub load: crate::common::LoadArgs,
    /// Prompt lengths to measure (comma-separated: one pp row each; 0 = none).
    #[arg(long, short = 'p', value_delimiter = ',', default_value = "256")]
    pub prompt_tokens: Vec<usize>,
    /// Generation lengths to measure (comma-separated: one tg row each; 0 = none).
    #[arg(long, short = 'n', value_delimiter = ',', default_value = "64")]
    pub gen_tokens: Vec<usize>,
    /// Untimed runs before each row's measured ones.
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// Measured runs per row.
    #[arg(long, short = 'r', default_value_t = 5)]
    pub reps: usize,
    /// Compute threads (comma-separated: rows for each) [default: one per core].
    #[arg(long, short = 't', value_delimiter = ',', default_value = "0")]
    pub threads: Vec<usize>,
    /// Prompt tokens per forward pass (comma-separated: rows for each).
    #[arg(long, short = 'b', value_delimiter = ',', default_value = "512")]
    pub batch: Vec<usize>,
    /// Print a JSON array of rows (llama-bench's fields plus median_ts, backend, ttft_ms,
    /// tpot_ms, peak_rss_bytes) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Sequences decoding together (comma-separated: a row each): the tg rows then measure
    /// the aggregate tokens/s of N sequences taking one token each per batched step.
    #[arg(long, value_delimiter = ',')]
    pub sequences: Vec<usize>,
    /// Tokens already in each sequence's cache before the timed tg steps (one sequence unless
    /// --sequences says more; pp rows start from an empty cache).
    #[arg(long, default_value_t = 0)]
    pub depth: usize,
    /// Seed of the random token ids.
    #[arg(long, default_value_t = 1234)]
    pub seed: u64,
    /// Decode rows: after every step, the bandwidth probe reads a slice of its buffer on the
    /// same threads, timed apart from the step, so that the weights' GB/s is set against the
    /// bandwidth of the same seconds (`read_share_between`: per run, the steps' weight GB/s
    /// over the slices' GB/s; the median over the runs). Steps are timed without the slices;
    /// the buffer counts in the peak RSS.
    #[arg(long)]
    pub probe_between: bool,
    /// MiB the probe's buffer holds (--probe-between).
    #[arg(long, default_value_t = 1024, requires = "probe_between")]
    pub probe_mb: usize,
    /// MiB read after each step (--probe-between).
    #[arg(long, default_value_t = 64, requires = "probe_between")]
    pub probe_slice_mb: usize,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Test {
    Prompt(usize),
    Gen(usize),
    /// `seqs` sequences, `gen` batched steps of one token each, after `depth` tokens each.
    Multi {
        gen: usize,
        seqs: usize,
        depth: usize,
    },
}

impl Test {
    fn name(self) -> String {
        match self {
            Test::Prompt(n) => format!("pp{n}"),
            Test::Gen(n) => format!("tg{n}"),
            Test::Multi { gen, seqs, depth } => format!("tg{gen} x{seqs} @ d{depth}"),
        }
    }
    /// Decode steps of one run (0 for prompt rows).
    fn steps(self) -> usize {
        match self {
            Test::Prompt(_) => 0,
            Test::Gen(g) | Test::Multi { gen: g, .. } => g,
        }
    }

    /// Tokens one run produces (all sequences together).
    fn n_tokens(self) -> usize {
        match self {
            Test::Prompt(n) | Test::Gen(n) => n,
            Test::Multi { gen, seqs, .. } => gen * seqs,
        }
    }
    /// Context one sequence needs.
    fn n_ctx(self) -> usize {
        match self {
            Test::Prompt(n) | Test::Gen(n) => n,
            Test::Multi { gen, depth, .. } => gen + depth,
        }
    }
}

/// One timed run: total seconds and seconds to the first token (logits ready).
struct Sample {
    secs: f64,
    first_secs: f64,
    /// Bytes the probe read between the steps (`--probe-between`), and in how long.
    probe_bytes: u64,
    probe_secs: f64,
}

/// After a step: a slice of the probe, timed apart (its time comes off the run's).
fn probe_after_step(s: &Session, probe: Option<&crate::probe::Slices>, smp: &mut Sample) {
    if let Some(p) = probe {
        let (bytes, secs) = p.read(&s.host_api());
        smp.probe_bytes += bytes;
        smp.probe_secs += secs;
    }
}

fn random_tokens(rng: &mut Rng, model: &Model, n: usize) -> Vec<u32> {
    let n_vocab = model.hp.n_vocab as u64;
    let mut v: Vec<u32> = (0..n).map(|_| (rng.next_u64() % n_vocab) as u32).collect();
    if let (Some(first), Some(bos)) = (v.first_mut(), model.tokenizer.bos()) {
        if model.tokenizer.add_bos() {
            *first = bos;
        }
    }
    v
}

fn run_once(
    s: &mut Session,
    model: &Model,
    test: Test,
    rng: &mut Rng,
    probe: Option<&crate::probe::Slices>,
) -> CliResult<Sample> {
    let mut smp = Sample {
        secs: 0.0,
        first_secs: 0.0,
        probe_bytes: 0,
        probe_secs: 0.0,
    };
    s.truncate(0);
    let toks = random_tokens(rng, model, test.n_tokens());
    match test {
        Test::Prompt(_) => {
            let t0 = Instant::now();
            s.eval(&toks, true)?;
            smp.secs = t0.elapsed().as_secs_f64();
            smp.first_secs = smp.secs;
            Ok(smp)
        }
        Test::Multi { gen, seqs, depth } => {
            let mut all: Vec<engine::Sequence> =
                (0..seqs).map(|_| s.new_sequence(gen + depth)).collect();
            s.reserve_step(seqs.max(depth.min(512)), seqs);
            for q in all.iter_mut() {
                let pre = random_tokens(rng, model, depth);
                for chunk in pre.chunks(512) {
                    s.step(&mut [engine::Work {
                        seq: q,
                        tokens: chunk,
                        n_out: 0,
                    }])?;
                }
            }
            let steps: Vec<Vec<u32>> = (0..gen).map(|_| random_tokens(rng, model, seqs)).collect();
            let t0 = Instant::now();
            for (i, toks) in steps.iter().enumerate() {
                let mut work: Vec<engine::Work> = all
                    .iter_mut()
                    .zip(toks.chunks(1))
                    .map(|(seq, t)| engine::Work {
                        seq,
                        tokens: t,
                        n_out: 1,
                    })
                    .collect();
                s.step(&mut work)?;
                if i == 0 {
                    smp.first_secs = t0.elapsed().as_secs_f64();
                }
                probe_after_step(s, probe, &mut smp);
            }
            smp.secs = t0.elapsed().as_secs_f64() - smp.probe_secs;
            Ok(smp)
        }
        Test::Gen(_) => {
            let t0 = Instant::now();
            for (i, &t) in toks.iter().enumerate() {
                s.eval(&[t], true)?;
                if i == 0 {
                    smp.first_secs = t0.elapsed().as_secs_f64();
                }
                probe_after_step(s, probe, &mut smp);
            }
            smp.secs = t0.elapsed().as_secs_f64() - smp.probe_secs;
            Ok(smp)
        }
    }
}

/// GB/s of weights read at `steps_per_sec` decode steps of `bytes` each.
fn weight_gbps(bytes: u64, steps_per_sec: f64) -> f64 {
    bytes as f64 * steps_per_sec / 1e9
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

pub fn bench(a: BenchArgs) -> CliResult {
    if a.reps == 0 {
        return Err("--reps must be at least 1".into());
    }
    let mut tests: Vec<Test> = a
        .prompt_tokens
        .iter()
        .filter(|&&n| n > 0)
        .map(|&n| Test::Prompt(n))
        .collect();
    for &n in a.gen_tokens.iter().filter(|&&n| n > 0) {
        if a.sequences.is_empty() {
            // `--depth` alone (llama-bench's `-d`): one sequence, that deep.
            tests.push(match a.depth {
                0 => Test::Gen(n),
                depth => Test::Multi {
                    gen: n,
                    seqs: 1,
                    depth,
                },
            });
        }
        for &seqs in &a.sequences {
            if seqs == 0 {
                return Err("--sequences: each count must be at least 1".into());
            }
            tests.push(Test::Multi {
                gen: n,
                seqs,
                depth: a.depth,
            });
        }
    }
    if tests.is_empty() {
        return Err("nothing to measure: --prompt-tokens and --gen-tokens are all 0".into());
    }
    let base = ModelArgs {
        load: a.load.clone(),
        threads: 0,
        batch: 512,
    };
    let (_, model) = base.load()?;
    let need = tests.iter().map(|t| t.n_ctx()).max().unwrap_or(1);
    // Multi-sequence tests hold every sequence's pages at once.
    let pool = tests
        .iter()
        .map(|t| match *t {
            Test::Multi { gen, seqs, depth } => {
                seqs * (gen + depth).next_multiple_of(engine::kv::KV_PAGE)
            }
            _ => 0,
        })
        .max()
        .unwrap_or(0)
        .max(need);
    let n_ctx = base
        .n_ctx(&model, Some(need.max(1)), need)
        .map_err(|e| format!("{e} (lower --prompt-tokens / --gen-tokens)"))?;

    let mut rows = Vec::new();
    let mut rng = Rng::new(a.seed);
    let weight_bytes = weight_bytes_per_step(&model);
    if a.probe_between && weight_bytes.is_none() {
        return Err("--probe-between: a mixture-of-experts step reads only part of its weights; the share is for dense models".into());
    }
    for &threads in &a.threads {
        for &batch in &a.batch {
            let margs = ModelArgs {
                threads,
                batch,
                ..base.clone()
            };
            let mut s = margs.session_with_pool(&model, n_ctx, pool)?;
            let slices = match a.probe_between {
                true => Some(crate::probe::Slices::new(
                    a.probe_mb,
                    a.probe_slice_mb,
                    s.n_threads(),
                )?),
                false => None,
            };
            for &test in &tests {
                let probe = slices.as_ref().filter(|_| test.steps() > 0);
                let total = (a.warmup + a.reps) as u64;
                let bar = crate::progress::bar(a.load.quiet, total, &test.name());
                let mut samples = Vec::new();
                let mut before = None;
                for i in 0..a.warmup + a.reps {
                    if i == a.warmup {
                        before = s.expert_stats();
                    }
                    let smp = run_once(&mut s, &model, test, &mut rng, probe)?;
                    if i >= a.warmup {
                        samples.push(smp);
                    }
                    bar.inc(1);
                }
                bar.finish_and_clear();
                let mut r = row(&a, &model, &s, batch, test, &samples);
                if let (Some(b), Some(now)) = (before, s.expert_stats()) {
                    let tokens = (test.n_tokens() * a.reps) as f64;
                    r["experts"] = crate::common::expert_json(&b, &now, tokens);
                }
                if let (Some(bytes), Some(_)) = (weight_bytes, probe) {
                    let probe_gbps: Vec<f64> = samples
                        .iter()
                        .map(|x| x.probe_bytes as f64 / x.probe_secs.max(1e-9) / 1e9)
                        .collect();
                    let shares: Vec<f64> = samples
                        .iter()
                        .zip(&probe_gbps)
                        .map(|(x, p)| weight_gbps(bytes, test.steps() as f64 / x.secs) / p)
                        .collect();
                    r["probe_between_gbps"] = probe_gbps.into();
                    r["read_share_between"] = median(&shares).into();
                    r["read_shares_between"] = shares.into();
                }
                rows.push(r);
            }
        }
    }
    let probed = crate::probe::load_gbps();
    for r in rows.iter_mut() {
        // Decode rows: every step reads the weights once, whatever the number of sequences.
        let (Some(bytes), Some(seqs)) = (r["weight_bytes_per_step"].as_u64(), r["n_seq"].as_u64())
        else {
            continue;
        };
        if r["n_gen"].as_u64() > Some(0) {
            let steps = r["median_ts"].as_f64().unwrap_or(0.0) / seqs.max(1) as f64;
            let gbps = weight_gbps(bytes, steps);
            r["weight_read_gbps"] = gbps.into();
            r["read_share"] = probed.map(|p| gbps / p).into();
        }
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print_table(&rows);
    }
    Ok(())
}

fn row(
    a: &BenchArgs,
    model: &Model,
    s: &Session,
    batch: usize,
    test: Test,
    samples: &[Sample],
) -> serde_json::Value {
    let n = test.n_tokens() as f64;
    let ts: Vec<f64> = samples.iter().map(|x| n / x.secs).collect();
    let ns: Vec<f64> = samples.iter().map(|x| x.secs * 1e9).collect();
    let (avg_ts, stddev_ts) = mean_sd(&ts);
    let (avg_ns, stddev_ns) = mean_sd(&ns);
    let ttft: Vec<f64> = samples.iter().map(|x| x.first_secs * 1e3).collect();
    let (n_prompt, n_gen, n_seq, n_depth) = match test {
        Test::Prompt(p) => (p, 0, 1, 0),
        Test::Gen(g) => (0, g, 1, 0),
        Test::Multi { gen, seqs, depth } => (0, gen, seqs, depth),
    };
    serde_json::json!({
        "build_commit": option_env!("MOLLM_GIT_COMMIT").unwrap_or("unknown"),
        "model_filename": model.gguf.path.display().to_string(),
        "model_type": model_type(model),
        "model_size": model_size(model),
        "model_n_params": model_n_params(model),
        "n_batch": batch,
        "n_threads": s.n_threads(),
        "type_k": "f32",
        "type_v": "f32",
        "n_prompt": n_prompt,
        "n_gen": n_gen,
        "n_depth": n_depth,
        "n_seq": n_seq,
        "test_time": now_rfc3339(),
        "avg_ns": avg_ns.round() as u64,
        "stddev_ns": stddev_ns.round() as u64,
        "avg_ts": avg_ts,
        "stddev_ts": stddev_ts,
        "samples_ns": ns.iter().map(|x| x.round() as u64).collect::<Vec<_>>(),
        "samples_ts": ts,
        "median_ts": median(&ts),
        "backend": s.backend_names().join(","),
        "ttft_ms": median(&ttft),
        "tpot_ms": 1e3 / median(&ts),
        "peak_rss_bytes": peak_rss_bytes(),
        "weight_bytes_per_step": weight_bytes_per_step(model),
        "state_bytes_per_sequence": s.kv_pool().state_values() * 4,
        "warmup": a.warmup,
        "reps": a.reps,
    })
}

/// Bytes of weights one decode step reads: every weight tensor once (matrices and norms), the
/// token embeddings only as the output matrix when the model ties them (a step takes just
/// its tokens' rows otherwise). `None` for mixture-of-experts models, whose experts a step
/// reads only in part.
fn weight_bytes_per_step(model: &Model) -> Option<u64> {
    let ts = &model.gguf.tensors;
    if ts.iter().any(|t| t.name.contains("_exps")) {
        return None;
    }
    let tied = !ts.iter().any(|t| t.name == "output.weight");
    Some(
        ts.iter()
            .filter(|t| tied || t.name != "token_embd.weight")
            .map(|t| t.size)
            .sum(),
    )
}

fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// The expert-cache line of each row that has one (MoE models with a cache).
fn print_expert_table(rows: &[serde_json::Value]) {
    if rows.iter().all(|r| r.get("experts").is_none()) {
        return;
    }
    println!();
    println!(
        "| test | expert cache | policy | prefetch | acquires | hit rate | evictions | MB read / token | reads | read ms | waited ms | prefetched | useful | accuracy |"
    );
    println!(
        "| ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for r in rows {
        let Some(e) = r.get("experts") else { continue };
        let pct = |k: &str| 100.0 * e[k].as_f64().unwrap_or(0.0);
        println!(
            "| {} | {} slots x {} | {} | {} | {} | {:.1}% | {} | {:.2} | {} | {:.1} | {:.1} | {} | {} | {:.1}% |",
            test_name(r),
            e["slots"],
            human_bytes(e["slot_bytes"].as_u64().unwrap_or(0)),
            e["policy"].as_str().unwrap_or(""),
            prefetch_cell(e),
            e["acquires"],
            pct("hit_rate"),
            e["evictions"],
            e["bytes_read_per_token"].as_f64().unwrap_or(0.0) / 1e6,
            e["reads"],
            e["read_ms"].as_f64().unwrap_or(0.0),
            e["wait_ms"].as_f64().unwrap_or(0.0),
            e["prefetches"],
            e["prefetch_useful"],
            pct("prediction_accuracy"),
        );
    }
}

/// "off", "on", or "auto" with the decode passes the back-off ran without prefetch.
fn prefetch_cell(e: &serde_json::Value) -> String {
    match (e["prefetch"].as_bool(), e["prefetch_auto"].as_bool()) {
        (Some(true), Some(true)) => format!(
            "auto (off {} of {} passes)",
            e["backoff_passes"], e["decode_passes"]
        ),
        (Some(true), _) => "on".into(),
        _ => "off".into(),
    }
}

fn test_name(r: &serde_json::Value) -> String {
    if r["n_prompt"].as_u64() > Some(0) {
        format!("pp{}", r["n_prompt"])
    } else if r["n_seq"].as_u64() > Some(1) || r["n_depth"].as_u64() > Some(0) {
        format!("tg{} x{} @ d{}", r["n_gen"], r["n_seq"], r["n_depth"])
    } else {
        format!("tg{}", r["n_gen"])
    }
}

fn print_table(rows: &[serde_json::Value]) {
    println!(
        "| model | size | params | backend | threads | n_batch | test | t/s | median t/s | ttft ms | ms/token | peak RSS | weights GB/s |"
    );
    println!("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in rows {
        let test = test_name(r);
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.2} ± {:.2} | {:.2} | {:.1} | {:.2} | {} | {} |",
            r["model_type"].as_str().unwrap_or(""),
            human_bytes(r["model_size"].as_u64().unwrap_or(0)),
            human_count(r["model_n_params"].as_u64().unwrap_or(0)),
            r["backend"].as_str().unwrap_or(""),
            r["n_threads"],
            r["n_batch"],
            test,
            r["avg_ts"].as_f64().unwrap_or(0.0),
            r["stddev_ts"].as_f64().unwrap_or(0.0),
            r["median_ts"].as_f64().unwrap_or(0.0),
            r["ttft_ms"].as_f64().unwrap_or(0.0),
            r["tpot_ms"].as_f64().unwrap_or(0.0),
            human_bytes(r["peak_rss_bytes"].as_u64().unwrap_or(0)),
            match (r["weight_read_gbps"].as_f64(), r["read_share"].as_f64()) {
                (Some(g), Some(s)) => format!("{g:.1} ({:.0}%)", 100.0 * s),
                (Some(g), None) => format!("{g:.1}"),
                _ => "-".into(),
            },
        );
    }
    for r in rows.iter().filter(|r| r["read_share_between"].is_f64()) {
        let pct = |v: &serde_json::Value| match v.as_f64() {
            Some(x) => format!("{:.1}%", 100.0 * x),
            None => "-".into(),
        };
        let list = |v: &serde_json::Value, f: &dyn Fn(&serde_json::Value) -> String| {
            v.as_array()
                .map(|a| a.iter().map(f).collect::<Vec<_>>().join(", "))
                .unwrap_or_default()
        };
        println!(
            "{}: weights at {} of the probe read between the steps (median; runs {}; probe {} GB/s)",
            test_name(r),
            pct(&r["read_share_between"]),
            list(&r["read_shares_between"], &pct),
            list(&r["probe_between_gbps"], &|v| format!("{:.1}", v.as_f64().unwrap_or(0.0))),
        );
    }
    let decode = rows.iter().any(|r| r["weight_read_gbps"].is_f64());
    if decode && rows.iter().all(|r| r["read_share"].is_null()) {
        println!("weights GB/s: weight bytes read per decode step x steps/s; `mollm devices --probe` measures this machine's read bandwidth once, and the share of it is shown from then on");
    }
    if let Some(b) = rows
        .first()
        .and_then(|r| r["state_bytes_per_sequence"].as_u64())
        .filter(|&b| b > 0)
    {
        println!(
            "recurrent state: {} per sequence (beside the KV cache)",
            human_bytes(b)
        );
    }
    print_expert_table(rows);
}
