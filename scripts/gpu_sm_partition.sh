#!/usr/bin/env bash
# Whether splitting the SMs lets a max-load decode step overlap its attention with its GEMMs, on
# the GPU machine, in one call: cuda_sm_partition_test (a stream's kernels stay on its set of SMs),
# then overlap_bench at the max-load shapes with the attention on PART_ATTN_SMS SMs and the FP8
# projections on the rest, against the same work unsplit (serial, and two ordinary streams).
#   PART_BATCHES (448,896), PART_CONTEXTS (1152,2176), PART_BLOCK (32: pages as max load runs),
#   PART_ATTN_SMS (66,80,96,112 of an H100's or H200's 132).
# Logs go to $OUT (default /tmp/origami-gpu-sm-partition); the table last.
set -uo pipefail
source "$(dirname "$0")/lib/gpu_common.sh"
gpu_script_init /tmp/origami-gpu-sm-partition
gpu_device_info "$OUT/device.txt"
declare -A RESULT
gpu_build "$BUILD" "$OUT/build.log" cuda_sm_partition_test overlap_bench || exit 1
RESULT[build]="rc $GPU_BUILD_RC, ${GPU_BUILD_SECONDS} s"
timeout 120 "$BUILD/tests/cuda_sm_partition_test" > "$OUT/cuda_sm_partition_test.log" 2>&1
RESULT[test]="rc $? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/cuda_sm_partition_test.log" | tr '\n' ' ')"
timeout 400 "$BUILD/overlap_bench" --block "${PART_BLOCK:-32}" --batches "${PART_BATCHES:-448,896}" \
  --contexts "${PART_CONTEXTS:-1152,2176}" --attn-sms "${PART_ATTN_SMS:-66,80,96,112}" > "$OUT/overlap_bench.log" 2>&1
RESULT[overlap_bench]="rc $?"
grep -E "^OVERLAP" "$OUT/overlap_bench.log"
gpu_print_summary "SM partition" "$OUT/summary.txt"
