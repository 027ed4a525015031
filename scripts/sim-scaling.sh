#!/usr/bin/env bash
# Simulation cost against its work: `hetsched simulate` as a whole process
# (plan, world, simulated run, memory plan, report) on the default scene, per prompt
# length and chunk length, with the instances (subgraphs) each run schedules.
#
# Usage: scripts/sim-scaling.sh [PROMPTS] [CHUNKS]
#        (defaults: "1024 4096 32768" and "1 16 256 512")
# Env:   HETSCHED  the binary                        [default: target/release/hetsched]
#        RUNS      runs per setting (median kept)    [default: 3]
#        TIMEOUT   seconds before a run is given up  [default: 60]
#        POLICY    scheduling policy                 [default: the scene's]
# Runs the settings round-robin (one run of each, RUNS times) so that load from other
# processes spreads over all of them; prints one markdown table row per setting: the
# median wall time and the median CPU time (user + system, from bash's `time`: on a
# loaded machine the wall time also counts waiting for a core, the CPU time does not).
# A setting past the instance limit prints the error instead of a time.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HETSCHED="${HETSCHED:-$ROOT/target/release/hetsched}"
RUNS="${RUNS:-3}"
TIMEOUT="${TIMEOUT:-60}"
read -r -a PROMPTS <<<"${1:-1024 4096 32768}"
read -r -a CHUNKS <<<"${2:-1 16 256 512}"
POLICY_ARGS=()
[[ -n "${POLICY:-}" ]] && POLICY_ARGS=(--policy "$POLICY")

declare -A times cpus instances notes
settings=()
for p in "${PROMPTS[@]}"; do
  for c in "${CHUNKS[@]}"; do
    settings+=("$p:$c")
  done
done

median() {
  tr ' ' '\n' <<<"$1" | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}

for ((run = 0; run < RUNS; run++)); do
  for s in "${settings[@]}"; do
    p=${s%:*} c=${s#*:}
    [[ -n "${notes[$s]:-}" ]] && continue
    out=$(mktemp) clock=$(mktemp)
    TIMEFORMAT="%3R %3U %3S"
    if { time timeout "$TIMEOUT" "$HETSCHED" simulate --prompt-len "$p" --chunk-len "$c" \
      "${POLICY_ARGS[@]}" >"$out" 2>&1; } 2>"$clock"; then
      read -r wall user sys <"$clock"
      times[$s]+="$(awk -v w="$wall" 'BEGIN {printf "%d", w * 1000}') "
      cpus[$s]+="$(awk -v u="$user" -v s="$sys" 'BEGIN {printf "%d", (u + s) * 1000}') "
      instances[$s]=$(sed -n 's/.* \([0-9]*\) instances run.*/\1/p' "$out")
    elif [[ $? -eq 124 ]]; then
      notes[$s]="over ${TIMEOUT} s"
    else
      notes[$s]="refused: $(head -c 160 "$out" | tr '\n' ' ')"
    fi
    rm -f "$out" "$clock"
  done
done

echo "| prompt | chunk | instances | wall (ms, median of $RUNS) | CPU (ms, median) | CPU us per instance |"
echo "|---:|---:|---:|---:|---:|---:|"
for s in "${settings[@]}"; do
  p=${s%:*} c=${s#*:}
  if [[ -n "${notes[$s]:-}" ]]; then
    echo "| $p | $c | ${instances[$s]:--} | ${notes[$s]} | - | - |"
    continue
  fi
  wall=$(median "${times[$s]}")
  cpu=$(median "${cpus[$s]}")
  per=$(awk -v t="$cpu" -v n="${instances[$s]}" 'BEGIN {printf "%.1f", t * 1000 / n}')
  echo "| $p | $c | ${instances[$s]} | $wall | $cpu | $per |"
done
