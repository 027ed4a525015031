#!/usr/bin/env bash
# SmolLM2-135M real prefill with the Vulkan GPU lane on a machine with an NVIDIA GPU that
# has neither cargo nor a Vulkan loader: the build machine prepares everything, the GPU
# machine only runs it.
#
#   scripts/gpu-prefill.sh prepare   # on the build machine: release build with --features
#                                    # gpu, strip it into target/gpu-run/, split the test model
#                                    # in two (the first part into target/model-a/, each part
#                                    # under 64 MiB), fetch the loader debs into target/gl/
#   # copy target/model-a, target/gpu-run and target/gl into the repository root of the GPU
#   # machine, then, there:
#   OUT=results bash target/gpu-run/gpu-prefill.sh remote
#                                    # join the model, unpack the loader, run prefills
#                                    # (GPU lane vs CPU only, stall vs inorder; every stage
#                                    # resident on the GPU), JSON and traces into $OUT;
#                                    # `remote resident` runs the resident ones only;
#                                    # `remote shadow` the outlier-shadow runs (8 threads)
#                                    # and three resident ones
set -euo pipefail
model=models/SmolLM2-135M-Instruct.Q4_1.gguf

case "${1:-}" in
prepare)
  cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
  cargo build -q --release -p hetsched-cli --features gpu
  rm -rf target/gpu-run target/model-a && mkdir -p target/gpu-run target/model-a
  cp target/release/hetsched target/gpu-run/ && strip target/gpu-run/hetsched
  cp scripts/gpu-prefill.sh target/gpu-run/
  head -c 60M "$model" > target/model-a/part-a
  tail -c +$((60 * 1024 * 1024 + 1)) "$model" > target/gpu-run/part-b
  head -c 2500 /usr/share/common-licenses/GPL-3 > target/gpu-run/prompt.txt
  if [ ! -d target/gl ]; then
    mkdir -p target/gl /tmp/amd64/partial
    o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
    # shellcheck disable=SC2086
    apt-get $o update -q >/dev/null
    # shellcheck disable=SC2086
    (cd target/gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
  fi
  du -sh target/gpu-run target/gl target/model-a
  ;;
remote)
  for f in target/gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
  icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  [ -f "$icd" ] && export VK_DRIVER_FILES="$icd"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
  nproc
  cat target/model-a/part-a target/gpu-run/part-b > /tmp/model.gguf
  out=${OUT:-/tmp}
  bin=target/gpu-run/hetsched
  # Output names avoid `+` and `,` (plain names survive any copy tool).
  prefill() { # threads backends policy precision [chunk_len] [prompt file] [name suffix]
    local chunk="${5:-128}" prompt="${6:-target/gpu-run/prompt.txt}"
    local name="t$1-${2//,/_}-$3-$4-c$chunk${7:-}"
    "$bin" run --model /tmp/model.gguf --prompt-file "$prompt" --chunk-len "$chunk" \
      --threads "$1" --backends "$2" --policy "$3" --precision "$4" --json \
      --trace "$out/$name.trace.json" --svg "$out/$name.svg" > "$out/$name.json" || echo "FAILED $name"
    python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], r['prompt_tokens'], 'tokens', round(r['prefill_ms'],1), 'ms', round(r['prefill_tokens_per_s']), 'tok/s', [(t['text'], round(t['prob'], 4)) for t in r['top_tokens'][:2]])" "$out/$name.json" "$name" || true
  }
  if [ "${2:-all}" = shadow ]; then
    # The outlier shadow as its own subgraph on a machine with cores to spare: 8 threads,
    # CPU + emulated NPU, every site shadowed and calibrated (18 sites), five runs each,
    # alternating with target/gpu-run/hetsched-inline (a build whose shadow runs inside
    # the INT8 job) when it was carried.
    for run in 1 2 3 4 5; do
      for cal in none calibrated; do
        flags=(--no-calibration)
        [ "$cal" = calibrated ] && flags=(--calibration target/gpu-run/smollm2.calibration.json)
        for b in "$bin" target/gpu-run/hetsched-inline; do
          [ -x "$b" ] || continue
          "$b" run --model /tmp/model.gguf --prompt-file target/gpu-run/prompt.txt --chunk-len 128 \
            --threads 8 --backends cpu,npu --precision w8a8-shadow "${flags[@]}" --json \
            > "$out/shadow-$cal-$(basename "$b")-r$run.json" || echo "FAILED $cal $b"
          python3 -c "import json,sys; r=json.load(open(sys.argv[1])); s=r['schedule']; sh=s.get('shadow') or {}; print(sys.argv[2], round(r['prefill_ms'],1), 'ms', 'hidden', sh.get('hidden_share'), 'concurrent', sh.get('concurrent_share'), 'exposed', sh.get('exposed_ms'))" "$out/shadow-$cal-$(basename "$b")-r$run.json" "$cal $(basename "$b") r$run" || true
        done
      done
    done
    for run in 1 2 3 4 5; do
      prefill 1 gpu stall f32 512 target/gpu-run/prompt.txt "-r$run"
    done
    exit 0
  fi
  if [ "${2:-all}" = ab ]; then
    # The resident path against target/gpu-run/hetsched-inline (another build), alternating.
    for run in 1 2 3 4 5 6 7; do
      for b in "$bin" target/gpu-run/hetsched-inline; do
        "$b" run --model /tmp/model.gguf --prompt-file target/gpu-run/prompt.txt --chunk-len 512 \
          --backends gpu --precision f32 --json > "$out/ab-$(basename "$b")-r$run.json" || echo "FAILED $b"
        python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], round(r['prefill_ms'],2), 'ms', r.get('gpu_activations'))" "$out/ab-$(basename "$b")-r$run.json" "$(basename "$b") r$run" || true
      done
    done
    exit 0
  fi
  if [ "${2:-all}" = all ]; then
  for threads in 2 8; do
    for backends in cpu,npu cpu,gpu,npu; do
      for policy in stall inorder; do
        prefill "$threads" "$backends" "$policy" w8a8
      done
    done
  done
  for backends in cpu,npu cpu,gpu,npu; do
    prefill 8 "$backends" stall f32
  done
  fi
  # Every stage resident on the GPU (f32), three runs each: chunk 128 and one 512 chunk,
  # then a 4x longer prompt.
  head -c 10000 /usr/share/common-licenses/GPL-3 > /tmp/prompt-long.txt 2>/dev/null ||
    for _ in 1 2 3 4; do cat target/gpu-run/prompt.txt; done > /tmp/prompt-long.txt
  for run in 1 2 3; do
    for chunk in 128 512; do
      prefill 1 gpu stall f32 "$chunk" target/gpu-run/prompt.txt "-r$run"
    done
    prefill 1 gpu stall f32 512 /tmp/prompt-long.txt "-long-r$run"
    prefill 1 gpu inorder f32 512 /tmp/prompt-long.txt "-long-r$run"
  done
  ;;
*)
  echo "usage: scripts/gpu-prefill.sh prepare|remote" >&2
  exit 2
  ;;
esac
