#!/usr/bin/env python3
"""Produce tokenizer test vectors for the 4 real mollm test models from llama.cpp (the oracle).

Writes fixtures/tokenizer/<key>.json:
  {"model_file": ..., "add_bos_flag": bool, "tokenizer_model": ..., "tokenizer_pre": ...,
   "cases": [{"text": ..., "add_bos": bool, "parse_special": bool, "ids": [...],
              "pieces": [...], "detokenized": ...}]}
Every text appears twice: parse_special=true and parse_special=false. "add_bos" is the model's
GGUF flag tokenizer.ggml.add_bos_token (llama_tokenize(add_special=True)), so ids start with BOS
when it is true. "pieces" are llama_token_to_piece(id, lstrip=0, special=true) decoded as UTF-8
(a piece that is an incomplete UTF-8 sequence is rendered with U+FFFD; "pieces_hex" then gives
the raw bytes of every piece). "detokenized" is llama_detokenize(ids, remove_special=false,
unparse_special=true).

The model is loaded vocab-only, so this is fast. Usage: make_tokenizer_vectors.py [--out DIR] [KEY ...]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llamacpp_oracle as O  # noqa: E402
from gguf_meta import read_gguf  # noqa: E402

COMMON = [
    "",
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\n\n",
    "\r\n",
    " \n \t ",
    "Hello",
    " Hello",
    "Hello ",
    "  Hello  ",
    "Hello world",
    "Hello, world! How are you?",
    "  multiple   spaces   here  ",
    "line one\nline two\n\nline four",
    "tabs\tand\ttabs\t\there",
    "I'm, you're, he's, we've, they'll, I'd, can't, DON'T",
    "1234567",
    "3.14159 -42 +7 1e10 0x1F 1,000,000",
    "2024-03-15T12:34:56Z",
    "Café naïve résumé façade Ångström",
    "Straße über Größe",
    "日本語のテキスト",
    "中文分词测试：你好，世界！",
    "한국어 텍스트",
    "Привет, мир!",
    "مرحبا بالعالم",
    "Emoji: 😀🎉👍🏽 👨‍👩‍👧‍👦",
    "🦙 llama",
    "def foo(x):\n    return x * 2  # double\n",
    "fn main() { println!(\"{}\", 1 + 2); }",
    "<html><body class=\"x\">&amp;</body></html>",
    "a=b&&c||d!=e>=f<=g->h::i",
    "!!!???...,,,;;;:::",
    "UPPER lower MiXeD",
    "   leading and trailing   ",
    "\u00a0non-breaking\u00a0space and zero\u200bwidth",
    "ied 4 ½ months",
]

SPECIAL = {
    "smollm2": ["<|im_start|>user\nHi<|im_end|>\n", "<|endoftext|>", "a<|im_end|>b"],
    "qwen05": ["<|im_start|>user\nHi<|im_end|>\n", "<|endoftext|>", "a<|im_end|>b"],
    "qwen15": ["<|im_start|>user\nHi<|im_end|>\n", "<|endoftext|>", "a<|im_end|>b"],
    "gemma3": ["<start_of_turn>user\nHi<end_of_turn>\n", "<bos>text<eos>", "a<end_of_turn>b"],
}


def _valid_utf8(b):
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def vectors(key, out_dir):
    m = O.Model(key, vocab_only=True)
    _, kv, _ = read_gguf(m.path)
    cases = []
    for text in COMMON + SPECIAL[key]:
        for ps in (True, False):
            ids = m.tokenize(text, True, ps)
            raw = [m.piece_bytes(t) for t in ids]
            c = {"text": text, "add_bos": m.add_bos, "parse_special": ps, "ids": ids,
                 "pieces": [p.decode("utf-8", errors="replace") for p in raw],
                 "detokenized": m.detokenize(ids)}
            if not all(_valid_utf8(p) for p in raw):
                c["pieces_hex"] = [p.hex() for p in raw]
            cases.append(c)
    doc = {
        "model_file": O.MODELS[key],
        "add_bos_flag": m.add_bos,
        "tokenizer_model": kv.get("tokenizer.ggml.model"),
        "tokenizer_pre": kv.get("tokenizer.ggml.pre"),
        "oracle": {"package": O.PACKAGE, "commit": O.llama_cpp_commit(),
                   "api": "llama_tokenize(vocab, text, add_special=True, parse_special=<case>)"},
        "cases": cases,
    }
    m.free()
    path = os.path.join(out_dir, f"{key}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"[{key}] wrote {path}: {len(cases)} cases")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(here, "..", "..", "fixtures", "tokenizer"))
    ap.add_argument("keys", nargs="*", default=list(O.MODELS))
    a = ap.parse_args()
    O.quiet_logs()
    for k in a.keys:
        vectors(k, a.out)


if __name__ == "__main__":
    main()
