#!/usr/bin/env python3
"""A small random-weight Gemma 3 checkpoint, twice: as a Hugging Face directory (model_type
gemma3_text) and as the same weights in a GGUF file, the way llama.cpp's converter writes it.

Like scripts/make_random_qwen3.py (whose helpers it uses), this lets mollm's HF loader and its
gemma3 graph be compared with llama.cpp (scripts/golden/make_random_golden.py --family gemma3;
engine/tests/random_checkpoints.rs).

What it exercises: Gemma's `1 + weight` RMS norms (the HF files hold `weight`, the GGUF holds
`1 + weight`, as convert_hf_to_gguf.py writes it), sandwich norms, q/k norms, GeGLU, embeddings
scaled by sqrt(hidden), local layers with a sliding window of 8 and their own rope base
(10000) next to a global layer (rope base 1e6): layer_types [sliding, sliding, full] in
config.json, `gemma3.attention.sliding_window_pattern = 3` in the GGUF. Prompts are longer than
the window, so the window matters.

Tokenizer: Gemma 3's, from the real Gemma 3 270M GGUF (the project's cached model,
scripts/fetch-models.sh). The GGUF gets it as llama.cpp's converter writes a SentencePiece
vocabulary (tokenizer.ggml.model = llama, scores, token types, add_space_prefix false); the HF
directory gets a tokenizer.json shaped like Hugging Face's Gemma one: BPE with byte fallback,
" " -> U+2581 normalizer, no pre-tokenizer, merges derived from the SentencePiece scores the way
transformers' SentencePieceExtractor does (every split of a piece into two pieces, ordered by
the piece's score), control and user-defined tokens as added tokens.

Weights: numpy PCG64, seed 300. hidden 64, 3 layers, 4 heads x head_dim 32, 2 KV heads, FFN 128,
query_pre_attn_scalar 32, tied embeddings (F16 in both files, 262144 x 64), norms F32 (the
post-attention and post-FFN ones near 16, see make_weights),
attention projections F16, MLP BF16 in HF / F32 (exact) in the GGUF.

Usage: make_random_gemma3.py [--vocab-gguf PATH] [--out DIR]
  (defaults: ~/.cache/mollm/models/gemma3-270m-q4_k_m.gguf, ~/.cache/mollm/models/random)
Needs: numpy, gguf (pip install numpy gguf==0.19.0).
"""
import argparse
import json
import os
import sys

import numpy as np
import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_random_qwen3 import CACHE, Weights, add_dense_hparams, safetensors_bytes, sha256  # noqa: E402

KEY = "gemma3-random"
M = dict(seed=300, hidden=64, layers=3, heads=4, kv_heads=2, head_dim=32, ff=128, window=8,
         layer_types=["sliding_attention", "sliding_attention", "full_attention"], pattern=3)
TEMPLATE = ("{{ bos_token }}{% for message in messages %}"
            "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
            "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}")


def read_spm_vocab(path):
    r = gguf.GGUFReader(path)
    f = r.fields
    tokens = [bytes(f["tokenizer.ggml.tokens"].parts[i]).decode("utf-8") for i in f["tokenizer.ggml.tokens"].data]
    scores = [float(f["tokenizer.ggml.scores"].parts[i][0]) for i in f["tokenizer.ggml.scores"].data]
    types = [int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data]
    ids = {k: int(f[f"tokenizer.ggml.{k}_token_id"].parts[-1][0]) for k in ("bos", "eos", "unknown", "padding")}
    assert len(set(tokens)) == len(tokens), "token texts are not unique"
    return dict(tokens=tokens, scores=scores, types=types, **ids)


def spm_merges(tokens, scores, types):
    """transformers' SentencePieceExtractor: every (left, right) whose concatenation is a piece,
    ordered by that piece's score (best first)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for i in sorted(range(len(tokens)), key=lambda i: (-scores[i], i)):
        if types[i] != 1:
            continue
        p = tokens[i]
        local = [(p[:k], p[k:]) for k in range(1, len(p)) if p[:k] in vocab and p[k:] in vocab]
        local.sort(key=lambda lr: (vocab[lr[0]], vocab[lr[1]]))
        merges.extend([l, r] for l, r in local)
    return merges


def write_tokenizer_files(d, v):
    tokens, types = v["tokens"], v["types"]
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": ty == 3}
             for i, (t, ty) in enumerate(zip(tokens, types)) if ty in (3, 4)]
    tj = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                    {"Sequence": {"id": "A", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<bos>": {"id": "<bos>", "ids": [v["bos"]], "tokens": ["<bos>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": tokens[v["unknown"]],
                  "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
                  "byte_fallback": True, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": spm_merges(tokens, v["scores"], types)},
    }
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    tc = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<bos>", "eos_token": "<eos>",
          "pad_token": "<pad>", "unk_token": "<unk>", "chat_template": TEMPLATE,
          "clean_up_tokenization_spaces": False, "model_max_length": 32768,
          "spaces_between_special_tokens": False, "tokenizer_class": "GemmaTokenizer"}
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tc, f, ensure_ascii=False, indent=1)
    eot = tokens.index("<end_of_turn>")
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": v["bos"], "eos_token_id": [v["eos"], eot], "pad_token_id": v["padding"]},
                  f, indent=1)


def make_weights(n_vocab):
    """HF name -> (float32 values in HF shape, storage kind). Norm weights are HF's (the model
    uses 1 + weight)."""
    W = Weights(M["seed"])
    normal, put, w = W.normal, W.put, W.w
    H, hd, nh, nkv, ff = M["hidden"], M["head_dim"], M["heads"], M["kv_heads"], M["ff"]

    put("model.embed_tokens.weight", normal((n_vocab, H), 1.0), "F16")
    for i in range(M["layers"]):
        p = f"model.layers.{i}."
        for n in ("input_layernorm", "pre_feedforward_layernorm"):
            put(p + n + ".weight", normal((H,), 0.2), "F32")
        # Sub-layer outputs ~16x normalized (their post-norms are 1 + ~15): with tied
        # embeddings, a residual stream still dominated by the token's own (sqrt(hidden)-scaled)
        # embedding would make every input token its own top-1 prediction.
        for n in ("post_attention_layernorm", "post_feedforward_layernorm"):
            put(p + n + ".weight", 15 + normal((H,), 2.0), "F32")
        put(p + "self_attn.q_proj.weight", normal((nh * hd, H), H ** -0.5), "F16")
        put(p + "self_attn.k_proj.weight", normal((nkv * hd, H), H ** -0.5), "F16")
        put(p + "self_attn.v_proj.weight", normal((nkv * hd, H), H ** -0.5), "F16")
        put(p + "self_attn.o_proj.weight", normal((H, nh * hd), (nh * hd) ** -0.5), "F16")
        put(p + "self_attn.q_norm.weight", normal((hd,), 0.2), "F32")
        put(p + "self_attn.k_norm.weight", normal((hd,), 0.2), "F32")
        put(p + "mlp.gate_proj.weight", normal((ff, H), H ** -0.5), "BF16")
        put(p + "mlp.up_proj.weight", normal((ff, H), H ** -0.5), "BF16")
        put(p + "mlp.down_proj.weight", normal((H, ff), ff ** -0.5), "BF16")
    put("model.norm.weight", normal((H,), 0.2), "F32")
    return w


def write_hf(d, v, weights):
    os.makedirs(d, exist_ok=True)
    cfg = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
           "vocab_size": len(v["tokens"]), "hidden_size": M["hidden"], "intermediate_size": M["ff"],
           "num_hidden_layers": M["layers"], "num_attention_heads": M["heads"],
           "num_key_value_heads": M["kv_heads"], "head_dim": M["head_dim"],
           "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
           "rope_local_base_freq": 10000.0, "rope_scaling": None, "sliding_window": M["window"],
           "layer_types": M["layer_types"], "query_pre_attn_scalar": M["head_dim"],
           "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": None,
           "attn_logit_softcapping": None, "attention_bias": False, "torch_dtype": "bfloat16",
           "bos_token_id": v["bos"], "eos_token_id": [v["eos"], v["tokens"].index("<end_of_turn>")],
           "pad_token_id": v["padding"]}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    write_tokenizer_files(d, v)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(safetensors_bytes([(n, vals, kind) for n, (vals, kind) in weights.items()]))


def write_gguf(path, v, weights):
    w = gguf.GGUFWriter(path, "gemma3")
    w.add_name(KEY)
    add_dense_hparams(w, M)
    w.add_sliding_window(M["window"])
    w.add_uint32("gemma3.attention.sliding_window_pattern", M["pattern"])
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(v["tokens"])
    w.add_token_scores(v["scores"])
    w.add_token_types(v["types"])
    w.add_bos_token_id(v["bos"])
    w.add_eos_token_id(v["eos"])
    w.add_unk_token_id(v["unknown"])
    w.add_pad_token_id(v["padding"])
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)
    w.add_chat_template(TEMPLATE)

    def store(vals, kind):
        return vals.astype(np.float16) if kind == "F16" else vals.astype(np.float32)

    def norm(name):
        vals, _ = weights[name]
        return (vals + np.float32(1.0)).astype(np.float32)

    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down"}
    norms = {"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
             "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
    w.add_tensor("token_embd.weight", store(*weights["model.embed_tokens.weight"]))
    for i in range(M["layers"]):
        p = f"model.layers.{i}."
        for hf, g in names.items():
            w.add_tensor(f"blk.{i}.{g}.weight", store(*weights[p + hf + ".weight"]))
        for hf, g in norms.items():
            w.add_tensor(f"blk.{i}.{g}.weight", norm(p + hf + ".weight"))
    w.add_tensor("output_norm.weight", norm("model.norm.weight"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab-gguf", default=os.path.join(CACHE, "gemma3-270m-q4_k_m.gguf"))
    ap.add_argument("--out", default=os.path.join(CACHE, "random"))
    a = ap.parse_args()
    v = read_spm_vocab(a.vocab_gguf)
    os.makedirs(a.out, exist_ok=True)
    weights = make_weights(len(v["tokens"]))
    d = os.path.join(a.out, KEY)
    write_hf(d, v, weights)
    g = os.path.join(a.out, KEY + ".gguf")
    write_gguf(g, v, weights)
    print(f"{KEY}: {d}/ ({', '.join(sorted(os.listdir(d)))}), {g} sha256 {sha256(g)}")


if __name__ == "__main__":
    main()
