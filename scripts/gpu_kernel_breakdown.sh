#!/usr/bin/env bash
# Where a decode step's GPU time goes, kernel by kernel (on the GPU machine): ncu times every kernel
# of the steps cuda_decode_bench_test's Roofline runs at each (batch, context), one kernel at a
# time, and scripts/ncu_kernel_table.py prints a row per kernel name: launches, total, per launch,
# share and per layer. The caches are not flushed between kernels and the clocks not locked
# (--cache-control none --clock-control none): with ncu's defaults a kernel that reads what the one
# before it just wrote reads it from DRAM, and decode's small kernels measured 30-60% slower that
# way. The kernels still run one by one, so their sum exceeds the graph's step by what programmatic
# launch overlaps (docs/benchmarks.md, "Decode at 1-64 sequences").
#   KB_SHAPES   "batch:context ..." (default "1:1024 64:1024")
#   KB_SKIP     kernels skipped first: warm-up and graph capture (default 3000)
#   KB_COUNT    kernels profiled after them (default 700: a few steps of a 32-layer model)
#   KB_LAYERS   layers the profiled kernels span, for a column of us per layer (default 0: none)
#   ORIGAMI_BENCH_CONFIG / _QUANTIZATION / _KV_DTYPE / _BLOCK / _FUSED_QUANTIZE as the bench takes them
#               (defaults llama-3.1-8b, fp8, fp8, the bench's pages, fused)
# Logs and each shape's CSV go to $OUT (default /tmp/origami-gpu-kernels); the tables are printed last.
set -uo pipefail
source "$(dirname "$0")/lib/gpu_common.sh"
gpu_script_init /tmp/origami-gpu-kernels
command -v ncu >/dev/null || { echo "gpu_kernel_breakdown: ncu not found" >&2; exit 2; }
gpu_device_info "$OUT/build.log"
gpu_build "$BUILD" "$OUT/build.log" cuda_decode_bench_test || exit 1
[ "$GPU_BUILD_RC" = 0 ] || { tail -30 "$OUT/build.log"; echo "BUILD FAILED" >&2; exit 1; }
export ORIGAMI_CUDA_BENCH=1 ORIGAMI_BENCH_CONFIG=${ORIGAMI_BENCH_CONFIG:-llama-3.1-8b}
export ORIGAMI_BENCH_QUANTIZATION=${ORIGAMI_BENCH_QUANTIZATION:-fp8} ORIGAMI_BENCH_KV_DTYPE=${ORIGAMI_BENCH_KV_DTYPE:-fp8}
export ORIGAMI_BENCH_FUSED_QUANTIZE=${ORIGAMI_BENCH_FUSED_QUANTIZE:-1}
layers=()
[ "${KB_LAYERS:-0}" -gt 0 ] && layers=(--layers "$KB_LAYERS")
tables=()
KB_SHAPES=${KB_SHAPES:-"1:1024 64:1024"}
for bc in $KB_SHAPES; do
  b=${bc%:*} c=${bc#*:}
  csv="$OUT/kernels_b${b}_c${c}.csv"
  ORIGAMI_BENCH_BATCHES=$b ORIGAMI_BENCH_CONTEXTS=$c timeout 400 ncu --cache-control none --clock-control none \
    --metrics gpu__time_duration.sum --launch-skip "${KB_SKIP:-3000}" --launch-count "${KB_COUNT:-700}" --csv \
    --print-units base "$BUILD/tests/cuda_decode_bench_test" --gtest_filter='*Roofline*' > "$csv" 2> "$OUT/ncu_b${b}_c${c}.err"
  grep '^ROOFLINE' "$csv" | head -1
  tables+=("$(echo "batch $b x context $c ($ORIGAMI_BENCH_CONFIG, $ORIGAMI_BENCH_QUANTIZATION weights, $ORIGAMI_BENCH_KV_DTYPE KV):"
             python3 "$ROOT/scripts/ncu_kernel_table.py" "$csv" "${layers[@]}" 2>&1)")
done
echo
printf '%s\n\n' "${tables[@]}"
