#!/usr/bin/env python3
"""Wide golden greedy-decoding sets from llama.cpp (the oracle): many prompts per model, given as
token ids, so that a numerics gap cannot hide behind a handful of cases.

Writes fixtures/golden/wide-<key>.json for key in smollm2, qwen05, qwen15, gemma3. Read by
cli/tests/wide_golden.rs, which feeds every case's `prompt_ids` to ONE `mollm batch` process per
model and backend.

Prompts are token-id sequences, not text, so tokenization plays no part. They are cut from real
text: the Lee news corpus that `mollm ppl` is checked on (scripts/fetch-ppl-text.sh: the first
100 articles of gensim 4.4.0's lee_background.cor, one article a line, sha256 pinned there).
  - every length L = 1..64: the first L tokens of article (L - 1) (each article tokenized on
    its own, add_special=False, parse_special=False), so each length starts a different
    article;
  - long prompts of LONG_LENGTHS tokens (300, 513 and 1000: the last two past Gemma 3's
    512-token sliding window and past one 512-token batch, so the oracle decodes them in
    chunks of 512): the first L tokens of the articles from LONG_START[L] on, joined with
    "\\n" and tokenized together.
  Where the model adds BOS (tokenizer.ggml.add_bos_token: gemma3 here), the prompt is BOS
  followed by L - 1 text tokens (L counts the BOS); so for gemma3 the length-1 prompt is BOS
  alone. The other models get no BOS, as llama.cpp completion does for them (make_golden.py).

Oracle configuration (also written into every JSON under llama_cpp.config), as make_golden.py:
  n_ctx 2048, n_batch 512, n_ubatch 512, n_threads = n_threads_batch = 2, n_seq_max 1,
  flash attention OFF (flash_attn_type 0; -1 would be auto = on), KV cache type_k = type_v =
  F32 (0), n_gpu_layers 0. Each case starts from an empty KV cache; the prompt is decoded in
  consecutive llama_decode calls of at most 512 tokens, logits for its last token only; then
  greedy argmax (first index among equal maxima), one token per decode, N_GEN tokens
  (N_GEN_LONG after the long prompts), stopping early only after an end-of-generation token
  (which is recorded).
  `top2_margins[i]`: logit(top1) - logit(top2) at step i (rounded to 1e-4): a divergence at a
  margin near 0 is a near-tie, not necessarily a bug.

Usage: make_wide_golden.py [--out DIR] [--text FILE] [KEY ...]
"""
import argparse
import heapq
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import llamacpp_oracle as O  # noqa: E402
import make_golden as G  # noqa: E402  (decode, logits_row, argmax)

L = O.L

N_GEN = 12        # generated tokens for the prompts of 1..64 tokens
N_GEN_LONG = 8    # and for the long ones
SHORT_LENGTHS = list(range(1, 65))
LONG_LENGTHS = [300, 513, 1000]
LONG_START = {300: 64, 513: 70, 1000: 82}  # first article of each long prompt
CONFIG = {
    "n_ctx": 2048, "n_batch": 512, "n_ubatch": 512, "n_threads": 2, "n_threads_batch": 2,
    "n_seq_max": 1, "n_gpu_layers": 0, "flash_attn_type": 0, "type_k": "f32", "type_v": "f32",
    "sampling": "greedy argmax (ties: lowest id)", "n_gen": N_GEN, "n_gen_long": N_GEN_LONG,
    "prompt_chunking": "prompt decoded in consecutive llama_decode calls of n_batch tokens",
}
TEXT_SHA256 = "6a6d8fb31427e0228c210a48ace911fa029023c79241686092c5a03a854ce95e"


def text_file(path):
    if path is None:
        path = subprocess.run([os.path.join(HERE, "..", "fetch-ppl-text.sh")], check=True,
                              capture_output=True, text=True).stdout.strip()
    if O.sha256_file(path) != TEXT_SHA256:
        sys.exit(f"{path}: sha256 is not {TEXT_SHA256} (see scripts/fetch-ppl-text.sh)")
    with open(path, encoding="utf-8") as f:
        articles = [line for line in f.read().split("\n") if line.strip()]
    assert len(articles) == 100, len(articles)
    return articles


def prompts_for(model, articles):
    bos = [L.llama_vocab_bos(model.vocab)] if model.add_bos else []
    out = []
    for n in SHORT_LENGTHS:
        toks = model.tokenize(articles[n - 1], False, False)
        need = n - len(bos)
        assert len(toks) >= need, (n, len(toks))
        out.append(bos + toks[:need])
    for n in LONG_LENGTHS:
        toks = model.tokenize("\n".join(articles[LONG_START[n]:]), False, False)
        need = n - len(bos)
        assert len(toks) >= need, (n, len(toks))
        out.append(bos + toks[:need])
    for p in out:
        assert p and len(p) + max(N_GEN, N_GEN_LONG) <= CONFIG["n_ctx"]
    return out


def generate(model, ctx, prompt, n_gen):
    L.llama_memory_clear(L.llama_get_memory(ctx), True)
    nb = CONFIG["n_batch"]
    for i in range(0, len(prompt), nb):
        G.decode(ctx, prompt[i:i + nb])
    row = G.logits_row(ctx, model.n_vocab)
    toks, margins = [], []
    for step in range(n_gen):
        t = G.argmax(row)
        toks.append(t)
        top1, top2 = heapq.nlargest(2, row)
        margins.append(round(float(top1) - float(top2), 4))
        if model.is_eog(t) or step == n_gen - 1:
            break
        G.decode(ctx, [t])
        row = G.logits_row(ctx, model.n_vocab)
    return toks, margins


def make_context(model):
    cp = L.llama_context_default_params()
    cp.n_ctx = CONFIG["n_ctx"]
    cp.n_batch = CONFIG["n_batch"]
    cp.n_ubatch = CONFIG["n_ubatch"]
    cp.n_seq_max = 1
    cp.n_threads = CONFIG["n_threads"]
    cp.n_threads_batch = CONFIG["n_threads_batch"]
    cp.flash_attn_type = 0  # LLAMA_FLASH_ATTN_TYPE_DISABLED (-1 = auto, which turns it on)
    cp.type_k = O.GGML_TYPE_F32
    cp.type_v = O.GGML_TYPE_F32
    cp.no_perf = True
    ctx = L.llama_init_from_model(model.model, cp)
    if not ctx:
        sys.exit(f"failed to create context for {model.key}")
    return ctx


def wide_for(key, articles, out_dir, commit):
    t0 = time.time()
    model = O.Model(key)
    sha = O.sha256_file(model.path)
    if sha != O.MODEL_SHA256[key]:
        sys.exit(f"{model.path}: sha256 {sha} != expected {O.MODEL_SHA256[key]}")
    ctx = make_context(model)
    cases = []
    for p in prompts_for(model, articles):
        toks, margins = generate(model, ctx, p, N_GEN if len(p) <= 64 else N_GEN_LONG)
        cases.append({"prompt_ids": p, "tokens": toks, "top2_margins": margins})
        if len(p) % 16 == 0 or len(p) > 64:
            print(f"[{key}] {len(p)} prompt tokens -> {model.detokenize(toks)!r} "
                  f"({time.time() - t0:.0f}s)", flush=True)
    L.llama_free(ctx)
    model.free()
    cfg = dict(CONFIG, add_bos=model.add_bos)
    doc = {
        "model_file": O.MODELS[key],
        "model_sha256": sha,
        "llama_cpp": {"package": O.PACKAGE, "commit": commit, "config": cfg},
        "prompts": {"text": "scripts/fetch-ppl-text.sh (lee-news-100.txt)", "text_sha256": TEXT_SHA256,
                    "short_lengths": "1..64", "long_lengths": LONG_LENGTHS,
                    "made_by": "scripts/golden/make_wide_golden.py"},
    }
    # Compact, one case a line (small, and diffs stay readable).
    head = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))[:-1]
    body = ",\n".join(json.dumps(c, separators=(",", ":")) for c in cases)
    path = os.path.join(out_dir, f"wide-{key}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(head + ',"cases":[\n' + body + "\n]}\n")
    json.load(open(path + ".tmp", encoding="utf-8"))  # well-formed
    os.replace(path + ".tmp", path)
    print(f"[{key}] wrote {path}: {len(cases)} cases in {time.time() - t0:.1f}s", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(HERE, "..", "..", "fixtures", "golden"))
    ap.add_argument("--text", help="lee-news-100.txt (default: scripts/fetch-ppl-text.sh fetches it)")
    ap.add_argument("keys", nargs="*", default=list(O.MODELS))
    a = ap.parse_args()
    for k in a.keys:
        if k not in O.MODELS:
            sys.exit(f"unknown key {k}; valid: {' '.join(O.MODELS)}")
    os.makedirs(a.out, exist_ok=True)
    articles = text_file(a.text)
    O.quiet_logs()
    commit = O.llama_cpp_commit()
    for k in a.keys:
        wide_for(k, articles, a.out, commit)


if __name__ == "__main__":
    main()
