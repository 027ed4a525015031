#!/usr/bin/env bash
# Side-by-side serving: `hetsched serve` (w8a8 or f32, the many-requests engine) against
# llama.cpp's `llama-server --parallel N` (Q8_0 or F32 made from the same GGUF), the same load from
# scripts/load.py against each, alternating server by server within each round (the order
# swapped every round); prints medians over the rounds and the ratios ours / llama's as a
# markdown table (docs/serving.md keeps one, with date, machine and commit).
#
#   scripts/serve-vs-llama-server.sh [-r ROUNDS] [-t THREADS] [-c "CLIENTS ..."] [-m MAX_TOKENS] [-p POLL] [-b BUDGET_S] [-q w8a8|f32] [-- LOAD_ARGS]
#       defaults: -r 3 -t 2 -c "1 4 16" -m 32, -p: llama-server's own (50), -b 540, -q w8a8
#       (-q f32: hetsched --precision f32 against llama.cpp's F32 file)
#
# Loads: `chat` at each client count (closed loop, 2 x clients requests, at least 4) and
# `agent-burst` (a background summary, then five interactive requests while it runs;
# llama-server gets --parallel 8 there and ignores the priority field). Every request is
# greedy with ignore_eos (both servers' extension), so both generate the same number of
# tokens. LOAD_ARGS go to every scripts/load.py run (see its --help). Both servers run
# side by side for the whole measurement (an idle server takes no CPU): ours once, one
# llama-server per client count. llama.cpp is built once by scripts/build-llamacpp.sh (or
# $LLAMACPP_BUILD) and the Q8_0 file cached in target/serve-vs-llama-server/, as
# scripts/setup-vs-llamacpp.sh does for every side-by-side script; hetsched is the release
# binary (built when missing). -p POLL is llama-server's --poll (how
# hard its threads spin waiting for work, 0 to 100): on a machine other processes load,
# -p 0 lets them sleep instead. -b BUDGET_S bounds the run: no round starts once that many
# seconds have passed since the launch (the table then says how many rounds ran).
# Before any load, the script checks that hetsched serve answered /health within 2 s of
# its launch (the listener is up before the model loads) and stops if not.
set -euo pipefail

ROUNDS=3 THREADS=2 CLIENTS="1 4 16" MAX_TOKENS=32 POLL=() BUDGET_S=540 PRECISION=w8a8
while getopts "r:t:c:m:p:b:q:" opt; do
  case $opt in
    r) ROUNDS=$OPTARG ;; t) THREADS=$OPTARG ;; c) CLIENTS=$OPTARG ;; m) MAX_TOKENS=$OPTARG ;;
    p) POLL=(--poll "$OPTARG") ;; b) BUDGET_S=$OPTARG ;; q) PRECISION=$OPTARG ;;
    *) sed -n 2,26p "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
LOAD_ARGS=("$@")

case $PRECISION in
  w8a8) QUANT=Q8_0 ;; f32) QUANT=F32 ;;
  *) echo "-q: w8a8 or f32, not $PRECISION" >&2; exit 2 ;;
esac
WORK=target/serve-vs-llama-server QUANTS=$QUANT
# shellcheck source=scripts/setup-vs-llamacpp.sh
. "$(dirname "${BASH_SOURCE[0]}")/setup-vs-llamacpp.sh"

PIDS=()
stop_servers() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap stop_servers EXIT

STARTED=$(date +%s)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

# Seconds since the epoch, to the millisecond.
now() { date +%s.%N; }

# Starts a server in the background on port $1 (the rest: its command line) and waits for
# its /health to answer 200. Sets FIRST_ANSWER_S: seconds from the launch to the first
# answer of /health (503 "loading" counts: the listener is up).
start_server() {
  local port=$1; shift
  local launched; launched=$(now)
  "$@" >"$WORK/server.$port.log" 2>&1 &
  PIDS+=($!)
  FIRST_ANSWER_S=""
  for _ in $(seq 6000); do
    local status
    status=$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "http://127.0.0.1:$port/health" || true)
    if [ -z "$FIRST_ANSWER_S" ] && [ "$status" != 000 ]; then
      FIRST_ANSWER_S=$(awk -v a="$launched" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }')
    fi
    [ "$status" = 200 ] && return 0
    sleep 0.01
  done
  echo "the server on port $port never became ready: see $WORK/server.$port.log" >&2
  exit 1
}

OURS=18480
start_server $OURS "$BIN" serve --model "$MODEL" --precision "$PRECISION" --threads "$THREADS" --port $OURS
# The listener is up before the model loads: /health answers within 2 s of the launch.
HEALTH_S=$FIRST_ANSWER_S
if awk -v s="$HEALTH_S" 'BEGIN { exit !(s > 2) }'; then
  echo "hetsched serve answered /health only ${HEALTH_S} s after its launch (at most 2 s)" >&2
  exit 1
fi
llama_port() { echo $((18490 + $1)); }
for n in $CLIENTS 8; do
  port=$(llama_port "$n")
  curl -sf "http://127.0.0.1:$port/health" >/dev/null && continue
  start_server "$port" "$LLAMA/llama-server" -m "$WORK/model.$QUANT.gguf" -t "$THREADS" -tb "$THREADS" \
    --parallel "$n" -c $((1024 * n)) "${POLL[@]}" --host 127.0.0.1 --port "$port"
done

load() { # port scenario clients
  local requests=$(($3 * 2)); [ $requests -ge 4 ] || requests=4
  scripts/load.py --url "http://127.0.0.1:$1" --scenario "$2" --clients "$3" \
    --max-requests $requests --max-tokens "$MAX_TOKENS" --temperature 0 --ignore-eos \
    --duration 120 --json "${LOAD_ARGS[@]}"
}

# One warm-up request on each server (first-request costs are not what is compared).
for n in $CLIENTS 8; do load "$(llama_port "$n")" chat 1 >/dev/null || true; done
load $OURS chat 1 >/dev/null || true

RESULTS="$WORK/results.txt"
: >"$RESULTS"
RAN=0
for round in $(seq "$ROUNDS"); do
  if [ $(($(date +%s) - STARTED)) -ge "$BUDGET_S" ]; then
    echo "the budget of $BUDGET_S s is spent: $RAN of $ROUNDS rounds ran" >&2
    break
  fi
  RAN=$round
  for load_case in $(for c in $CLIENTS; do echo "chat:$c"; done) agent-burst:8; do
    scenario=${load_case%:*} clients=${load_case#*:}
    sides="hetsched llama-server"
    [ $((round % 2)) -eq 0 ] && sides="llama-server hetsched"
    for side in $sides; do
      port=$OURS
      [ "$side" = hetsched ] || port=$(llama_port "$clients")
      report=$(load "$port" "$scenario" "$clients") || true
      echo "$side $scenario $clients $round $report" | tee -a "$RESULTS" >&2
    done
  done
done

echo "hetsched serve: /health answered ${HEALTH_S} s after the launch (at most 2 s)"
echo "hetsched $PRECISION against llama.cpp $QUANT; commit $(git rev-parse --short HEAD), $(date -u +%Y-%m-%d), $(nproc) cores, $RAN of $ROUNDS rounds, \
$MAX_TOKENS tokens a request, load average $LOAD_BEFORE before and $(cut -d' ' -f1-3 /proc/loadavg) \
after, $(($(date +%s) - STARTED)) s in all; every round's report in $RESULTS"
echo
python3 - "$RESULTS" <<'EOF'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    side, scenario, clients, _round, report = line.split(" ", 4)
    rows.setdefault((scenario, int(clients)), {}).setdefault(side, []).append(json.loads(report))
figures = [("ttft_p50_ms", "TTFT p50"), ("ttft_p99_ms", "TTFT p99"),
           ("tpot_median_ms", "time per output token"), ("tokens_per_s", "tokens/s")]
print("| load | clients | figure | hetsched (median) | llama-server (median) | ratio ours/llama |")
print("|---|---|---|---|---|---|")
for (scenario, clients), sides in sorted(rows.items()):
    keys = figures + ([("ttft_p99_ms_interactive", "interactive TTFT p99")]
                      if scenario == "agent-burst" else [])
    errors = {s: sum(r["errors"] for r in runs) for s, runs in sides.items()}
    for key, name in keys:
        med = {}
        for side in ("hetsched", "llama-server"):
            values = [r[key] for r in sides.get(side, []) if r.get(key) is not None]
            med[side] = statistics.median(values) if values else None
        ours, theirs = med["hetsched"], med["llama-server"]
        ratio = f"{ours / theirs:.2f}" if ours and theirs else "-"
        fmt = lambda v: "-" if v is None else f"{v:.1f}"
        print(f"| {scenario} | {clients} | {name} | {fmt(ours)} | {fmt(theirs)} | {ratio} |")
    print(f"| {scenario} | {clients} | errors | {errors.get('hetsched', 0)} | "
          f"{errors.get('llama-server', 0)} | |")
EOF
