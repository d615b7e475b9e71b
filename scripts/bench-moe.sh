#!/usr/bin/env bash
# MoE decode with experts streamed from disk, mollm next to llama.cpp, in one run:
#   scripts/bench-moe.sh [MODEL.gguf] [GEN_TOKENS]
# MODEL: default the large derived model (scripts/make-moe-models.sh qwen15-moe, about 27 GB:
# larger than this machine's memory; made here when missing). GEN_TOKENS: default 32.
#
# Protocol. Before every command the page cache is dropped (`echo 3 > /proc/sys/vm/drop_caches`,
# as root), so each starts cold from the disk; 2 threads each.
# - mollm: `mollm bench -p 0 -n GEN -r 1 --warmup 1 -t 2` with --expert-cache at 5, 10, 25 and
#   50% of the expert bytes (next-use with the prefetch back-off, with prefetch always on,
#   without prefetch; least-stale with the back-off; LRU with prefetch on), and the
#   default budget (what the memory available leaves after the dense weights and KV cache).
#   The warm-up run (GEN tokens) fills the expert cache; the row is the measured run after it:
#   decode tokens/s, hit rate (prefetched experts count as hits), MB read per token.
# - llama.cpp: `llama-bench -p 0 -n GEN -r 1 -t 2` with its defaults (the file memory-mapped,
#   its load asking the kernel to read the whole file ahead; the Q4_K weights copied into its
#   CPU repack buffer), and with `--repack 0` (the page cache its only cache); a 1-token
#   warm-up, then the measured run.
# - PCTS (default "5 10 25 50"; "" for none) sets the cache sizes; ROWS=main keeps, per size, the default
#   (next-use with the back-off) and the LRU rows only. Sizes whose cache would not fit in
#   memory beside the dense weights have no place here: mind PCTS for files over twice RAM.
# - Both: "cold s" is the whole command's wall time (load, warm-up and measured run, from a
#   dropped page cache), peak RSS from /usr/bin/time (for llama.cpp it counts the mapped file
#   pages it touched).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
models="${MOLLM_MODELS_DIR:-$HOME/.cache/mollm/models}"
model=${1:-$models/derived/qwen15-moe40.gguf}
gen=${2:-32}
mollm="$here/target/release/mollm"
llama="${LLAMA_BIN:-$HOME/.cache/mollm/llama.cpp-build/bin}/llama-bench"
[[ -x $mollm ]] || { echo "build mollm first: cargo build --release --workspace" >&2; exit 2; }
[[ -x $llama ]] || { echo "$llama missing: scripts/build-llama-cpp.sh builds it" >&2; exit 2; }
[[ -x /usr/bin/time ]] || { echo "/usr/bin/time missing (apt-get install time)" >&2; exit 2; }
if [[ ! -e $model && $model == "$models/derived/qwen15-moe40.gguf" ]]; then
  "$here/scripts/make-moe-models.sh" qwen15-moe
fi
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
drop || { echo "cannot drop the page cache (run as root)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Expert bytes: the routed expert tensors of the file.
experts=$(python3 - "$model" <<'EOF'
import sys, gguf
r = gguf.GGUFReader(sys.argv[1])
print(sum(int(t.n_bytes) for t in r.tensors if "_exps." in t.name))
EOF
)
echo "model: $model ($(( $(stat -c %s "$model") >> 20 )) MiB, experts $(( experts >> 20 )) MiB), tg$gen, 2 threads, $(nproc) cores, page cache dropped before each command"
echo
echo "| engine | cache | policy | prefetch | decode t/s | cold s | hit rate | MB read / token | prediction accuracy | peak RSS MiB |"
echo "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"

# One mollm row: LABEL then extra flags.
mollm_row() {
  local label=$1; shift
  drop
  if ! /usr/bin/time -f "%e %M" -o "$tmp/time" "$mollm" bench -m "$model" -p 0 -n "$gen" -r 1 \
    --warmup 1 -t 2 -q --json "$@" > "$tmp/out.json" 2> "$tmp/err"; then
    cat "$tmp/err" >&2
    exit 1
  fi
  python3 - "$label" "$tmp/time" "$tmp/out.json" <<'EOF'
import json, sys
label, tfile, out = sys.argv[1:]
wall, rss_kb = open(tfile).read().split()[-2:]
r = json.load(open(out))[0]
e = r.get("experts")
def prefetch(e):
    if not e["prefetch"]:
        return "off"
    if e.get("prefetch_auto"):
        return "auto (off %d of %d passes)" % (e["backoff_passes"], e["decode_passes"])
    return "on"
if e is None:
    print("| mollm | %s (all resident) | - | - | %.2f | %.0f | - | - | - | %d |" % (label, r["avg_ts"], float(wall), int(rss_kb) >> 10))
else:
    with open(tfile + ".slots", "a") as f:
        f.write("%d\n" % e["slots"])
    print("| mollm | %s | %s | %s | %.2f | %.0f | %.1f%% | %.0f | %s | %d |" % (
        label, e["policy"], prefetch(e), r["avg_ts"], float(wall),
        100 * e["hit_rate"], e["bytes_read_per_token"] / 1e6,
        "%.0f%%" % (100 * e["prediction_accuracy"]) if e["prefetch"] else "-", int(rss_kb) >> 10))
EOF
}

for pct in ${PCTS-5 10 25 50}; do
  mb=$(( experts * pct / 100 >> 20 ))
  mollm_row "$pct% ($mb MiB)" --expert-cache "$mb"
  if [[ ${ROWS:-full} != main ]]; then
    mollm_row "$pct% ($mb MiB)" --expert-cache "$mb" --prefetch on
    mollm_row "$pct% ($mb MiB)" --expert-cache "$mb" --prefetch off
    mollm_row "$pct% ($mb MiB)" --expert-cache "$mb" --cache-policy least-stale
  fi
  mollm_row "$pct% ($mb MiB)" --expert-cache "$mb" --cache-policy lru --prefetch on
done
mollm_row "default" --trace "$tmp/trace.json"

# llama.cpp with its defaults, then without its CPU repack (which copies the Q4_K weights into
# anonymous memory at load, so its memory is not only the page cache: on a file much larger
# than memory that copy does not fit and the default load fails).
llama_row() {
  local label=$1; shift
  drop
  if /usr/bin/time -f "%e %M" -o "$tmp/time" "$llama" -m "$model" -p 0 -n "$gen" -r 1 -t 2 \
    -o json "$@" > "$tmp/llama.json" 2> "$tmp/llama.err"; then
    python3 - "$label" "$tmp/time" "$tmp/llama.json" <<'EOF'
import json, sys
label, tfile, out = sys.argv[1:]
wall, rss_kb = open(tfile).read().split()[-2:]
r = json.load(open(out))[0]
print("| llama.cpp | %s | - | - | %.2f | %.0f | - | - | - | %d |" % (label, r["avg_ts"], float(wall), int(rss_kb) >> 10))
EOF
  else
    why=$( (grep -E "error loading model" "$tmp/llama.err" || grep -E "error|failed" "$tmp/llama.err") |
      head -1 | sed 's/.*error loading model: //' | tr '|' '/')
    echo "| llama.cpp | $label | - | - | did not load: ${why:-see its stderr} | - | - | - | - | - |"
  fi
}
llama_row "page cache (mmap), defaults"
llama_row "page cache (mmap), --repack 0" --repack 0

# The bound: the default run's routes (the same for every cache: exact kernels, the same
# tokens) replayed against Belady's MIN at each size's slot count, the fewest expert reads
# any policy could make there (prefetched or not).
echo
slots=$(awk '!seen[$1]++' "$tmp/time.slots" | paste -sd, -)
python3 "$here/scripts/moe_cache_bound.py" "$tmp/trace.json" --model "$model" --slots "$slots"
