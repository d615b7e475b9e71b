#!/usr/bin/env bash
# The GPU backends on a machine with an NVIDIA GPU, from prebuilt files (such a machine here has
# no network and takes a few tens of MiB beside the source tree):
#   DIR/mollm, DIR/libmollm_metal.so, DIR/libmollm_cuda.so (stripped release builds),
#   DIR/model.gguf (scripts/make_small_model.py: 7 of SmolLM2's 30 layers, 31 MB),
#   DIR/lee-news-100.txt (scripts/fetch-ppl-text.sh),
#   DIR/cuda-ptx/ (scripts/build-cuda-ptx.sh: the machine has the driver but no NVRTC).
# What it runs: `mollm devices` (both GPU plugins, with their reasons), the conformance gate of
# cuda and of metal on the GPU's Vulkan driver (`mollm backends`), greedy generation, teacher
# forcing (`mollm ppl --json`: top-1 agreement and perplexity against the reference) and
# `mollm bench`, on cuda, metal and the reference. Results go to OUT (default
# ./gpu-out). The Vulkan loader comes from Debian packages unpacked first when the machine has
# none (.gl/*.deb, see the device tool's notes).
#
# Preparing DIR here (it travels with the device call; 64 MiB with the tree):
#   cargo build --release --workspace && mkdir -p .gpu && echo /.gpu/ >> .git/info/exclude
#   cp target/release/{mollm,libmollm_metal.so,libmollm_cuda.so} .gpu/ && strip .gpu/*
#   scripts/make_small_model.py .gpu/model.gguf && cp "$(scripts/fetch-ppl-text.sh)" .gpu/
#   scripts/build-cuda-ptx.sh .gpu/cuda-ptx
# (and the Vulkan loader's .deb files in .gl/, as the device tool's notes say), then run
#   scripts/gpu-check.sh .gpu "$OUT"   with carry [".gl", ".gpu"].
#
#   scripts/gpu-check.sh DIR [OUT]    (CHUNKS=8 ppl windows, BENCH="-p 256 -n 64" bench rows)
set -uo pipefail
dir=${1:?usage: scripts/gpu-check.sh DIR [OUT]}
out=${2:-gpu-out}
mkdir -p "$out"
if ! ldconfig -p | grep -q libvulkan.so.1 && ls .gl/*.deb >/dev/null 2>&1; then
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[[ -e $icd ]] && export VK_DRIVER_FILES=$icd
export XDG_RUNTIME_DIR=/tmp XDG_CACHE_HOME=/tmp/mollm-gpu-cache MOLLM_METAL_ADAPTER=vulkan
export MOLLM_CUDA_PTX=$dir/cuda-ptx
m=$dir/model.gguf
t=$dir/lee-news-100.txt
mollm=$dir/mollm
step() { echo "== $*"; }
{
  step machine
  nvidia-smi -L 2>&1; nproc
  step devices; $mollm devices 2>&1
  step gate; $mollm backends 2>&1 | grep -E '^(cuda|metal|  [a-z_]+ )' | head -60
  for b in cuda metal reference; do
    step "run $b"
    MOLLM_PROFILE=1 $mollm run -m "$m" --backend "$b" --prompt "The capital of France is" \
      --max-tokens 16 --json 2>&1 | tail -30
  done
  for b in cuda metal reference; do
    step "ppl $b"
    $mollm ppl -m "$m" -f "$t" --ctx 256 --chunks "${CHUNKS:-8}" --json --backend "$b" > "$out/ppl_$b.json" 2>&1
    python3 -c "import json,sys; v=json.load(open('$out/ppl_$b.json')); print(v['ppl'], v['seconds'])" 2>&1
  done
  step "teacher forcing"
  python3 - "$out" <<'PY'
import json, sys
o = sys.argv[1]
b = json.load(open(f"{o}/ppl_reference.json"))
for k in ("cuda", "metal"):
    try:
        a = json.load(open(f"{o}/ppl_{k}.json"))
    except Exception as e:
        print(f"{k}: no result ({e})")
        continue
    same = sum(x == y for x, y in zip(a["top1"], b["top1"]))
    print(f"{k}: top-1 agreement {same}/{len(b['top1'])} = {same / len(b['top1']):.4f}; "
          f"ppl {a['ppl']:.4f} reference {b['ppl']:.4f} "
          f"({abs(a['ppl'] - b['ppl']) / b['ppl']:.2e} relative)")
PY
  for b in cuda metal reference; do
    step "bench $b"
    $mollm bench -m "$m" --backend "$b" ${BENCH:--p 256 -n 64} --warmup 1 -r 3 2>&1 | tail -4
  done
} 2>&1 | tee "$out/log.txt"
