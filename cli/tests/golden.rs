//! Greedy parity with llama.cpp: `mollm run --json` must produce exactly the token ids that
//! llama.cpp produced for the same prompt (fixtures/golden/*.json, made by
//! scripts/golden/make_golden.py; its configuration is recorded in each file).
//!
//! Models come from the model cache (scripts/fetch-models.sh). A missing model skips its test
//! with a note, unless MOLLM_REQUIRE_MODELS=1 (CI sets it), where it fails.
//!
//! The mixture-of-experts models derived from SmolLM2 (Mixtral-style llama, 8 experts, top 2)
//! and Qwen2.5-0.5B (qwen2moe, 4 experts, top 2, shared expert) by scripts/make_moe_models.py
//! are made on first use (scripts/make-moe-models.sh); their golden files record the derived
//! file's sha256.
//!
//! Every native backend runs every case. The reference backend (scalar: 1.4 to 7 tokens/s
//! with 2 cores, and a prompt of a few hundred tokens costs it a minute) runs the prompts of at
//! most [`REFERENCE_MAX_PROMPT`] tokens (five or six of each model's eight or nine cases; three
//! on the 1.5B, [`REFERENCE_MAX_PROMPT_QWEN15`]): the long ones cost it about seven minutes of
//! CI, and the native backends, which the conformance gate holds bit-identical to it op by op,
//! run them on all four models (Gemma's past its sliding window). `MOLLM_GOLDEN_MAX_PROMPT=N`
//! applies such a limit to every backend (the ARM stage under emulation, where a long prompt
//! costs minutes: scripts/arm-test.sh). On the derived
//! MoE models the reference runs the cases of [`REFERENCE_MOE_CASES`] only (the routing is
//! engine code that every backend shares; its expert matmuls are ordinary mat_mul calls),
//! every native backend all cases in one `mollm batch`, and the first one SmolLM2-MoE's cases
//! one by one too.

mod common;

use common::{repo, test_backends as backends};
use serde_json::Value;
use std::process::Command;

/// The longest prompt the reference backend runs (see the module comment).
const REFERENCE_MAX_PROMPT: usize = 64;
/// The same on Qwen2.5-Coder-1.5B, where the reference decodes 1.4 tokens/s (2 cores): its
/// three shortest cases (Q4_K and Q6_K, every op of the model) instead of six cost CI about
/// 100 s less; the native backends run all eight.
const REFERENCE_MAX_PROMPT_QWEN15: usize = 16;
const REFERENCE_MOE_CASES: &[&str] = &["short-en"];

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

fn check_model(key: &str) {
    let golden_path = repo().join(format!("fixtures/golden/{key}.json"));
    let golden: Value =
        serde_json::from_slice(&std::fs::read(&golden_path).expect("golden file")).unwrap();
    let Some(model) = common::model(golden["model_file"].as_str().unwrap()) else {
        return;
    };
    if key.ends_with("-moe") {
        let want = golden["model_sha256"].as_str().unwrap_or("");
        let o = Command::new("sha256sum")
            .arg(&model)
            .output()
            .expect("sha256sum");
        let got = String::from_utf8_lossy(&o.stdout);
        assert!(
            got.starts_with(want),
            "{}: sha256 {got} is not the golden file's {want} (scripts/make_moe_models.py changed? \
             remake the model with --force and the golden with scripts/golden/make_golden.py {key})",
            model.display()
        );
    }
    let cases = golden["cases"].as_array().unwrap();
    let mut failures = Vec::new();
    let mut runs = 0;
    let all = backends();
    let first_native = all.iter().find(|b| *b != "reference").cloned();
    let max_prompt = abi::settings::GOLDEN_MAX_PROMPT
        .int()
        .unwrap_or_else(|e| panic!("{e}"))
        .map_or(usize::MAX, |v| v as usize);
    for backend in all {
        let limit = match backend.as_str() {
            "reference" if key == "qwen15" => max_prompt.min(REFERENCE_MAX_PROMPT_QWEN15),
            "reference" => max_prompt.min(REFERENCE_MAX_PROMPT),
            _ => max_prompt,
        };
        for case in cases {
            let name = case["name"].as_str().unwrap();
            if ids(&case["prompt_tokens"]).len() > limit {
                eprintln!("{key}/{name} on {backend}: skipped (prompt over {limit} tokens)");
                continue;
            }
            if backend == "reference"
                && key.ends_with("-moe")
                && !REFERENCE_MOE_CASES.contains(&name)
            {
                eprintln!("{key}/{name} on reference: skipped (MoE: {REFERENCE_MOE_CASES:?} only)");
                continue;
            }
            if key.ends_with("-moe")
                && backend != "reference"
                && (key == "qwen05-moe" || Some(&backend) != first_native.as_ref())
            {
                // The native backends run every case batched (below); one by one only
                // SmolLM2-MoE's on the first (the larger model's cost CI a minute).
                continue;
            }
            runs += 1;
            if let Err(e) = check_case(key, &model, &backend, case, &[]) {
                failures.push(e);
            }
        }
    }
    if key.ends_with("-moe") {
        // Experts through a cache of about a tenth of the file (every miss read from the disk:
        // kept to the short case, and to SmolLM2's for batches): the same tokens; LRU and no
        // prefetch on one backend; a one-slot cache (a route larger than the cache: waves).
        // On the larger model (disk-bound at 1-2 tokens/s when cached: each run costs CI about
        // 25 s) the cache runs on the native backends only, whose repacks land in cache slots
        // (the reference's numerics are its resident run above; the cache policies, engine
        // code shared by every model, run on SmolLM2's), and batches run resident.
        let mb = ((std::fs::metadata(&model).unwrap().len() / 10) >> 20).to_string();
        let cache = ["--expert-cache", mb.as_str()];
        let lru = ["--expert-cache", mb.as_str(), "--cache-policy", "lru"];
        let short = &cases[0];
        let natives: Vec<String> = backends()
            .into_iter()
            .filter(|b| b != "reference")
            .collect();
        let mut check = |backend: &str, extra: &[&str], batched: bool| {
            runs += 1;
            let r = if batched {
                check_batched(key, &model, backend, cases, extra)
            } else {
                check_case(key, &model, backend, short, extra).map(|_| ())
            };
            if let Err(e) = r {
                failures.push(format!("{e} (with {extra:?})"));
            }
        };
        for backend in backends() {
            if key == "smollm2-moe" || backend != "reference" {
                check(&backend, &cache, false);
            }
        }
        let no_prefetch = ["--expert-cache", mb.as_str(), "--no-prefetch"];
        if let Some(b) = natives.first().filter(|_| key == "smollm2-moe") {
            check(b, &lru, false);
            check(b, &no_prefetch, false);
        }
        for b in &natives {
            if key == "smollm2-moe" {
                check(b, &cache, true);
            } else {
                check(b, &[], true);
            }
        }
        if key == "smollm2-moe" {
            check("auto", &["--expert-cache", "1"], false);
        }
    }
    assert!(
        failures.is_empty(),
        "{key}: {} of {runs} runs differ from llama.cpp:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// All cases in one `mollm batch --parallel 4` (prompt chunks mixed with other sequences'
/// decode steps, experts shared by the tokens of several sequences): each equals llama.cpp.
fn check_batched(
    key: &str,
    model: &std::path::Path,
    backend: &str,
    cases: &[Value],
    extra: &[&str],
) -> Result<(), String> {
    let mut jsonl = String::new();
    for (i, c) in cases.iter().enumerate() {
        let line = serde_json::json!({
            "id": i,
            "prompt_ids": c["prompt_tokens"],
            "max_tokens": ids(&c["tokens"]).len(),
        });
        jsonl.push_str(&format!("{line}\n"));
    }
    let input = common::tmp(&format!("golden-{key}-{backend}.jsonl"), jsonl.as_bytes());
    let out = Command::new(env!("CARGO_BIN_EXE_mollm"))
        .args(["batch", "--parallel", "4", "--ctx", "4096", "-t", "2"])
        .args(["--temperature", "0", "--backend", backend, "-m"])
        .arg(model)
        .arg("-i")
        .arg(&input)
        .args(extra)
        .output()
        .expect("run mollm batch");
    if !out.status.success() {
        return Err(format!(
            "{key} batched on {backend}: mollm batch failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut bad = Vec::new();
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).map_err(|e| format!("{key}: {e}: {line}"))?;
        let i = v["id"].as_u64().unwrap_or(u64::MAX) as usize;
        let Some(c) = cases.get(i) else {
            return Err(format!(
                "{key} batched on {backend}: bad result line {line}"
            ));
        };
        let got = v.get("tokens").map(ids);
        if got.as_ref() != Some(&ids(&c["tokens"])) {
            bad.push(format!(
                "{}: mollm {:?}, llama.cpp {:?}",
                c["name"],
                got.unwrap_or_default(),
                ids(&c["tokens"])
            ));
        }
    }
    if text.lines().count() != cases.len() || !bad.is_empty() {
        return Err(format!(
            "{key} batched on {backend}: {} result lines for {} cases; differing: {}",
            text.lines().count(),
            cases.len(),
            bad.join("; ")
        ));
    }
    eprintln!("{key} batched on {backend}: {} cases equal", cases.len());
    Ok(())
}

fn check_case(
    key: &str,
    model: &std::path::Path,
    backend: &str,
    case: &Value,
    extra: &[&str],
) -> Result<Value, String> {
    check_case_env(key, model, backend, case, extra, &[])
}

/// [`check_case`] with environment variables set for the run.
fn check_case_env(
    key: &str,
    model: &std::path::Path,
    backend: &str,
    case: &Value,
    extra: &[&str],
    envs: &[(&str, &str)],
) -> Result<Value, String> {
    let name = case["name"].as_str().unwrap();
    let want = ids(&case["tokens"]);
    let out = Command::new(env!("CARGO_BIN_EXE_mollm"))
        .envs(envs.iter().copied())
        .args([
            "run",
            "--json",
            "--temperature",
            "0",
            "--threads",
            "2",
            "--ctx",
            "2048",
        ])
        .args(["--backend", backend])
        .arg("--model")
        .arg(model)
        .args(["--max-tokens", &want.len().to_string()])
        .args(["--prompt", case["prompt"].as_str().unwrap()])
        .args(extra)
        .output()
        .expect("run mollm");
    if !out.status.success() {
        return Err(format!(
            "{name} on {backend}: mollm failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let got: Value = serde_json::from_slice(&out.stdout).expect("json output");
    let got_prompt = ids(&got["prompt_tokens"]);
    let want_prompt = ids(&case["prompt_tokens"]);
    if got_prompt != want_prompt {
        return Err(format!(
            "{name}: prompt tokens differ\n  mollm: {got_prompt:?}\n  llama: {want_prompt:?}"
        ));
    }
    let got_tokens = ids(&got["tokens"]);
    if got_tokens != want {
        let at = got_tokens
            .iter()
            .zip(&want)
            .position(|(a, b)| a != b)
            .unwrap_or(got_tokens.len().min(want.len()));
        return Err(format!(
            "{name} on {backend}: generated tokens differ at {at}\n  mollm: {got_tokens:?}\n  llama: {want:?}\n  mollm text: {:?}",
            got["text"]
        ));
    }
    eprintln!(
        "{key}/{name} on {backend}: {} tokens equal ({:.1} tok/s decode)",
        want.len(),
        got["timings"]["decode_tokens_per_s"]
            .as_f64()
            .unwrap_or(0.0)
    );
    Ok(got)
}

#[test]
fn golden_smollm2() {
    check_model("smollm2");
}

#[test]
fn golden_qwen05() {
    check_model("qwen05");
}

#[test]
fn golden_gemma3() {
    check_model("gemma3");
}

#[test]
fn golden_qwen15() {
    check_model("qwen15");
}

#[test]
fn golden_smollm2_moe() {
    check_model("smollm2-moe");
    // A cache the machine cannot hold is refused before anything runs, naming the sizes.
    if let Some(m) = common::model("derived/smollm2-moe8.gguf") {
        let o = Command::new(env!("CARGO_BIN_EXE_mollm"))
            .args([
                "run",
                "--prompt",
                "Hi",
                "--max-tokens",
                "1",
                "--expert-cache",
            ])
            .arg((1u64 << 40).to_string())
            .arg("-m")
            .arg(&m)
            .output()
            .unwrap();
        common::assert_clean_error(&o, "does not fit");
        prefetch_and_trace(&m);
        package_of_moe(&m);
    }
}

/// Matmul calls per weight format, repacked or not (`MOLLM_PROFILE=1`'s table).
fn profile_formats(model: &std::path::Path, backend: &str, extra: &[&str]) -> Vec<(String, u64)> {
    let o = Command::new(env!("CARGO_BIN_EXE_mollm"))
        .env("MOLLM_PROFILE", "1")
        .env("MOLLM_SLOT_REPACK_AFTER", "0")
        .args([
            "run",
            "--temperature",
            "0",
            "--max-tokens",
            "8",
            "--threads",
            "2",
        ])
        .args(["--prompt", "The capital of France is", "--backend", backend])
        .arg("--model")
        .arg(model)
        .args(extra)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stderr);
    let mut lines = text.lines().skip_while(|l| !l.starts_with("mat_mul"));
    lines.next();
    lines
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| {
            let (fmt, rest) = l.trim().split_once(&format!(" {backend}"))?;
            let calls = rest.split_whitespace().next()?.parse().ok()?;
            Some((fmt.trim().to_string(), calls))
        })
        .collect()
}

/// Experts in cache slots are repacked wherever their resident copies are: every format the
/// resident run multiplies only repacked, a cache holding every expert multiplies mostly
/// repacked too (an expert's first use in its slot runs the file's layout, the later ones
/// its repack).
fn slot_repacks(model: &std::path::Path, backend: &str) {
    let resident = profile_formats(model, backend, &[]);
    let cached = profile_formats(model, backend, &["--expert-cache", "2000"]);
    assert!(!resident.is_empty(), "no mat_mul profile");
    let calls =
        |p: &[(String, u64)], f: &str| p.iter().filter(|x| x.0 == f).map(|x| x.1).sum::<u64>();
    for (fmt, _) in resident.iter().filter(|(f, _)| f.ends_with("(repacked)")) {
        let raw = fmt.trim_end_matches("(repacked)").trim();
        if calls(&resident, raw) > 0 {
            continue;
        }
        assert!(
            calls(&cached, fmt) > calls(&cached, raw),
            "{backend}: {raw} weights in cache slots not repacked: resident {resident:?}, cached {cached:?}"
        );
    }
}

/// A `.mollm` package of the MoE file (`convert --quant keep`: the same bits) interleaves each
/// expert's gate, up and down: resident (3-D weights whose experts are a block apart) and
/// through the cache, the same tokens as llama.cpp, and one read fetches a whole expert where
/// the GGUF takes one per matrix.
fn package_of_moe(gguf: &std::path::Path) {
    let golden: Value = serde_json::from_slice(
        &std::fs::read(repo().join("fixtures/golden/smollm2-moe.json")).unwrap(),
    )
    .unwrap();
    let short = &golden["cases"][0];
    let pkg = common::scratch().join("golden-moe.mollm");
    let o = Command::new(env!("CARGO_BIN_EXE_mollm"))
        .args(["convert", "--quant", "keep"])
        .arg(gguf)
        .arg(&pkg)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "convert: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let mb = ((std::fs::metadata(gguf).unwrap().len() / 10) >> 20).to_string();
    let cache = ["--expert-cache", mb.as_str(), "--no-prefetch"];
    // One slot: every expert lands at the same address (a package's experts all start
    // 4096-aligned), so a repack kept from the slot's last tenant would run on the next.
    let one_slot = ["--expert-cache", "1", "--no-prefetch"];
    let native = backends().into_iter().find(|b| b != "reference");
    let mut failures = Vec::new();
    let mut reads = Vec::new();
    // The reference (slow on a MoE) runs the strided 3-D weights resident only.
    let runs = native
        .iter()
        .flat_map(|b| [&[][..], &cache[..], &one_slot[..]].map(|e| (b.as_str(), e)))
        .chain([("reference", &[][..])]);
    // Slot repacks at an expert's first use (the reference has none to make).
    let slot = [("MOLLM_SLOT_REPACK_AFTER", "0")];
    for (backend, extra) in runs {
        match check_case_env("smollm2-moe.mollm", &pkg, backend, short, extra, &slot) {
            Ok(v) if !extra.is_empty() => reads.push((
                v["experts"]["reads"].as_u64().unwrap(),
                v["experts"]["misses"].as_u64().unwrap(),
            )),
            Ok(_) => {}
            Err(e) => failures.push(format!("{e} (with {extra:?})")),
        }
    }
    let gguf_run = check_case(
        "smollm2-moe",
        gguf,
        native.as_deref().unwrap_or("reference"),
        short,
        &cache,
    )
    .unwrap();
    if let Some(b) = &native {
        slot_repacks(&pkg, b);
    }
    let _ = std::fs::remove_file(&pkg);
    assert!(
        failures.is_empty(),
        "the package differs from llama.cpp:\n{}",
        failures.join("\n")
    );
    // Buffered reads (a file system without O_DIRECT) may merge neighbours: at most one each.
    for (r, m) in reads {
        assert!(
            m > 0 && r <= m,
            "package: {r} reads for {m} missed experts (want one each)"
        );
    }
    let (r, m) = (
        gguf_run["experts"]["reads"].as_u64().unwrap(),
        gguf_run["experts"]["misses"].as_u64().unwrap(),
    );
    if gguf_run["experts"]["direct"] == true {
        assert_eq!(r, 3 * m, "GGUF, direct: a read per matrix");
    }
}

/// Next-layer prefetch raises the hit rate of a cache of a quarter of the experts (room for
/// stale entries, the only ones a prefetch may take), its
/// predictions are mostly right, and `--trace` writes a Chrome trace with the layers, each
/// read on an I/O worker's thread, and flows from predictions to the reads they queued.
fn prefetch_and_trace(model: &std::path::Path) {
    let trace = common::scratch().join("trace.json");
    let run_n = |n: &str, extra: &[&str]| -> Value {
        let o = Command::new(env!("CARGO_BIN_EXE_mollm"))
            .args([
                "run",
                "--json",
                "-q",
                "--ignore-eos",
                "--max-tokens",
                n,
                "--expert-cache",
                "100",
            ])
            .args(["--prompt", "The history of the printing press"])
            .args(extra)
            .arg("-m")
            .arg(model)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let out = String::from_utf8_lossy(&o.stdout);
        serde_json::from_str(out.lines().last().unwrap()).unwrap()
    };
    let run = |extra: &[&str]| run_n("12", extra);
    let on = run(&["--prefetch", "on", "--trace", trace.to_str().unwrap()]);
    let off = run(&["--no-prefetch"]);
    assert_eq!(on["tokens"], off["tokens"], "prefetch changed the tokens");
    let (e_on, e_off) = (&on["experts"]["decode"], &off["experts"]["decode"]);
    let hit = |e: &Value| e["hit_rate"].as_f64().unwrap();
    assert!(
        hit(e_on) > hit(e_off) + 0.2,
        "decode hit rate with prefetch {} vs without {}",
        hit(e_on),
        hit(e_off)
    );
    assert!(
        e_on["prediction_accuracy"].as_f64().unwrap() > 0.4,
        "{e_on}"
    );
    assert!(e_on["prefetch_useful"].as_u64().unwrap() > 0, "{e_on}");
    assert_eq!(e_off["prefetches"], 0);
    assert_eq!(
        on["experts"]["backoff_passes"], 0,
        "--prefetch on never backs off"
    );

    // The default back-off: after its warm-up passes it probes (a few passes without
    // prefetch, whatever it then decides), and the tokens stay the same.
    let warm = engine::experts::backoff::HOLD + 2 * engine::experts::backoff::PROBE;
    let n = (warm + 4).to_string();
    let auto = run_n(&n, &[]);
    let fixed = run_n(&n, &["--prefetch", "on"]);
    assert_eq!(
        auto["tokens"], fixed["tokens"],
        "the back-off changed the tokens"
    );
    let e = &auto["experts"];
    assert_eq!(e["prefetch_auto"], true, "{e}");
    assert!(e["decode_passes"].as_u64() >= Some(warm as u64), "{e}");
    assert!(
        e["backoff_passes"].as_u64() >= Some(engine::experts::backoff::PROBE as u64),
        "{e}"
    );
    assert_eq!(fixed["experts"]["backoff_passes"], 0);

    let t: Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    // The routes replayed against Belady's MIN and LRU: MIN hits at least as often as LRU,
    // and more slots never hit less.
    let o = Command::new("python3")
        .arg(repo().join("scripts/moe_cache_bound.py"))
        .arg(&trace)
        .args(["--slots", "4,16,64"])
        .output()
        .expect("python3");
    let _ = std::fs::remove_file(&trace);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let rates: Vec<(f64, f64)> = out
        .lines()
        .filter(|l| l.starts_with("| ") && l[2..].starts_with(|c: char| c.is_ascii_digit()))
        .map(|l| {
            let c: Vec<&str> = l.split('|').map(str::trim).collect();
            let pct = |s: &str| s.trim_end_matches('%').parse::<f64>().unwrap();
            (pct(c[3]), pct(c[4]))
        })
        .collect();
    assert_eq!(rates.len(), 3, "{out}");
    assert!(rates.iter().all(|&(min, lru)| min >= lru), "{out}");
    assert!(rates.windows(2).all(|w| w[1].0 >= w[0].0), "{out}");
    assert!(rates[2].0 > rates[0].0, "{out}");
    let ev = t["traceEvents"].as_array().unwrap();
    let has = |f: &dyn Fn(&Value) -> bool| ev.iter().any(f);
    let name = |e: &Value| e["name"].as_str().unwrap_or("").to_string();
    assert!(has(&|e| e["ph"] == "X"
        && name(e).starts_with("moe L")
        && e["tid"] == 0));
    // Each MoE layer's span carries its step's route (what scripts/moe_cache_bound.py
    // replays): distinct experts in order, as many as it says; a one-token decode step's
    // route is the model's top 2 (make_moe_models.py's n_used).
    let spans: Vec<&Value> = ev.iter().filter(|e| name(e).starts_with("moe L")).collect();
    for e in &spans {
        let a = &e["args"];
        let route: Vec<u64> = a["route"]
            .as_array()
            .unwrap_or_else(|| panic!("no route: {e}"))
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        assert_eq!(Some(route.len() as u64), a["experts"].as_u64(), "{e}");
        assert!(route.windows(2).all(|w| w[0] < w[1]), "{e}");
        if a["decode"] == true && a["tokens"] == 1 {
            assert_eq!(route.len(), 2, "{e}");
        }
    }
    assert!(
        spans.iter().any(|e| e["args"]["decode"] == true),
        "no decode step traced"
    );
    assert!(
        spans.iter().any(|e| e["args"]["decode"] == false),
        "no prompt step traced"
    );
    for kind in ["demand", "prefetch"] {
        assert!(
            has(&|e| e["ph"] == "X" && e["cat"] == kind && e["tid"].as_u64() >= Some(1)),
            "no {kind} read on an I/O worker thread"
        );
    }
    let starts: Vec<&Value> = ev
        .iter()
        .filter(|e| e["ph"] == "s")
        .map(|e| &e["id"])
        .collect();
    assert!(!starts.is_empty(), "no prediction flow");
    assert!(
        ev.iter()
            .any(|e| e["ph"] == "f" && starts.contains(&&e["id"])),
        "no flow ends at a read"
    );
    assert!(has(
        &|e| e["ph"] == "M" && e["args"]["name"] == "io worker 0"
    ));
}

#[test]
fn golden_qwen05_moe() {
    check_model("qwen05-moe");
}
