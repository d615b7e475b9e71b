#!/usr/bin/env python3
"""Small random-weight LFM2 and LFM2-MoE models as GGUF files (the `gguf` PyPI writer; no torch), the way
llama.cpp's converter and its own test writer (tests/test-llama-archs.cpp) lay them out, for
mollm's lfm2 graph against llama.cpp (scripts/golden/make_recurrent_golden.py records llama.cpp's
tokens and logits on them; engine/tests/recurrent.rs runs mollm).

LFM2 mixes attention layers (q/k head norms, neox rope) with gated short-convolution layers
(`shortconv.in_proj` into b, c and x; `c * conv(b * x)` over a window of `shortconv.l_cache`
tokens each sequence keeps; `shortconv.out_proj`); a layer's entry in
`lfm2.attention.head_count_kv` is 0 when it has no attention. The final norm is
`token_embd_norm`.

Tokenizer: llama.cpp's test vocabulary (`tokenizer.ggml.model = test`: ids stand for 5-byte
chunks of text, no special tokens), as test-llama-archs writes it; the models are driven by
token ids.

Models (weights all F32; numpy PCG64, fixed seeds, so every machine writes the same bytes and
the golden file records their sha256):
- lfm2-random: seed 530, hidden 64, 6 layers [conv, conv, attn, conv, attn, conv], 4 heads x
  head_dim 16, 2 KV heads, FFN 128, l_cache 3, vocab 256, context 256, untied output,
  head_count as one number and head_count_kv per layer (as the converter writes real LFM2).
- lfm2-swa-random: seed 531, the shape test-llama-archs gives lfm2: hidden 128, 2 layers
  [attn, conv], 2 heads x 64, 2 KV heads, FFN 192, l_cache 3, vocab 128, context 256, tied
  embeddings, per-layer head counts, and a sliding window of 32 on the attention layer
  (`sliding_window_pattern` as integers, as llama.cpp's writer stores it).
- lfm2moe-random: seed 532, architecture lfm2moe: hidden 64, 4 layers [conv, conv, attn, conv],
  the first dense (`leading_dense_block_count` 1), the others 8 experts of FFN 32, 2 used,
  sigmoid gating (`expert_gating_func` 2) with a selection bias `exp_probs_b.bias`, as
  llama.cpp's converter writes LFM2-MoE; untied output.

Usage: make_random_lfm2.py [--out DIR]   (default ~/.cache/mollm/models/random)
Needs: numpy, gguf (pip install numpy gguf==0.19.0).
"""
import argparse
import hashlib
import os

import numpy as np
import gguf

CACHE = os.path.expanduser("~/.cache/mollm/models")
MODELS = {
    "lfm2-random": dict(seed=530, hidden=64, kinds="ccacac", heads=4, head_dim=16, kv_heads=2, ff=128,
                        l_cache=3, vocab=256, ctx=256, tied=False, per_layer_heads=False, window=0),
    "lfm2-swa-random": dict(seed=531, hidden=128, kinds="ac", heads=2, head_dim=64, kv_heads=2, ff=192,
                            l_cache=3, vocab=128, ctx=256, tied=True, per_layer_heads=True, window=32),
    "lfm2moe-random": dict(seed=532, arch="lfm2moe", hidden=64, kinds="ccac", heads=4, head_dim=16, kv_heads=2,
                           ff=128, l_cache=3, vocab=256, ctx=256, tied=False, per_layer_heads=False, window=0,
                           experts=8, used=2, expert_ff=32, dense_lead=1),
}


def make(path, m):
    rng = np.random.default_rng(m["seed"])
    n, L = m["hidden"], len(m["kinds"])
    ARCH = m.get("arch", "lfm2")

    def normal(shape, std):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)

    def norm_weight():
        return (1.0 + normal((n,), 0.1)).astype(np.float32)

    w = gguf.GGUFWriter(path, ARCH)
    w.add_name(os.path.basename(path)[:-5])
    w.add_context_length(m["ctx"])
    w.add_embedding_length(n)
    w.add_block_count(L)
    w.add_feed_forward_length(m["ff"])
    kv = [m["kv_heads"] if k == "a" else 0 for k in m["kinds"]]
    heads = [m["heads"] if k == "a" else 0 for k in m["kinds"]]
    if m["per_layer_heads"]:
        w.add_array(f"{ARCH}.attention.head_count", heads)
    else:
        w.add_uint32(f"{ARCH}.attention.head_count", m["heads"])
    w.add_array(f"{ARCH}.attention.head_count_kv", kv)
    w.add_uint32(f"{ARCH}.attention.key_length", m["head_dim"])
    w.add_uint32(f"{ARCH}.attention.value_length", m["head_dim"])
    w.add_uint32(f"{ARCH}.rope.dimension_count", m["head_dim"])
    w.add_float32(f"{ARCH}.rope.freq_base", 1000000.0)
    w.add_float32(f"{ARCH}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_uint32(f"{ARCH}.shortconv.l_cache", m["l_cache"])
    w.add_uint32(f"{ARCH}.vocab_size", m["vocab"])
    if "experts" in m:
        w.add_uint32(f"{ARCH}.expert_count", m["experts"])
        w.add_uint32(f"{ARCH}.expert_used_count", m["used"])
        w.add_uint32(f"{ARCH}.expert_feed_forward_length", m["expert_ff"])
        w.add_uint32(f"{ARCH}.expert_gating_func", 2)
        w.add_uint32(f"{ARCH}.leading_dense_block_count", m["dense_lead"])
    if m["window"]:
        w.add_uint32(f"{ARCH}.attention.sliding_window", m["window"])
        w.add_array(f"{ARCH}.attention.sliding_window_pattern", [1 if k == "a" else 0 for k in m["kinds"]])
    w.add_tokenizer_model("test")
    w.add_token_list([f"tok_{i}" for i in range(m["vocab"])])
    w.add_token_scores([0.0] * m["vocab"])
    w.add_token_types([1] * m["vocab"])
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)

    # numpy shapes are ggml's ne reversed: a [n_in, n_out] weight is an (n_out, n_in) array.
    hd, nh = m["head_dim"], m["heads"]
    # Tied: the embeddings are also the output matrix, whose logits want a smaller scale.
    w.add_tensor("token_embd.weight", normal((m["vocab"], n), 0.25 if m["tied"] else 1.0))
    for i, kind in enumerate(m["kinds"]):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", norm_weight())
        if kind == "a":
            w.add_tensor(b + "attn_q.weight", normal((nh * hd, n), n ** -0.5))
            w.add_tensor(b + "attn_k.weight", normal((m["kv_heads"] * hd, n), n ** -0.5))
            w.add_tensor(b + "attn_v.weight", normal((m["kv_heads"] * hd, n), n ** -0.5))
            w.add_tensor(b + "attn_q_norm.weight", (1.0 + normal((hd,), 0.1)).astype(np.float32))
            w.add_tensor(b + "attn_k_norm.weight", (1.0 + normal((hd,), 0.1)).astype(np.float32))
            w.add_tensor(b + "attn_output.weight", normal((n, nh * hd), (nh * hd) ** -0.5))
        else:
            w.add_tensor(b + "shortconv.in_proj.weight", normal((3 * n, n), n ** -0.5))
            w.add_tensor(b + "shortconv.conv.weight", normal((n, m["l_cache"]), 0.6))
            w.add_tensor(b + "shortconv.out_proj.weight", normal((n, n), n ** -0.5))
        w.add_tensor(b + "ffn_norm.weight", norm_weight())
        if "experts" in m and i >= m["dense_lead"]:
            ne, f = m["experts"], m["expert_ff"]
            w.add_tensor(b + "ffn_gate_inp.weight", normal((ne, n), n ** -0.5))
            w.add_tensor(b + "ffn_gate_exps.weight", normal((ne, f, n), n ** -0.5))
            w.add_tensor(b + "ffn_up_exps.weight", normal((ne, f, n), n ** -0.5))
            w.add_tensor(b + "ffn_down_exps.weight", normal((ne, n, f), f ** -0.5))
            w.add_tensor(b + "exp_probs_b.bias", normal((ne,), 0.1))
        else:
            w.add_tensor(b + "ffn_gate.weight", normal((m["ff"], n), n ** -0.5))
            w.add_tensor(b + "ffn_up.weight", normal((m["ff"], n), n ** -0.5))
            w.add_tensor(b + "ffn_down.weight", normal((n, m["ff"]), m["ff"] ** -0.5))
    w.add_tensor("token_embd_norm.weight", norm_weight())
    if not m["tied"]:
        w.add_tensor("output.weight", normal((m["vocab"], n), n ** -0.5 * 3))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.environ.get("MOLLM_MODELS_DIR", CACHE), "random"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for key, m in MODELS.items():
        path = os.path.join(a.out, f"{key}.gguf")
        make(path + ".partial", m)
        os.replace(path + ".partial", path)
        print(f"{path} {sha256(path)}")


if __name__ == "__main__":
    main()
