#!/usr/bin/env python3
"""Side-by-side speed of mollm and llama.cpp on one GGUF, in one run.

Protocol (printed with the table): a prompt of --prompt-tokens tokens (a fixed English text
repeated and cut to length by mollm's tokenizer), --gen tokens generated greedily with
end-of-generation ignored, --threads threads, one warm-up run then --reps measured runs,
median tokens/s. mollm is timed by its own --json timings (prefill = prompt processing,
decode = generation after the first token); llama.cpp by llama-bench (pp = prompt processing
of the same length, tg = generation) in its default configuration (F16 KV cache, flash
attention auto, CPU repack on): what a llama.cpp user gets. llama-bench cannot use an F32 KV
cache; mollm runs with its F32 cache, the configuration the golden tests mirror.

Usage: scripts/bench_compare.py --model M.gguf [--backend auto] [--prompt-tokens 256]
       [--gen 64] [--reps 5] [--threads 2] [--llama-bench PATH]
"""
import argparse, json, os, shutil, statistics, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TEXT = ("The lighthouse keeper climbed the stairs every evening to light the great lamp, "
        "watching ships pass along the rocky coast while the wind sang through the rigging. ")


def mollm_runs(a):
    # the build's mollm: $CARGO_TARGET_DIR as cargo uses it (worktrees with their own target)
    exe = os.path.join(os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target"), "release", "mollm")
    ids_needed = a.prompt_tokens
    prompt = TEXT * (ids_needed // 20 + 2)
    # Trim the prompt to the requested token count with mollm's own tokenizer.
    probe = subprocess.run([exe, "run", "--json", "-m", a.model, "--prompt", prompt, "--max-tokens", "1",
                            "--threads", str(a.threads), "--backend", a.backend],
                           capture_output=True, text=True, check=True)
    n = len(json.loads(probe.stdout)["prompt_tokens"])
    words = prompt.split(" ")
    while n > ids_needed and len(words) > 1:
        words = words[: max(1, int(len(words) * ids_needed / n) - 1)]
        prompt = " ".join(words)
        probe = subprocess.run([exe, "run", "--json", "-m", a.model, "--prompt", prompt, "--max-tokens", "1",
                                "--threads", str(a.threads), "--backend", a.backend],
                               capture_output=True, text=True, check=True)
        n = len(json.loads(probe.stdout)["prompt_tokens"])
    pp, tg = [], []
    for i in range(a.reps + 1):
        out = subprocess.run([exe, "run", "--json", "-m", a.model, "--prompt", prompt, "--max-tokens", str(a.gen),
                              "--ignore-eos", "--threads", str(a.threads), "--backend", a.backend],
                             capture_output=True, text=True, check=True)
        t = json.loads(out.stdout)["timings"]
        if i > 0:
            pp.append(t["prefill_tokens_per_s"])
            tg.append(t["decode_tokens_per_s"])
    return n, statistics.median(pp), statistics.median(tg)


def llama_runs(a, n_prompt):
    exe = a.llama_bench or shutil.which("llama-bench") or os.path.expanduser("~/.cache/mollm/llama.cpp-build/bin/llama-bench")
    if not os.path.exists(exe):
        return None
    out = subprocess.run([exe, "-m", a.model, "-p", str(n_prompt), "-n", str(a.gen), "-t", str(a.threads),
                          "-r", str(a.reps), "-o", "json"],
                         capture_output=True, text=True, check=True)
    rows = json.loads(out.stdout)
    pp = next(r for r in rows if r["n_prompt"] > 0)
    tg = next(r for r in rows if r["n_gen"] > 0)
    med = lambda r: statistics.median(r["samples_ts"]) if r.get("samples_ts") else r["avg_ts"]
    return med(pp), med(tg)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--backend", default="auto")
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--gen", type=int, default=64)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--llama-bench")
    a = p.parse_args()
    n, m_pp, m_tg = mollm_runs(a)
    ll = llama_runs(a, n)
    print(f"model {os.path.basename(a.model)}; prompt {n} tokens, {a.gen} generated, {a.threads} threads, "
          f"1 warm-up + {a.reps} runs, median; mollm --backend {a.backend} (F32 KV); llama-bench defaults (F16 KV, FA auto)")
    print(f"{'':10} {'mollm t/s':>10} {'llama.cpp t/s':>14} {'ratio':>7}")
    for name, m, l in [("prompt", m_pp, ll[0] if ll else None), ("generate", m_tg, ll[1] if ll else None)]:
        print(f"{name:10} {m:10.2f} {l if l is not None else float('nan'):14.2f} {m / l if l else float('nan'):7.2f}")


if __name__ == "__main__":
    sys.exit(main())
