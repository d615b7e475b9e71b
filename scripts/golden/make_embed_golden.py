#!/usr/bin/env python3
"""Golden sentence embeddings (mean-pooled, L2-normalized) -> fixtures/golden/embed.json.

Two oracles:

(a) llama.cpp's `llama-embedding` (llama.cpp as vendored in llama-cpp-python 0.3.36, built by
    scripts/build-llama-cpp.sh), run once per (model, input) with --pooling mean and
    --embd-normalize 2 (see LLAMA_ARGS below; the whole input is one batch and one ubatch, F32 K/V
    for the decoder models as in the other golden files). Its token ids come from the same run
    (--verbose-prompt) and are checked against llama_tokenize(add_special=true,
    parse_special=true) through the ctypes bindings. llama-embedding prints each component as
    "%1.7f": 7 decimal places (absolute precision 5e-8), which is what the file records.

(b) for all-MiniLM-L6-v2 only: the sentence-transformers computation written out in numpy from
    model.safetensors: HF tokenizer ids (the `tokenizers` package on tokenizer.json, truncation
    at sentence-transformers' max_seq_length 256, no padding), token_type_ids 0, attention mask of
    ones, BertModel forward (absolute position embeddings, post-LayerNorm with eps 1e-12, 12 heads,
    exact erf GELU), mean over the last hidden states of all tokens ([CLS] and [SEP] included), L2
    normalization. Computed in float64; recorded with 7 significant digits.

Models: minilm (the GGUF twin of all-MiniLM-L6-v2 from scripts/make_minilm_gguf.py, F32; its HF
directory from scripts/fetch-models.sh minilm), smollm2 and qwen05 (scripts/fetch-models.sh; mean
pooling of a decoder, causal attention, as llama.cpp does when asked for --pooling mean).

The file: `llama_cpp` (build, commit, CPU, the command line), `numpy_reference`, `inputs`,
`models` (per key: GGUF file, sha256, n_embd), then `cases`, one per line: model, gguf_sha256,
input, text, llama_token_ids, llama_embedding and, for minilm, hf_token_ids, st_embedding,
cosine_llama_vs_st and max_abs_diff_llama_vs_st.

Usage: make_embed_golden.py [--out FILE] [--llama-embedding PATH] [keys...]
       make_embed_golden.py --bench N [--bench-ctx 2048,512,256]   (minilm throughput of
           llama-embedding on the inputs repeated N times in one process; prints, writes nothing)
Needs: the llama.cpp build (libllama.so and llama-embedding), numpy, tokenizers
(pip install numpy tokenizers), the models (see above).
"""
import argparse
import json
import math
import os
import platform
import re
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import llamacpp_oracle as O  # noqa: E402

BIN_DEFAULT = os.path.join(O.CACHE, "llama.cpp-build", "bin", "llama-embedding")
MINILM_DIR = os.path.join(O.MODELS_DIR, "all-minilm-l6-v2")
MODELS = {
    # key -> (GGUF file name under MOLLM_MODELS_DIR, expected sha256)
    "minilm": ("all-minilm-l6-v2.gguf", "d80a86a97a44b3c31f6d0f41d888a36f69b353a458666ff651466a0d3bb9248c"),
    "smollm2": (O.MODELS["smollm2"], O.MODEL_SHA256["smollm2"]),
    "qwen05": (O.MODELS["qwen05"], O.MODEL_SHA256["qwen05"]),
}
HOW = {
    "minilm": "scripts/fetch-models.sh minilm && python3 scripts/make_minilm_gguf.py",
    "smollm2": "scripts/fetch-models.sh smollm2",
    "qwen05": "scripts/fetch-models.sh qwen05",
}
# never occurs in an input: each input (the code snippet has newlines) is one prompt
SEP = "<#mollm-sep#>"
N_THREADS = 2
LLAMA_ARGS = ["-c", "2048", "-b", "2048", "-ub", "2048", "-fa", "off", "-t", str(N_THREADS),
              "-ctk", "f32", "-ctv", "f32", "--pooling", "mean", "--embd-normalize", "2",
              "--embd-output-format", "json", "--embd-separator", SEP, "--verbose-prompt"]

INPUTS = [
    ("short", "Hello world"),
    ("sentence", "The quick brown fox jumps over the lazy dog."),
    ("punct-digits",
     "Order #4521 shipped on 2024-03-15 at 09:30; total: $1,299.99 (incl. 8.5% tax)! Questions? "
     "Call 555-0142, ext. 7."),
    ("long-sentence",
     "Although the committee had reviewed every proposal twice, it still could not agree on "
     "which of the three designs would best serve the needs of a rapidly growing community "
     "whose priorities kept changing."),
    ("code",
     "def fibonacci(n):\n"
     "    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
     "    a, b = 0, 1\n"
     "    for _ in range(n):\n"
     "        a, b = b, a + b\n"
     "    return a\n"),
    ("paragraph",
     "Sentence embeddings map a piece of text to a single vector of fixed size, so that texts "
     "with similar meanings end up close to each other. A small encoder such as MiniLM reads the "
     "whole input at once, lets every token attend to every other token, and then averages the "
     "hidden states of all positions. The average is scaled to unit length, which turns the dot "
     "product of two embeddings into their cosine similarity. Search engines, clustering tools "
     "and recommendation systems use such vectors every day, because comparing two of them costs "
     "only a few hundred multiplications, no matter how long the original texts were."),
]


# ------------------------------------------------------------------ llama.cpp oracle (a)

def cpu_info(system_info):
    name = ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        m = re.search(r"^Model name:\s*(.+)$", out, re.M)
        name = m.group(1).strip() if m else ""
    except (OSError, subprocess.CalledProcessError):
        pass
    flags = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            m = re.search(r"^flags\s*:\s*(.*)$", f.read(), re.M)
            flags = set(m.group(1).split()) if m else set()
    except OSError:
        pass
    return {
        "lscpu_model_name": name,
        "machine": platform.machine(),
        "avx512": "avx512f" in flags,
        "avx512_flags": sorted(f for f in flags if f.startswith("avx512")),
        "avx2": "avx2" in flags,
        "llama_system_info": system_info,
    }


def run_llama(binary, gguf, prompts, n_ctx=None):
    args = list(LLAMA_ARGS)
    if n_ctx is not None:  # the bench: -c = -b = -ub = n_ctx
        for flag in ("-c", "-b", "-ub"):
            args[args.index(flag) + 1] = str(n_ctx)
    cmd = [binary, "-m", gguf, *args, "-p", SEP.join(prompts)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8", errors="replace")
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"llama-embedding failed ({p.returncode}):\n{p.stderr[-4000:]}\n{p.stdout[-2000:]}")
    out = p.stdout
    start = out.find('{\n  "object": "list"')
    if start < 0:
        sys.exit(f"no JSON in llama-embedding output:\n{out[-2000:]}")
    head, rest = out[:start], out[start:]
    data, _ = json.JSONDecoder().raw_decode(rest)
    embs = [d["embedding"] for d in sorted(data["data"], key=lambda d: d["index"])]
    ids = [int(m.group(1)) for m in re.finditer(r"^\s*(-?\d+) -> '", head, re.M)]
    counts = [int(n) for n in re.findall(r"number of tokens in prompt = (\d+)", p.stderr)]
    if len(counts) != len(prompts) or sum(counts) != len(ids) or len(embs) != len(prompts):
        sys.exit(f"could not parse llama-embedding output: {len(prompts)} prompts, counts {counts}, "
                 f"{len(ids)} ids, {len(embs)} embeddings")
    per_prompt, k = [], 0
    for n in counts:
        per_prompt.append(ids[k:k + n])
        k += n
    m = re.search(r"system_info: (.*)$", p.stderr, re.M)
    sysinfo = m.group(1).strip() if m else ""
    warn_no_eos = "last token in the prompt is not SEP or EOS" in p.stderr
    return dict(ids=per_prompt, embs=embs, system_info=sysinfo, wall_s=wall,
                warn_no_eos=warn_no_eos, stderr=p.stderr)


# ------------------------------------------------------------------ numpy sentence-transformers (b)

def read_safetensors(path):
    import struct
    dt = {"F32": np.float32, "F16": np.float16, "I64": np.int64}
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        base = 8 + n
        out = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            a, b = info["data_offsets"]
            f.seek(base + a)
            t = np.dtype(dt[info["dtype"]]).newbyteorder("<")
            out[name] = np.frombuffer(f.read(b - a), dtype=t).reshape(info["shape"])
    return out


class StMiniLM:
    """sentence-transformers all-MiniLM-L6-v2: Transformer -> mean Pooling -> Normalize."""

    def __init__(self, model_dir):
        from tokenizers import Tokenizer
        self.cfg = json.load(open(os.path.join(model_dir, "config.json"), encoding="utf-8"))
        st_cfg = json.load(open(os.path.join(model_dir, "sentence_bert_config.json"), encoding="utf-8"))
        pool = json.load(open(os.path.join(model_dir, "1_Pooling", "config.json"), encoding="utf-8"))
        assert pool["pooling_mode_mean_tokens"] and not pool["pooling_mode_cls_token"]
        assert self.cfg["hidden_act"] == "gelu" and self.cfg["position_embedding_type"] == "absolute"
        self.max_len = st_cfg["max_seq_length"]
        self.tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
        self.tok.no_padding()
        self.tok.enable_truncation(self.max_len)
        w = read_safetensors(os.path.join(model_dir, "model.safetensors"))
        self.w = {k: v.astype(np.float64) for k, v in w.items() if v.dtype != np.int64}

    def ids(self, text):
        enc = self.tok.encode(text)
        assert not enc.overflowing, "input longer than max_seq_length"
        return list(enc.ids)

    @staticmethod
    def layer_norm(x, g, b, eps):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * g + b

    def embed(self, ids):
        w, c = self.w, self.cfg
        eps = c["layer_norm_eps"]
        n = len(ids)
        nh = c["num_attention_heads"]
        hd = c["hidden_size"] // nh
        erf = np.frompyfunc(math.erf, 1, 1)
        x = (w["embeddings.word_embeddings.weight"][ids]
             + w["embeddings.position_embeddings.weight"][:n]
             + w["embeddings.token_type_embeddings.weight"][[0] * n])
        x = self.layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
        mask = np.zeros((1, n, n))  # attention mask of ones (no padding): nothing masked
        for i in range(c["num_hidden_layers"]):
            p = f"encoder.layer.{i}."

            def lin(h, name):
                return h @ w[p + name + ".weight"].T + w[p + name + ".bias"]

            q = lin(x, "attention.self.query").reshape(n, nh, hd).transpose(1, 0, 2)
            k = lin(x, "attention.self.key").reshape(n, nh, hd).transpose(1, 0, 2)
            v = lin(x, "attention.self.value").reshape(n, nh, hd).transpose(1, 0, 2)
            s = q @ k.transpose(0, 2, 1) / math.sqrt(hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            ctx = (s @ v).transpose(1, 0, 2).reshape(n, nh * hd)
            x = self.layer_norm(x + lin(ctx, "attention.output.dense"),
                                w[p + "attention.output.LayerNorm.weight"],
                                w[p + "attention.output.LayerNorm.bias"], eps)
            h = lin(x, "intermediate.dense")
            h = 0.5 * h * (1.0 + erf(h / math.sqrt(2.0)).astype(np.float64))
            x = self.layer_norm(x + lin(h, "output.dense"), w[p + "output.LayerNorm.weight"],
                                w[p + "output.LayerNorm.bias"], eps)
        pooled = x.mean(0)  # mean over all tokens (mask of ones), [CLS] and [SEP] included
        return pooled / max(np.linalg.norm(pooled), 1e-12)


# ------------------------------------------------------------------ main

def gguf_path(key):
    p = os.path.join(O.MODELS_DIR, MODELS[key][0])
    if not os.path.isfile(p):
        sys.exit(f"{p} missing: run {HOW[key]}")
    return p


def sig7(x):
    return float(f"{x:.7g}")


def cosine(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def bench(binary, reps, ctxs):
    """Throughput of llama-embedding on the minilm GGUF: the 6 inputs repeated `reps` times as the
    prompts of one process, timed by wall clock against a run with the 6 inputs once, so that
    loading is subtracted out. llama-embedding packs prompts into one batch (= one ubatch for a
    non-causal model) of up to n_ctx tokens, and attention then spans the whole batch (masked), so
    the context size changes the cost: each n_ctx of `ctxs` is timed."""
    gguf = gguf_path("minilm")
    texts = [t for _, t in INPUTS]
    n = len(texts) * reps
    run_llama(binary, gguf, texts)  # warm the page cache
    print(f"llama-embedding, minilm GGUF (F32), {N_THREADS} threads, {len(texts)} inputs x {reps} = {n} "
          f"prompts in one process; best of 5 runs each")
    for c in ctxs:
        small = min(run_llama(binary, gguf, texts, c)["wall_s"] for _ in range(5))
        big = min(run_llama(binary, gguf, texts * reps, c)["wall_s"] for _ in range(5))
        print(f"  -c/-b/-ub {c:5d}: {len(texts)} inputs {small:.3f} s, {n} inputs {big:.3f} s wall -> "
              f"marginal {(n - len(texts)) / (big - small):.1f} inputs/s, whole process {n / big:.1f} inputs/s")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(HERE, "..", "..", "fixtures", "golden", "embed.json"))
    ap.add_argument("--llama-embedding", default=os.environ.get("LLAMA_EMBEDDING", BIN_DEFAULT))
    ap.add_argument("--bench", type=int, default=0, metavar="N")
    ap.add_argument("--bench-ctx", default="2048,512,256", help="n_ctx values for --bench")
    ap.add_argument("keys", nargs="*", default=list(MODELS))
    a = ap.parse_args()
    binary = a.llama_embedding
    if not os.access(binary, os.X_OK):
        sys.exit(f"{binary} not found (run scripts/build-llama-cpp.sh)")
    if a.bench:
        bench(binary, a.bench, [int(c) for c in a.bench_ctx.split(",")])
        return
    for k in a.keys:
        if k not in MODELS:
            sys.exit(f"unknown key {k} (valid: {' '.join(MODELS)})")

    O.quiet_logs()
    O.MODELS.setdefault("minilm", MODELS["minilm"][0])  # so that O.Model("minilm") finds the file
    st = StMiniLM(MINILM_DIR) if "minilm" in a.keys else None
    models, cases, sysinfo = {}, [], ""
    for key in a.keys:
        path = gguf_path(key)
        sha = O.sha256_file(path)
        if sha != MODELS[key][1]:
            sys.exit(f"{path}: sha256 {sha}, want {MODELS[key][1]} (remake it: {HOW[key]})")
        tk = O.Model(key, vocab_only=True)  # llama_tokenize, to check --verbose-prompt's ids
        n_embd = None
        warn = False
        for name, text in INPUTS:
            r = run_llama(binary, path, [text])
            sysinfo = sysinfo or r["system_info"]
            ids, emb = r["ids"][0], r["embs"][0]
            warn = warn or r["warn_no_eos"]
            ref_ids = tk.tokenize(text, True, True)
            if ids != ref_ids:
                sys.exit(f"{key}/{name}: --verbose-prompt ids differ from llama_tokenize: {ids} vs {ref_ids}")
            n_embd = len(emb)
            case = {"model": key, "gguf_sha256": sha, "input": name, "text": text,
                    "llama_token_ids": ids, "llama_embedding": emb}
            if key == "minilm":
                hf_ids = st.ids(text)
                ref = st.embed(hf_ids)
                case["hf_token_ids"] = hf_ids
                case["st_embedding"] = [sig7(x) for x in ref]
                case["cosine_llama_vs_st"] = round(cosine(emb, ref), 9)
                case["max_abs_diff_llama_vs_st"] = float(f"{np.abs(np.asarray(emb) - ref).max():.3g}")
                print(f"{key:8s} {name:14s} {len(ids):4d} tokens  ids {'==' if hf_ids == ids else '!='} HF  "
                      f"cos(a,b) = {case['cosine_llama_vs_st']:.9f}  max|a-b| = {case['max_abs_diff_llama_vs_st']:.2e}")
            else:
                print(f"{key:8s} {name:14s} {len(ids):4d} tokens  first {ids[:3]} last {ids[-2:]}")
            cases.append(case)
        models[key] = {"gguf": MODELS[key][0], "gguf_sha256": sha, "n_embd": n_embd,
                       "add_bos": tk.add_bos, "add_eos": bool(O.L.llama_vocab_get_add_eos(tk.vocab)),
                       "llama_warned_last_token_not_sep_or_eos": warn}
        tk.free()
        if key == "minilm":
            models[key]["hf_dir"] = os.path.basename(MINILM_DIR)
            models[key]["made_by"] = "scripts/make_minilm_gguf.py (F32, as convert_hf_to_gguf.py BertModel)"

    cmd = ["llama-embedding", "-m", "<gguf>", *LLAMA_ARGS, "-p", "<text>"]
    doc = {
        "about": "Mean-pooled, L2-normalized sentence embeddings. Made by scripts/golden/make_embed_golden.py; "
                 "see fixtures/golden/README.md.",
        "llama_cpp": {
            "package": O.PACKAGE,
            "commit": O.llama_cpp_commit(),
            "binary": "llama-embedding (scripts/build-llama-cpp.sh: Release, CPU, GGML_NATIVE)",
            "command": cmd,
            "command_line": " ".join(json.dumps(c) if (" " in c or c == "") else c for c in cmd),
            "config": {"n_ctx": 2048, "n_batch": 2048, "n_ubatch": 2048, "n_threads": N_THREADS,
                       "flash_attn": False, "type_k": "f32", "type_v": "f32", "pooling": "mean",
                       "embd_normalize": 2, "one_input_per_process": True,
                       "tokenize": "common_tokenize(add_special=true, parse_special=true)"},
            "output_precision": "llama-embedding prints %1.7f: 7 decimal places",
            "cpu": cpu_info(sysinfo),
        },
        "numpy_reference": {
            "models": ["minilm"],
            "what": "sentence-transformers all-MiniLM-L6-v2 (Transformer, mean Pooling, Normalize) in numpy "
                    "float64 from model.safetensors: HF BertModel forward with exact erf GELU, attention mask "
                    "of ones, mean over all tokens incl. [CLS]/[SEP], L2 normalize; ids from tokenizer.json "
                    "(tokenizers package, truncation 256, no padding)",
            "output_precision": "7 significant digits",
        },
        "inputs": [{"name": n, "text": t} for n, t in INPUTS],
        "models": models,
    }
    out = os.path.abspath(a.out)
    head = json.dumps(doc, indent=1, ensure_ascii=False)
    body = ",\n".join("  " + json.dumps(c, ensure_ascii=False, separators=(",", ":")) for c in cases)
    text = head[:-2] + ',\n "cases": [\n' + body + "\n ]\n}\n"
    json.loads(text)
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, out)
    print(f"wrote {out} ({len(cases)} cases)")


if __name__ == "__main__":
    main()
