#!/usr/bin/env python3
"""Small random-weight RWKV7 models as GGUF files (the `gguf` PyPI writer; no torch), laid out as
llama.cpp's converter (conversion/rwkv.py, Rwkv7Model) writes them, for llama.cpp's rwkv7 graph
as an oracle (scripts/golden/make_recurrent_golden.py --family rwkv7 records llama.cpp's tokens
and logits on them). mollm does not run RWKV7 yet: these files and fixtures/golden/random-rwkv7.json
are the oracle data its rwkv7 graph will be checked against. llama.cpp's own random-model writer
(tests/test-llama-archs.cpp) skips the RWKV architectures.

RWKV7 has no attention: every layer is a time mix (token shift, then the wkv7 recurrence on a
per-sequence state of head_size^2 per head, with decay `w`, in-context learning rate `a`, a value
residual from layer 0 and an output gate, each through a low-rank MLP; a per-head group norm
`time_mix_ln` and a "bonus" term `r_k`) followed by a channel mix (token shift, relu^2).
LayerNorms with biases everywhere, the embeddings normalised first (`token_embd_norm`); the
output matrix is always separate (llama.cpp requires `output.weight`), and so is the gate LoRA
(`time_mix_g1/g2`: llama.cpp's rwkv7 loader refuses a file without them).

As the converter writes them: `attention.head_count` 0, no `token_shift_count` (llama.cpp's
default, 2), layer 0's `time_mix_v0/v1/v2` (unused: layer 0 has no value residual) written as
copies of its `time_mix_a0/a1/a2`, so of the iclr rank, `channel_mix_lerp_k` and the `r_k`
bonus flattened to one dimension, the six token-shift mixes (r, w, k, v, a, g) in one
`time_mix_lerp_fused` [n_embd, 1, 1, 6].

Tokenizer: llama.cpp's test vocabulary (`tokenizer.ggml.model = test`: ids stand for 5-byte
chunks of text, no special tokens), as test-llama-archs writes it; the models are driven by
token ids.

Models (weights all F32; numpy PCG64, fixed seeds, so every machine writes the same bytes and
the golden file records their sha256). Head size 64 (every real RWKV7; ggml's x86 rwkv_wkv7
kernel steps through a head 64 floats at a time):
- rwkv7-random: seed 550, hidden 128 (2 heads), 4 layers, FFN 512, LoRA ranks 32 for decay,
  iclr, value residual and gate (the converter's default ranks at this width), vocab 256,
  context_length 1048576 and the other keys as the converter writes them.
- rwkv7-h4-random: seed 551, the shape of the RWKV7 file the earlier C++ writer made through
  llama.cpp's API (scripts/research/make_random.cpp): hidden 256 (4 heads), 2 layers, FFN 384,
  vocab 128, context_length 256 and `token_shift_count` 2 written; its LoRA ranks all differ (decay 64,
  iclr 32, value residual 16, gate 48), so a rank taken from the wrong key fails, and layer 0's
  dummy v1/v2 (iclr, 32) differ in shape from layer 1's (value residual, 16).

Scales: LayerNorm weights 1 + N(0, 0.1) and biases N(0, 0.1); token-shift mixes U(0, 1);
projections N(0, 1/fan_in); w0 U(-5, 1), so the decay exp(-0.606531 sigmoid(.)) spans about 0.6
(forgets in a token or two) to 0.996 (remembers for hundreds); the LoRAs' second matrices at
half scale; k_k 0.85 + N(0, 0.1), k_a 1 + N(0, 0.1), r_k N(0, 0.1). The per-head group norm
after the recurrence keeps the output's scale whatever the state's.

Usage: make_random_rwkv7.py [--out DIR]   (default ~/.cache/mollm/models/random)
Needs: numpy, gguf (pip install numpy gguf==0.19.0).
"""
import argparse
import hashlib
import os

import numpy as np
import gguf

CACHE = os.path.expanduser("~/.cache/mollm/models")
MODELS = {
    "rwkv7-random": dict(seed=550, hidden=128, layers=4, head_size=64, ff=512, vocab=256,
                         ranks=dict(decay=32, iclr=32, value_res=32, gate=32), ctx=1048576,
                         shift_count_key=False),
    "rwkv7-h4-random": dict(seed=551, hidden=256, layers=2, head_size=64, ff=384, vocab=128,
                            ranks=dict(decay=64, iclr=32, value_res=16, gate=48), ctx=256,
                            shift_count_key=True),
}


def make(path, name, m):
    rng = np.random.default_rng(m["seed"])
    n, L, V, ff = m["hidden"], m["layers"], m["vocab"], m["ff"]
    r = m["ranks"]
    assert n % m["head_size"] == 0

    def normal(shape, std):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)

    def uniform(shape, lo, hi):
        return rng.uniform(lo, hi, shape).astype(np.float32)

    def norm_weight():
        return (1.0 + normal((n,), 0.1)).astype(np.float32)

    def norm_bias():
        return normal((n,), 0.1)

    A = "rwkv7"
    w = gguf.GGUFWriter(path, A)
    w.add_name(name)
    w.add_context_length(m["ctx"])
    w.add_embedding_length(n)
    w.add_block_count(L)
    w.add_layer_norm_eps(1e-5)
    w.add_wkv_head_size(m["head_size"])
    w.add_decay_lora_rank(r["decay"])
    w.add_iclr_lora_rank(r["iclr"])
    w.add_value_residual_mix_lora_rank(r["value_res"])
    w.add_gate_lora_rank(r["gate"])
    w.add_feed_forward_length(ff)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_head_count(0)  # the converter: "required by llama.cpp, unused"
    if m["shift_count_key"]:
        w.add_token_shift_count(2)
    w.add_uint32(f"{A}.vocab_size", V)
    w.add_tokenizer_model("test")
    w.add_token_list([f"tok_{i}" for i in range(V)])
    w.add_token_scores([0.0] * V)
    w.add_token_types([1] * V)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)

    # numpy shapes are ggml's ne reversed: a [n_in, n_out] weight is an (n_out, n_in) array.
    w.add_tensor("token_embd.weight", normal((V, n), 1.0))
    w.add_tensor("token_embd_norm.weight", norm_weight())
    w.add_tensor("token_embd_norm.bias", norm_bias())

    def lora(rank):
        """(x0 [n], x1 [n -> rank], x2 [rank -> n])."""
        return normal((n,), 0.5), normal((rank, n), n ** -0.5), normal((n, rank), 0.5 * rank ** -0.5)

    for i in range(L):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", norm_weight())
        w.add_tensor(b + "attn_norm.bias", norm_bias())
        w.add_tensor(b + "attn_norm_2.weight", norm_weight())
        w.add_tensor(b + "attn_norm_2.bias", norm_bias())
        w.add_tensor(b + "time_mix_w0.weight", uniform((n,), -5.0, 1.0))
        _, w1, w2 = lora(r["decay"])
        w.add_tensor(b + "time_mix_w1.weight", w1)
        w.add_tensor(b + "time_mix_w2.weight", w2)
        a0, a1, a2 = lora(r["iclr"])
        w.add_tensor(b + "time_mix_a0.weight", a0)
        w.add_tensor(b + "time_mix_a1.weight", a1)
        w.add_tensor(b + "time_mix_a2.weight", a2)
        # Layer 0 has no value residual; the converter writes its a0/a1/a2 again as v0/v1/v2.
        v0, v1, v2 = (a0, a1, a2) if i == 0 else lora(r["value_res"])
        w.add_tensor(b + "time_mix_v0.weight", v0)
        w.add_tensor(b + "time_mix_v1.weight", v1)
        w.add_tensor(b + "time_mix_v2.weight", v2)
        w.add_tensor(b + "time_mix_g1.weight", normal((r["gate"], n), n ** -0.5))
        w.add_tensor(b + "time_mix_g2.weight", normal((n, r["gate"]), r["gate"] ** -0.5))
        # Token-shift mixes of r, w, k, v, a, g, in that order: ggml [n, 1, 1, 6].
        w.add_tensor(b + "time_mix_lerp_fused.weight", uniform((6, 1, 1, n), 0.0, 1.0))
        w.add_tensor(b + "time_mix_k_k.weight", (0.85 + normal((n,), 0.1)).astype(np.float32))
        w.add_tensor(b + "time_mix_k_a.weight", (1.0 + normal((n,), 0.1)).astype(np.float32))
        w.add_tensor(b + "time_mix_r_k.weight", normal((n,), 0.1))
        w.add_tensor(b + "time_mix_key.weight", normal((n, n), n ** -0.5))
        w.add_tensor(b + "time_mix_value.weight", normal((n, n), n ** -0.5))
        w.add_tensor(b + "time_mix_receptance.weight", normal((n, n), n ** -0.5))
        w.add_tensor(b + "time_mix_ln.weight", norm_weight())
        w.add_tensor(b + "time_mix_ln.bias", norm_bias())
        w.add_tensor(b + "time_mix_output.weight", normal((n, n), n ** -0.5))
        w.add_tensor(b + "channel_mix_lerp_k.weight", uniform((n,), 0.0, 1.0))
        w.add_tensor(b + "channel_mix_key.weight", normal((ff, n), n ** -0.5))
        w.add_tensor(b + "channel_mix_value.weight", normal((n, ff), 0.5 * ff ** -0.5))
    w.add_tensor("output_norm.weight", norm_weight())
    w.add_tensor("output_norm.bias", norm_bias())
    w.add_tensor("output.weight", normal((V, n), n ** -0.5 * 3))
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
        make(path + ".partial", key, m)
        os.replace(path + ".partial", path)
        print(f"{path} {sha256(path)}")


if __name__ == "__main__":
    main()
