#!/usr/bin/env bash
# GEMM benchmark (and the GPU tests) on a machine with an NVIDIA GPU that has neither cargo
# nor a Vulkan loader: the build machine prepares everything, the GPU machine only runs it.
#
#   scripts/gpu-bench.sh prepare   # here: build gpu_bench and the GPU test binaries, strip
#                                  # them into target/gpu-carry/, fetch the Vulkan loader debs into
#                                  # target/gl/ (the remote machine has neither cargo nor a loader)
#   scripts/gpu-bench.sh remote [--no-tests] [gpu_bench args]
#                                  # on the GPU machine, with target/gpu-carry and target/gl copied
#                                  # into the repository root, from there: unpack the loader,
#                                  # run the GPU tests with HETSCHED_REQUIRE_GPU=1 (unless
#                                  # --no-tests), then the benchmark (table on stdout and
#                                  # $OUT/bench.txt, JSON lines in $OUT/bench.json), e.g.
#                                  # `remote --no-tests --kernels f16-coopmat-khr,f16-coopmat-khr-64x64`
#
# docs/gpu.md's figures: copy target/gpu-carry and target/gl into the repository root of the
# GPU machine, then there: OUT=results bash target/gpu-carry/gpu-bench.sh remote
set -euo pipefail

case "${1:-}" in
prepare)
  cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
  rm -rf target/gpu-carry && mkdir -p target/gpu-carry
  # The test profile (opt-level 2, the build `cargo test` already made): the timings come from
  # GPU timestamps, but unoptimised host code spent seconds of device time per large shape
  # generating and packing operands.
  cargo build -q -p hetsched-gpu --example gpu_bench --profile test
  cp target/debug/examples/gpu_bench target/gpu-carry/
  cargo test -q -p hetsched-gpu --no-run --message-format=json 2>/dev/null |
    python3 -c 'import sys, json
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["executable"])' |
    while read -r exe; do cp "$exe" "target/gpu-carry/test-$(basename "$exe" | sed 's/-[0-9a-f]*$//')"; done
  strip target/gpu-carry/*
  cp scripts/gpu-bench.sh target/gpu-carry/
  if [ ! -d target/gl ]; then
    mkdir -p target/gl /tmp/amd64/partial
    o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
    # shellcheck disable=SC2086
    apt-get $o update -q >/dev/null
    # shellcheck disable=SC2086
    (cd target/gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
  fi
  du -sh target/gpu-carry target/gl
  ;;
remote)
  # The binaries beside this script: target/gpu-carry, or wherever it was copied to travel.
  carried=$(dirname "$0")
  for f in target/gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
  icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  [ -f "$icd" ] && export VK_DRIVER_FILES="$icd"
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader || true
  out=${OUT:-/tmp}
  status=0
  shift
  if [ "${1:-}" = --no-tests ]; then
    shift
  else
    for t in "$carried"/test-*; do
      HETSCHED_REQUIRE_GPU=1 "$t" --nocapture 2>&1 | tee -a "$out/tests.log" | grep -E 'test result|FAILED|panicked|skipped' || status=1
    done
  fi
  "$carried"/gpu_bench --json "$out/bench.json" "$@" 2>&1 | tee "$out/bench.txt" || status=1
  exit $status
  ;;
*)
  echo "usage: scripts/gpu-bench.sh prepare|remote" >&2
  exit 2
  ;;
esac
