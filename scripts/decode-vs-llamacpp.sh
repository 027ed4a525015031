#!/usr/bin/env bash
# Side-by-side decode speed: hetsched `generate` (direct decode steps) against llama.cpp's
# `llama-bench` tg128, on the same model file and thread count, interleaved round by round;
# prints medians, ranges and the goal ratios as a markdown table, and the measured memory
# bandwidth with each precision's achieved fraction of it (docs/generation.md keeps one,
# with date and machine).
#
#   scripts/decode-vs-llamacpp.sh [-n TOKENS] [-t THREADS] [-r ROUNDS] [-d DEPTH]
#       defaults: -n 128 -t 2 -r 5 -d 0
#
# -d DEPTH decodes after DEPTH tokens of context: llama-bench's `-d DEPTH` (the tokens
# in its KV cache before the timed ones), hetsched's prompt the same text repeated to
# about DEPTH tokens (the report gives its exact count); each step then also reads the
# keys and values of every earlier position, which at a long context costs as much as
# the weights.
#
# llama.cpp is built once by scripts/build-llamacpp.sh (or $LLAMACPP_BUILD); its Q8_0 and
# Q4_0 files are made from the test model with llama-quantize (cached in
# target/decode-vs-llamacpp/). llama-bench runs `-n TOKENS -p 0 -t THREADS -r 1`: one
# warm-up, then TOKENS generated tokens timed. hetsched runs the release binary
# (`cargo build --release` first): a 16-token prompt, then TOKENS tokens with
# --ignore-eos, --decode direct (the head at the precision's width: INT8 for w8a8, 4-bit
# with rescored candidates for the W4A8 precisions, f32 for f32), its `decode_tokens_per_s`, `weight_bytes_per_token`, `bandwidth_fraction`
# and `decode_overhead` (the share of a step outside the kernels) from --json.
# On a machine others load, read the ranges: a round where another process ran shows
# as the minimum, and the medians and ratios are what to quote.
set -euo pipefail

TOKENS=128 THREADS=2 ROUNDS=5 DEPTH=0
while getopts "n:t:r:d:" opt; do
  case $opt in
    n) TOKENS=$OPTARG ;; t) THREADS=$OPTARG ;; r) ROUNDS=$OPTARG ;; d) DEPTH=$OPTARG ;;
    *) sed -n 2,26p "$0"; exit 2 ;;
  esac
done

WORK=target/decode-vs-llamacpp QUANTS="Q8_0 Q4_0"
# shellcheck source=scripts/setup-vs-llamacpp.sh
. "$(dirname "${BASH_SOURCE[0]}")/setup-vs-llamacpp.sh"

PROMPT="The history of the printing press begins in the fifteenth century, when"
# About 13 tokens a repeat (64 repeats are 832 tokens); at least one.
PROMPT_FILE="$WORK/prompt.$DEPTH.txt"
python3 -c 'import sys; sys.stdout.write(" ".join([sys.argv[1]] * max(1, round(int(sys.argv[2]) / 13))))' \
  "$PROMPT" "$DEPTH" >"$PROMPT_FILE"
hetsched_row() { # precision -> "tok/s fraction bytes bandwidth overhead prompt_tokens"
  "$BIN" generate --model "$MODEL" --prompt-file "$PROMPT_FILE" --max-tokens "$TOKENS" --ignore-eos \
    --precision "$1" --threads "$THREADS" --decode direct --json |
    python3 -c 'import json,sys; d=json.load(sys.stdin); b=d["weight_bytes_per_token"]
print(d["decode_tokens_per_s"], d["bandwidth_fraction"], b["layers"] + b["head"], d["bandwidth_gb_s"], d["decode_overhead"], d["prompt_tokens"])'
}
llama_row() { # quant -> "tok/s"
  "$LLAMA/llama-bench" -m "$WORK/model.$1.gguf" -n "$TOKENS" -p 0 -d "$DEPTH" -t "$THREADS" -r 1 -o json 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["avg_ts"])'
}

ROWS="hetsched:w8a8 hetsched:w4a8-g32 hetsched:w4a8-g128 hetsched:f32 llama.cpp:Q8_0 llama.cpp:Q4_0"
RESULTS="$WORK/results.$TOKENS.$THREADS.$DEPTH.txt"
: >"$RESULTS"
for round in $(seq "$ROUNDS"); do
  for row in $ROWS; do
    tool=${row%%:*} what=${row#*:}
    if [ "$tool" = hetsched ]; then line=$(hetsched_row "$what"); else line=$(llama_row "$what"); fi
    echo "$row $line" >>"$RESULTS"
    echo "round $round/$ROUNDS  $row  $line" >&2
  done
done

python3 - "$RESULTS" "$TOKENS" "$THREADS" "$ROUNDS" "$DEPTH" <<'PY'
import statistics, sys
path, tokens, threads, rounds, depth = sys.argv[1:]
runs, fraction, nbytes, bandwidth, overhead, prompt = {}, {}, {}, [], {}, set()
for line in open(path):
    row, *v = line.split()
    runs.setdefault(row, []).append(float(v[0]))
    if len(v) > 1:
        fraction.setdefault(row, []).append(float(v[1]))
        nbytes[row] = int(v[2])
        bandwidth.append(float(v[3]))
        overhead.setdefault(row, []).append(float(v[4]))
        prompt.add(int(v[5]))
med = {row: statistics.median(v) for row, v in runs.items()}
at = f" after {depth} tokens of context (hetsched's prompt: {', '.join(map(str, sorted(prompt)))} tokens)" if depth != "0" else ""
print(f"tg{tokens}{at}, {threads} threads, {rounds} interleaved rounds, medians (measured)")
print(f"streaming-read bandwidth at {threads} threads: median {statistics.median(bandwidth):.1f} GB/s over the hetsched rows")
print()
print("| row | tok/s (median) | min-max | weight MB/token | bandwidth fraction (median) | step outside kernels (median) |")
print("|---|---|---|---|---|---|")
for row, v in runs.items():
    mb = f"{nbytes[row] / 1e6:.1f}" if row in nbytes else "-"
    fr = f"{statistics.median(fraction[row]):.2f}" if row in fraction else "-"
    oh = f"{100 * statistics.median(overhead[row]):.1f}%" if row in overhead else "-"
    print(f"| {row} | {med[row]:.1f} | {min(v):.1f}-{max(v):.1f} | {mb} | {fr} | {oh} |")
print()
def ratio(a, b, goal):
    r = med[a] / med[b]
    print(f"- {a} / {b}: {r:.2f}x (goal {goal}x)")
ratio("hetsched:w4a8-g32", "llama.cpp:Q4_0", 1.25)
ratio("hetsched:w8a8", "llama.cpp:Q8_0", 1.1)
ratio("hetsched:w4a8-g32", "hetsched:w8a8", 1.7)
PY
