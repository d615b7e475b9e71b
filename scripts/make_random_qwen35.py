#!/usr/bin/env python3
"""Small random-weight Qwen3.5, Qwen3.5-MoE and Qwen3-Next models as GGUF files (the `gguf` PyPI
writer; no torch), laid out as llama.cpp's converter (conversion/qwen.py) and its own test writer
(tests/test-llama-archs.cpp) write them, for mollm's qwen35 graphs against llama.cpp
(scripts/golden/make_recurrent_golden.py --family qwen35 records llama.cpp's tokens and logits;
cli/tests/recurrent.rs runs mollm).

These models mix gated delta-net layers (`attn_qkv` into q, k, v through a causal convolution
of `ssm.conv_kernel` tokens each sequence keeps, the gated delta rule on a per-sequence state
of `ssm.state_size`^2 per value head, `ssm_norm`, a silu gate from `attn_gate`, `ssm_out`) with
full attention layers whose `attn_q` gives each head's query and an output gate.

Tokenizer: llama.cpp's test vocabulary (`tokenizer.ggml.model = test`), as test-llama-archs
writes it; the models are driven by token ids.

Models (weights all F32; numpy PCG64, fixed seeds, so every machine writes the same bytes and
the golden file records their sha256). Every width is a multiple of 64:
- qwen35-random: seed 540, hidden 128, 6 layers [gdn, gdn, attn, gdn, gdn, attn]
  (`full_attention_interval` 3), attention 4 heads x 64 with 2 KV heads, partial rope over 16
  dimensions in sections [3, 3, 2, 0] (each pair in a section, as the real models' [11, 11, 10,
  0] over 64), delta-net 2 key heads and 4 value heads of 64 (value heads tiled over key heads,
  as the converter orders them), convolution 4, FFN 256, vocab 256, untied output.
- qwen35-mtp-random: qwen35-random with one multi-token-prediction block after its 6 layers
  (`nextn_predict_layers` 1; the block's weights from seed 1540), which neither llama.cpp's
  main graph nor mollm runs: the same tokens.
- qwen35moe-random: seed 541, qwen35moe: the layers of qwen35-random given by
  `attention.recurrent_layers` (bools), 8 experts of FFN 64 with 2 used, their gate and up in
  one `ffn_gate_up_exps` (the converter's --fuse-gate-up-exps), a shared expert of 128 behind a
  sigmoid gate, tied output.
- qwen3next-random: seed 542, qwen3next: 4 layers [gdn, gdn, gdn, attn] (the default interval,
  4), neox rope over 16 dimensions, value heads grouped by key head with beta and alpha in one
  `ssm_ba`, separate `ffn_gate_exps`/`ffn_up_exps`, 8 experts of 64, 2 used, shared expert 128.

Usage: make_random_qwen35.py [--out DIR]   (default ~/.cache/mollm/models/random)
Needs: numpy, gguf (pip install numpy gguf==0.19.0).
"""
import argparse
import hashlib
import os

import numpy as np
import gguf

CACHE = os.path.expanduser("~/.cache/mollm/models")
BASE = dict(hidden=128, heads=4, head_dim=64, kv_heads=2, n_rot=16, k_heads=2, v_heads=4, s=64,
            conv=4, ff=256, vocab=256, ctx=256)
MODELS = {
    "qwen35-random": dict(BASE, seed=540, arch="qwen35", kinds="rrarra", interval=3,
                          sections=[3, 3, 2, 0], tied=False),
    # qwen35-random's weights plus one multi-token-prediction block (its own seed), which the
    # main graph does not run: the same tokens.
    "qwen35-mtp-random": dict(BASE, seed=540, arch="qwen35", kinds="rrarra", interval=3,
                              sections=[3, 3, 2, 0], tied=False, mtp=1),
    "qwen35moe-random": dict(BASE, seed=541, arch="qwen35moe", kinds="rrarra", layer_flags=True,
                             sections=[3, 3, 2, 0], tied=True, experts=8, used=2, expert_ff=64,
                             shared_ff=128, merged=True),
    "qwen3next-random": dict(BASE, seed=542, arch="qwen3next", kinds="rrra", tied=False,
                             experts=8, used=2, expert_ff=64, shared_ff=128, merged=False),
}


def make(path, m):
    rng = np.random.default_rng(m["seed"])
    n, L, A = m["hidden"], len(m["kinds"]), m["arch"]
    hd, nh, nkv = m["head_dim"], m["heads"], m["kv_heads"]
    s, hk, hv = m["s"], m["k_heads"], m["v_heads"]
    conv_ch = (2 * hk + hv) * s

    def normal(shape, std):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)

    def norm_weight(k=n):
        return (1.0 + normal((k,), 0.1)).astype(np.float32)

    w = gguf.GGUFWriter(path, A)
    w.add_name(os.path.basename(path)[:-5])
    w.add_context_length(m["ctx"])
    w.add_embedding_length(n)
    w.add_block_count(L + m.get("mtp", 0))
    if m.get("mtp"):
        w.add_uint32(f"{A}.nextn_predict_layers", m["mtp"])
    w.add_feed_forward_length(m["ff"])
    w.add_uint32(f"{A}.attention.head_count", nh)
    w.add_uint32(f"{A}.attention.head_count_kv", nkv)
    w.add_uint32(f"{A}.attention.key_length", hd)
    w.add_uint32(f"{A}.attention.value_length", hd)
    w.add_uint32(f"{A}.rope.dimension_count", m["n_rot"])
    w.add_float32(f"{A}.rope.freq_base", 10000000.0)
    w.add_float32(f"{A}.attention.layer_norm_rms_epsilon", 1e-6)
    if "sections" in m:
        w.add_array(f"{A}.rope.dimension_sections", m["sections"])
    w.add_uint32(f"{A}.ssm.conv_kernel", m["conv"])
    w.add_uint32(f"{A}.ssm.state_size", s)
    w.add_uint32(f"{A}.ssm.group_count", hk)
    w.add_uint32(f"{A}.ssm.time_step_rank", hv)
    w.add_uint32(f"{A}.ssm.inner_size", hv * s)
    if m.get("layer_flags"):
        w.add_array(f"{A}.attention.recurrent_layers", [k == "r" for k in m["kinds"]])
    elif "interval" in m:
        w.add_uint32(f"{A}.full_attention_interval", m["interval"])
    if "experts" in m:
        w.add_uint32(f"{A}.expert_count", m["experts"])
        w.add_uint32(f"{A}.expert_used_count", m["used"])
        w.add_uint32(f"{A}.expert_feed_forward_length", m["expert_ff"])
        w.add_uint32(f"{A}.expert_shared_feed_forward_length", m["shared_ff"])
    w.add_uint32(f"{A}.vocab_size", m["vocab"])
    w.add_tokenizer_model("test")
    w.add_token_list([f"tok_{i}" for i in range(m["vocab"])])
    w.add_token_scores([0.0] * m["vocab"])
    w.add_token_types([1] * m["vocab"])
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)

    # numpy shapes are ggml's ne reversed: a [n_in, n_out] weight is an (n_out, n_in) array.
    w.add_tensor("token_embd.weight", normal((m["vocab"], n), 0.25 if m["tied"] else 1.0))
    for i, kind in enumerate(m["kinds"]):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", norm_weight())
        if kind == "a":
            w.add_tensor(b + "attn_q.weight", normal((2 * nh * hd, n), n ** -0.5))
            w.add_tensor(b + "attn_k.weight", normal((nkv * hd, n), n ** -0.5))
            w.add_tensor(b + "attn_v.weight", normal((nkv * hd, n), n ** -0.5))
            w.add_tensor(b + "attn_q_norm.weight", norm_weight(hd))
            w.add_tensor(b + "attn_k_norm.weight", norm_weight(hd))
            w.add_tensor(b + "attn_output.weight", normal((n, nh * hd), (nh * hd) ** -0.5))
        else:
            w.add_tensor(b + "attn_qkv.weight", normal((conv_ch, n), n ** -0.5))
            w.add_tensor(b + "attn_gate.weight", normal((hv * s, n), n ** -0.5))
            w.add_tensor(b + "ssm_conv1d.weight", normal((conv_ch, m["conv"]), 0.5))
            w.add_tensor(b + "ssm_dt.bias", normal((hv,), 0.5))
            # The converter stores -exp(A_log).
            w.add_tensor(b + "ssm_a", (-np.exp(rng.uniform(-1.0, 1.0, hv))).astype(np.float32))
            if A == "qwen3next":
                w.add_tensor(b + "ssm_ba.weight", normal((2 * hv, n), n ** -0.5))
            else:
                w.add_tensor(b + "ssm_beta.weight", normal((hv, n), n ** -0.5))
                w.add_tensor(b + "ssm_alpha.weight", normal((hv, n), n ** -0.5))
            w.add_tensor(b + "ssm_norm.weight", norm_weight(s))
            w.add_tensor(b + "ssm_out.weight", normal((n, hv * s), (hv * s) ** -0.5))
        w.add_tensor(b + "post_attention_norm.weight", norm_weight())
        if "experts" in m:
            ne, f, sf = m["experts"], m["expert_ff"], m["shared_ff"]
            w.add_tensor(b + "ffn_gate_inp.weight", normal((ne, n), n ** -0.5))
            gate, up = normal((ne, f, n), n ** -0.5), normal((ne, f, n), n ** -0.5)
            if m["merged"]:
                w.add_tensor(b + "ffn_gate_up_exps.weight", np.concatenate([gate, up], axis=1))
            else:
                w.add_tensor(b + "ffn_gate_exps.weight", gate)
                w.add_tensor(b + "ffn_up_exps.weight", up)
            w.add_tensor(b + "ffn_down_exps.weight", normal((ne, n, f), f ** -0.5))
            w.add_tensor(b + "ffn_gate_inp_shexp.weight", normal((n,), n ** -0.5))
            w.add_tensor(b + "ffn_gate_shexp.weight", normal((sf, n), n ** -0.5))
            w.add_tensor(b + "ffn_up_shexp.weight", normal((sf, n), n ** -0.5))
            w.add_tensor(b + "ffn_down_shexp.weight", normal((n, sf), sf ** -0.5))
        else:
            w.add_tensor(b + "ffn_gate.weight", normal((m["ff"], n), n ** -0.5))
            w.add_tensor(b + "ffn_up.weight", normal((m["ff"], n), n ** -0.5))
            w.add_tensor(b + "ffn_down.weight", normal((n, m["ff"]), m["ff"] ** -0.5))
    if m.get("mtp"):
        # llama.cpp's MTP block: a full-attention decoder block and the nextn projections.
        main, rng = rng, np.random.default_rng(m["seed"] + 1000)
        for i in range(L, L + m["mtp"]):
            b = f"blk.{i}."
            w.add_tensor(b + "attn_norm.weight", norm_weight())
            w.add_tensor(b + "attn_q.weight", normal((2 * nh * hd, n), n ** -0.5))
            w.add_tensor(b + "attn_k.weight", normal((nkv * hd, n), n ** -0.5))
            w.add_tensor(b + "attn_v.weight", normal((nkv * hd, n), n ** -0.5))
            w.add_tensor(b + "attn_q_norm.weight", norm_weight(hd))
            w.add_tensor(b + "attn_k_norm.weight", norm_weight(hd))
            w.add_tensor(b + "attn_output.weight", normal((n, nh * hd), (nh * hd) ** -0.5))
            w.add_tensor(b + "post_attention_norm.weight", norm_weight())
            w.add_tensor(b + "ffn_gate.weight", normal((m["ff"], n), n ** -0.5))
            w.add_tensor(b + "ffn_up.weight", normal((m["ff"], n), n ** -0.5))
            w.add_tensor(b + "ffn_down.weight", normal((n, m["ff"]), m["ff"] ** -0.5))
            w.add_tensor(b + "nextn.eh_proj.weight", normal((n, 2 * n), (2 * n) ** -0.5))
            w.add_tensor(b + "nextn.enorm.weight", norm_weight())
            w.add_tensor(b + "nextn.hnorm.weight", norm_weight())
            w.add_tensor(b + "nextn.shared_head_norm.weight", norm_weight())
        rng = main
    w.add_tensor("output_norm.weight", norm_weight())
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
