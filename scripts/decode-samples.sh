#!/usr/bin/env bash
# Parallel samples against one: `hetsched generate --n N` (N samples of one prompt decoded
# together in batched steps) against `--n 1`, the same prompt, precision and threads,
# --ignore-eos, rounds interleaved (one --n 1 run, then one --n N run, per round); prints
# each round's decode tokens per second (summed over the samples), the medians and the
# ratio of the medians (docs/generation.md keeps one, with date and machine).
#
#   scripts/decode-samples.sh [-n SAMPLES] [-m MAX_TOKENS] [-t THREADS] [-p PRECISION] [-r ROUNDS]
#       defaults: -n 8 -m 64 -t 2 -p w8a8 -r 5
#
# Runs the release binary (`cargo build --release` first) on the test model
# (models/SmolLM2-135M-Instruct.Q4_1.gguf, or $MODEL). Each run takes a few seconds.
set -euo pipefail

SAMPLES=8 MAX_TOKENS=64 THREADS=2 PRECISION=w8a8 ROUNDS=5
while getopts "n:m:t:p:r:" opt; do
  case $opt in
    n) SAMPLES=$OPTARG ;; m) MAX_TOKENS=$OPTARG ;; t) THREADS=$OPTARG ;;
    p) PRECISION=$OPTARG ;; r) ROUNDS=$OPTARG ;;
    *) sed -n 2,12p "$0"; exit 2 ;;
  esac
done

BIN=${BIN:-target/release/hetsched}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -x "$BIN" ] || { echo "no $BIN: run cargo build --release first" >&2; exit 1; }
[ -f "$MODEL" ] || { echo "no model at $MODEL" >&2; exit 1; }

rate() { # samples -> decode tokens/s
  "$BIN" generate --model "$MODEL" --prompt "The capital of France is" \
    --max-tokens "$MAX_TOKENS" --ignore-eos --threads "$THREADS" --precision "$PRECISION" \
    --n "$1" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["decode_tokens_per_s"])'
}

ones=() many=()
echo "| round | --n 1 tok/s | --n $SAMPLES tok/s | ratio |"
echo "|---|---|---|---|"
for r in $(seq "$ROUNDS"); do
  one=$(rate 1)
  n=$(rate "$SAMPLES")
  ones+=("$one") many+=("$n")
  python3 -c "print(f'| $r | {$one:.1f} | {$n:.1f} | {$n / $one:.2f}x |')"
done
python3 - "${ones[*]}" "${many[*]}" "$SAMPLES" <<'EOF'
import statistics, sys
ones = [float(v) for v in sys.argv[1].split()]
many = [float(v) for v in sys.argv[2].split()]
a, b = statistics.median(ones), statistics.median(many)
print(f"| median | {a:.1f} | {b:.1f} | {b / a:.2f}x |")
print(f"\n--n {sys.argv[3]} decodes {b / a:.2f}x the tokens/s of --n 1 (medians).")
EOF
