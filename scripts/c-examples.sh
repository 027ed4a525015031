#!/usr/bin/env bash
# Builds the C ABI library, compiles every C and C++ example with AddressSanitizer
# (leak checking on) and runs them, then the Python ctypes scripts; exits non-zero on any
# failure or sanitizer report. Needs gcc, g++ and python3.
#
#   scripts/c-examples.sh [--release]
set -euo pipefail
cd "$(dirname "$0")/.."

profile=debug
cargo_flags=()
if [ "${1:-}" = "--release" ]; then
  profile=release
  cargo_flags=(--release)
fi
cargo build -p hetsched-capi "${cargo_flags[@]}"
target="${CARGO_TARGET_DIR:-target}/$profile"
lib="$(cd "$target" && pwd)"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:halt_on_error=1"
flags=(-fsanitize=address -fno-omit-frame-pointer -g -Wall -Wextra -Werror -Icapi/include
  -L"$lib" -Wl,-rpath,"$lib" -lhetsched_capi -pthread)

echo "== C: host queues (pthreads), virtual clock, blocking and stepped; wall clock"
gcc -std=c11 -O1 examples/c/host_queues.c -o "$out/host_queues" "${flags[@]}"
"$out/host_queues" --json-out "$out/hosted.json" --trace "$out/hosted.trace.json" --svg "$out/hosted.svg"
"$out/host_queues" --step
"$out/host_queues" --wall --step
"$out/host_queues" --cancel-after 10
"$out/host_queues" --step --cancel-after 10

echo "== C: profile a device through host queues, predict held-out workloads"
gcc -std=c11 -O1 examples/c/profile_device.c -o "$out/profile_device" "${flags[@]}" -lm
mkdir "$out/profile"
"$out/profile_device" "$out/profile"

echo "== C: every function with bad input"
gcc -std=c11 -O1 examples/c/abuse.c -o "$out/abuse" "${flags[@]}"
"$out/abuse"

echo "== C and C++: many requests on the test model (skipped without it)"
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
gcc -std=c11 -O1 examples/c/requests.c -o "$out/requests" "${flags[@]}"
g++ -std=c++17 -O1 examples/c/requests.cpp -o "$out/requests_cpp" "${flags[@]}"
if [ -f "$model" ]; then
  "$out/requests" "$model"
  "$out/requests_cpp" "$model"
else
  echo "skipped: no $model (scripts/fetch-model.sh fetches it)"
fi

echo "== C++: the RAII wrapper"
g++ -std=c++17 -O1 examples/c/simulate.cpp -o "$out/simulate_cpp" "${flags[@]}"
"$out/simulate_cpp" "$out"

echo "== Python: the ctypes binding (examples/python/hetsched.py)"
python3 examples/python/simulate.py "$lib/libhetsched_capi.so"
if [ -f "$model" ]; then
  python3 examples/python/stream_requests.py "$lib/libhetsched_capi.so" "$model"
fi

echo "all C examples passed"
