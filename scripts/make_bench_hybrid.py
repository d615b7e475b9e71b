#!/usr/bin/env python3
"""Random-weight models in the shapes of Qwen3.5-0.8B and LFM2-350M, for speed comparisons with
llama.cpp (scripts/bench_compare.py); the weights are random, so only speed and memory mean
anything.

Shape (Qwen3.5-0.8B's published configuration): hidden 1024, 24 layers, every fourth full
attention (8 query heads and 2 KV heads of 256, rope over 64 dimensions in sections
[11, 11, 10, 0], base 1e7, output gated), the others gated delta-net (16 key and 16 value heads
of 128, convolution 4), SwiGLU FFN 3584, tied embeddings, vocabulary 248,320: llama.cpp's
ggml-vocab-qwen35 tokens (fixtures/tokenizer/, 151,936 of them, with Qwen3.5's pre-tokenizer)
padded with control tokens to the real model's size, so the output matrix has its real cost.

LFM2-350M's shape: hidden 1024, 16 layers, attention at layers 2, 5, 8, 10, 12 and 14 (16
query and 8 KV heads of 64), gated short convolutions of 3 tokens at the others, SwiGLU FFN
4608, tied embeddings, vocabulary 65,536 of llama.cpp's test tokenizer (ids only: LFM2's own
tokenizer is not here).

Writes F16 matrices (norms, convolutions, A and dt bias in F32) as <name>-f16.gguf, then, when
llama.cpp's llama-quantize is found (--llama-quantize, PATH,
~/.cache/mollm/llama.cpp-build/bin), Q8_0 and Q4_K_M files beside it.

Usage: make_bench_hybrid.py [--out DIR] [--llama-quantize PATH]
   (default DIR: ~/.cache/mollm/models/bench)
Needs: numpy, gguf (pip install numpy gguf==0.19.0).
"""
import argparse
import os
import shutil
import subprocess
import sys

import numpy as np
import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CACHE = os.path.expanduser(os.environ.get("MOLLM_MODELS_DIR", "~/.cache/mollm/models"))
SHAPE = dict(hidden=1024, layers=24, interval=4, heads=8, kv_heads=2, head_dim=256, n_rot=64,
             sections=[11, 11, 10, 0], k_heads=16, v_heads=16, s=128, conv=4, ff=3584,
             vocab=248320, ctx=4096)


def vocab():
    r = gguf.GGUFReader(os.path.join(ROOT, "fixtures", "tokenizer", "ggml-vocab-qwen35.gguf"))
    f = r.fields
    tokens = [bytes(f["tokenizer.ggml.tokens"].parts[i]).decode() for i in f["tokenizer.ggml.tokens"].data]
    types = [int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data]
    merges = [bytes(f["tokenizer.ggml.merges"].parts[i]).decode() for i in f["tokenizer.ggml.merges"].data]
    return tokens, types, merges


def make(path, m):
    rng = np.random.default_rng(550)
    n, A = m["hidden"], "qwen35"
    hd, nh, nkv = m["head_dim"], m["heads"], m["kv_heads"]
    s, hk, hv = m["s"], m["k_heads"], m["v_heads"]
    conv_ch = (2 * hk + hv) * s

    def mat(rows, cols):
        # Row-major (out, in); F16 like a converted checkpoint's matrices.
        return (rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(cols ** -0.5)).astype(np.float16)

    def vec(k, mean=1.0, std=0.1):
        return (mean + rng.standard_normal(k, dtype=np.float32) * np.float32(std)).astype(np.float32)

    tokens, types, merges = vocab()
    extra = m["vocab"] - len(tokens)
    tokens += [f"<|extra_{i}|>" for i in range(extra)]
    types += [3] * extra
    w = gguf.GGUFWriter(path, A)
    w.add_name("qwen35-0.8b-shape")
    w.add_context_length(m["ctx"])
    w.add_embedding_length(n)
    w.add_block_count(m["layers"])
    w.add_feed_forward_length(m["ff"])
    w.add_uint32(f"{A}.attention.head_count", nh)
    w.add_uint32(f"{A}.attention.head_count_kv", nkv)
    w.add_uint32(f"{A}.attention.key_length", hd)
    w.add_uint32(f"{A}.attention.value_length", hd)
    w.add_uint32(f"{A}.rope.dimension_count", m["n_rot"])
    w.add_array(f"{A}.rope.dimension_sections", m["sections"])
    w.add_float32(f"{A}.rope.freq_base", 10000000.0)
    w.add_float32(f"{A}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_uint32(f"{A}.ssm.conv_kernel", m["conv"])
    w.add_uint32(f"{A}.ssm.state_size", s)
    w.add_uint32(f"{A}.ssm.group_count", hk)
    w.add_uint32(f"{A}.ssm.time_step_rank", hv)
    w.add_uint32(f"{A}.ssm.inner_size", hv * s)
    w.add_uint32(f"{A}.full_attention_interval", m["interval"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen35")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(151643)
    w.add_eos_token_id(151645)
    w.add_pad_token_id(151643)
    w.add_add_bos_token(False)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tensor("token_embd.weight", mat(m["vocab"], n))
    for i in range(m["layers"]):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", vec(n))
        if (i + 1) % m["interval"] == 0:
            w.add_tensor(b + "attn_q.weight", mat(2 * nh * hd, n))
            w.add_tensor(b + "attn_k.weight", mat(nkv * hd, n))
            w.add_tensor(b + "attn_v.weight", mat(nkv * hd, n))
            w.add_tensor(b + "attn_q_norm.weight", vec(hd))
            w.add_tensor(b + "attn_k_norm.weight", vec(hd))
            w.add_tensor(b + "attn_output.weight", mat(n, nh * hd))
        else:
            w.add_tensor(b + "attn_qkv.weight", mat(conv_ch, n))
            w.add_tensor(b + "attn_gate.weight", mat(hv * s, n))
            w.add_tensor(b + "ssm_conv1d.weight", vec((conv_ch, m["conv"]), 0.0, 0.5))
            w.add_tensor(b + "ssm_dt.bias", vec(hv, 0.0, 0.5))
            w.add_tensor(b + "ssm_a", (-np.exp(rng.uniform(-1.0, 1.0, hv))).astype(np.float32))
            w.add_tensor(b + "ssm_beta.weight", mat(hv, n))
            w.add_tensor(b + "ssm_alpha.weight", mat(hv, n))
            w.add_tensor(b + "ssm_norm.weight", vec(s))
            w.add_tensor(b + "ssm_out.weight", mat(n, hv * s))
        w.add_tensor(b + "post_attention_norm.weight", vec(n))
        w.add_tensor(b + "ffn_gate.weight", mat(m["ff"], n))
        w.add_tensor(b + "ffn_up.weight", mat(m["ff"], n))
        w.add_tensor(b + "ffn_down.weight", mat(n, m["ff"]))
    w.add_tensor("output_norm.weight", vec(n))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


LFM2 = dict(hidden=1024, layers=16, attn=[2, 5, 8, 10, 12, 14], heads=16, kv_heads=8, head_dim=64,
            l_cache=3, ff=4608, vocab=65536, ctx=4096)


def make_lfm2(path, m):
    rng = np.random.default_rng(551)
    n, A = m["hidden"], "lfm2"

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(cols ** -0.5)).astype(np.float16)

    def vec(k, mean=1.0, std=0.1):
        return (mean + rng.standard_normal(k, dtype=np.float32) * np.float32(std)).astype(np.float32)

    w = gguf.GGUFWriter(path, A)
    w.add_name("lfm2-350m-shape")
    w.add_context_length(m["ctx"])
    w.add_embedding_length(n)
    w.add_block_count(m["layers"])
    w.add_feed_forward_length(m["ff"])
    w.add_uint32(f"{A}.attention.head_count", m["heads"])
    w.add_array(f"{A}.attention.head_count_kv",
                [m["kv_heads"] if i in m["attn"] else 0 for i in range(m["layers"])])
    w.add_uint32(f"{A}.rope.dimension_count", m["head_dim"])
    w.add_float32(f"{A}.rope.freq_base", 1000000.0)
    w.add_float32(f"{A}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_uint32(f"{A}.shortconv.l_cache", m["l_cache"])
    w.add_uint32(f"{A}.vocab_size", m["vocab"])
    w.add_tokenizer_model("test")
    w.add_token_list([f"tok_{i}" for i in range(m["vocab"])])
    w.add_token_scores([0.0] * m["vocab"])
    w.add_token_types([1] * m["vocab"])
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    hd, nh, nkv = m["head_dim"], m["heads"], m["kv_heads"]
    w.add_tensor("token_embd.weight", mat(m["vocab"], n))
    for i in range(m["layers"]):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", vec(n))
        if i in m["attn"]:
            w.add_tensor(b + "attn_q.weight", mat(nh * hd, n))
            w.add_tensor(b + "attn_k.weight", mat(nkv * hd, n))
            w.add_tensor(b + "attn_v.weight", mat(nkv * hd, n))
            w.add_tensor(b + "attn_q_norm.weight", vec(hd))
            w.add_tensor(b + "attn_k_norm.weight", vec(hd))
            w.add_tensor(b + "attn_output.weight", mat(n, nh * hd))
        else:
            w.add_tensor(b + "shortconv.in_proj.weight", mat(3 * n, n))
            w.add_tensor(b + "shortconv.conv.weight", vec((n, m["l_cache"]), 0.0, 0.5))
            w.add_tensor(b + "shortconv.out_proj.weight", mat(n, n))
        w.add_tensor(b + "ffn_norm.weight", vec(n))
        w.add_tensor(b + "ffn_gate.weight", mat(m["ff"], n))
        w.add_tensor(b + "ffn_up.weight", mat(m["ff"], n))
        w.add_tensor(b + "ffn_down.weight", mat(n, m["ff"]))
    w.add_tensor("token_embd_norm.weight", vec(n))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llama_quantize(given):
    for c in [given, shutil.which("llama-quantize"),
              os.path.expanduser("~/.cache/mollm/llama.cpp-build/bin/llama-quantize")]:
        if c and os.path.exists(c):
            return c
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(CACHE, "bench"))
    ap.add_argument("--llama-quantize")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    q = llama_quantize(a.llama_quantize)
    if q is None:
        print("llama-quantize not found: only the F16 files", file=sys.stderr)
    for name, write, shape in [("qwen35-0.8b-shape", make, SHAPE),
                               ("lfm2-350m-shape", make_lfm2, LFM2)]:
        f16 = os.path.join(a.out, f"{name}-f16.gguf")
        if not os.path.exists(f16):
            write(f16 + ".partial", shape)
            os.replace(f16 + ".partial", f16)
        print(f16)
        for kind in ["Q8_0", "Q4_K_M"] if q else []:
            out = os.path.join(a.out, f"{name}-{kind.lower()}.gguf")
            if not os.path.exists(out):
                subprocess.run([q, f16, out + ".partial", kind], check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                os.replace(out + ".partial", out)
            print(out)


if __name__ == "__main__":
    main()
