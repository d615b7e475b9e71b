#!/usr/bin/env bash
# MoE decode with experts streamed from disk, mollm next to llama.cpp, in one run:
#   scripts/bench-moe.sh [MODEL.gguf] [GEN_TOKENS]
# MODEL: default the large derived model (scripts/make-moe-models.sh qwen15-moe, about 27 GB:
# larger than this machine's memory; made here when missing). GEN_TOKENS: default 32.
#
# Before every run the page cache is dropped (`echo 3 > /proc/sys/vm/drop_caches`, as root), so
# nobody starts warm. mollm: `mollm bench -p 0 -n GEN -r 1 --warmup 0 -t 2 --json` with
# --expert-cache at 5, 10, 25 and 50% of the expert bytes, policy least-stale and lru; its row
# gives decode tokens/s, the cache's hit rate and MB read per token, and peak RSS.
# llama.cpp: `llama-bench -p 0 -n GEN -r 1 -t 2` (its defaults: mmap, the page cache as the
# only cache), peak RSS from /usr/bin/time. Both 2 threads.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
models="${MOLLM_MODELS_DIR:-$HOME/.cache/mollm/models}"
model=${1:-$models/derived/qwen15-moe40.gguf}
gen=${2:-32}
mollm="$here/target/release/mollm"
llama="${LLAMA_BIN:-$HOME/.cache/mollm/llama.cpp-build/bin}/llama-bench"
[[ -x $mollm ]] || { echo "build mollm first: cargo build --release --workspace" >&2; exit 2; }
[[ -x $llama ]] || { echo "$llama missing: scripts/build-llama-cpp.sh builds it" >&2; exit 2; }
if [[ ! -e $model && $model == "$models/derived/qwen15-moe40.gguf" ]]; then
  "$here/scripts/make-moe-models.sh" qwen15-moe
fi
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
drop || { echo "cannot drop the page cache (run as root)" >&2; exit 2; }

# Expert bytes: the routed expert tensors of the file.
experts=$(python3 - "$model" <<'EOF'
import sys, gguf
r = gguf.GGUFReader(sys.argv[1])
print(sum(int(t.n_bytes) for t in r.tensors if "_exps." in t.name))
EOF
)
echo "model: $model ($(( $(stat -c %s "$model") >> 20 )) MiB, experts $(( experts >> 20 )) MiB), tg$gen, 2 threads, page cache dropped before each run"
echo
echo "| engine | cache | policy | decode t/s | hit rate | MB read / token | peak RSS MiB |"
echo "| --- | ---: | --- | ---: | ---: | ---: | ---: |"
for pct in 5 10 25 50; do
  mb=$(( experts * pct / 100 >> 20 ))
  for policy in least-stale lru; do
    drop
    "$mollm" bench -m "$model" -p 0 -n "$gen" -r 1 --warmup 0 -t 2 -q --json \
      --expert-cache "$mb" --cache-policy "$policy" \
      | python3 -c '
import json, sys
r = json.load(sys.stdin)[0]
e = r.get("experts", {})
print("| mollm | %s%% (%s MiB) | %s | %.2f | %.1f%% | %.1f | %d |" % (sys.argv[1], sys.argv[2], sys.argv[3],
      r["avg_ts"], 100 * e.get("hit_rate", 0), e.get("bytes_read_per_token", 0) / 1e6,
      r["peak_rss_bytes"] >> 20))' "$pct" "$mb" "$policy"
  done
done
drop
out=$( { /usr/bin/time -v "$llama" -m "$model" -p 0 -n "$gen" -r 1 -t 2 -o json 2>/tmp/bench-moe-time.txt; } || true)
rss=$(awk -F: '/Maximum resident/ { print int($2 / 1024) }' /tmp/bench-moe-time.txt)
echo "$out" | python3 -c '
import json, sys
r = json.load(sys.stdin)[0]
print("| llama.cpp | page cache (mmap) | - | %.2f | - | - | %s |" % (r["avg_ts"], sys.argv[1]))' "$rss"
