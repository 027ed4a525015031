#!/usr/bin/env bash
# Builds llama.cpp (the copy vendored in the llama-cpp-python 0.3.36 source package on PyPI)
# once, for side-by-side measurements. Prints the folder holding build/bin/llama-bench,
# llama-perplexity, llama-quantize and llama-cli.
#   scripts/build-llamacpp.sh [DIR]      (default: ~/.cache/llamacpp-0.3.36)
#   CUDA=1 ... builds with -DGGML_CUDA=ON (on a machine with nvcc)
# Takes several minutes on 2 cores; later calls return at once.
set -eu
W=${1:-$HOME/.cache/llamacpp-0.3.36}; mkdir -p "$W"; cd "$W"
if [ ! -x build/bin/llama-bench ]; then
  [ -x venv/bin/cmake ] || { python3 -m venv venv && venv/bin/pip install -q cmake scikit-build-core; }
  if ! ls llama_cpp_python-0.3.36/vendor/llama.cpp >/dev/null 2>&1; then
    # the source package only; --no-build-isolation keeps pip from compiling cmake itself
    PATH=$W/venv/bin:$PATH venv/bin/pip download -q --no-deps --no-binary llama-cpp-python \
      --no-build-isolation llama-cpp-python==0.3.36 -d . || true
    tar xzf llama_cpp_python-0.3.36.tar.gz
  fi
  extra=(); [ "${CUDA:-0}" = 1 ] && extra=(-DGGML_CUDA=ON)
  venv/bin/cmake -S llama_cpp_python-0.3.36/vendor/llama.cpp -B build -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DLLAMA_CURL=OFF "${extra[@]}" >cmake.log
  venv/bin/cmake --build build -j"$(nproc)" --target llama-bench llama-perplexity llama-quantize llama-cli >build.log
fi
echo "$W"
