#!/usr/bin/env python3
"""Text that llama.cpp's "test" tokenizer (LLAMA_VOCAB_TYPE_TEST, src/llama-vocab.cpp) maps to given ids.

The test tokenizer cuts raw text into 5-byte chunks; chunk -> (h = h*31 + byte over the bytes) % n_vocab.
For each wanted id we emit one printable 5-byte chunk hashing to it, so the concatenation tokenizes
to exactly the wanted ids (no BOS: the test vocab has none). Detokenized output is the hex id.
Usage: scripts/research/ids2text.py 1,2,3,4,5 [n_vocab=128]
"""
import itertools
import sys


def chunk_hash(b):
    h = 0
    for c in b:
        h = (h * 31 + c) & 0xFFFFFFFFFFFFFFFF
    return h


def table(n_vocab):
    out = {}
    alphabet = b"abcdefghijklmnopqrstuvwxyz"
    for pre in itertools.product(alphabet, repeat=4):
        for last in alphabet:
            b = bytes(pre) + bytes([last])
            t = chunk_hash(b) % n_vocab
            out.setdefault(t, b.decode())
        if len(out) == n_vocab:
            break
    return out


if __name__ == "__main__":
    ids = [int(x) for x in sys.argv[1].split(",")]
    n_vocab = int(sys.argv[2]) if len(sys.argv) > 2 else 128
    t = table(n_vocab)
    sys.stdout.write("".join(t[i] for i in ids))
