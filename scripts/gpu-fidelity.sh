#!/usr/bin/env bash
# The cost model checked on a GPU host, where device timestamps are steady: for each GPU
# mode, `hetsched profile` measures the stage costs over a grid of prompt and chunk
# lengths (the resident path's stages timed by device timestamps), then
# scripts/fidelity-grid.sh runs every setting REPS times with `run --profile --predict`:
# predicted against measured makespan per setting, the median and worst error, and each
# run's `--json` (with its per-stage-kind errors) in OUTDIR/runs-MODE.jsonl.
#
#   scripts/gpu-fidelity.sh MODEL OUTDIR [REPS]
#
# Needs a release build with `--features gpu` (BIN, default target/release/hetsched).
# MODES picks the modes (default "gpu cpu,gpu,npu": every stage resident at f32, and the
# GPU as float lane at W8A8); PROMPTS and CHUNKS the grid (default 557 2048 4096 and
# 128 256 512); THREADS the CPU threads (default: the host's cores).
set -euo pipefail
model=${1:?usage: scripts/gpu-fidelity.sh MODEL OUTDIR [REPS]}
out=${2:?usage: scripts/gpu-fidelity.sh MODEL OUTDIR [REPS]}
reps=${3:-3}
bin=${BIN:-target/release/hetsched}
here=$(cd "$(dirname "$0")" && pwd)
prompts=${PROMPTS:-557 2048 4096}
chunks=${CHUNKS:-128 256 512}
threads=${THREADS:-$(nproc)}
mkdir -p "$out"
for mode in ${MODES:-gpu cpu,gpu,npu}; do
  case $mode in
    gpu) precision=f32 name=resident ;;
    *) precision=w8a8 name=float-lane ;;
  esac
  "$bin" profile --model "$model" --backends "$mode" --precision "$precision" \
    --threads "$threads" --chunk-lens "${chunks// /,}" --prompt-lens "${prompts// /,}" \
    --out "$out/profile-$name.toml" 2>&1 | tail -n 12 | tee "$out/profile-$name.txt"
  BIN=$bin BACKENDS=$mode PRECISIONS=$precision PROMPTS=$prompts CHUNKS=$chunks \
    POLICIES=balance REPS=$reps RAW="$out/runs-$name.jsonl" "$here/fidelity-grid.sh" "$out/profile-$name.toml" "$model" \
    "$threads" | tee "$out/fidelity-$name.txt"
done
