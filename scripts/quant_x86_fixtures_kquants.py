#!/usr/bin/env python3
"""Regenerates fixtures/quant/x86_kquants/kquants.json from this machine's llama.cpp build.

Builds quant/tools/x86_oracle_kquants.c against the compiled ggml CPU backend (the real x86
kernels: AVX2/AVX-512 vec_dot, repack gemv/gemm) and writes its JSON. A dev tool: cargo and CI
only read the committed fixture.

  LLAMA_SRC   llama.cpp source  (default /root/.cache/mollm/llama.cpp-src/vendor/llama.cpp)
  LLAMA_BUILD llama.cpp build   (default /root/.cache/mollm/llama.cpp-build)
"""
import os, subprocess, sys, tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
src = os.environ.get("LLAMA_SRC", "/root/.cache/mollm/llama.cpp-src/vendor/llama.cpp")
build = os.environ.get("LLAMA_BUILD", "/root/.cache/mollm/llama.cpp-build")
lib = os.path.join(build, "bin")
out = os.path.join(root, "fixtures", "quant", "x86_kquants", "kquants.json")

with tempfile.TemporaryDirectory() as tmp:
    exe = os.path.join(tmp, "oracle")
    subprocess.run(["gcc", "-O2", "-I", os.path.join(src, "ggml", "include"),
                    os.path.join(root, "quant", "tools", "x86_oracle_kquants.c"),
                    "-L", lib, "-lggml-cpu", "-lggml-base", "-lm", "-Wl,-rpath," + lib, "-o", exe], check=True)
    text = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
with open(out, "w") as f:
    f.write(text)
print(f"wrote {out} ({len(text)} bytes)", file=sys.stderr)
