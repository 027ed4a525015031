#!/usr/bin/env bash
# A request trace on the real model, the default request policy against `fcfs`:
# `hetsched run --requests TRACE --json` (each request alone first, then all together
# at their arrivals scaled to the machine; docs/requests.md, "A trace on a real model")
# ROUNDS times, the two policies alternating within each round (the order swapped every
# round); prints per policy and request the medians over the rounds of its time to first
# token and end to end over the same request alone (measured), as a markdown table.
#
#   scripts/requests-real.sh [-r ROUNDS] [-t TRACE] [-p "POLICIES"] [-- RUN_ARGS]
#       defaults: -r 3 -t agent-burst -p "slack fcfs"; RUN_ARGS go to every run
#       (e.g. -- --chunk-len 32 --threads 2)
#
# The model is the test model at W8A8; hetsched is the release binary (built when
# missing; $HETSCHED_BIN names another). The raw reports stay in target/requests-real/.
set -euo pipefail

ROUNDS=3 TRACE=agent-burst POLICIES="slack fcfs"
while getopts "r:t:p:" opt; do
  case $opt in
    r) ROUNDS=$OPTARG ;; t) TRACE=$OPTARG ;; p) POLICIES=$OPTARG ;;
    *) sed -n 2,14p "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
BIN=${HETSCHED_BIN:-target/release/hetsched}
OUT=target/requests-real
[ -s "$MODEL" ] || scripts/fetch-model.sh
[ -x "$BIN" ] || cargo build --release -p hetsched-cli
mkdir -p "$OUT"
rm -f "$OUT"/*.json

for round in $(seq 1 "$ROUNDS"); do
  order=$POLICIES
  [ $((round % 2)) -eq 0 ] && order=$(echo "$POLICIES" | tr ' ' '\n' | tac | tr '\n' ' ')
  for policy in $order; do
    echo "round $round, $policy (load: $(cut -d' ' -f1-3 /proc/loadavg))" >&2
    "$BIN" run --requests "$TRACE" --model "$MODEL" --precision w8a8 \
      --request-policy "$policy" --json "$@" >"$OUT/$policy.$round.json"
  done
done

python3 - "$OUT" "$POLICIES" <<'EOF'
import glob, json, statistics, sys
out, policies = sys.argv[1], sys.argv[2].split()
print("| policy | request | priority | TTFT / alone (median) | e2e / alone (median) | TTFT ms (median) | alone TTFT ms (median) | arrival scale (median) |")
print("|---|---|---|---|---|---|---|---|")
for policy in policies:
    runs = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/{policy}.*.json"))]
    if not runs:
        continue
    for i, first in enumerate(runs[0]["requests"]):
        rows = [r["requests"][i] for r in runs]
        med = lambda key: statistics.median(r[key] for r in rows)
        ratio = lambda a, b: statistics.median(r[a] / r[b] for r in rows)
        scale = statistics.median(r["arrival_scale"] for r in runs)
        print(f"| {policy} | {first['id']} | {first['priority']} | "
              f"{ratio('ttft_ms', 'alone_ttft_ms'):.2f}x | {ratio('e2e_ms', 'alone_e2e_ms'):.3f}x | "
              f"{med('ttft_ms'):.1f} | {med('alone_ttft_ms'):.1f} | {scale:.3f} |")
print(f"\n{len(runs)} rounds each; measured (hetsched run --requests); raw reports in {out}/")
EOF
