#!/usr/bin/env python3
"""Produce golden greedy-decoding data for mollm from llama.cpp (the oracle).

Writes fixtures/golden/<key>.json for key in smollm2, qwen05, qwen15, gemma3 (the default),
and the derived mixture-of-experts models smollm2-moe, qwen05-moe (scripts/make_moe_models.py).

Oracle: llama.cpp as vendored in llama-cpp-python 0.3.36 (see scripts/build-llama-cpp.sh), driven
through its own ctypes bindings (llama_cpp/llama_cpp.py), CPU only.

FIXED configuration (also written into every JSON under llama_cpp.config):
  n_ctx 2048, n_batch 512, n_ubatch 512, n_threads 2 (and n_threads_batch 2), n_seq_max 1,
  flash attention OFF (LLAMA_FLASH_ATTN_TYPE_DISABLED), KV cache type_k = type_v = F32,
  n_gpu_layers 0, model loaded with the library defaults (mmap on, extra/repack buffers on).
  Prompt: tokenized like llama.cpp completion: llama_tokenize(add_special=True -> BOS iff the
  GGUF says tokenizer.ggml.add_bos_token, no EOS for these models), parse_special=True
  (so "<|im_start|>" etc. become the special tokens). The whole prompt is decoded as ONE batch
  when it has <= 512 tokens (all cases except gemma3 "long-swa"); a longer prompt is decoded in
  consecutive llama_decode calls of n_batch=512 tokens (positions continue). Only the last
  position's logits are used (llama_batch_get_one requests logits for the last token only).
  Decoding: greedy = argmax over the last logits (first index among equal maxima), then the
  chosen token is decoded as a single-token batch at the next position; 32 tokens are generated,
  stopping early only if the model emits an end-of-generation token (llama_vocab_is_eog); that
  token is recorded and included in "tokens".
  "text" is llama_detokenize(tokens, remove_special=False, unparse_special=True), i.e. special
  tokens are rendered as their text.
  Every case also has "top2_margins": for each generated step, logit(top1) - logit(top2) of the
  logits that step's token was chosen from (small margins = near-ties where a tiny numeric
  difference may legitimately flip the greedy choice).
  The first case of every model also gets "first_logits_top5": the 5 largest (id, logit) of the
  logits right after the prompt (ties: lower id first).
  For smollm2 a sensitivity check is also run with flash attention ON + F16 K/V cache; the
  number of cases whose generated tokens differ is stored in "note_fa_f16_disagreements".

Usage: make_golden.py [--out DIR] [KEY ...]
"""
import argparse
import array
import heapq
import ctypes
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llamacpp_oracle as O  # noqa: E402

L = O.L

N_PREDICT = 32
CONFIG = {
    "n_ctx": 2048, "n_batch": 512, "n_ubatch": 512, "n_threads": 2,
    "flash_attn": False, "type_k": "f32", "type_v": "f32", "sampling": "greedy argmax",
}

LONG_PROSE = (
    "The lighthouse keeper woke before dawn, as he had every morning for thirty-one years. "
    "He climbed the spiral stairs slowly, counting each of the one hundred and twelve steps, "
    "and at the top he wiped the salt from the great lens with a soft grey cloth. Below him the "
    "sea was calm, a sheet of dull pewter stretching toward a horizon that had not yet decided "
    "whether to be blue or white. Fishing boats were already moving out of the harbour, their "
    "engines muttering like old men at a market.\n\n"
    "In the village, the baker had lit her ovens an hour earlier. She kneaded the dough with "
    "strong, practised hands and thought about her daughter, who had gone to study engineering "
    "in a city far to the south. The letters came less often now, but each one was longer, full "
    "of bridges and equations and the names of friends the baker had never met. She kept them "
    "in a tin box beside the flour, and on quiet afternoons she read them again.\n\n"
    "The schoolteacher walked along the harbour wall with a bundle of exercise books under his "
    "arm. He had asked his pupils to write about the sea, and most of them had written about "
    "storms, shipwrecks and sea monsters with too many teeth. One girl, however, had written a "
    "single careful page about the way the light changed on the water between morning and "
    "evening, and he had read it three times before breakfast.\n\n"
    "By noon the wind had turned, carrying the smell of rain from the west. The keeper noted the "
    "pressure in his logbook, the baker pulled the last loaves from the oven, and the teacher "
    "stood at the window of the empty classroom, watching the first heavy drops darken the "
    "stones. Somewhere out beyond the point, a bell buoy began to ring. None of them knew it yet, "
    "but by evening the whole village would be gathered on the quay, waiting for"
)

NUMBERS = (
    "Invoice #00417 (2024-03-15)\n"
    "  qty   item            unit     total\n"
    "  3  x  widget-A      $19.99  = $59.97\n"
    "  12 x  bolt M4x20     $0.35  =  $4.20\n"
    "\tsubtotal:\t$64.17;  tax (8.25%) -> $5.29!!\n"
    "pi ~= 3.14159265358979, e ~= 2.71828, 1234567 + 7654321 = 8888888...\n"
    "Fibonacci: 1, 1, 2, 3, 5, 8, 13, 21, 34,"
)

CODE = (
    "def fibonacci(n: int) -> int:\n"
    "    \"\"\"Return the n-th Fibonacci number (0-indexed).\"\"\"\n"
)


def chat_prompt(key):
    if key == "gemma3":
        return ("<start_of_turn>user\nWrite a haiku about the ocean.<end_of_turn>\n"
                "<start_of_turn>model\n")
    return ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nWhat is the boiling point of water in Celsius?<|im_end|>\n"
            "<|im_start|>assistant\n")


def cases_for(key):
    extra = []
    if key == "gemma3":
        # > 512 prompt tokens: exercises the 512-token sliding window of the local layers and a
        # prompt decoded in two llama_decode calls (512 + rest).
        extra = [("long-swa", LONG_PROSE + " the boats.\n\n" + LONG_PROSE)]
    return [
        ("short-en", "The capital of France is"),
        ("code-python", CODE),
        ("fr", "La tour Eiffel a été construite pour l'Exposition universelle de"),
        ("de", "Die Hauptstadt von Deutschland ist Berlin. Die größte Stadt Bayerns ist"),
        ("cjk", "日本の首都は東京です。中国的首都是"),
        ("long-prose", LONG_PROSE),
        ("chat", chat_prompt(key)),
        ("numbers-punct", NUMBERS),
    ] + extra


def make_context(model, flash_attn, kv_type):
    cp = L.llama_context_default_params()
    cp.n_ctx = CONFIG["n_ctx"]
    cp.n_batch = CONFIG["n_batch"]
    cp.n_ubatch = CONFIG["n_ubatch"]
    cp.n_seq_max = 1
    cp.n_threads = CONFIG["n_threads"]
    cp.n_threads_batch = CONFIG["n_threads"]
    cp.flash_attn_type = 1 if flash_attn else 0
    cp.type_k = kv_type
    cp.type_v = kv_type
    cp.no_perf = True
    ctx = L.llama_init_from_model(model.model, cp)
    if not ctx:
        sys.exit(f"failed to create context for {model.key}")
    return ctx


def logits_row(ctx, n_vocab):
    ptr = L.llama_get_logits_ith(ctx, -1)
    if not ptr:
        raise RuntimeError("no logits")
    raw = ctypes.string_at(ctypes.addressof(ptr.contents), n_vocab * 4)
    return array.array("f", raw)


def argmax(row):
    best = max(row)  # first index among equal maxima (NaN would break: checked below)
    if best != best:
        raise RuntimeError("NaN logits")
    return row.index(best)


def top5(row):
    idx = sorted(range(len(row)), key=lambda i: (-row[i], i))[:5]
    return [[i, float(row[i])] for i in idx]


def decode(ctx, toks):
    arr = (L.llama_token * len(toks))(*toks)
    rc = L.llama_decode(ctx, L.llama_batch_get_one(arr, len(toks)))
    if rc != 0:
        raise RuntimeError(f"llama_decode returned {rc}")


def run_case(model, ctx, prompt, want_top5=False):
    mem = L.llama_get_memory(ctx)
    L.llama_memory_clear(mem, True)
    ptoks = model.tokenize(prompt, True, True)
    if len(ptoks) + N_PREDICT > CONFIG["n_ctx"]:
        raise RuntimeError(f"prompt too long ({len(ptoks)} tokens)")
    nb = CONFIG["n_batch"]
    for i in range(0, len(ptoks), nb):  # prompts > n_batch: consecutive n_batch-sized decodes
        decode(ctx, ptoks[i:i + nb])
    row = logits_row(ctx, model.n_vocab)
    first = top5(row) if want_top5 else None
    out = []
    margins = []
    for step in range(N_PREDICT):
        t = argmax(row)
        out.append(t)
        top1, top2 = heapq.nlargest(2, row)
        margins.append(round(float(top1) - float(top2), 6))
        if model.is_eog(t) or step == N_PREDICT - 1:
            break
        decode(ctx, [t])
        row = logits_row(ctx, model.n_vocab)
    return ptoks, out, first, margins


def golden_for(key, out_dir, commit):
    t0 = time.time()
    model = O.Model(key)
    sha = O.sha256_file(model.path)
    if sha != O.model_sha256(key):
        sys.exit(f"{model.path}: sha256 {sha} != expected {O.model_sha256(key)}")
    ctx = make_context(model, False, O.GGML_TYPE_F32)
    cases = []
    for i, (name, prompt) in enumerate(cases_for(key)):
        ptoks, toks, first, margins = run_case(model, ctx, prompt, want_top5=(i == 0))
        c = {"name": name, "prompt": prompt, "prompt_tokens": ptoks, "tokens": toks,
             "text": model.detokenize(toks)}
        if first is not None:
            c["first_logits_top5"] = first
        c["top2_margins"] = margins
        cases.append(c)
        print(f"[{key}] {name}: {len(ptoks)} prompt toks -> {len(toks)} toks: {c['text']!r}", flush=True)
    L.llama_free(ctx)

    cfg = dict(CONFIG)
    cfg.update({"n_predict": N_PREDICT, "add_bos": model.add_bos, "parse_special": True,
                "n_threads_batch": CONFIG["n_threads"], "n_seq_max": 1, "n_gpu_layers": 0,
                "prompt_chunking": "prompt decoded in consecutive batches of n_batch tokens"})
    doc = {
        "model_file": O.model_file(key),
        "model_sha256": sha,
        "llama_cpp": {"package": O.PACKAGE, "commit": commit, "config": cfg},
        "cases": cases,
    }

    if key == "smollm2":
        def disagreements(flash_attn, kv_type):
            ctx2 = make_context(model, flash_attn, kv_type)
            differ = []
            for (name, prompt), ref in zip(cases_for(key), cases):
                _, toks, _, _ = run_case(model, ctx2, prompt)
                if toks != ref["tokens"]:
                    k = next((j for j, (a, b) in enumerate(zip(toks, ref["tokens"])) if a != b),
                             min(len(toks), len(ref["tokens"])))
                    differ.append({"name": name, "first_divergent_index": k})
            L.llama_free(ctx2)
            return differ

        differ = disagreements(True, O.GGML_TYPE_F16)
        f16_only = disagreements(False, O.GGML_TYPE_F16)
        control = disagreements(False, O.GGML_TYPE_F32)
        doc["note_fa_f16_disagreements"] = {
            "config": {"flash_attn": True, "type_k": "f16", "type_v": "f16"},
            "differing_cases": len(differ), "total_cases": len(cases), "cases": differ,
            "f16_kv_without_flash_attn": {"differing_cases": len(f16_only), "cases": f16_only},
            "control_fresh_context_same_config": {"differing_cases": len(control)},
        }
        print(f"[{key}] FA+F16: {len(differ)}/{len(cases)} differ {differ}; F16 KV only: "
              f"{len(f16_only)} {f16_only}; control: {len(control)}", flush=True)

    model.free()
    path = os.path.join(out_dir, f"{key}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)
    print(f"[{key}] wrote {path} in {time.time() - t0:.1f}s", flush=True)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(here, "..", "..", "fixtures", "golden"))
    ap.add_argument("keys", nargs="*", default=list(O.MODELS))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    O.quiet_logs()
    commit = O.llama_cpp_commit()
    for k in a.keys:
        if k not in O.MODELS and k not in O.DERIVED:
            sys.exit(f"unknown key {k}; valid: {' '.join(list(O.MODELS) + list(O.DERIVED))}")
        golden_for(k, a.out, commit)


if __name__ == "__main__":
    main()
