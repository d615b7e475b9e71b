#!/usr/bin/env python3
"""RWKV "world" tokenizer fixtures: a vocab-only GGUF written the way llama.cpp's converter
writes it, and llama.cpp's tokenization of test texts.

Writes into fixtures/tokenizer/ (or --out):
  ggml-vocab-rwkv-world.gguf              vocab-only GGUF, arch rwkv7, tokenizer.ggml.model "rwkv"
  ggml-vocab-rwkv-world.gguf.inp          test texts joined by "\\n__ggml_vocab_test__\\n"
  ggml-vocab-rwkv-world.gguf.out          llama.cpp's ids, add_special=false, parse_special=false
  ggml-vocab-rwkv-world.gguf.special.out  the same with parse_special=true
  ggml-vocab-rwkv-world.gguf.pieces       FNV-1a 64 of every token's llama_token_to_piece bytes

The vocabulary is `rwkv/rwkv_vocab_v20230424.txt` from the PyPI package `rwkv` (e.g.
`pip download --no-deps rwkv==0.8.32 -d /tmp/rwkvwhl`); pass the wheel or the extracted text
file with --vocab. The token list follows `_set_vocab_rwkv_world` of llama.cpp's
convert_hf_to_gguf.py (conversion/base.py): "<s>" (CONTROL) first, then `repr(bytes)[2:-1]` of
each vocabulary entry (NORMAL), then "[PAD<i>]" (UNUSED) up to 65536 tokens; bos = eos = 0,
eot = 261 ("\\n\\n"), the chat template models/templates/llama-cpp-rwkv-world.jinja (the
converter's fallback "rwkv-world" when the llama.cpp tree is not there). The model
hyperparameters are those the converter writes for an RWKV7 0.1B shape (768 wide, 12 layers):
llama.cpp needs them even to load a vocabulary.

The oracle is llama.cpp 0c1e570 through llama-cpp-python's ctypes bindings
(scripts/golden/llamacpp_oracle.py); defaults: LLAMA_CPP_PY=~/.cache/mollm/llama.cpp-0c1e570-src,
LLAMA_CPP_LIB_PATH=~/.cache/mollm/llama.cpp-0c1e570-tests/bin. --no-vectors only writes the GGUF.
Nothing from llama.cpp is copied into the repository except what its converter writes into a
GGUF (the chat template).

Usage: make_rwkv_vocab.py --vocab /tmp/rwkvwhl/rwkv-0.8.32-py3-none-any.whl [--out DIR] [--no-vectors]
"""
import argparse
import ast
import ctypes
import hashlib
import io
import os
import sys
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
HOME = os.path.expanduser("~")
LLAMA_SRC = os.path.join(HOME, ".cache", "mollm", "llama.cpp-0c1e570-src")
# Read by llamacpp_oracle (imported only for the vectors).
os.environ.setdefault("LLAMA_CPP_PY", LLAMA_SRC)
os.environ.setdefault("LLAMA_CPP_LIB_PATH", os.path.join(HOME, ".cache", "mollm", "llama.cpp-0c1e570-tests", "bin"))
LLAMA_DIR = os.environ.get("LLAMA_CPP_DIR", os.path.join(LLAMA_SRC, "vendor", "llama.cpp"))

VOCAB_NAME = "rwkv/rwkv_vocab_v20230424.txt"
VOCAB_SHA256 = "8324476023347dec2964625ccb2075c864d250a9c6d9a74f36daba628de8c008"
VOCAB_SIZE = 65536
STEM = "ggml-vocab-rwkv-world.gguf"
SEP = "\n__ggml_vocab_test__\n"

# Texts for this tokenizer in particular (the shared ones come from the other .inp files).
RWKV_TEXTS = [
    # special and control token text: "<s>" is a CONTROL token, and also in the trie
    "<s>",
    "<s><s>",
    "a<s>b",
    " <s> ",
    "<s",
    "</s>",
    "<|endoftext|>",
    "[PAD65530]",
    "[PAD65535]x",
    "[PAD65529]",
    # escapes in the token list: \\ \' \t \n \r \xHH
    "\\",
    "\\\\",
    "\\n",
    "\\x00",
    "C:\\path\\to\\file",
    "'\"'\"",
    "it's \"quoted\"",
    "\x00",
    "\x00\x01\x02\x7f",
    "a\x00b",
    "\x1b[31mred\x1b[0m",
    "\u0080\u00ff",
    "\u00ad soft hyphen",
    # whitespace runs, newlines (token 261 is "\n\n", the EOT)
    " " * 128,
    " " * 129,
    " " * 300,
    "\t" * 7,
    "\n" * 7,
    "\r\n\r\n\r\n",
    "\r\r\n\n",
    "a\n\nb\n\n\nc",
    " \n \n\t\n",
    "User: hi\n\nAssistant:",
    "#" * 80,
    "#" * 81,
    "-" * 200,
    "=" * 33,
    # multi-byte UTF-8, emoji, Chinese and rarer scripts
    "中文分词测试：你好，世界！",
    "我想在apple工作1",
    "𠜎𠜱𠝹𠱓",
    "龘靐齉",
    "日本語のテキスト、カタカナ",
    "한국어 텍스트",
    "Ελληνικά",
    "עברית",
    "हिन्दी",
    "ไทย",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛",
    "😀😁😂🤣",
    "👨‍👩‍👧‍👦",
    "🏳️‍🌈🇺🇳",
    "e\u0301\u0302\u0303",
    "\ufeffBOM",
    "\U0010ffff\U000e0001",
    "\u200b\u200c\u200d",
    "Hello world. The quick brown fox jumps over the lazy dog.",
    "def f(x):\n\treturn x ** 2\n",
]


def unique(texts):
    seen, out = set(), []
    for t in texts:
        if t not in seen and SEP not in t:
            seen.add(t)
            out.append(t)
    return out


def read_vocab_lines(path):
    if path.endswith(".whl") or zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            data = z.read(VOCAB_NAME)
    else:
        with open(path, "rb") as f:
            data = f.read()
    got = hashlib.sha256(data).hexdigest()
    if got != VOCAB_SHA256:
        sys.exit(f"{path}: {VOCAB_NAME} has sha256 {got}, expected {VOCAB_SHA256}")
    return io.StringIO(data.decode("utf-8")).readlines()


def world_tokens(lines):
    """The token list and types exactly as _set_vocab_rwkv_world builds them."""
    import gguf

    tokens = ["<s>".encode("utf-8")]
    types = [gguf.TokenType.CONTROL]
    for line in lines:
        parts = line.split(" ")
        assert len(parts) >= 3
        token, token_len = ast.literal_eval(" ".join(parts[1:-1])), int(parts[-1])
        token = token.encode("utf-8") if isinstance(token, str) else token
        assert isinstance(token, bytes)
        assert len(token) == token_len
        tokens.append(repr(token)[2:-1].encode("utf-8"))
        types.append(gguf.TokenType.NORMAL)
    assert len(tokens) <= VOCAB_SIZE
    for i in range(len(tokens), VOCAB_SIZE):
        tokens.append(f"[PAD{i}]".encode("utf-8"))
        types.append(gguf.TokenType.UNUSED)
    return tokens, types


def write_gguf(path, tokens, types):
    import gguf

    w = gguf.GGUFWriter(path, "rwkv7")
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name("rwkv7-world")
    # Rwkv7Model.set_gguf_parameters for hidden 768, 12 layers, head 64 (lora ranks by its
    # calc_lora_rank: decay 64, iclr 64, value-residual 32, gate 128).
    w.add_context_length(1048576)
    w.add_embedding_length(768)
    w.add_block_count(12)
    w.add_layer_norm_eps(1e-5)
    w.add_wkv_head_size(64)
    w.add_decay_lora_rank(64)
    w.add_iclr_lora_rank(64)
    w.add_value_residual_mix_lora_rank(32)
    w.add_gate_lora_rank(128)
    w.add_feed_forward_length(3072)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_head_count(0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_tokenizer_model("rwkv")
    w.add_token_list(tokens)
    w.add_token_types(types)
    # SpecialVocab.add_to_gguf after the converter's overrides
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_eot_token_id(261)
    template = os.path.join(LLAMA_DIR, "models", "templates", "llama-cpp-rwkv-world.jinja")
    if os.path.isfile(template):
        with open(template, encoding="utf-8") as f:
            w.add_chat_template(f.read())
    else:
        print(f"note: {template} not found; chat template 'rwkv-world' (the converter's fallback)")
        w.add_chat_template("rwkv-world")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()


def shared_texts(out_dir):
    """The texts of llama.cpp's own vector files (all share one .inp) and of the real models'."""
    with open(os.path.join(out_dir, "ggml-vocab-llama-spm.gguf.inp"), encoding="utf-8", newline="") as f:
        inp = f.read().split(SEP)
    if inp and inp[-1] == "":
        inp.pop()
    sys.path.insert(0, os.path.join(HERE, "golden"))
    from make_tokenizer_vectors import COMMON  # noqa: E402

    return inp + COMMON


def fnv1a64(pieces):
    h = 0xCBF29CE484222325
    for p in pieces:
        for b in len(p).to_bytes(4, "little") + p:
            h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def write_vectors(gguf_path, out_dir):
    sys.path.insert(0, os.path.join(HERE, "golden"))
    import llamacpp_oracle as O  # noqa: E402

    O.quiet_logs()
    L = O.L
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    mp.vocab_only = True
    model = L.llama_model_load_from_file(gguf_path.encode(), mp)
    if not model:
        sys.exit(f"llama.cpp failed to load {gguf_path}")
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    assert n_vocab == VOCAB_SIZE, n_vocab

    def tokenize(text, parse_special):
        b = text.encode("utf-8")
        n_max = len(b) + 16
        buf = (L.llama_token * n_max)()
        n = L.llama_tokenize(vocab, b, len(b), buf, n_max, False, parse_special)
        if n < 0:
            raise RuntimeError(f"tokenize failed ({n}) for {text!r}")
        return list(buf[:n])

    def piece(tok, special):
        buf = ctypes.create_string_buffer(512)
        n = L.llama_token_to_piece(vocab, tok, buf, 512, 0, special)
        assert n >= 0, (tok, n)
        return buf.raw[:n]

    texts = unique(shared_texts(out_dir) + RWKV_TEXTS)
    with open(os.path.join(out_dir, STEM + ".inp"), "w", encoding="utf-8", newline="") as f:
        f.write(SEP.join(texts) + SEP)
    for name, ps in ((".out", False), (".special.out", True)):
        with open(os.path.join(out_dir, STEM + name), "w", encoding="utf-8", newline="") as f:
            for t in texts:
                f.write("".join(f" {i}" for i in tokenize(t, ps)) + "\n")
    with open(os.path.join(out_dir, STEM + ".pieces"), "w", encoding="utf-8") as f:
        for special in (True, False):
            h = fnv1a64(piece(i, special) for i in range(n_vocab))
            f.write(f"special={str(special).lower()} fnv1a64={h:016x}\n")
    info = {
        "bos": L.llama_vocab_bos(vocab),
        "eos": L.llama_vocab_eos(vocab),
        "eot": L.llama_vocab_eot(vocab),
        "add_bos": bool(L.llama_vocab_get_add_bos(vocab)),
        "eog": [i for i in range(n_vocab) if L.llama_vocab_is_eog(vocab, i)],
    }
    L.llama_model_free(model)
    print(f"{len(texts)} texts; llama.cpp {O.llama_cpp_commit()}; {info}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", required=True, help="the rwkv wheel, or rwkv_vocab_v20230424.txt")
    ap.add_argument("--out", default=os.path.join(HERE, "..", "fixtures", "tokenizer"))
    ap.add_argument("--no-vectors", action="store_true")
    a = ap.parse_args()
    gguf_py = os.path.join(LLAMA_DIR, "gguf-py")
    if os.path.isdir(gguf_py):
        sys.path.insert(0, gguf_py)
    tokens, types = world_tokens(read_vocab_lines(a.vocab))
    path = os.path.join(a.out, STEM)
    write_gguf(path, tokens, types)
    with open(path, "rb") as f:
        print(f"wrote {path}: {len(tokens)} tokens, sha256 {hashlib.sha256(f.read()).hexdigest()}")
    if not a.no_vectors:
        write_vectors(path, a.out)


if __name__ == "__main__":
    main()
