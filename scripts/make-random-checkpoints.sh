#!/usr/bin/env bash
# The random-weight Qwen3 / Qwen3-MoE / Gemma 3 checkpoints the tests run (Hugging Face
# directories and GGUF twins under ${MOLLM_MODELS_DIR:-~/.cache/mollm/models}/random), made from
# fixed seeds by scripts/make_random_qwen3.py and scripts/make_random_gemma3.py, and the LFM2
# GGUF files (and one Hugging Face twin) of scripts/make_random_lfm2.py and the Qwen3.5 /
# Qwen3.5-MoE / Qwen3-Next ones of scripts/make_random_qwen35.py (and their Hugging Face
# directories with GGUF twins, scripts/make_random_qwen35_hf.py), and the RWKV7 ones of
# scripts/make_random_rwkv7.py (llama.cpp's oracle data; mollm has no rwkv7 graph yet), and the F32
# GGUF twin of the real all-MiniLM-L6-v2 directory (scripts/make_minilm_gguf.py, written beside it
# as $MODELS_DIR/all-minilm-l6-v2.gguf, not under random/; the directory is fetched here). Idempotent:
# existing checkpoints are kept. Needs python3 with numpy and gguf 0.19.0 (installed here from
# PyPI when missing) and, for Gemma 3's vocabulary, the Gemma 3 270M GGUF (fetched here).
# The tests call this themselves when a checkpoint is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
MODELS_DIR="${MOLLM_MODELS_DIR:-$HOME/.cache/mollm/models}"
have() { [[ -e "$MODELS_DIR/random/$1" ]]; }
have_model() { [[ -e "$MODELS_DIR/$1" ]]; }
if have qwen3-random.gguf && have qwen3moe-random.gguf && have gemma3-random.gguf \
  && have qwen3-random && have qwen3moe-random && have gemma3-random \
  && have lfm2-random.gguf && have lfm2-swa-random.gguf && have lfm2moe-random.gguf \
  && have lfm2-hf-random.gguf && have lfm2-hf-random \
  && have qwen35-random.gguf && have qwen35-mtp-random.gguf && have qwen35moe-random.gguf \
  && have qwen3next-random.gguf && have qwen35-hf-random.gguf && have qwen35-hf-random \
  && have qwen35moe-hf-random.gguf && have qwen35moe-hf-random && have qwen3next-hf-random.gguf \
  && have qwen3next-hf-random && have rwkv7-random.gguf && have rwkv7-h4-random.gguf \
  && have_model all-minilm-l6-v2.gguf; then
  exit 0
fi
if ! python3 -c "import numpy, gguf" 2>/dev/null; then
  python3 -m pip install -q --disable-pip-version-check "gguf==0.19.0" numpy
fi
if ! have qwen3-random.gguf || ! have qwen3moe-random.gguf; then
  python3 scripts/make_random_qwen3.py
fi
if ! have gemma3-random.gguf; then
  scripts/fetch-models.sh gemma3
  python3 scripts/make_random_gemma3.py
fi
if ! have lfm2-random.gguf || ! have lfm2-swa-random.gguf || ! have lfm2moe-random.gguf \
  || ! have lfm2-hf-random.gguf || ! have lfm2-hf-random; then
  scripts/fetch-models.sh qwen05
  python3 scripts/make_random_lfm2.py
fi
if ! have qwen35-random.gguf || ! have qwen35-mtp-random.gguf || ! have qwen35moe-random.gguf \
  || ! have qwen3next-random.gguf; then
  python3 scripts/make_random_qwen35.py
fi
if ! have qwen35-hf-random.gguf || ! have qwen35-hf-random || ! have qwen35moe-hf-random.gguf \
  || ! have qwen35moe-hf-random || ! have qwen3next-hf-random.gguf || ! have qwen3next-hf-random; then
  scripts/fetch-models.sh qwen05
  python3 scripts/make_random_qwen35_hf.py
fi
if ! have rwkv7-random.gguf || ! have rwkv7-h4-random.gguf; then
  python3 scripts/make_random_rwkv7.py
fi
if ! have_model all-minilm-l6-v2.gguf; then
  scripts/fetch-models.sh minilm
  python3 scripts/make_minilm_gguf.py
fi
