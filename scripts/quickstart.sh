#!/usr/bin/env bash
# One command on a fresh machine: fetch the models (cached), build mollm, generate text with
# the default model (SmolLM2-135M-Instruct). Extra arguments go to `mollm run`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-models.sh
cargo build --release --workspace
if [ $# -eq 0 ]; then
  set -- --chat --prompt "Write a haiku about running language models on a laptop." --max-tokens 64
fi
exec target/release/mollm run "$@"
