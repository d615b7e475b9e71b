#!/usr/bin/env python3
"""Regenerates fixtures/quant/x86_tiled/tiled.json from this machine's llama.cpp build.

Builds quant/tools/x86_oracle_tiled.c against the compiled ggml CPU backend and runs real
MUL_MAT graphs (ggml-cpu/tiled/ takes them for >= 8 columns) and writes its JSON. A dev tool: cargo and CI
only read the committed fixture.

  LLAMA_SRC   llama.cpp source  (default /root/.cache/mollm/llama.cpp-src/vendor/llama.cpp)
  LLAMA_BUILD llama.cpp build   (default /root/.cache/mollm/llama.cpp-build)
"""
import os, subprocess, sys, tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
src = os.environ.get("LLAMA_SRC", "/root/.cache/mollm/llama.cpp-src/vendor/llama.cpp")
build = os.environ.get("LLAMA_BUILD", "/root/.cache/mollm/llama.cpp-build")
lib = os.path.join(build, "bin")
out = os.path.join(root, "fixtures", "quant", "x86_tiled", "tiled.json")

with tempfile.TemporaryDirectory() as tmp:
    exe = os.path.join(tmp, "oracle")
    subprocess.run(["gcc", "-O2", "-I", os.path.join(src, "ggml", "include"),
                    os.path.join(root, "quant", "tools", "x86_oracle_tiled.c"),
                    "-L", lib, "-lggml-cpu", "-lggml-base", "-lggml", "-lm", "-Wl,-rpath," + lib, "-o", exe], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GGML_CPU_TILED_MM")}
    text = subprocess.run([exe], check=True, capture_output=True, text=True, env=env).stdout
os.makedirs(os.path.dirname(out), exist_ok=True)
with open(out, "w") as f:
    f.write(text)
print(f"wrote {out} ({len(text)} bytes)", file=sys.stderr)
