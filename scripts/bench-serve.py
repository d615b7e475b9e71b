#!/usr/bin/env python3
"""Load generator for OpenAI-compatible servers: `mollm serve` side by side with llama.cpp's
`llama-server`, on the same GGUF, the same machine, in one run.

For each concurrency level (interleaved: mollm, llama-server, next level, ...) it keeps C
streaming chat clients busy until R = max(2*C, 4) requests have finished (after one untimed
warm-up pass per server at the highest level), each with the same
prompt length and exactly --max-tokens output tokens (ignore_eos; greedy), and reports
requests/s, aggregate output tokens/s, time to first token and inter-token latency (median,
p90, p99) as a Markdown table. The servers are started here, both with --parallel P and 2
threads, bound to 127.0.0.1, and stopped at the end.

    scripts/bench-serve.py [--model GGUF] [--parallel 16] [--levels 1,4,16,64] [--max-tokens 64]
        [--prompt-words 64] [--llama-server PATH] [--rounds 1]

Needs python3 with the openai package (pip install openai), a release build of mollm, and
llama-server (scripts/build-llama-cpp.sh builds it).
"""

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request

import openai

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.expanduser("~/.cache/mollm")


def wait_ready(url, proc, secs=300):
    t = time.monotonic()
    while time.monotonic() - t < secs:
        if proc.poll() is not None:
            sys.exit(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.2)
    sys.exit(f"{url} not ready after {secs} s")


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


async def level(url, conc, n_req, max_tokens, prompt):
    # Retries: llama-server drops some of 64 concurrent connections ("Server disconnected
    # without sending a response"); a retried request counts once, from its first try.
    ac = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=3, timeout=600)
    ttft, itl, toks, prompt_toks = [], [], [], []
    left = [n_req]

    async def one(i):
        t0 = time.perf_counter()
        s = await ac.chat.completions.create(
            model="m", messages=[{"role": "user", "content": f"{i}: {prompt}"}],
            max_tokens=max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        last, n, usage = None, 0, None
        async for k in s:
            if k.usage:
                usage = k.usage
            if k.choices and k.choices[0].delta.content:
                now = time.perf_counter()
                if last is None:
                    ttft.append(now - t0)
                else:
                    itl.append(now - last)
                last = now
                n += 1
        toks.append(usage.completion_tokens if usage else n)
        if usage:
            prompt_toks.append(usage.prompt_tokens)

    async def worker(i):
        while left[0] > 0:
            left[0] -= 1
            await one(i * 1000 + left[0])

    t = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(conc)))
    secs = time.perf_counter() - t
    await ac.close()
    return {
        "req_s": n_req / secs, "tok_s": sum(toks) / secs, "secs": secs,
        "out_tokens": statistics.mean(toks), "prompt_tokens": statistics.mean(prompt_toks) if prompt_toks else float("nan"),
        "ttft": [pct(ttft, q) * 1e3 for q in (0.5, 0.9, 0.99)],
        "itl": [pct(itl, q) * 1e3 for q in (0.5, 0.9, 0.99)],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(CACHE, "models/smollm2-135m-instruct-q4_1.gguf"))
    ap.add_argument("--parallel", type=int, default=16)
    ap.add_argument("--levels", default="1,4,16,64")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-words", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--llama-server", default=os.path.join(CACHE, "llama.cpp-build/bin/llama-server"))
    ap.add_argument("--mollm", default=os.path.join(REPO, "target/release/mollm"))
    ap.add_argument("--only", choices=["mollm", "llama"], help="run one server only")
    a = ap.parse_args()
    levels = [int(x) for x in a.levels.split(",")]
    ctx = 4096 * a.parallel
    prompt = " ".join(["Tell me everything you know about the history of computing."] * (a.prompt_words // 10 + 1)).split(" ")
    prompt = " ".join(prompt[:a.prompt_words])
    servers = {}
    if a.only != "llama":
        servers["mollm"] = ("http://127.0.0.1:18431", [a.mollm, "serve", "-m", a.model, "--port", "18431",
                            "--parallel", str(a.parallel), "--ctx", str(min(ctx, 65536)), "-t", "2", "-q",
                            "--queue", "1024"])
    if a.only != "mollm":
        servers["llama-server"] = ("http://127.0.0.1:18432", [a.llama_server, "-m", a.model, "--port", "18432",
                                   "--host", "127.0.0.1", "-np", str(a.parallel), "-c", str(min(ctx, 65536)),
                                   "-t", "2", "-tb", "2", "--no-webui"])
    procs = {}
    try:
        for name, (url, cmd) in servers.items():
            env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(a.llama_server))
            procs[name] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        for name, (url, _) in servers.items():
            wait_ready(url, procs[name])
        # Warm-up, untimed: each server once at the highest level, so that no measured level
        # pays for first use (mollm maps its KV pool lazily: a page's first write faults it
        # in, which on a VM can cost ~20 us per 4 KiB; llama-server clears its whole cache at
        # start-up).
        for name, (url, _) in servers.items():
            for other, p in procs.items():
                p.send_signal(signal.SIGCONT if other == name else signal.SIGSTOP)
            asyncio.run(level(url, max(levels), max(levels), a.max_tokens, prompt))
        rows = {}
        for r in range(a.rounds):
            for c in levels:
                for name, (url, _) in servers.items():
                    # Only the server being measured runs: the other is stopped meanwhile.
                    for other, p in procs.items():
                        p.send_signal(signal.SIGCONT if other == name else signal.SIGSTOP)
                    res = asyncio.run(level(url, c, max(2 * c, 4), a.max_tokens, prompt))
                    rows.setdefault((c, name), []).append(res)
                    print(f"round {r + 1} c={c} {name}: {res['tok_s']:.1f} tok/s", file=sys.stderr)
        for p in procs.values():
            p.send_signal(signal.SIGCONT)
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGCONT)
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    med = lambda xs: statistics.median(xs)
    print(f"\nmodel {os.path.basename(a.model)}, --parallel {a.parallel}, 2 threads, prompt ~{a.prompt_words} words "
          f"({med([x['prompt_tokens'] for v in rows.values() for x in v]):.0f} tokens with the chat template), "
          f"{a.max_tokens} output tokens per request (greedy, ignore_eos), requests per level max(2C, 4), "
          f"{a.rounds} round(s), median over rounds\n")
    print("| C | server | requests/s | output tok/s | TTFT ms p50 / p90 / p99 | ITL ms p50 / p90 / p99 |")
    print("|---|---|---|---|---|---|")
    for c in levels:
        for name in servers:
            v = rows[(c, name)]
            f = lambda k: med([x[k] for x in v])
            t = [med([x["ttft"][i] for x in v]) for i in range(3)]
            l = [med([x["itl"][i] for x in v]) for i in range(3)]
            print(f"| {c} | {name} | {f('req_s'):.2f} | {f('tok_s'):.1f} | {t[0]:.0f} / {t[1]:.0f} / {t[2]:.0f} | {l[0]:.1f} / {l[1]:.1f} / {l[2]:.1f} |")
    if len(servers) == 2:
        print("\n| C | mollm / llama-server (output tok/s) | mollm C / mollm 1 |")
        print("|---|---|---|")
        base = med([x["tok_s"] for x in rows[(levels[0], "mollm")]])
        for c in levels:
            m = med([x["tok_s"] for x in rows[(c, "mollm")]])
            l = med([x["tok_s"] for x in rows[(c, "llama-server")]])
            print(f"| {c} | {m / l:.2f}x | {m / base:.2f}x |")


if __name__ == "__main__":
    main()
