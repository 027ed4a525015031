#!/usr/bin/env bash
# What the side-by-side scripts against llama.cpp share, sourced by them (not run):
# the repository root as working folder, the test model (fetched when missing), the
# release binary (built when missing), llama.cpp built once from the llama-cpp-python
# 0.3.36 source package by scripts/build-llamacpp.sh (or $LLAMACPP_BUILD; cached in
# ~/.cache; several minutes the first time), and the test model requantized by
# llama-quantize to each type in QUANTS, cached in WORK.
#
#   WORK=target/bench-vs-llamacpp QUANTS="Q8_0 F32"
#   . "$(dirname "${BASH_SOURCE[0]}")/setup-vs-llamacpp.sh"
#
# Sets ROOT, MODEL (the test model), BIN (hetsched) and LLAMA (llama.cpp's build/bin);
# the llama.cpp files are $WORK/model.TYPE.gguf.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
BIN=target/release/hetsched
mkdir -p "$WORK"
[ -s "$MODEL" ] || scripts/fetch-model.sh
[ -x "$BIN" ] || cargo build --release
BUILD_SCRIPT="${LLAMACPP_BUILD:-$ROOT/scripts/build-llamacpp.sh}"
LLAMA="$("$BUILD_SCRIPT" | tail -1)/build/bin"

for q in $QUANTS; do
  [ -s "$WORK/model.$q.gguf" ] ||
    "$LLAMA/llama-quantize" --allow-requantize "$MODEL" "$WORK/model.$q.gguf" "$q" >"$WORK/quantize.$q.log" 2>&1
done
