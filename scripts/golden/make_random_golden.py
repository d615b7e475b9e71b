#!/usr/bin/env python3
"""llama.cpp's logits on the random-weight GGUF files written by scripts/make_random_qwen3.py
(Qwen3, Qwen3-MoE) and scripts/make_random_gemma3.py (Gemma 3), at every position of
teacher-forced prompts, into fixtures/golden/random-<family>.json.
engine/tests/random_checkpoints.rs runs mollm on the Hugging Face directories holding the same
weights and compares: tokenization, top-1 agreement at every position, and the largest absolute
difference over the recorded logits.

Oracle: llama.cpp as vendored in llama-cpp-python 0.3.36 (scripts/build-llama-cpp.sh), through
its ctypes bindings (llamacpp_oracle.py), CPU only.
Configuration (also written into the JSON): n_ctx 512, the whole prompt in ONE llama_decode
batch with logits requested for every position, n_threads 2, flash attention off, F32 K/V cache.
Prompt tokens: llama_tokenize(add_special=True, parse_special=True).
Recorded per position: the 8 largest (id, logit) (ties: lower id first), and the logits of 64
fixed "probe" ids (numpy PCG64 seed 1234 over the vocabulary), so that the comparison covers
ordinary tokens, not only the top ones.

Usage: scripts/golden/make_random_golden.py --family qwen3|gemma3 [--models-dir DIR]
"""
import argparse
import array
import ctypes
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llamacpp_oracle as O  # noqa: E402

L = O.L
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = {"n_ctx": 512, "n_batch": 512, "n_ubatch": 512, "n_threads": 2, "flash_attn": False,
          "type_k": "f32", "type_v": "f32", "logits": "every position, one batch"}
CODE = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"
FAMILIES = {
    "qwen3": dict(generator="scripts/make_random_qwen3.py", models=["qwen3-random", "qwen3moe-random"],
                  prompts=[("chat", "<|im_start|>user\nWrite a Python function that adds two numbers."
                                    "<|im_end|>\n<|im_start|>assistant\n"),
                           ("code", CODE)]),
    # Prompts longer than the 8-token sliding window; the third one needs byte fallback.
    "gemma3": dict(generator="scripts/make_random_gemma3.py", models=["gemma3-random"],
                   prompts=[("chat", "<start_of_turn>user\nWrite a Python function that adds two numbers."
                                     "<end_of_turn>\n<start_of_turn>model\n"),
                            ("code", CODE),
                            ("text", "Crabs \U0001f980 and na\u00efve caf\u00e9s: \u0561\u0562\u0563 \u2603 ok")]),
}
TOP = 8
N_PROBE = 64


def all_logits(model, toks, n_vocab):
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
    b = L.llama_batch_init(len(toks), 0, 1)
    for i, t in enumerate(toks):
        b.token[i] = t
        b.pos[i] = i
        b.n_seq_id[i] = 1
        b.seq_id[i][0] = 0
        b.logits[i] = 1
    b.n_tokens = len(toks)
    rc = L.llama_decode(ctx, b)
    if rc != 0:
        sys.exit(f"llama_decode returned {rc}")
    rows = []
    for i in range(len(toks)):
        ptr = L.llama_get_logits_ith(ctx, i)
        raw = ctypes.string_at(ctypes.addressof(ptr.contents), n_vocab * 4)
        rows.append(np.frombuffer(raw, dtype=np.float32).copy())
    L.llama_batch_free(b)
    L.llama_free(ctx)
    return rows


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
        vocab = L.llama_model_get_vocab(model)
        n_vocab = L.llama_vocab_n_tokens(vocab)
        probe = sorted(int(i) for i in np.random.default_rng(1234).choice(n_vocab, N_PROBE, replace=False))
        cases = []
        for name, text in fam["prompts"]:
            b = text.encode()
            buf = (L.llama_token * (len(b) + 16))()
            n = L.llama_tokenize(vocab, b, len(b), buf, len(b) + 16, True, True)
            toks = list(buf[:n])
            positions = []
            for row in all_logits(model, toks, n_vocab):
                order = sorted(range(n_vocab), key=lambda i: (-row[i], i))[:TOP]
                positions.append({"top": [[i, float(row[i])] for i in order],
                                  "probe": [float(row[i]) for i in probe]})
            cases.append({"name": name, "prompt": text, "tokens": toks, "positions": positions})
            margins = [p["top"][0][1] - p["top"][1][1] for p in positions]
            print(f"{key} {name}: {len(toks)} tokens, top1-top2 margin min {min(margins):.3f}, "
                  f"logit spread {positions[0]['top'][0][1] - min(positions[0]['probe']):.1f}")
        out["models"][key] = {"gguf": key + ".gguf", "gguf_sha256": O.sha256_file(path),
                              "n_vocab": n_vocab, "probe_ids": probe, "cases": cases}
        L.llama_model_free(model)
    with open(out_path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
