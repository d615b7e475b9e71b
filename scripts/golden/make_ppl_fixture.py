#!/usr/bin/env python3
"""Record llama-perplexity's perplexity on the ppl text (scripts/fetch-ppl-text.sh) for the
models `mollm ppl` is checked on, next to mollm's own value on the same file, into
fixtures/ppl/lee-news-100.json. cli/tests/ppl.rs compares mollm against the recorded running
estimates; the perplexity table of docs/src/formats.md is these numbers.

llama-perplexity configuration (recorded in the fixture): -c 512 -b 512 -t 2, flash attention
off, F32 K/V cache (mollm's cache type), everything else default. Also recorded: llama.cpp's
default-configuration value (F16 K/V cache), to show what a default llama.cpp user sees.

Usage: scripts/golden/make_ppl_fixture.py [--models smollm2,qwen05] [--llama-bin DIR] [--skip-mollm]
Needs llama.cpp built by scripts/build-llama-cpp.sh and mollm built (cargo build --release).
"""
import argparse, hashlib, json, os, re, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llamacpp_oracle as O  # noqa: E402

OUT = os.path.join(ROOT, "fixtures", "ppl", "lee-news-100.json")
CTX, BATCH, THREADS = 512, 512, 2


def llama_ppl(bin_dir, model, text, extra):
    cmd = [os.path.join(bin_dir, "llama-perplexity"), "-m", model, "-f", text, "-c", str(CTX),
           "-b", str(BATCH), "-t", str(THREADS)] + extra
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"llama-perplexity failed: {out.stderr[-2000:]}")
    log = out.stdout + out.stderr
    running = [float(x) for x in re.findall(r"\[\d+\](\d+\.\d+),", log)]
    m = re.search(r"Final estimate: PPL = (\d+\.\d+) \+/- (\d+\.\d+)", log)
    return {"ppl": float(m.group(1)), "stderr": float(m.group(2)), "running": running,
            "args": [os.path.basename(x) if x.startswith("/") else x for x in cmd[3:]]}


def mollm_ppl(model, text):
    exe = os.path.join(ROOT, "target", "release", "mollm")
    out = subprocess.run([exe, "ppl", "-m", model, "-f", text, "--ctx", str(CTX), "--batch", str(BATCH),
                          "--threads", str(THREADS), "--json", "--quiet"], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"mollm ppl failed: {out.stderr}")
    v = json.loads(out.stdout)
    return {"ppl": v["ppl"], "stderr": v["ppl_stderr"], "running": v["running"], "backend": v["backend"],
            "n_tokens": v["n_tokens"], "seconds": v["seconds"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="smollm2,qwen05")
    ap.add_argument("--llama-bin", default=os.path.expanduser("~/.cache/mollm/llama.cpp-build/bin"))
    ap.add_argument("--skip-mollm", action="store_true")
    a = ap.parse_args()
    text = subprocess.run([os.path.join(ROOT, "scripts", "fetch-ppl-text.sh")], capture_output=True,
                          text=True, check=True).stdout.strip()
    sha = hashlib.sha256(open(text, "rb").read()).hexdigest()
    fx = json.load(open(OUT)) if os.path.exists(OUT) else {}
    fx.update({
        "text": {"file": os.path.basename(text), "sha256": sha,
                 "source": "gensim==4.4.0 wheel (PyPI), gensim/test/test_data/lee_background.cor, first 100 lines",
                 "fetched_by": "scripts/fetch-ppl-text.sh"},
        "llama_cpp": {"package": O.PACKAGE, "commit": O.llama_cpp_commit(),
                      "config": {"n_ctx": CTX, "n_batch": BATCH, "n_threads": THREADS, "flash_attn": False,
                                 "type_k": "f32", "type_v": "f32"}},
    })
    fx.setdefault("models", {})
    for key in a.models.split(","):
        model = os.path.join(O.MODELS_DIR, O.MODELS[key])
        rec = fx["models"].get(key, {})
        rec["model_file"] = O.MODELS[key]
        rec["model_sha256"] = O.MODEL_SHA256[key]
        rec["llama"] = llama_ppl(a.llama_bin, model, text, ["-fa", "off", "-ctk", "f32", "-ctv", "f32"])
        rec["llama_default_f16_kv"] = {k: v for k, v in llama_ppl(a.llama_bin, model, text, []).items()
                                       if k in ("ppl", "stderr", "args")}
        if not a.skip_mollm:
            rec["mollm"] = mollm_ppl(model, text)
            rec["relative_difference"] = abs(rec["mollm"]["ppl"] - rec["llama"]["ppl"]) / rec["llama"]["ppl"]
        fx["models"][key] = rec
        print(key, {k: (v["ppl"] if isinstance(v, dict) else v) for k, v in rec.items()
                    if k in ("llama", "llama_default_f16_kv", "mollm", "relative_difference")}, flush=True)
        json.dump(fx, open(OUT, "w"), indent=1)
    json.dump(fx, open(OUT, "w"), indent=1)


if __name__ == "__main__":
    main()
