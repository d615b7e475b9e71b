#!/usr/bin/env python3
"""llama.cpp's greedy continuations and logits on the random-weight hybrid/recurrent models
(scripts/make_random_lfm2.py: LFM2 and LFM2-MoE; scripts/make_random_qwen35.py: Qwen3.5,
Qwen3.5-MoE, Qwen3-Next; scripts/make_random_qwen35_hf.py: their Hugging Face twins' GGUF
conversions; scripts/make_random_rwkv7.py: RWKV7), for prompts given as token ids,
into fixtures/golden/random-<family>.json. engine/tests/recurrent.rs runs mollm on the same
files and prompts: every generated id equal, the prompt's last logits close (RWKV7: oracle data
only, mollm has no rwkv7 graph yet).

Oracle: llama.cpp as vendored in llama-cpp-python 0.3.36 (commit 0c1e570), through its ctypes
bindings (llamacpp_oracle.py), CPU only, built for this machine's AVX-512 (AMX off). Recorded
on the build whose libraries LLAMA_CPP_LIB_PATH names (scripts/build-llama-cpp.sh, or any
build of that commit).
Configuration (also written into the JSON): n_ctx 256, n_batch = n_ubatch = 64 (a prompt runs
in chunks of 64 tokens, each one llama_decode), n_threads 2, flash attention off, F32 K/V cache
(recurrent state is always F32), one sequence. The prompt's last logits are recorded; then 16
tokens are generated greedily (argmax, lowest id on ties), each decoded alone at the next
position.
Recorded per prompt: the ids generated, the 8 largest (id, logit) after the prompt (ties: lower
id first) and the logits of 32 fixed probe ids (numpy PCG64 seed 1234).

Usage: scripts/golden/make_recurrent_golden.py --family lfm2|qwen35|qwen35hf|rwkv7 [--models-dir DIR]
"""
import argparse
import ctypes
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llamacpp_oracle as O  # noqa: E402

L = O.L
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = {"n_ctx": 256, "n_batch": 64, "n_ubatch": 64, "n_threads": 2, "flash_attn": False,
          "type_k": "f32", "type_v": "f32", "generate": 16}


def prompts(n_vocab):
    """One token; tens of tokens; a prompt of several 64-token chunks that, with the 16
    generated tokens, comes close to the 256-token context."""
    rng = np.random.default_rng(77)
    return [("one", [1]),
            ("tens", [int(x) for x in rng.integers(0, n_vocab, 37)]),
            ("long", [int(x) for x in rng.integers(0, n_vocab, 230)])]


FAMILIES = {
    "lfm2": dict(generator="scripts/make_random_lfm2.py",
                 models=["lfm2-random", "lfm2-swa-random", "lfm2moe-random", "lfm2-hf-random"]),
    "qwen35": dict(generator="scripts/make_random_qwen35.py",
                   models=["qwen35-random", "qwen35-mtp-random", "qwen35moe-random", "qwen3next-random"]),
    "qwen35hf": dict(generator="scripts/make_random_qwen35_hf.py",
                     models=["qwen35-hf-random", "qwen35moe-hf-random", "qwen3next-hf-random"]),
    "rwkv7": dict(generator="scripts/make_random_rwkv7.py", models=["rwkv7-random", "rwkv7-h4-random"]),
}
TOP = 8
N_PROBE = 32


def run(model, toks, n_vocab):
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = CONFIG["n_ctx"], CONFIG["n_batch"], CONFIG["n_ubatch"]
    cp.n_seq_max = 1
    cp.n_threads = cp.n_threads_batch = CONFIG["n_threads"]
    cp.flash_attn_type = 0
    cp.type_k = cp.type_v = O.GGML_TYPE_F32
    cp.no_perf = True
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        sys.exit("failed to create a context")

    def decode(ids, start):
        b = L.llama_batch_init(len(ids), 0, 1)
        for i, t in enumerate(ids):
            b.token[i] = t
            b.pos[i] = start + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = 1 if i == len(ids) - 1 else 0
        b.n_tokens = len(ids)
        rc = L.llama_decode(ctx, b)
        if rc != 0:
            sys.exit(f"llama_decode returned {rc}")
        L.llama_batch_free(b)
        ptr = L.llama_get_logits_ith(ctx, -1)
        raw = ctypes.string_at(ctypes.addressof(ptr.contents), n_vocab * 4)
        return np.frombuffer(raw, dtype=np.float32).copy()

    chunk = CONFIG["n_batch"]
    for s in range(0, len(toks), chunk):
        row = decode(toks[s:s + chunk], s)
    first = row
    out = []
    for i in range(CONFIG["generate"]):
        t = int(sorted(range(n_vocab), key=lambda j: (-row[j], j))[0])
        out.append(t)
        if i + 1 < CONFIG["generate"]:
            row = decode([t], len(toks) + i)
    L.llama_free(ctx)
    return first, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", required=True, choices=sorted(FAMILIES))
    ap.add_argument("--models-dir", default=os.path.join(O.MODELS_DIR, "random"))
    a = ap.parse_args()
    fam = FAMILIES[a.family]
    out_path = os.path.join(ROOT, "fixtures", "golden", f"random-{a.family}.json")
    O.quiet_logs()
    L.llama_backend_init()
    out = {"generator": fam["generator"],
           "llama_cpp": {"package": O.PACKAGE, "commit": O.llama_cpp_commit(), "config": CONFIG},
           "models": {}}
    for key in fam["models"]:
        path = os.path.join(a.models_dir, key + ".gguf")
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        model = L.llama_model_load_from_file(path.encode(), mp)
        if not model:
            sys.exit(f"failed to load {path} (run {fam['generator']})")
        n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
        probe = sorted(int(i) for i in np.random.default_rng(1234).choice(n_vocab, N_PROBE, replace=False))
        cases = []
        for name, toks in prompts(n_vocab):
            row, gen = run(model, toks, n_vocab)
            if not np.isfinite(row).all():
                sys.exit(f"{key} {name}: llama.cpp's logits are not finite")
            order = sorted(range(n_vocab), key=lambda i: (-row[i], i))[:TOP]
            cases.append({"name": name, "tokens": toks, "generated": gen,
                          "top": [[i, float(row[i])] for i in order],
                          "probe": [float(row[i]) for i in probe]})
            print(f"{key} {name}: {len(toks)} tokens -> {gen}, margin {row[order[0]] - row[order[1]]:.4f}, "
                  f"logits mean {row.mean():.3f} std {row.std():.3f} [{row.min():.3f}, {row.max():.3f}], "
                  f"{len(set(gen))} distinct ids")
        out["models"][key] = {"gguf": key + ".gguf", "gguf_sha256": O.sha256_file(path),
                              "n_vocab": n_vocab, "probe_ids": probe, "cases": cases}
        L.llama_model_free(model)
    with open(out_path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
