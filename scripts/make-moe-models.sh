#!/usr/bin/env bash
# The mixture-of-experts test models derived from the real dense GGUF files
# (scripts/make_moe_models.py; under ${MOLLM_MODELS_DIR:-~/.cache/mollm/models}/derived).
# Idempotent: existing files are kept. Needs python3 with numpy and gguf 0.19.0 (installed
# here from PyPI when missing) and the source models (fetched here). The tests call this
# themselves when a derived model is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c "import numpy, gguf" 2>/dev/null; then
  python3 -m pip install -q --disable-pip-version-check "gguf==0.19.0" numpy
fi
scripts/fetch-models.sh smollm2 qwen05
python3 scripts/make_moe_models.py "$@"
