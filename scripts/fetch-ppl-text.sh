#!/usr/bin/env bash
# Fetch the English text that `mollm ppl` is checked on, from a PyPI package, and verify it.
#
# Source: the Lee news corpus (Australian Broadcasting Corporation news articles, one article a
# line; Lee, Pincombe & Welsh 2005) as shipped in the `gensim` wheel, version 4.4.0, at
# gensim/test/test_data/lee_background.cor. The text used is its first 100 lines (articles):
# 113,983 bytes, 24,061 SmolLM2 tokens, 23,547 Qwen2.5 tokens.
#
# Usage: scripts/fetch-ppl-text.sh        prints the path of the verified text file
# Written to ${MOLLM_DATA_DIR:-$HOME/.cache/mollm/data}/lee-news-100.txt (a temp file renamed
# into place once its sha256 matches); a verified file is reused.
set -euo pipefail

DATA_DIR="${MOLLM_DATA_DIR:-$HOME/.cache/mollm/data}"
OUT="$DATA_DIR/lee-news-100.txt"
SHA=6a6d8fb31427e0228c210a48ace911fa029023c79241686092c5a03a854ce95e
MEMBER=gensim/test/test_data/lee_background.cor

die() { echo "fetch-ppl-text.sh: error: $*" >&2; exit 1; }

if [[ -f "$OUT" ]] && echo "$SHA  $OUT" | sha256sum -c --status; then
  echo "$OUT"
  exit 0
fi
mkdir -p "$DATA_DIR"
WORK="$(mktemp -d "$DATA_DIR/.fetch.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
# One fixed wheel whatever the host, so the bytes are the same everywhere (the text file is
# identical in every gensim 4.4.0 wheel).
python3 -m pip download --quiet --no-deps --only-binary :all: \
  --python-version 3.11 --platform manylinux_2_28_x86_64 --implementation cp \
  -d "$WORK" gensim==4.4.0 >&2 || die "pip could not download gensim==4.4.0"
WHL="$(ls "$WORK"/gensim-4.4.0-*.whl 2>/dev/null | head -1)"
[[ -n "$WHL" ]] || die "no gensim 4.4.0 wheel in the download"
python3 - "$WHL" "$MEMBER" "$WORK/text" <<'PY' || die "could not extract $MEMBER"
import sys, zipfile
whl, member, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z:
    data = z.read(member)
lines = data.split(b"\n")[:100]
open(out, "wb").write(b"\n".join(lines) + b"\n")
PY
echo "$SHA  $WORK/text" | sha256sum -c --status || die "sha256 mismatch for the extracted text"
mv "$WORK/text" "$OUT"
echo "$OUT"
