#!/usr/bin/env bash
# Side-by-side prefill speed: hetsched `run` against llama.cpp's `llama-bench`, on the same
# model, prompt length and thread count, interleaved round by round; prints medians and
# ratios as a markdown table (docs/real-execution.md keeps one, with date and machine).
#
#   scripts/bench-vs-llamacpp.sh [-p TOKENS] [-t THREADS] [-r ROUNDS] [-c CHUNK]
#       defaults: -p 512 -t 2 -r 5 -c 128
#
# llama.cpp is built once from the llama-cpp-python 0.3.36 source package on PyPI by
# scripts/build-llamacpp.sh (or $LLAMACPP_BUILD; cached in ~/.cache; several
# minutes the first time). Its Q8_0 and F32 files are made from the test model with
# llama-quantize (cached in target/bench-vs-llamacpp/). The hetsched prompt is
# /usr/share/common-licenses/GPL-3's tokens cut to exactly TOKENS (`run --prompt-len`;
# llama-bench uses random tokens: prefill time does not depend on their values). hetsched runs are the release
# binary (`cargo build --release` first); its w8a8-shadow row uses the calibration file
# beside the model when there is one (say which in the figures you quote).
set -euo pipefail

TOKENS=512 THREADS=2 ROUNDS=5 CHUNK=128
while getopts "p:t:r:c:" opt; do
  case $opt in
    p) TOKENS=$OPTARG ;; t) THREADS=$OPTARG ;; r) ROUNDS=$OPTARG ;; c) CHUNK=$OPTARG ;;
    *) sed -n 2,15p "$0"; exit 2 ;;
  esac
done

WORK=target/bench-vs-llamacpp QUANTS="Q8_0 F32"
# shellcheck source=scripts/setup-vs-llamacpp.sh
. "$(dirname "${BASH_SOURCE[0]}")/setup-vs-llamacpp.sh"

# The prompt: GPL-3's tokens cut to exactly TOKENS (`run --prompt-len`).
PROMPT=/usr/share/common-licenses/GPL-3

# Both sides warm: llama-bench runs one warm-up prompt in its process before it times
# (unless --no-warmup), so hetsched times its prefill after one warm-up prefill too
# (`--warmup 1`: page cache, the pool's threads, a calibrated shadow's cold rows read once).
hetsched_tps() { # precision
  "$BIN" run --model "$MODEL" --prompt-file "$PROMPT" --prompt-len "$TOKENS" --precision "$1" \
    --threads "$THREADS" --chunk-len "$CHUNK" --warmup 1 --json |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["prefill_tokens_per_s"])'
}
llama_tps() { # quant
  "$LLAMA/llama-bench" -m "$WORK/model.$1.gguf" -p "$TOKENS" -n 0 -t "$THREADS" -r 1 -o json 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["avg_ts"])'
}

ROWS="hetsched:w8a8 hetsched:w8a8-shadow hetsched:f32 llama.cpp:Q8_0 llama.cpp:F32"
RESULTS="$WORK/results.$TOKENS.$THREADS.txt"
: >"$RESULTS"
for round in $(seq "$ROUNDS"); do
  for row in $ROWS; do
    tool=${row%%:*} what=${row#*:}
    if [ "$tool" = hetsched ]; then tps=$(hetsched_tps "$what"); else tps=$(llama_tps "$what"); fi
    echo "$row $tps" >>"$RESULTS"
    echo "round $round/$ROUNDS  $row  $tps tok/s" >&2
  done
done

python3 - "$RESULTS" "$TOKENS" "$THREADS" "$ROUNDS" "$CHUNK" <<'EOF'
import statistics, sys
path, tokens, threads, rounds, chunk = sys.argv[1:]
runs = {}
for line in open(path):
    row, tps = line.split()
    runs.setdefault(row, []).append(float(tps))
med = {row: statistics.median(v) for row, v in runs.items()}
q8, f32 = med["llama.cpp:Q8_0"], med["llama.cpp:F32"]
print(f"pp{tokens}, {threads} threads, chunk {chunk} (hetsched), {rounds} interleaved rounds, medians")
print()
print("| path | tok/s (median) | min-max | vs llama.cpp Q8_0 | vs llama.cpp F32 |")
print("|---|---|---|---|---|")
for row, v in runs.items():
    print(f"| {row} | {med[row]:.0f} | {min(v):.0f}-{max(v):.0f} | {med[row] / q8:.2f}x | {med[row] / f32:.2f}x |")
EOF
