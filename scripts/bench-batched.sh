#!/usr/bin/env bash
# Aggregate decode of N sequences decoding together, mollm next to llama.cpp, in one run:
#   scripts/bench-batched.sh MODEL.gguf [ROUNDS]
# mollm: `mollm bench -p 0 -n 32 --sequences 1,2,4,8 --depth 64` (median of 3 runs after one
# warm-up; every sequence has 64 tokens in its cache, then 32 batched decode steps).
# llama.cpp: `llama-batched-bench -npp 64 -ntg 32 -npl 1,2,4,8` (S_TG: the same 32 steps
# after a 64-token prompt per sequence; one run; its default F16 KV cache, flash attention
# auto). Both 2 threads. The two alternate ROUNDS times (default 2): this machine's speed
# drifts, so compare rows of the same round.
set -euo pipefail
model=$1
rounds=${2:-2}
here="$(cd "$(dirname "$0")/.." && pwd)"
mollm="$here/target/release/mollm"
llama="${LLAMA_BIN:-$HOME/.cache/mollm/llama.cpp-build/bin}/llama-batched-bench"
[[ -x $mollm ]] || { echo "build mollm first: cargo build --release --workspace" >&2; exit 2; }
[[ -x $llama ]] || { echo "$llama missing: scripts/build-llama-cpp.sh builds it" >&2; exit 2; }
for r in $(seq "$rounds"); do
  echo "== round $r: mollm"
  "$mollm" bench -m "$model" -p 0 -n 32 --sequences 1,2,4,8 --depth 64 --warmup 1 -r 3 -t 2 -q \
    | awk -F'|' 'NR > 2 { printf "%s | %s t/s\n", $8, $10 }'
  echo "== round $r: llama.cpp"
  "$llama" -m "$model" -c 4096 -b 512 -ub 512 -npp 64 -ntg 32 -npl 1,2,4,8 -t 2 2>/dev/null \
    | awk -F'|' '/^\| +64 / { printf " tg32 x%s @ d64 | %s t/s\n", $4 + 0, $9 + 0 }'
done
