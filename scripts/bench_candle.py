#!/usr/bin/env python3
"""mollm beside candle (and llama.cpp) on a Qwen2 GGUF, interleaved in one run.

candle is built from crates.io (scripts/peers/candle-bench: candle-core / candle-transformers
0.11, their quantized_qwen2 model; the build goes to ~/.cache/mollm/candle-bench). It measures
the llama-bench way, as `mollm bench` and `llama-bench` do (scripts/bench_compare.py): pp = one
forward over --prompt-tokens random ids from an empty cache, tg = --gen single-token forwards
from an empty cache; one warm-up, --reps runs, median tokens/s; --threads threads (candle:
RAYON_NUM_THREADS). The three engines alternate, --rounds times.

Usage: scripts/bench_candle.py --model Q.gguf [--prompt-tokens 256] [--gen 64] [--reps 3]
       [--threads 2] [--rounds 2]
"""
import argparse, json, os, subprocess, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_compare import ROOT, llama_rows, mollm_rows  # noqa: E402

CRATE = os.path.join(ROOT, "scripts", "peers", "candle-bench")
TARGET = os.path.expanduser("~/.cache/mollm/candle-bench")


def candle_exe():
    subprocess.run(["cargo", "build", "--release", "--quiet", "--manifest-path",
                    os.path.join(CRATE, "Cargo.toml"), "--target-dir", TARGET], check=True)
    return os.path.join(TARGET, "release", "candle-bench")


def candle_rows(a, exe):
    env = dict(os.environ, RAYON_NUM_THREADS=str(a.threads))
    out = subprocess.run([exe, a.model, str(a.prompt_tokens), str(a.gen), str(a.reps)],
                         capture_output=True, text=True, check=True, env=env).stdout
    rows = {r["test"]: r["median_ts"] for r in map(json.loads, out.splitlines())}
    return rows[f"pp{a.prompt_tokens}"], rows[f"tg{a.gen}"]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--gen", type=int, default=64)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--backend", default="auto")
    p.add_argument("--llama-bench")
    p.add_argument("--kv-type", choices=["f32", "f16"], default="f32",
                   help="mollm's K/V cache format (as in bench_compare.py)")
    a = p.parse_args()
    exe = candle_exe()
    print(f"pp{a.prompt_tokens} / tg{a.gen}, random ids, empty cache, {a.threads} threads, "
          f"1 warm-up + {a.reps} runs, median t/s; engines alternating, {a.rounds} rounds")
    print()
    print("| round | test | mollm | candle | llama.cpp | mollm / candle | mollm / llama.cpp |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in range(1, a.rounds + 1):
        m = mollm_rows(a, a.model)
        c = candle_rows(a, exe)
        l = llama_rows(a, a.model) or (float("nan"), float("nan"))
        for i, test in enumerate([f"pp{a.prompt_tokens}", f"tg{a.gen}"]):
            print(f"| {r} | {test} | {m[i]:.2f} | {c[i]:.2f} | {l[i]:.2f} | {m[i] / c[i]:.2f} | "
                  f"{m[i] / l[i]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
