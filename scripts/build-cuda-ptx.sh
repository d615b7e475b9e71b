#!/usr/bin/env bash
# The cuda backend's kernels as PTX for Volta, Ampere and Hopper (compute_70/80/90), into
# OUT (default target/cuda-ptx): what a machine with the CUDA driver but no NVRTC loads. NVRTC
# comes from scripts/install-nvrtc.sh (PyPI) unless MOLLM_NVRTC names one.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/cuda-ptx}
if [[ -z ${MOLLM_NVRTC:-} ]]; then
  MOLLM_NVRTC=$(scripts/install-nvrtc.sh)
  export MOLLM_NVRTC
fi
cargo run --release -q -p mollm-cuda --example ptx -- "$out"
