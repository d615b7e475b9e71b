#!/usr/bin/env bash
# NVRTC (CUDA's run-time compiler) from PyPI's nvidia-cuda-nvrtc-cu12 wheel, unpacked into
# ~/.cache/mollm/nvrtc/VERSION (sha256-checked), where the cuda backend finds it: so that its
# kernels compile in CI on machines with no CUDA toolkit and no GPU. Prints the library's path.
# Exit 3 when it cannot be fetched here.
set -uo pipefail
ver=12.9.86
sha=210cf05005a447e29214e9ce50851e83fc5f4358df8b453155d5e1918094dcb4
dir="$HOME/.cache/mollm/nvrtc/$ver"
lib="$dir/nvidia/cuda_nvrtc/lib/libnvrtc.so.12"
if [[ -e $lib ]]; then
  echo "$lib"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! pip download -q --no-deps "nvidia-cuda-nvrtc-cu12==$ver" -d "$tmp" >&2; then
  echo "install-nvrtc: pip could not download nvidia-cuda-nvrtc-cu12==$ver" >&2
  exit 3
fi
whl=$(ls "$tmp"/*.whl)
got=$(sha256sum "$whl" | cut -c1-64)
if [[ $got != "$sha" ]]; then
  echo "install-nvrtc: $whl has sha256 $got, expected $sha" >&2
  exit 1
fi
mkdir -p "$dir.tmp" && python3 -m zipfile -e "$whl" "$dir.tmp" && rm -rf "$dir" && mv "$dir.tmp" "$dir"
echo "$lib"
