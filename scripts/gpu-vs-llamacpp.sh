#!/usr/bin/env bash
# Side-by-side prefill on a machine with an NVIDIA GPU (measured on an H100): hetsched's resident Vulkan
# path (`run --backends gpu --precision f32 --chunk-len 512`; row `hetsched` with the
# default weights (f16 where the fused GEMMs run on tensor cores, as on an H100) and the
# output projection inside attention (4 dispatches a layer); row `hetsched-unfused-o` the
# same with HETSCHED_GPU_UNFUSED_O=1 (the o GEMM of its own, 5 dispatches: the path
# before); row `hetsched-f32w` with HETSCHED_GPU_F16_WEIGHTS=0 (f32 weights, the
# reference); rows asked for by name: `hetsched-f16` (HETSCHED_GPU_F16_WEIGHTS=1),
# `hetsched-f32attn` (HETSCHED_GPU_F32_ATTENTION=1))
# against llama.cpp built with
# CUDA there (llama-bench, F16 and F32 files made from the same Q4_1 test model with
# llama-quantize, so both sides run the same dequantized weights), at 557, 2048 and 4096
# prompt tokens, interleaved round by round; medians and ratios as a markdown table.
# The GPU machine needs no cargo, no Vulkan loader and no internet: the build machine
# prepares two folders (each under 64 MiB, so they travel in small pieces), the GPU
# machine builds llama.cpp and runs the rows:
#
#   scripts/gpu-vs-llamacpp.sh prepare DEST [OLD_BIN]
#       here: release build with --features gpu, the binary (and OLD_BIN, an older build to
#       compare with, if given) stripped and xz'd into DEST/gpu-vs-llamacpp-b/ with the
#       attention benchmark (gpu_bench), the GPU test binaries (hetsched-gpu's and
#       gpu_prefill, run first there with HETSCHED_REQUIRE_GPU=1), the second part of the
#       model and this script; the
#       first part of the model and llama.cpp's source (from the llama-cpp-python 0.3.36
#       sdist that build-llamacpp.sh caches in ~/.cache/llamacpp-0.3.36, CUDA-irrelevant
#       parts left out) into DEST/gpu-vs-llamacpp-a/; the Vulkan loader debs into
#       DEST/gl/. DEST is a folder inside the repository (e.g. target/x; part A is 50 MiB
#       of model and 5 MiB of source). Copy DEST into the same path under the repository
#       root of the GPU machine, then, there:
#   bash DEST/gpu-vs-llamacpp-a/gpu-vs-llamacpp.sh start
#       starts the llama.cpp CUDA build (sm_90, llama-bench and llama-quantize only)
#       detached (setsid), so it outlives the shell.
#   OUT=results bash DEST/gpu-vs-llamacpp-b/gpu-vs-llamacpp.sh remote [ROUNDS] [hetsched-only|llama-only]
#       joins the model, runs the GPU tests (unless RUN_TESTS=0), the attention
#       benchmark and layer_bench (device time per dispatch of a layer, attention at every
#       chunk position) while llama.cpp builds, waits for the build, makes the F16/F32
#       files, then ROUNDS (default 5) rounds of every row, interleaved; results in $OUT.
#       ROWS="hetsched-f16 hetsched ..." picks the rows (llama.cpp:F16 and llama.cpp:F32
#       name llama.cpp's; hetsched-f16-mbN: f16 weights with the attention's key split
#       down to N blocks per range, HETSCHED_GPU_ATTN_MIN_KEY_BLOCKS=N); ATTN_MIN_BLOCKS=8,16
#       picks layer_bench's key splits (default 16,8,4), LAYER_BENCH_ARGS replaces its
#       arguments (--decode-only: the decode rows alone); TRACED=0 skips the traced runs.
#       Rows tg-hetsched and tg-llama.cpp:F16/F32 measure decode, one sequence: hetsched's
#       greedy turn of 128 tokens after a short prompt (generate --backends gpu
#       --precision f32 --max-tokens 128 --ignore-eos) against llama-bench -p 0 -n 128;
#       tg-hetsched-old the same with OLD_BIN; tg-hetsched-f16 the same with f16 weights
#       (--gpu-weights f16); tg-hetsched-tree the same with the one-row GEMV's 64-thread tree
#       (HETSCHED_GPU_ONE_ROW_GEMV_TREE=1), tg-hetsched-dmbN with the decode attention's
#       split down to N key blocks a workgroup (HETSCHED_GPU_DECODE_MIN_KEY_BLOCKS=N),
#       tg-hetsched-five with five dispatches a layer (HETSCHED_GPU_FIVE_DISPATCH_DECODE=1),
#       tg-hetsched-gN with N workgroups a multiprocessor in the one-dispatch layer
#       (HETSCHED_GPU_DECODE_GROUPS_PER_SM=N), tg-hetsched-pf with its prefetch of
#       later stages' weights (HETSCHED_GPU_DECODE_PREFETCH=1), tg-hetsched-lN with at
#       most N layers a dispatch (HETSCHED_GPU_DECODE_LAYERS_PER_DISPATCH=N),
#       tg-hetsched-unfused-o with o a stage of its own after attention in the one-dispatch
#       layers (HETSCHED_GPU_UNFUSED_O=1; tg-hetsched-nN-unfused-o the same for N samples),
#       tg-hetsched-nN decodes N greedy samples of the prompt together (generate --n N:
#       batched steps, decode tokens/s summed over the samples; tg-hetsched-nNgG with G
#       workgroups a multiprocessor), tg-hetsched-sN N samples
#       at temperature 0.8 (each step reads the logits back for the host's sampler).
#       tgd-hetsched-cC decodes 128 tokens after a prompt of the prompt file's first C
#       characters (the keys a step attends grow from the prompt's tokens);
#       tgd-hetsched-cC-okN the same with attention and o as one stage up to N keys
#       (HETSCHED_GPU_DECODE_O_MAX_KEYS=N), tgd-hetsched-cC-unfused-o with o apart.
set -euo pipefail
model_name=SmolLM2-135M-Instruct.Q4_1.gguf
lengths="557 2048 4096"

case "${1:-}" in
prepare)
  dest=${2:?usage: prepare DEST [OLD_BIN]}
  old=${3:-}
  cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
  cargo build -q --release -p hetsched-cli --features gpu
  cargo build -q --release -p hetsched-gpu --example gpu_bench --example layer_bench
  a="$dest/gpu-vs-llamacpp-a" b="$dest/gpu-vs-llamacpp-b"
  rm -rf "$a" "$b" && mkdir -p "$a" "$b"
  strip -o "$b/hetsched" target/release/hetsched && xz -T2 "$b/hetsched"
  [ -n "$old" ] && strip -o "$b/hetsched-old" "$old" && xz -T2 "$b/hetsched-old"
  for ex in gpu_bench layer_bench; do
    strip -o "$b/$ex" "target/release/examples/$ex" && xz -T2 "$b/$ex"
  done
  mkdir -p "$b/tests"
  # FACADE_TESTS=0 leaves out gpu_prefill and gpu_decode (their build unifies features
  # differently and rebuilds vulkano).
  { cargo test -q --release -p hetsched-gpu --no-run --message-format=json
    if [ "${FACADE_TESTS:-1}" = 1 ]; then
      cargo test -q --release -p hetsched --features gpu --test gpu_prefill --test gpu_decode --no-run --message-format=json
    fi; } |
    python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])' | while read -r t; do
      strip -o "$b/tests/$(basename "$t")" "$t" && xz -T2 "$b/tests/$(basename "$t")"
    done
  pwd >"$b/tests/manifest-dir" # gpu_prefill finds the model under its build-time root
  cp "$0" "$a/" && cp "$0" "$b/"
  head -c 50M "models/$model_name" >"$a/model-part-a"
  tail -c +$((50 * 1024 * 1024 + 1)) "models/$model_name" >"$b/model-part-b"
  cp /usr/share/common-licenses/GPL-3 "$b/prompt.txt"
  # The sdist build-llamacpp.sh unpacked (run it once first: it downloads the package).
  src="${LLAMACPP_DIR:-$HOME/.cache/llamacpp-0.3.36}/llama_cpp_python-0.3.36/vendor"
  [ -d "$src/llama.cpp" ] || { echo "no llama.cpp source in $src: run build-llamacpp.sh" >&2; exit 1; }
  tar -C "$src" -cJf "$a/llamacpp-src.tar.xz" --exclude=llama.cpp/models \
    --exclude=llama.cpp/docs --exclude=llama.cpp/media --exclude=llama.cpp/tools/ui \
    --exclude=llama.cpp/tests --exclude=llama.cpp/ggml/src/ggml-vulkan \
    --exclude=llama.cpp/ggml/src/ggml-sycl --exclude=llama.cpp/ggml/src/ggml-opencl \
    --exclude=llama.cpp/ggml/src/ggml-hexagon --exclude=llama.cpp/ggml/src/ggml-metal \
    --exclude=llama.cpp/ggml/src/ggml-et llama.cpp
  if [ ! -d "$dest/gl" ]; then
    mkdir -p "$dest/gl" /tmp/amd64/partial
    o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
    # shellcheck disable=SC2086
    apt-get $o update -q >/dev/null
    # shellcheck disable=SC2086
    (cd "$dest/gl" && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
  fi
  du -sh "$a" "$b" "$dest/gl"
  ;;
start)
  here=$(cd "$(dirname "$0")" && pwd)
  mkdir -p /tmp/llamacpp && tar -C /tmp/llamacpp -xJf "$here/llamacpp-src.tar.xz"
  cp "$here/model-part-a" /tmp/model-part-a
  setsid bash -c 'cd /tmp/llamacpp && cmake -S llama.cpp -B build -DCMAKE_BUILD_TYPE=Release \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >cmake.log 2>&1 &&
    cmake --build build -j"$(nproc)" --target llama-bench llama-quantize >build.log 2>&1;
    echo $? >done' </dev/null >/dev/null 2>&1 &
  echo "llama.cpp CUDA build started in /tmp/llamacpp"
  ;;
remote)
  rounds=${2:-5}
  here=$(cd "$(dirname "$0")" && pwd)
  out=${OUT:-/tmp}
  for f in "$here"/../gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
  icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  [ -f "$icd" ] && export VK_DRIVER_FILES="$icd"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
  cat /tmp/model-part-a "$here/model-part-b" >/tmp/model.gguf
  for bin in hetsched hetsched-old gpu_bench layer_bench; do
    [ -f "$here/$bin.xz" ] && xz -dc "$here/$bin.xz" >"/tmp/$bin" && chmod +x "/tmp/$bin"
  done
  if [ -d "$here/tests" ] && [ "${3:-}" != llama-only ] && [ "${RUN_TESTS:-1}" = 1 ]; then
    root=$(cat "$here/tests/manifest-dir")
    mkdir -p "$root/models" /tmp/tests && ln -sf /tmp/model.gguf "$root/models/$model_name"
    for t in "$here"/tests/*.xz; do
      name=$(basename "$t" .xz)
      xz -dc "$t" >"/tmp/tests/$name" && chmod +x "/tmp/tests/$name"
      echo "== $name" | tee -a "$out/tests.txt"
      HETSCHED_REQUIRE_GPU=1 "/tmp/tests/$name" --test-threads=1 --nocapture >>"$out/tests.txt" 2>&1 ||
        echo "== $name FAILED" | tee -a "$out/tests.txt"
      grep -E "^test result|tensor cores true" "$out/tests.txt" | tail -n 3
    done
  fi
  if [ "${3:-}" != llama-only ]; then
    [ -x /tmp/gpu_bench ] && { /tmp/gpu_bench --shapes 512x576x1536 2>&1 | tee "$out/ops.txt" || true; }
    # shellcheck disable=SC2086
    [ -x /tmp/layer_bench ] && { /tmp/layer_bench ${LAYER_BENCH_ARGS:---attn-min-blocks ${ATTN_MIN_BLOCKS:-16,8,4}} 2>&1 | tee "$out/layers.txt" || true; }
  fi
  hetsched_tps() { # binary tokens
    "$1" run --model /tmp/model.gguf --prompt-file "$here/prompt.txt" --prompt-len "$2" \
      --backends gpu --precision f32 --chunk-len 512 --json |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["prefill_tokens_per_s"])'
  }
  llama_tps() { # quant tokens
    "$bin/llama-bench" -m "/tmp/model.$1.gguf" -p "$2" -n 0 -ngl 99 -r 1 -o json 2>/dev/null |
      python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["avg_ts"])'
  }
  # Decode, one sequence: hetsched's greedy turn of N tokens after a short prompt (the
  # step recorded once and replayed), llama.cpp's tgN (llama-bench -p 0 -n N).
  hetsched_tg() { # binary tokens [generate options] (a --prompt-file among them replaces the short prompt)
    local prompt=(--prompt "The capital of France is")
    [[ " ${*:3} " == *" --prompt-file "* ]] && prompt=()
    "$1" generate --model /tmp/model.gguf "${prompt[@]}" \
      --backends gpu --precision f32 --max-tokens "$2" --ignore-eos --json "${@:3}" 2>/dev/null |
      tee -a "$out/generate.jsonl" |
      python3 -c 'import json,sys
text, dec, at, last = sys.stdin.read(), json.JSONDecoder(), 0, None
while text[at:].strip():  # the report is pretty-printed: take the last JSON value
    last, at = dec.raw_decode(text, at + len(text[at:]) - len(text[at:].lstrip()))
print(last["decode_tokens_per_s"])'
  }
  llama_tg() { # quant tokens
    "$bin/llama-bench" -m "/tmp/model.$1.gguf" -p 0 -n "$2" -ngl 99 -r 1 -o json 2>/dev/null |
      python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["avg_ts"])'
  }
  results="$out/results.txt"
  touch "$results"
  bin=/tmp/llamacpp/build/bin
  # Round by round, every length, every row: the rows of both sides interleaved.
  first=${lengths%% *}
  rows() { # row names...
    for round in $(seq "$rounds"); do
      for n in $lengths; do
        for row in "$@"; do
          label=$n
          case $row in
            tg-hetsched) [ "$n" = "$first" ] || continue; tps=$(hetsched_tg /tmp/hetsched 128 || echo nan); label=tg128 ;;
            tg-hetsched-old) [ "$n" = "$first" ] || continue; tps=$(hetsched_tg /tmp/hetsched-old 128 || echo nan); label=tg128 ;;
            tg-hetsched-tree) # the one-row GEMV's 64-thread tree instead of its subgroup kernel
              [ "$n" = "$first" ] || continue; label=tg128
              tps=$(HETSCHED_GPU_ONE_ROW_GEMV_TREE=1 hetsched_tg /tmp/hetsched 128 || echo nan) ;;
            tg-hetsched-dmb*) # the decode attention split down to N key blocks a workgroup
              [ "$n" = "$first" ] || continue; label=tg128
              tps=$(HETSCHED_GPU_DECODE_MIN_KEY_BLOCKS=${row#tg-hetsched-dmb} hetsched_tg /tmp/hetsched 128 || echo nan) ;;
            tg-hetsched-five) # five dispatches a layer instead of one
              [ "$n" = "$first" ] || continue; label=tg128
              tps=$(HETSCHED_GPU_FIVE_DISPATCH_DECODE=1 hetsched_tg /tmp/hetsched 128 || echo nan) ;;
            tg-hetsched-f16) # f16 weights (generate --gpu-weights f16)
              [ "$n" = "$first" ] || continue; label=tg128
              tps=$(hetsched_tg /tmp/hetsched 128 --gpu-weights f16 || echo nan) ;;
            tg-hetsched-pf) # the one-dispatch layer with its weight prefetch
              [ "$n" = "$first" ] || continue; label=tg128
              tps=$(HETSCHED_GPU_DECODE_PREFETCH=1 hetsched_tg /tmp/hetsched 128 || echo nan) ;;
            tg-hetsched-l*) # at most N layers a dispatch of the one-dispatch layers
              [ "$n" = "$first" ] || continue; label=tg128
              tps=$(HETSCHED_GPU_DECODE_LAYERS_PER_DISPATCH=${row#tg-hetsched-l} hetsched_tg /tmp/hetsched 128 || echo nan) ;;
            tg-hetsched-g*) # the one-dispatch layer's grid at N workgroups a multiprocessor
              [ "$n" = "$first" ] || continue; label=tg128
              tps=$(HETSCHED_GPU_DECODE_GROUPS_PER_SM=${row#tg-hetsched-g} hetsched_tg /tmp/hetsched 128 || echo nan) ;;
            tg-hetsched-unfused-o) # o a stage of its own after attention (HETSCHED_GPU_UNFUSED_O=1)
              [ "$n" = "$first" ] || continue; label=tg128
              tps=$(HETSCHED_GPU_UNFUSED_O=1 hetsched_tg /tmp/hetsched 128 || echo nan) ;;
            tg-hetsched-n*-unfused-o) # tg-hetsched-nN with o a stage of its own
              [ "$n" = "$first" ] || continue; label=tg128
              spec=${row#tg-hetsched-n}
              tps=$(HETSCHED_GPU_UNFUSED_O=1 hetsched_tg /tmp/hetsched 128 --n "${spec%-unfused-o}" || echo nan) ;;
            tg-hetsched-n*) # N greedy samples decoded together (nNgG: at G workgroups a multiprocessor)
              [ "$n" = "$first" ] || continue; label=tg128
              spec=${row#tg-hetsched-n} groups=
              [[ $spec == *g* ]] && groups=${spec#*g}
              tps=$( [ -n "$groups" ] && export HETSCHED_GPU_DECODE_GROUPS_PER_SM=$groups
                hetsched_tg /tmp/hetsched 128 --n "${spec%%g*}" || echo nan) ;;
            tg-hetsched-s*) # N samples at temperature 0.8 decoded together
              [ "$n" = "$first" ] || continue; label=tg128
              tps=$(hetsched_tg /tmp/hetsched 128 --n "${row#tg-hetsched-s}" --temperature 0.8 --seed 1 || echo nan) ;;
            tgd-hetsched-c*) # decode after the prompt file's first C characters (-okN, -unfused-o: see above)
              [ "$n" = "$first" ] || continue; label=tg128
              spec=${row#tgd-hetsched-c} chars=${spec%%-*}
              head -c "$chars" "$here/prompt.txt" >"/tmp/prompt-$chars.txt"
              tps=$( case $spec in
                  *-ok*) export HETSCHED_GPU_DECODE_O_MAX_KEYS=${spec#*-ok} ;;
                  *-unfused-o) export HETSCHED_GPU_UNFUSED_O=1 ;;
                esac
                hetsched_tg /tmp/hetsched 128 --prompt-file "/tmp/prompt-$chars.txt" || echo nan) ;;
            tg-llama.cpp:*) [ "$n" = "$first" ] || continue; tps=$(llama_tg "${row#tg-llama.cpp:}" 128 || echo nan); label=tg128 ;;
            llama.cpp:*) tps=$(llama_tps "${row#llama.cpp:}" "$n" || echo nan) ;;
            hetsched-f32attn) tps=$(HETSCHED_GPU_F32_ATTENTION=1 hetsched_tps /tmp/hetsched "$n" || echo nan) ;;
            hetsched-f16) tps=$(HETSCHED_GPU_F16_WEIGHTS=1 hetsched_tps /tmp/hetsched "$n" || echo nan) ;;
            hetsched-f32w) tps=$(HETSCHED_GPU_F16_WEIGHTS=0 hetsched_tps /tmp/hetsched "$n" || echo nan) ;;
            hetsched-unfused-o) tps=$(HETSCHED_GPU_UNFUSED_O=1 hetsched_tps /tmp/hetsched "$n" || echo nan) ;;
            hetsched-f16-mb*) # f16 weights, attention split down to N key blocks per range
              tps=$(HETSCHED_GPU_F16_WEIGHTS=1 HETSCHED_GPU_ATTN_MIN_KEY_BLOCKS=${row#hetsched-f16-mb} \
                hetsched_tps /tmp/hetsched "$n" || echo nan) ;;
            *) [ -x "/tmp/$row" ] || continue; tps=$(hetsched_tps "/tmp/$row" "$n" || echo nan) ;;
          esac
          echo "$round $label $row $tps" | tee -a "$results"
        done
      done
    done
  }
  if [ "${3:-}" != llama-only ] && [ "${TRACED:-1}" = 1 ]; then
    # Traced runs: device timestamps per stage and the next-token distribution, f32 and
    # f16 weights (f16 twice, and once with the o GEMM unfused: the atomics' run-to-run
    # spread against the deterministic path).
    for w in 0 1 1b u; do
      HETSCHED_GPU_F16_WEIGHTS=${w:0:1} HETSCHED_GPU_UNFUSED_O=$([ "$w" = u ] && echo 1 || echo 0) \
        /tmp/hetsched run --model /tmp/model.gguf --prompt-file "$here/prompt.txt" --prompt-len 557 \
        --backends gpu --precision f32 --chunk-len 512 --json --trace "/tmp/trace557-f16w$w.json" >"/tmp/run557-f16w$w.json" || true
      python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("run", sys.argv[2], r.get("gpu_weights"), [(t["text"], round(t["prob"], 6)) for t in r["top_tokens"][:5]], r.get("gpu_activations"))' "/tmp/run557-f16w$w.json" "$w" || true
    done
  fi
  if [ "${3:-}" != hetsched-only ]; then
    # Every timed row waits for the build: hetsched's rows lose half their speed while 16
    # cores compile (the host records the command buffers).
    while [ ! -f /tmp/llamacpp/done ]; do sleep 5; done
    echo "llama.cpp build exit $(cat /tmp/llamacpp/done)"
    tail -3 /tmp/llamacpp/build.log
    for q in F16 F32; do
      [ -s "/tmp/model.$q.gguf" ] ||
        "$bin/llama-quantize" --allow-requantize /tmp/model.gguf "/tmp/model.$q.gguf" "$q" >/dev/null 2>&1
    done
  fi
  if [ -n "${ROWS:-}" ]; then
    # shellcheck disable=SC2086
    rows $ROWS
  else
    case "${3:-}" in
      hetsched-only) rows hetsched hetsched-unfused-o hetsched-f32w hetsched-old ;;
      llama-only) rows llama.cpp:F16 llama.cpp:F32 ;;
      *) rows hetsched hetsched-unfused-o hetsched-f32w hetsched-old llama.cpp:F16 llama.cpp:F32 ;;
    esac
  fi
  python3 - "$results" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    _, n, row, tps = line.split()
    rows.setdefault((n, row), []).append(float(tps))
names = sorted({r for _, r in rows}, key=lambda r: ("llama" in r, r))
ours = [r for r in names if "llama" not in r]
print("| prompt | " + " | ".join(names) + " | " + " | ".join(f"{r} / llama.cpp F16" for r in ours) + " |")
print("|---" * (len(names) + len(ours) + 1) + "|")
for n in sorted({n for n, _ in rows}, key=lambda n: (not n.isdigit(), int(n) if n.isdigit() else 0)):
    med = {r: statistics.median(rows[(n, r)]) for r in names if (n, r) in rows}
    cells = [f"{med[r]:,.0f}" if r in med else "-" for r in names]
    f16 = "tg-llama.cpp:F16" if n.startswith("tg") else "llama.cpp:F16"
    ratios = [f"{med[r] / med[f16]:.2f}x" if r in med and f16 in med else "-" for r in ours]
    print(f"| {n} | " + " | ".join(cells + ratios) + " |")
EOF
  ;;
*)
  sed -n 2,39p "$0"
  exit 2
  ;;
esac
