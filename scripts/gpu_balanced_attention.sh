#!/usr/bin/env bash
# The balanced FP8 decode attention (AttentionPlan::stream_ctas: one resident wave of CTAs sharing
# the batch's KV tiles evenly) against the streamed kernel's fixed splits, on the GPU machine, in
# one call: the attention tests, the kernel alone (bench/attention_bench.cu, --balanced 0,1),
# per-head pages (ragged_attention_bench --per-head --fp8-only, ORIGAMI_BENCH_BALANCED=0 / 1) and
# the decode step (cuda_decode_bench_test Roofline, Llama-3.1-8B FP8 + FP8 KV, ORIGAMI_BENCH_BALANCED
# 0 / 1 alternating, BA_ROUNDS rounds).
#   BA_TESTS     1: the attention tests first (default 1)
#   BA_KERNEL    1: the kernel bench (default 1); BA_BLOCKS (default "32,256"), BA_BATCHES
#                (default "1,4,16,64,256,472,1024"), BA_CONTEXTS (default "1024,4096")
#   BA_PER_HEAD  1: the per-head bench (default 1); ORIGAMI_BENCH_BATCHES / _CONTEXTS as it takes them
#   BA_STEP      1: the decode step (default 1); BA_STEP_BATCHES (default "1,16,64,256,472"),
#                BA_STEP_CONTEXTS (default 1024), BA_ROUNDS (default 2), ORIGAMI_BENCH_BLOCK (default 32)
# Logs go to $OUT (default /tmp/origami-gpu-balanced); the summary table is printed last.
set -uo pipefail
source "$(dirname "$0")/lib/gpu_common.sh"
gpu_script_init /tmp/origami-gpu-balanced
gpu_device_info "$OUT/device.txt"
declare -A RESULT
targets=()
[ "${BA_TESTS:-1}" = 1 ] && targets+=(attention_paged_test attention_ragged_test engine_cuda_fused_merge_test)
[ "${BA_PER_HEAD:-1}" = 1 ] && targets+=(ragged_attention_bench)
[ "${BA_STEP:-1}" = 1 ] && targets+=(cuda_decode_bench_test)
if [ ${#targets[@]} -gt 0 ]; then
  gpu_build "$BUILD" "$OUT/build.log" "${targets[@]}" || exit 1
  RESULT[build]="rc $GPU_BUILD_RC, ${GPU_BUILD_SECONDS} s"
  [ "$GPU_BUILD_RC" = 0 ] || { grep -E "error" "$OUT/build.log" | head -20; echo "BUILD FAILED" >&2; }
fi
if [ "${BA_KERNEL:-1}" = 1 ]; then
  # The bench builds on its own (nvcc, the kernel's file only), as bench/attention_gpu.sh does.
  nvcc -std=c++20 -O3 -arch=sm_90 -lineinfo -Isrc bench/attention_bench.cu src/backend/cuda/paged_attention.cu src/backend/cuda/programmatic_launch.cpp \
    -o "$BUILD/attention_bench" >> "$OUT/build.log" 2>&1 || echo "attention_bench BUILD FAILED"
fi

if [ "${BA_TESTS:-1}" = 1 ]; then
  for t in attention_paged_test attention_ragged_test engine_cuda_fused_merge_test; do
    timeout 300 "$BUILD/tests/$t" > "$OUT/$t.log" 2>&1
    RESULT[test_$t]="rc $? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/$t.log" | tr '\n' ' ')"
  done
  grep -h "balanced" "$OUT/attention_paged_test.log" "$OUT/attention_ragged_test.log" | sort -t= -k2 -g | tail -3
fi

if [ "${BA_KERNEL:-1}" = 1 ]; then
  timeout 300 "$BUILD/attention_bench" --cache fp8 --rows 16 --blocks "${BA_BLOCKS:-32,256}" \
    --batches "${BA_BATCHES:-1,4,16,64,256,472,1024}" --contexts "${BA_CONTEXTS:-1024,4096}" --balanced 0,1 \
    --no-prefill > "$OUT/attention_bench.log" 2>&1
  RESULT[kernel_bench]="rc $?"
fi

if [ "${BA_PER_HEAD:-1}" = 1 ]; then
  for bal in 0 1; do
    ORIGAMI_BENCH_BALANCED=$bal timeout 300 "$BUILD/ragged_attention_bench" --per-head --fp8-only \
      > "$OUT/per_head_balanced$bal.log" 2>&1
    RESULT[per_head_$bal]="rc $?"
  done
fi

if [ "${BA_STEP:-1}" = 1 ]; then
  export ORIGAMI_CUDA_BENCH=1 ORIGAMI_BENCH_FUSED_QUANTIZE=1 ORIGAMI_BENCH_CONFIG=llama-3.1-8b
  export ORIGAMI_BENCH_QUANTIZATION=fp8 ORIGAMI_BENCH_KV_DTYPE=fp8 ORIGAMI_BENCH_BLOCK=${ORIGAMI_BENCH_BLOCK:-32}
  for round in $(seq 1 "${BA_ROUNDS:-2}"); do
    for bal in 0 1; do
      ORIGAMI_BENCH_BALANCED=$bal ORIGAMI_BENCH_BATCHES=${BA_STEP_BATCHES:-1,16,64,256,472} \
        ORIGAMI_BENCH_CONTEXTS=${BA_STEP_CONTEXTS:-1024} timeout 400 "$BUILD/tests/cuda_decode_bench_test" \
        --gtest_filter='*Roofline*' > "$OUT/step_balanced${bal}_round$round.log" 2>&1
      RESULT[step_${bal}_round$round]="rc $?"
    done
  done
fi

gpu_print_summary "balanced attention" "$OUT/summary.txt"
if [ -f "$OUT/attention_bench.log" ]; then
  echo; echo "kernel alone (attention_bench, FP8, 16 rows): us (% of copy), splits -> balanced"
  python3 - "$OUT/attention_bench.log" <<'PY'
import sys
rows = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 13 and f[0] == "fp8":
        key = (int(f[2]), int(f[3]), int(f[4]))
        rows.setdefault(key, {})[int(f[7]) > 0] = (float(f[9]), f[11])
print("%6s %6s %6s %18s %18s %8s" % ("block", "batch", "ctx", "splits us (copy)", "balanced us (copy)", "speedup"))
for k in sorted(rows):
    r = rows[k]
    if False in r and True in r:
        print("%6d %6d %6d %10.1f (%5s) %10.1f (%5s) %7.3fx" % (k + (r[False][0], r[False][1], r[True][0], r[True][1],
              r[False][0] / r[True][0])))
PY
fi
for f in "$OUT"/per_head_balanced*.log; do
  [ -f "$f" ] && { echo; echo "$(basename "$f"):"; grep -E "^ *(kv|fp8) " "$f" | head -30; }
done
if ls "$OUT"/step_balanced*.log >/dev/null 2>&1; then
  echo; echo "decode step (ms), splits (0) and balanced (1), each round:"
  grep -H "^ROOFLINE" "$OUT"/step_balanced*.log | sed 's|.*/step_||; s|floor.*||' | sort -t= -k3 -n | head -60
fi
