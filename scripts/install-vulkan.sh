#!/usr/bin/env bash
# Mesa's software Vulkan device (lavapipe) and the Vulkan loader, from Debian: the metal
# backend's WGSL kernels run there in the tests (MOLLM_METAL_ADAPTER=vulkan), so that they are
# checked on machines without a Mac. Exit 0 when the driver is there (installed now or
# before), 3 when it cannot be installed here.
set -uo pipefail
if [[ -e /usr/share/vulkan/icd.d/lvp_icd.x86_64.json || -e /usr/share/vulkan/icd.d/lvp_icd.aarch64.json ]] &&
  dpkg -s libvulkan1 >/dev/null 2>&1; then
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if apt-get install -y -qq mesa-vulkan-drivers libvulkan1 >/dev/null 2>&1 ||
  { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq mesa-vulkan-drivers libvulkan1 >/dev/null 2>&1; }; then
  exit 0
fi
echo "install-vulkan: apt-get could not install mesa-vulkan-drivers and libvulkan1" >&2
exit 3
