#!/usr/bin/env bash
# Predicted against measured prefill makespan over a grid (issue 14's goal): for each
# prompt length x chunk length x policy x precision, one real `hetsched run --predict`
# (after one warm-up prefill) with a measured profile; prints one row per setting, then
# the median and worst absolute error of the makespan and of each processor's busy time.
#
#   scripts/fidelity-grid.sh PROFILE.toml [MODEL] [THREADS]
#
# Environment: PROMPTS, CHUNKS, POLICIES, PRECISIONS (space-separated) narrow the grid;
# BIN picks the binary (default target/release/hetsched); CALIBRATION names the
# w8a8-shadow calibration file (default: the one beside the model, if any); ALSO names a
# second profile: every setting then runs once with each, interleaved, and the summary
# compares the two predictors on the same machine state (rows are prefixed by profile).
# Timings are noisy on a shared machine: run it when nothing else is building, and say so
# beside the figures.
set -euo pipefail
profile=${1:?usage: scripts/fidelity-grid.sh PROFILE.toml [MODEL] [THREADS]}
model=${2:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
threads=${3:-2}
bin=${BIN:-target/release/hetsched}
prompts=${PROMPTS:-128 512 2048}
chunks=${CHUNKS:-64 128 256}
policies=${POLICIES:-balance stall inorder}
precisions=${PRECISIONS:-f32 w8a8}
profiles=("$profile")
[[ -n ${ALSO:-} ]] && profiles+=("$ALSO")
rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
for precision in $precisions; do
  for prompt in $prompts; do
    for chunk in $chunks; do
      for policy in $policies; do
        calibration=()
        if [[ $precision == w8a8-shadow && -n ${CALIBRATION:-} ]]; then
          calibration=(--calibration "$CALIBRATION")
        fi
        for prof in "${profiles[@]}"; do
          "$bin" run --model "$model" --prompt "The committee reviewed the proposal." \
            --prompt-len "$prompt" --chunk-len "$chunk" --policy "$policy" \
            --precision "$precision" --threads "$threads" --warmup 1 \
            --profile "$prof" --predict --json "${calibration[@]}" 2>/dev/null \
            | PROF="$prof" MANY=${#profiles[@]} python3 -c '
import json, os, sys
r = json.load(sys.stdin)
p = r["prediction"]
busy = " ".join("%s %+.1f%%" % (b["name"], 100 * b["error"]) for b in p["processors"])
label = os.environ["PROF"] + "\t" if os.environ["MANY"] != "1" else ""
print("%s%s\t%d\t%d\t%s\t%.1f\t%.1f\t%+.1f%%\t%s\t%s" % (label, r["precision"], r["prompt_tokens"],
      r["schedule"]["chunk_len"], r["schedule"]["policy"], r["prefill_ms"],
      r["predicted_makespan_ms"], 100 * r["prediction_error"], busy, r["cost_model"]["model"]))
' | tee -a "$rows"
        done
      done
    done
  done
done
MANY=${#profiles[@]} python3 - "$rows" <<'PY'
import collections, os, statistics, sys
groups = collections.defaultdict(list)
for line in open(sys.argv[1]):
    if not line.strip():
        continue
    r = line.rstrip("\n").split("\t")
    key = r.pop(0) if os.environ["MANY"] != "1" else ""
    groups[key].append(r)
for key, rows in groups.items():
    errors = [abs(float(r[6].rstrip("%"))) for r in rows]
    busy = [abs(float(x.rstrip("%"))) for r in rows for x in r[7].split()[1::2]]
    within = sum(b <= 15.0 for b in busy)
    print("%ssettings %d: makespan error median %.1f%%, worst %.1f%%; busy-time error median %.1f%%, worst %.1f%%, %d of %d within 15%%"
          % (key + ": " if key else "", len(rows), statistics.median(errors), max(errors),
             statistics.median(busy), max(busy), within, len(busy)))
PY
