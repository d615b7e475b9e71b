#!/usr/bin/env bash
# The mixture-of-experts test models derived from the real dense GGUF files
# (scripts/make_moe_models.py; under ${MOLLM_MODELS_DIR:-~/.cache/mollm/models}/derived):
# smollm2-moe and qwen05-moe by default, the 27 GB benchmark model with `qwen15-moe`, its
# 54 GB twin (80 experts) with `qwen15-moe80`.
# Idempotent: existing files are kept. Needs python3 with numpy and gguf 0.19.0 (installed
# here from PyPI when missing) and the source models (fetched here). The tests call this
# themselves when a derived model is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c "import numpy, gguf" 2>/dev/null; then
  python3 -m pip install -q --disable-pip-version-check "gguf==0.19.0" numpy
fi
sources=(smollm2 qwen05)
[[ " $* " == *" qwen15-moe "* || " $* " == *" qwen15-moe80 "* ]] && sources+=(qwen15)
scripts/fetch-models.sh "${sources[@]}"
python3 scripts/make_moe_models.py "$@"
