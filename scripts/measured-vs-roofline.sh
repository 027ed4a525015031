#!/usr/bin/env bash
# Does scheduling with measured costs ever lose to scheduling with the roofline costs?
# (docs/calibration.md, "Deciding with measured costs".) For each prompt length x chunk length x policy, one real
# `hetsched run` with the measured profile (`--profile`: the policy decides with the cost
# table its model predicts faster, named in the last column) and one with the built-in
# roofline host profile, interleaved, ROUNDS times each after one warm-up; prints the
# median makespans and their ratio per setting, then how many settings the measured
# costs were slower on by more than the noise (5%).
#
#   scripts/measured-vs-roofline.sh PROFILE.toml [MODEL] [THREADS]
#
# Environment: PROMPTS, CHUNKS, POLICIES, PRECISION, ROUNDS; BIN (default
# target/release/hetsched). Run it on a quiet machine and say so beside the figures.
set -euo pipefail
profile=${1:?usage: scripts/measured-vs-roofline.sh PROFILE.toml [MODEL] [THREADS]}
model=${2:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
threads=${3:-2}
bin=${BIN:-target/release/hetsched}
prompts=${PROMPTS:-512 2048}
chunks=${CHUNKS:-64 256}
policies=${POLICIES:-balance stall lookahead}
precision=${PRECISION:-w8a8}
rounds=${ROUNDS:-3}
rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
makespan() {
  "$bin" run --model "$model" --prompt "The committee reviewed the proposal." \
    --prompt-len "$1" --chunk-len "$2" --policy "$3" --precision "$precision" \
    --threads "$threads" --warmup 1 --json "${@:4}" 2>/dev/null \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["prefill_ms"])'
}
# Which cost table the measured run's policy decided with (deterministic per setting).
decided() {
  "$bin" run --model "$model" --prompt "The committee reviewed the proposal." \
    --prompt-len "$1" --chunk-len "$2" --policy "$3" --precision "$precision" \
    --threads "$threads" --json --profile "$profile" 2>/dev/null \
    | python3 -c 'import json,sys; d=json.load(sys.stdin)["decision_costs"]; print(d["costs"])'
}
for prompt in $prompts; do
  for chunk in $chunks; do
    for policy in $policies; do
      measured=(); roofline=()
      for _ in $(seq "$rounds"); do
        measured+=("$(makespan "$prompt" "$chunk" "$policy" --profile "$profile")")
        roofline+=("$(makespan "$prompt" "$chunk" "$policy")")
      done
      decision=$(decided "$prompt" "$chunk" "$policy")
      python3 - "$prompt" "$chunk" "$policy" "${measured[*]}" "${roofline[*]}" "$decision" <<'PY' | tee -a "$rows"
import statistics, sys
p, c, pol, m, r, d = sys.argv[1:]
m = statistics.median(map(float, m.split())); r = statistics.median(map(float, r.split()))
print("%s\t%s\t%s\tmeasured-costs %.1f ms\troofline %.1f ms\tratio %.3f\tdecided with %s" % (p, c, pol, m, r, m / r, d))
PY
    done
  done
done
python3 - "$rows" <<'PY'
import sys
ratios = [float(l.split("ratio ")[1].split()[0]) for l in open(sys.argv[1]) if "ratio" in l]
slower = [x for x in ratios if x > 1.05]
print("settings %d: measured costs slower by over 5%% on %d; ratio best %.3f, worst %.3f"
      % (len(ratios), len(slower), min(ratios), max(ratios)))
PY
