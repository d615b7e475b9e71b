#!/usr/bin/env bash
# Build the llama.cpp "oracle" used to produce golden data for mollm.
#
# - Downloads the llama-cpp-python 0.3.36 sdist (which vendors llama.cpp) into a cache dir,
#   extracts it OUTSIDE the repository and builds llama.cpp with cmake (CPU only, Release).
# - Never copies llama.cpp code into this repository.
# - Developer-only: never run this from CI (it takes ~15-30 min on 2 cores).
#
# Env overrides:
#   MOLLM_CACHE      (default $HOME/.cache/mollm)
#   LLAMA_CPP_SRC    (default $MOLLM_CACHE/llama.cpp-src)     extracted sdist root
#   LLAMA_CPP_BUILD  (default $MOLLM_CACHE/llama.cpp-build)   cmake build dir
#   JOBS             (default 2)
set -euo pipefail

if [[ -n "${CI:-}" ]]; then
  echo "build-llama-cpp.sh: refusing to run under CI (CI is set)" >&2
  exit 1
fi

PKG_VERSION=0.3.36
SDIST_NAME="llama_cpp_python-${PKG_VERSION}.tar.gz"
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
SDIST_URL="https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/${SDIST_NAME}"

MOLLM_CACHE="${MOLLM_CACHE:-$HOME/.cache/mollm}"
DL_DIR="$MOLLM_CACHE/dl/sdist"
SRC="${LLAMA_CPP_SRC:-$MOLLM_CACHE/llama.cpp-src}"
BUILD="${LLAMA_CPP_BUILD:-$MOLLM_CACHE/llama.cpp-build}"
JOBS="${JOBS:-2}"

die() { echo "build-llama-cpp.sh: error: $*" >&2; exit 1; }
command -v cmake >/dev/null || die "cmake not found (apt-get install cmake, or pip install cmake)"
command -v c++ >/dev/null || die "no C++ compiler found (apt-get install build-essential)"

mkdir -p "$DL_DIR"
SDIST="$DL_DIR/$SDIST_NAME"
if [[ ! -f "$SDIST" ]] || ! echo "$SDIST_SHA256  $SDIST" | sha256sum -c --quiet - 2>/dev/null; then
  echo "==> downloading $SDIST_NAME"
  rm -f "$SDIST"
  # NOTE: 'pip download --no-binary :all:' would also try to build cmake from source to prepare
  # metadata (very slow); fetch the sdist file directly from PyPI's file host instead, and fall
  # back to pip (only llama-cpp-python as sdist) if that fails.
  if ! curl -fsSL -o "$SDIST.tmp" "$SDIST_URL"; then
    rm -f "$SDIST.tmp"
    pip download --no-deps --no-binary llama-cpp-python "llama-cpp-python==${PKG_VERSION}" -d "$DL_DIR" \
      || die "could not download the llama-cpp-python sdist"
  else
    mv "$SDIST.tmp" "$SDIST"
  fi
  echo "$SDIST_SHA256  $SDIST" | sha256sum -c --quiet - || die "sha256 mismatch for $SDIST"
fi

if [[ ! -f "$SRC/vendor/llama.cpp/CMakeLists.txt" ]]; then
  echo "==> extracting to $SRC"
  mkdir -p "$SRC"
  tar xzf "$SDIST" -C "$SRC" --strip-components=1
fi

# Sapphire Rapids (AMX): llama.cpp's AMX kernels die with SIGILL here, so a native build must
# not use the AMX instructions the compiler would otherwise enable.
EXTRA_FLAGS=()
if grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
  NOAMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  EXTRA_FLAGS=(-DCMAKE_C_FLAGS="$NOAMX" -DCMAKE_CXX_FLAGS="$NOAMX")
  echo "==> AMX CPU: building with $NOAMX"
fi

echo "==> configuring in $BUILD"
cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD" "${EXTRA_FLAGS[@]}" \
  -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=ON \
  -DBUILD_SHARED_LIBS=ON \
  -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF \
  -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_OPENMP=ON \
  -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_EXAMPLES=ON

echo "==> building (-j$JOBS)"
start=$(date +%s)
# llama-completion is the classic text-completion CLI (llama-cli now needs the server build);
# llama-eval-callback prints every tensor of a forward pass (compare with MOLLM_TRACE=1);
# llama-server is the peer of `mollm serve` (scripts/bench-serve.py).
# llama-embedding is the oracle of `mollm embed` (scripts/golden/make_embed_golden.py).
# TARGETS picks fewer (one oracle's binary) on a machine where time is short.
TARGETS="${TARGETS:-llama llama-simple llama-tokenize llama-perplexity llama-bench llama-completion \
  llama-eval-callback llama-batched-bench llama-server llama-embedding}"
# shellcheck disable=SC2086
cmake --build "$BUILD" --config Release -j"$JOBS" --target $TARGETS
end=$(date +%s)
echo "==> build done in $((end - start)) s; binaries in $BUILD/bin"
ls -la "$BUILD/bin"
