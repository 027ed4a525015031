#!/usr/bin/env bash
# Perplexity of one GGUF file on one text, measured by llama.cpp's llama-perplexity and by
# `hetsched eval --scoring llama-cpp` (the same windows and scored positions), side by
# side. An outside reference for the importer and the executor; not run in CI (minutes).
#
# Usage: scripts/compare-llamacpp-ppl.sh [MODEL] [TEXT] [CTX]
#   MODEL  default models/SmolLM2-135M-Instruct.Q4_1.gguf
#   TEXT   default /usr/share/common-licenses/GPL-3
#   CTX    tokens per window, default 512
# Environment: THREADS (default 2), PRECISIONS (hetsched precisions, default "f32 w8a8"),
#   REFERENCE=1 (score with the f32 reference forward, examples/reference_ppl, instead of
#   `hetsched eval`: the importer's own figure, without the executor),
#   HETSCHED (default target/release/hetsched; build with `cargo build --release`),
#   LLAMACPP_DIR (default: what scripts/build-llamacpp.sh prints; it builds llama.cpp
#   from the llama-cpp-python 0.3.36 source package once).
# Prints one line per measurement: `tool precision ppl`, then hetsched's ratio to llama.cpp.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL="${1:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
TEXT="${2:-/usr/share/common-licenses/GPL-3}"
CTX="${3:-512}"
THREADS="${THREADS:-2}"
PRECISIONS="${PRECISIONS:-f32 w8a8}"
HETSCHED="${HETSCHED:-$ROOT/target/release/hetsched}"
die() { echo "compare-llamacpp-ppl: error: $*" >&2; exit 1; }

[[ -f "$MODEL" ]] || die "no model at $MODEL (scripts/fetch-model.sh fetches SmolLM2)"
[[ -f "$TEXT" ]] || die "no text at $TEXT"
[[ -x "$HETSCHED" ]] || die "no hetsched binary at $HETSCHED (cargo build --release)"
LLAMACPP_DIR="${LLAMACPP_DIR:-$("$ROOT/scripts/build-llamacpp.sh" | tail -n 1)}"
PERPLEXITY="$LLAMACPP_DIR/build/bin/llama-perplexity"
[[ -x "$PERPLEXITY" ]] || die "no llama-perplexity in $LLAMACPP_DIR/build/bin"

LOG="$(mktemp "${TMPDIR:-/tmp}/llama-ppl.XXXXXX")"
trap 'rm -f "$LOG"' EXIT
# -b CTX: one batch per window, as hetsched's one prefill per window.
"$PERPLEXITY" -m "$MODEL" -f "$TEXT" -c "$CTX" -b "$CTX" -t "$THREADS" >"$LOG" 2>&1 ||
    { tail -n 20 "$LOG" >&2; die "llama-perplexity failed"; }
llama="$(sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' "$LOG")"
chunks="$(sed -n 's/.*calculating perplexity over \([0-9]*\) chunks.*/\1/p' "$LOG")"
[[ -n "$llama" ]] || { tail -n 20 "$LOG" >&2; die "no 'Final estimate' in llama-perplexity's output"; }
echo "llama.cpp $(basename "$MODEL") $llama ($chunks windows of $CTX)"

ratio() { python3 -c 'import sys; print("%+.3f%%" % (100 * (float(sys.argv[1]) / float(sys.argv[2]) - 1)))' "$1" "$llama"; }
if [[ "${REFERENCE:-0}" == 1 ]]; then
    # The importer alone: the f32 reference forward, same scoring.
    REF="${REF_BIN:-$ROOT/target/release/examples/reference_ppl}"
    [[ -x "$REF" ]] || die "no $REF (cargo build --release --example reference_ppl)"
    out="$("$REF" "$MODEL" "$TEXT" "$CTX" 2>/dev/null)"
    ppl="$(awk '{print $2}' <<<"$out")"
    echo "hetsched reference-f32 $out, vs llama.cpp $(ratio "$ppl")"
    exit 0
fi
for p in $PRECISIONS; do
    json="$("$HETSCHED" eval --model "$MODEL" --text "$TEXT" --ctx "$CTX" --precision "$p" \
        --scoring llama-cpp --threads "$THREADS" --json 2>/dev/null)"
    read -r ppl windows tokens < <(python3 -c 'import json, sys; r = json.load(sys.stdin); print(r["perplexity"], r["windows"], r["tokens"])' <<<"$json")
    printf 'hetsched %s %.4f (%s windows, %s tokens scored), vs llama.cpp %s\n' "$p" "$ppl" "$windows" "$tokens" "$(ratio "$ppl")"
done
