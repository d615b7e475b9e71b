#!/usr/bin/env python3
"""Side-by-side speed of mollm and llama.cpp on the same GGUF files, in one run.

Protocol (printed with the table): both sides measure the llama-bench way. `mollm bench` and
`llama-bench` each run, per model, prompt processing of --prompt-tokens random token ids from an
empty context (pp) and generation of --gen single-token steps from an empty context (tg), with
--threads threads, warm-up first (mollm: --warmup runs per row; llama-bench: its own warm-up
run), then --reps measured runs; the figure is the median tokens/s of those runs. mollm runs
--backend (default auto) with its F32 KV cache; llama-bench runs its default configuration
(F16 KV cache, flash attention auto, CPU repack on): what a llama.cpp user gets (llama-bench
cannot use an F32 cache). Run it on a quiet machine: under load llama.cpp's spinning threads
lose far more than mollm's, and the ratios mean nothing.

With --convert MODE each model is also converted (`mollm convert --quant MODE`, into
~/.cache/mollm/converted/) and the package is measured by mollm in the same run, next to its
source GGUF on both engines.

With --depth D a third row per model, `tg{gen} @ d{D}`: generation with D tokens already in the
cache (mollm `bench -p 0 --sequences 1 --depth D`, llama-bench `-p 0 -d D`; the D-token prefill
is not timed on either side).

Usage: scripts/bench_compare.py --model A.gguf [--model B.gguf ...] [--prompt-tokens 256]
       [--gen 64] [--reps 5] [--warmup 1] [--threads 2] [--backend auto] [--llama-bench PATH]
       [--depth 2048] [--convert w4g128] [--baseline OLD/mollm] [--rounds 3] [--kv-type f16]
With --kv-type f16 mollm runs an F16 KV cache (half the bytes per row: what llama.cpp keeps by
default; mollm still computes llama.cpp's non-flash chain on it).
With --rounds R mollm and llama.cpp (or the two builds) alternate R times: figures are medians
over the rounds, and the per-round ratios are printed in a comment under each model.
mollm is target/release/mollm (or $CARGO_TARGET_DIR/release/mollm); llama-bench is --llama-bench,
then PATH, then ~/.cache/mollm/llama.cpp-build/bin/llama-bench (scripts/build-llama-cpp.sh).
"""
import argparse, json, os, shutil, statistics, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def mollm_exe():
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
    return os.path.join(target, "release", "mollm")


def median_ts(row):
    s = row.get("samples_ts")
    return statistics.median(s) if s else row["avg_ts"]


def bench_json(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def gen_row(rows):
    return next(r for r in rows if r["n_gen"] > 0)


def mollm_bench(a, model, args, exe=None):
    return bench_json([exe or mollm_exe(), "bench", "-m", model, *args, "--warmup", str(a.warmup),
                       "--reps", str(a.reps), "--threads", str(a.threads), "--backend", a.backend,
                       "--kv-type", a.kv_type, "--json", "--quiet"])


def llama_bench(a, model, args):
    """llama-bench's rows, or None where it is not built."""
    exe = a.llama_bench or shutil.which("llama-bench") or os.path.expanduser(
        "~/.cache/mollm/llama.cpp-build/bin/llama-bench")
    if not os.path.exists(exe):
        return None
    return bench_json([exe, "-m", model, *args, "-t", str(a.threads), "-r", str(a.reps), "-o", "json"])


def mollm_rows(a, model, exe=None):
    rows = mollm_bench(a, model, ["-p", str(a.prompt_tokens), "-n", str(a.gen)], exe)
    pp = next(r for r in rows if r["n_prompt"] > 0)
    return median_ts(pp), median_ts(gen_row(rows)), pp["backend"]


def mollm_depth(a, model):
    """tg --gen with --depth tokens already in the cache (one sequence)."""
    rows = mollm_bench(a, model, ["-p", "0", "-n", str(a.gen), "--sequences", "1", "--depth", str(a.depth)])
    return median_ts(gen_row(rows))


def llama_depth(a, model):
    rows = llama_bench(a, model, ["-p", "0", "-n", str(a.gen), "-d", str(a.depth)])
    return median_ts(gen_row(rows)) if rows else None


def llama_rows(a, model):
    rows = llama_bench(a, model, ["-p", str(a.prompt_tokens), "-n", str(a.gen)])
    if rows is None:
        return None
    pp = next(r for r in rows if r["n_prompt"] > 0)
    return median_ts(pp), median_ts(gen_row(rows))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", action="append", required=True)
    p.add_argument("--backend", default="auto")
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--gen", type=int, default=64)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--llama-bench")
    p.add_argument("--kv-type", choices=["f32", "f16"], default="f32",
                   help="mollm's K/V cache format (f16: the same bytes per row as llama-bench's default cache)")
    p.add_argument("--depth", type=int, default=0,
                   help="also tg --gen with this many tokens already in the cache (llama-bench -d)")
    p.add_argument("--convert")
    p.add_argument("--baseline", help="another mollm binary (an older build), measured in the same run, "
                   "interleaved with this one: rows say new / baseline")
    p.add_argument("--rounds", type=int, default=1, help="alternate mollm and llama.cpp (or, with --baseline, the two builds) this many times")
    a = p.parse_args()
    print(f"pp{a.prompt_tokens} and tg{a.gen} from an empty context, random token ids, {a.threads} threads, "
          f"warm-up then {a.reps} runs, median tokens/s, {a.rounds} interleaved round(s), median over rounds; mollm --backend {a.backend} ({a.kv_type.upper()} KV cache), "
          f"llama-bench defaults (F16 KV cache, flash attention auto)")
    print()
    if a.convert:
        return with_packages(a)
    if a.baseline:
        return against_baseline(a)
    print("| model | test | mollm t/s | llama.cpp t/s | mollm / llama.cpp |")
    print("|---|---|---:|---:|---:|")
    for model in a.model:
        # Rounds alternate mollm and llama.cpp (mollm, llama, mollm, llama, ...) so that a
        # shared machine's slow minutes hit both; each figure is the median over the rounds of
        # each run's median, and the per-round ratios are printed beside the table.
        mr, lr, dr = [], [], []
        for _ in range(a.rounds):
            m_pp, m_tg, backend = mollm_rows(a, model)
            mr.append((m_pp, m_tg))
            ll = llama_rows(a, model)
            if ll:
                lr.append(ll)
            if a.depth:
                dr.append((mollm_depth(a, model), llama_depth(a, model)))
        med = lambda xs, i: statistics.median(x[i] for x in xs) if xs and all(x[i] for x in xs) else None
        name = os.path.basename(model)
        rows = [(f"pp{a.prompt_tokens}", med(mr, 0), med(lr, 0)),
                (f"tg{a.gen}", med(mr, 1), med(lr, 1))]
        if a.depth:
            rows.append((f"tg{a.gen} @ d{a.depth}", med(dr, 0), med(dr, 1)))
        for test, m, l in rows:
            ls = f"{l:.2f}" if l else "n/a"
            ratio = f"{m / l:.2f}" if l else "n/a"
            print(f"| {name} | {test} | {m:.2f} | {ls} | {ratio} |", flush=True)
        if a.rounds > 1 and lr:
            per = "; ".join(f"pp {m[0] / l[0]:.2f} tg {m[1] / l[1]:.2f}" for m, l in zip(mr, lr))
            print(f"<!-- {name}: per-round mollm / llama.cpp: {per} -->", flush=True)
        print(f"<!-- {name}: mollm backends {backend} -->", flush=True)


def against_baseline(a):
    """This build against an older one, interleaved (baseline, new, baseline, new, ...), so drift
    hits both alike; each figure is the median over the rounds of each run's median."""
    print(f"| model | test | baseline t/s | this build t/s | this / baseline |")
    print("|---|---|---:|---:|---:|")
    for model in a.model:
        runs = {"base": [], "new": []}
        for _ in range(a.rounds):
            runs["base"].append(mollm_rows(a, model, a.baseline))
            runs["new"].append(mollm_rows(a, model))
        name = os.path.basename(model)
        for i, test in [(0, f"pp{a.prompt_tokens}"), (1, f"tg{a.gen}")]:
            b = statistics.median(r[i] for r in runs["base"])
            n = statistics.median(r[i] for r in runs["new"])
            print(f"| {name} | {test} | {b:.2f} | {n:.2f} | {n / b:.2f} |", flush=True)


def with_packages(a):
    conv = os.path.expanduser("~/.cache/mollm/converted")
    os.makedirs(conv, exist_ok=True)
    print(f"| model | test | mollm GGUF | mollm {a.convert} package | llama.cpp GGUF | package / llama.cpp | package / mollm GGUF |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for model in a.model:
        name = os.path.basename(model)
        pkg = os.path.join(conv, os.path.splitext(name)[0] + f"-{a.convert}.mollm")
        subprocess.run([mollm_exe(), "convert", model, pkg, "--quant", a.convert, "-q"], check=True,
                       capture_output=True)
        g_pp, g_tg, _ = mollm_rows(a, model)
        p_pp, p_tg, backend = mollm_rows(a, pkg)
        ll = llama_rows(a, model)
        for test, g, m, l in [(f"pp{a.prompt_tokens}", g_pp, p_pp, ll[0] if ll else None),
                              (f"tg{a.gen}", g_tg, p_tg, ll[1] if ll else None)]:
            ls = f"{l:.2f}" if l else "n/a"
            ratio = f"{m / l:.2f}" if l else "n/a"
            print(f"| {name} | {test} | {g:.2f} | {m:.2f} | {ls} | {ratio} | {m / g:.2f} |", flush=True)
        print(f"<!-- {name}: mollm backends {backend} -->", flush=True)


if __name__ == "__main__":
    sys.exit(main())
