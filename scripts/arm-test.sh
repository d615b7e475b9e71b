#!/usr/bin/env bash
# Cross-build mollm for aarch64-unknown-linux-gnu on an x86-64 Debian host and run the ARM
# checks under qemu-user emulation (speed means nothing there; correctness does).
#
# Usage: scripts/arm-test.sh [--install] [--cpu max|cortex-a53|...] [--golden]
#   --install   install the cross toolchain and qemu first (root, Debian bookworm):
#               rustc-web + libstd-rust-web-dev:arm64 (Debian's Rust with the aarch64 std),
#               gcc-aarch64-linux-gnu + libc6-dev-arm64-cross (linker, C runtime), qemu-user
#               (+ qemu-user-binfmt: aarch64 executables run transparently, so tests that
#               spawn `mollm` and mollm's own gate child work under emulation).
#   --cpu C     the emulated CPU (QEMU_CPU): `max` has NEON, dotprod, i8mm; `cortex-a53` is a
#               plain Armv8.0 core (NEON only), which proves the fallbacks.
#   --golden    also SmolLM2's golden parity test with `--backend auto`, on its prompts of at
#               most 64 tokens (six of eight: the two long prompts cost about eight minutes
#               under emulation; the x86 stage runs them); needs the model
#               (scripts/fetch-models.sh).
# Exit status 3: --install could not install the toolchain (no root or no package mirror).
#
# Builds into ${MOLLM_ARM_TARGET_DIR:-target/aarch64-cross} (Debian's rustc, so a separate
# target directory from the host build), then runs: the ARM kernels' exactness tests, the
# conformance gate on every native backend built for ARM, and `mollm devices`.
set -euo pipefail
cd "$(dirname "$0")/.."

CPU=max
INSTALL=0
GOLDEN=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --install) INSTALL=1 ;;
    --cpu) CPU="$2"; shift ;;
    --golden) GOLDEN=1 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "arm-test.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

if [[ $INSTALL == 1 ]]; then
  { dpkg --add-architecture arm64 && apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rustc-web libstd-rust-web-dev:arm64 \
      gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user qemu-user-binfmt >/dev/null; } ||
    { echo "arm-test.sh: could not install the cross toolchain" >&2; exit 3; }
fi
for t in /usr/bin/rustc aarch64-linux-gnu-gcc qemu-aarch64; do
  command -v "$t" >/dev/null || { echo "arm-test.sh: $t missing (run with --install)" >&2; exit 1; }
done
# Register qemu for aarch64 executables if the kernel does not run them yet.
if [[ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]]; then
  [[ -e /proc/sys/fs/binfmt_misc/register ]] || mount binfmt_misc -t binfmt_misc /proc/sys/fs/binfmt_misc
  cat /usr/lib/binfmt.d/qemu-aarch64.conf > /proc/sys/fs/binfmt_misc/register
fi

export RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_DIR="${MOLLM_ARM_TARGET_DIR:-target/aarch64-cross}"
export QEMU_CPU="$CPU"
T=aarch64-unknown-linux-gnu

cargo build --release --workspace --target $T
echo "== qemu-aarch64 -cpu $CPU: mollm devices"
"$CARGO_TARGET_DIR/$T/release/mollm" devices
echo "== qemu-aarch64 -cpu $CPU: kernel exactness and the conformance gate"
cargo test --release --target $T -p mollm-arm-common -p mollm-cpu-common -p mollm-conformance
if [[ $GOLDEN == 1 ]]; then
  echo "== qemu-aarch64 -cpu $CPU: SmolLM2 golden parity, --backend auto"
  MOLLM_TEST_BACKENDS=auto MOLLM_GOLDEN_MAX_PROMPT=64 cargo test --release --target $T -p mollm-cli --test golden golden_smollm2 -- --exact
  echo "== qemu-aarch64 -cpu $CPU: LFM2 and Qwen3.5 (recurrent state) against llama.cpp, every ARM backend"
  MOLLM_TEST_BACKENDS=reference,arm-neon,arm-i8mm cargo test --release --target $T -p mollm-cli --test recurrent
fi
