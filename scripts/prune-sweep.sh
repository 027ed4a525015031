#!/usr/bin/env bash
# Pruning-rate sweep of the calibrated outlier shadow (docs/outliers.md):
# perplexity, KL and top-1 against f32, resident shadow bytes, hits/misses (eval on a
# held-out text), and prefill speed (run on a prompt), per prune rate.
#
# Usage: scripts/prune-sweep.sh [RATES...]        (default: 0 0.5 0.85 0.95 1)
# Env:   HETSCHED   the binary              [default: target/release/hetsched]
#        MODEL      the model               [default: models/SmolLM2-135M-Instruct.Q4_1.gguf]
#        CORPUS     calibration text        [default: /usr/share/common-licenses/Apache-2.0]
#        TEXT       evaluation text         [default: /usr/share/common-licenses/GPL-3]
#        WINDOWS    eval windows of 256     [default: 8]
#        THREADS    compute threads         [default: 2]
#        CALIBRATE_ARGS  more `hetsched calibrate` flags, e.g. "--importance ratio
#                   --pruned-scale max" for seed 000's pruning   [default: none]
#        LABEL      the calibrated rows' label [default: w8a8-shadow]
#        REFERENCES 0: only the calibrated rows (no header, f32, w8a8, no calibration)
# Writes the calibration to a temporary file (the one beside the model is left alone);
# prints one markdown table row per setting. Needs jq.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HETSCHED="${HETSCHED:-$ROOT/target/release/hetsched}"
MODEL="${MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
CORPUS="${CORPUS:-/usr/share/common-licenses/Apache-2.0}"
TEXT="${TEXT:-/usr/share/common-licenses/GPL-3}"
WINDOWS="${WINDOWS:-8}"
THREADS="${THREADS:-2}"
read -r -a CALIBRATE_ARGS <<<"${CALIBRATE_ARGS:-}"
LABEL="${LABEL:-w8a8-shadow}"
REFERENCES="${REFERENCES:-1}"
RATES=("$@")
[[ ${#RATES[@]} -gt 0 ]] || RATES=(0 0.5 0.85 0.95 1)

command -v jq >/dev/null || { echo "prune-sweep: error: needs jq" >&2; exit 1; }
[[ -x "$HETSCHED" ]] || { echo "prune-sweep: error: no binary at $HETSCHED (cargo build --release, or set HETSCHED)" >&2; exit 1; }

CAL="$(mktemp --suffix=.calibration.json)"
PROMPT="$(mktemp)"
trap 'rm -f "$CAL" "$PROMPT"' EXIT
head -c 2400 "$TEXT" >"$PROMPT"   # about 512 tokens

"$HETSCHED" calibrate --model "$MODEL" --corpus "$CORPUS" --out "$CAL" --threads "$THREADS" "${CALIBRATE_ARGS[@]}" --json >/dev/null

row() { # label, then the precision / shadow arguments
    local label="$1"
    shift
    local e r
    e="$("$HETSCHED" eval --model "$MODEL" --text "$TEXT" --max-windows "$WINDOWS" --threads "$THREADS" --json "$@")"
    r="$("$HETSCHED" run --model "$MODEL" --prompt-file "$PROMPT" --chunk-len 128 --threads "$THREADS" --json "$@")"
    jq -rn --argjson e "$e" --argjson r "$r" --arg name "$label" '
        def mib: . / 1048576 * 10 | round / 10;
        [$name,
         ($e.perplexity * 100 | round / 100),
         (($e.perplexity / $e.perplexity_f32 - 1) * 1000 | round / 10 | tostring + "%"),
         ($e.kl_divergence * 10000 | round / 10000),
         ($e.top1_agreement * 1000 | round / 10 | tostring + "%"),
         (if $e.shadow then "\($e.shadow.resident_bytes | mib) / \($e.shadow.full_copy_bytes | mib) MiB" else "-" end),
         (if $e.shadow then "\($e.shadow.hits) / \($e.shadow.misses)" else "-" end),
         (if $r.shadow then ($r.shadow.prefill_share * 1000 | round / 10 | tostring + "%") else "-" end),
         ($r.prefill_tokens_per_s | round)]
        | "| " + (map(tostring) | join(" | ")) + " |"'
}

if [[ "$REFERENCES" != 0 ]]; then
    echo "| setting | perplexity | vs f32 | KL | top-1 | shadow rows resident / full copy | hits / misses | shadow share of prefill | prefill tok/s |"
    echo "|---|---|---|---|---|---|---|---|---|"
    row "f32" --precision f32
    row "w8a8" --precision w8a8
    row "w8a8-shadow, no calibration" --precision w8a8-shadow --no-calibration
fi
for rate in "${RATES[@]}"; do
    row "$LABEL, prune $rate" --precision w8a8-shadow --calibration "$CAL" --prune "$rate"
done
