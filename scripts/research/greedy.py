#!/usr/bin/env python3
"""Greedy continuation from raw token ids with llama.cpp (issue 53 oracle helper).

Research tool (docs/src/dev/hybrid-models.md), not run by the tests. Uses only llama.cpp's own ctypes bindings
(llama_cpp/llama_cpp.py from the llama-cpp-python 0.3.36 sdist) and the shared libraries of a
llama.cpp build; nothing is copied from llama.cpp.

Environment (defaults = the issue-53 build):
  LLAMA_CPP_PY        sdist root holding llama_cpp/llama_cpp.py
                      (default ~/.cache/mollm/llama.cpp-0c1e570-src)
  LLAMA_CPP_LIB_PATH  dir with libllama.so + libggml*.so
                      (default ~/.cache/mollm/llama.cpp-0c1e570-tests/bin)

Configuration: CPU only, n_seq_max 1, flash attention OFF, K/V cache F32 (recurrent r/s state is
always F32 in llama.cpp), n_batch = n_ubatch = 512 (clamped to n_ctx), n_threads 2.
Prompt feeding:
  --feed batch   whole prompt in ONE llama_decode (logits for the last position only)
  --feed token   prompt fed one token per llama_decode (exercises the single-token paths)
Decoding: argmax over the last logits (lowest id on ties), the chosen token is decoded alone
at the next position; n tokens are generated (no EOG stop: the "test" vocab has no EOG).

Usage:
  scripts/research/greedy.py MODEL.gguf --ids 1,2,3,4,5 -n 16 [--feed batch|token] [--n-ctx 256]
                    [--threads 2] [--top 5] [--dump-logits FILE.f32] [--json]
--dump-logits writes every step's full logits (prompt step first) as little-endian f32 rows.
"""
import argparse
import array
import ctypes
import importlib
import json
import os
import sys
import types

HOME = os.path.expanduser("~")
SRC = os.environ.get("LLAMA_CPP_PY", os.path.join(HOME, ".cache/mollm/llama.cpp-0c1e570-src"))
os.environ.setdefault("LLAMA_CPP_LIB_PATH", os.path.join(HOME, ".cache/mollm/llama.cpp-0c1e570-tests/bin"))


def load_bindings():
    pkg_dir = os.path.join(SRC, "llama_cpp")
    if "llama_cpp" not in sys.modules:
        pkg = types.ModuleType("llama_cpp")
        pkg.__path__ = [pkg_dir]
        sys.modules["llama_cpp"] = pkg
    return importlib.import_module("llama_cpp.llama_cpp")


L = load_bindings()
GGML_TYPE_F32 = 0
FA_DISABLED = 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--ids", required=True, help="comma separated prompt token ids")
    ap.add_argument("-n", type=int, default=16)
    ap.add_argument("--feed", choices=["batch", "token"], default="batch")
    ap.add_argument("--n-ctx", type=int, default=0, help="0 = the GGUF context_length")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=0, help="print the top-k (id, logit) of every step")
    ap.add_argument("--dump-logits", default=None)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()

    if not a.verbose:
        @L.llama_log_callback
        def _quiet(level, text, ud):  # noqa: ARG001
            return None
        main._cb = _quiet
        L.llama_log_set(_quiet, ctypes.c_void_p(0))

    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = L.llama_model_load_from_file(a.model.encode(), mp)
    if not model:
        sys.exit(f"failed to load {a.model}")
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)

    cp = L.llama_context_default_params()
    cp.n_ctx = a.n_ctx
    cp.n_batch = 512
    cp.n_ubatch = 512
    cp.n_seq_max = 1
    cp.n_threads = a.threads
    cp.n_threads_batch = a.threads
    cp.flash_attn_type = FA_DISABLED
    cp.type_k = GGML_TYPE_F32
    cp.type_v = GGML_TYPE_F32
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        sys.exit("failed to create context")

    prompt = [int(x) for x in a.ids.split(",") if x.strip()]
    dump = open(a.dump_logits, "wb") if a.dump_logits else None

    def decode(toks, pos0):
        batch = L.llama_batch_init(len(toks), 0, 1)
        batch.n_tokens = len(toks)
        for i, t in enumerate(toks):
            batch.token[i] = t
            batch.pos[i] = pos0 + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1 if i == len(toks) - 1 else 0
        rc = L.llama_decode(ctx, batch)
        L.llama_batch_free(batch)
        if rc != 0:
            sys.exit(f"llama_decode returned {rc}")
        ptr = L.llama_get_logits_ith(ctx, -1)
        raw = ctypes.string_at(ctypes.addressof(ptr.contents), n_vocab * 4)
        if dump:
            dump.write(raw)
        return array.array("f", raw)

    if a.feed == "batch":
        logits = decode(prompt, 0)
    else:
        for i, t in enumerate(prompt):
            logits = decode([t], i)

    out, steps = [], []
    pos = len(prompt)
    for _ in range(a.n):
        best = max(range(n_vocab), key=lambda j: (logits[j], -j))
        if a.top:
            top = sorted(range(n_vocab), key=lambda j: (-logits[j], j))[: a.top]
            steps.append([(j, float(logits[j])) for j in top])
        out.append(best)
        logits = decode([best], pos)
        pos += 1
    if dump:
        dump.close()

    if a.json:
        print(json.dumps({"model": os.path.basename(a.model), "prompt": prompt, "feed": a.feed,
                          "n_ctx": L.llama_n_ctx(ctx), "tokens": out, "top": steps}))
    else:
        print(" ".join(str(t) for t in out))
        for i, s in enumerate(steps):
            print(f"step {i}: " + " ".join(f"{j}:{v:.6f}" for j, v in s))

    L.llama_free(ctx)
    L.llama_model_free(model)


if __name__ == "__main__":
    main()
