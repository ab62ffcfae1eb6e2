#!/usr/bin/env bash
# The compression kernels on the GPU: their tests against the CPU twins (bf16 and FP8 caches), then
# the batches of the max-load headline (Llama-3.1-8B shape, FP8 KV, pages of 128, `zipage` 512:
# 640 entries scored, 512 kept) timed and profiled kernel by kernel.
#   COMPRESSION_NCU=0  skips the ncu profile (one 56-job batch, after its warm-up: totals / 2)
# Logs to $OUT (default /tmp/origami-gpu); the BENCH and NCU lines are printed last.
set -uo pipefail
source "$(dirname "$0")/lib/gpu_common.sh"
gpu_script_init /tmp/origami-gpu
gpu_device_info "$OUT/build.log"
gpu_build "$BUILD" "$OUT/build.log" cuda_compression_test cuda_compression_fp8_test || exit 1
echo "build rc=$GPU_BUILD_RC (${GPU_BUILD_SECONDS}s) on $GPU_DEVICE"
for t in cuda_compression_test cuda_compression_fp8_test; do
  timeout 300 "$BUILD/tests/$t" ${COMPRESSION_FILTER:+--gtest_filter="$COMPRESSION_FILTER"} >> "$OUT/compression.log" 2>&1
  echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)|^\[compression' "$OUT/compression.log" | tail -6 | tr '\n' ' ')"
done
if [ "${COMPRESSION_NCU:-1}" = 1 ]; then
  ORIGAMI_BENCH_PROFILE=1 timeout 240 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum \
    --csv --print-units base --log-file /tmp/ncu_compression.csv "$BUILD/tests/cuda_compression_fp8_test" \
    --gtest_filter='*TimingAtMaxLoadShape' >> "$OUT/compression_ncu.log" 2>&1
  echo "ncu rc=$?"
  python3 "$ROOT/scripts/lib/ncu_kernel_totals.py" /tmp/ncu_compression.csv "one 56-job batch" 16 2 | tee "$OUT/ncu_totals.log"
fi
grep -E '^BENCH' "$OUT/compression.log"
