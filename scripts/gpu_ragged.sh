#!/usr/bin/env bash
# Head groups (ragged paging) on the GPU machine: builds the CUDA backend's ragged-paging tests and
# benchmark, runs them (kernel test, CUDA-vs-CPU engine test), then the ragged decode-attention
# benchmark (bench/ragged_attention_bench.cu); with `all`, every GPU test too (ctest -L gpu).
# Logs go to $OUT (or /tmp/origami-gpu). BUILD (default build-gpu) may point outside the tree.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source scripts/lib/gpu_common.sh
OUT=${OUT:-/tmp/origami-gpu}
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
gpu_shared_dir
gpu_device_info "$OUT/build.log"
targets=(attention_ragged_test engine_cuda_head_groups_test ragged_attention_bench)
# all: every GPU test (tests/gpu/*_test.cpp) too, and the existing decode benchmark.
[ "${1:-}" = all ] && targets+=($(basename -s .cpp tests/gpu/*_test.cpp) cuda_decode_bench_test)
gpu_build "$BUILD" "$OUT/build.log" "${targets[@]}" || exit 1
echo "build rc=$GPU_BUILD_RC (${GPU_BUILD_SECONDS}s)"; grep -E "error" "$OUT/build.log" | head -20
OMP_NUM_THREADS=16 timeout 120 "$BUILD/tests/attention_ragged_test" > "$OUT/ragged_kernels.log" 2>&1
echo "attention_ragged_test rc=$?"; grep -E "^\[ *(OK|FAILED|PASSED)|Failure|Expected|Which is|rel_err" "$OUT/ragged_kernels.log" | head -60
timeout 300 "$BUILD/tests/engine_cuda_head_groups_test" > "$OUT/ragged_engine.log" 2>&1
echo "engine_cuda_head_groups_test rc=$?"; grep -E "^\[ *(OK|FAILED|PASSED)|Failure|Expected|Which is|head groups\]" "$OUT/ragged_engine.log" | head -40
timeout 200 "$BUILD/ragged_attention_bench" > "$OUT/ragged_bench.log" 2>&1
echo "ragged_attention_bench rc=$?"; cat "$OUT/ragged_bench.log"
if [ "${1:-}" = all ]; then
  (cd "$BUILD" && OMP_NUM_THREADS=16 timeout 360 ctest -L gpu --output-on-failure --timeout 300 -j2) > "$OUT/ctest_gpu.log" 2>&1
  echo "ctest -L gpu rc=$?"; grep -E "tests passed|Failed|\*\*\*" "$OUT/ctest_gpu.log" | head -30
fi
