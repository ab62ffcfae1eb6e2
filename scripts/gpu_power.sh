#!/usr/bin/env bash
# What separates the decode bench's step from the max-load run's step at the same batch and mean
# context (docs/benchmarks.md, "Full KV on one H200"): the cache's contents and the run's length,
# both of which bear on the clocks a GPU at its power cap holds. One call: the decode step
# (cuda_decode_bench_test Roofline, CUDA graphs) over a zero cache for 20 steps, over a random cache
# for 20 steps, the same with the contexts spread as a max-load batch's (128 to 2 x context - 128,
# longest first, then shuffled: ORIGAMI_BENCH_SPREAD), then over a random cache for POWER_STEPS
# steps, then, optionally, `origami bench`
# at the same batch (the max-load path, one wave), with nvidia-smi sampling clocks, power and the
# throttle reasons every 500 ms. The table last: each phase's step time and the clocks and power
# it ran at.
#   POWER_BATCH (default 896), POWER_CONTEXT (default 1152), POWER_STEPS (default 1000),
#   POWER_MAXLOAD 1: also the max-load wave, POWER_BATCH prompts of 128 -> 2 x (POWER_CONTEXT - 128)
#                 tokens (mean context POWER_CONTEXT; default 0),
#   ORIGAMI_BENCH_CONFIG (default llama-3.1-8b), FP8 weights + FP8 KV, pages of 32, fast
#   accumulation (as the max-load runs compared with TensorRT-LLM).
# Logs go to $OUT (default /tmp/origami-gpu-power).
set -uo pipefail
source "$(dirname "$0")/lib/gpu_common.sh"
gpu_script_init /tmp/origami-gpu-power
gpu_device_info "$OUT/device.txt"
declare -A RESULT
targets=(cuda_decode_bench_test)
[ "${POWER_MAXLOAD:-0}" = 1 ] && targets+=(origami_cli)
gpu_build "$BUILD" "$OUT/build.log" "${targets[@]}" || exit 1
RESULT[build]="rc $GPU_BUILD_RC, ${GPU_BUILD_SECONDS} s"

B=${POWER_BATCH:-896} C=${POWER_CONTEXT:-1152}
gpu_fp8_bench_env "${ORIGAMI_BENCH_CONFIG:-llama-3.1-8b}"
export ORIGAMI_BENCH_BATCHES=$B ORIGAMI_BENCH_CONTEXTS=$C

gpu_smi_start "$OUT/smi.csv"
: > "$OUT/phases.txt"  # this call's phases only (an OUT used before keeps the last call's)
phase() {  # name, then the command; records its start and end times for the clocks table
  local name=$1; shift
  echo "$name $(date +%s.%N)" >> "$OUT/phases.txt"
  "$@" > "$OUT/$name.log" 2>&1
  RESULT[$name]="rc $? $(grep -h ROOFLINE "$OUT/$name.log" | sed 's/.*context=[0-9]*: //; s/ (weights.*//')"
  echo "end $(date +%s.%N)" >> "$OUT/phases.txt"
}
sleep 2  # an idle sample first
phase zero_kv_20 env ORIGAMI_BENCH_STEPS=20 timeout 200 "$BUILD/tests/cuda_decode_bench_test" --gtest_filter='*Roofline*'
phase random_kv_20 env ORIGAMI_BENCH_RANDOM_KV=1 ORIGAMI_BENCH_STEPS=20 timeout 200 \
  "$BUILD/tests/cuda_decode_bench_test" --gtest_filter='*Roofline*'
phase spread_desc_20 env ORIGAMI_BENCH_RANDOM_KV=1 ORIGAMI_BENCH_STEPS=20 ORIGAMI_BENCH_SPREAD=128 timeout 200 \
  "$BUILD/tests/cuda_decode_bench_test" --gtest_filter='*Roofline*'
phase spread_shuf_20 env ORIGAMI_BENCH_RANDOM_KV=1 ORIGAMI_BENCH_STEPS=20 ORIGAMI_BENCH_SPREAD=128 \
  ORIGAMI_BENCH_SPREAD_ORDER=shuffled timeout 200 "$BUILD/tests/cuda_decode_bench_test" --gtest_filter='*Roofline*'
phase random_kv_long env ORIGAMI_BENCH_RANDOM_KV=1 ORIGAMI_BENCH_STEPS=${POWER_STEPS:-1000} timeout 300 \
  "$BUILD/tests/cuda_decode_bench_test" --gtest_filter='*Roofline*'
if [ "${POWER_MAXLOAD:-0}" = 1 ]; then
  phase maxload bash -c "timeout 300 '$BUILD/origami' bench --model '$SH/configs/$ORIGAMI_BENCH_CONFIG' --dummy-weights \
    --tokenizer '$BENCH_TOKENIZER' --device cuda --num-prompts $B --input-len 128 --output-len $((2 * (C - 128))) \
    --max-num-seqs 2048 --max-num-batched-tokens 8192 --gpu-memory-utilization 0.95 --quantization fp8 \
    --kv-cache-dtype fp8 --query-slots -1 --reserve-full-kv --fp8-fast-accumulation --quiet --json > '$OUT/maxload.json'"
  RESULT[maxload]+=" $(python3 -c "import json, sys; j = json.load(open(sys.argv[1])); print('device %.3f ms/step, while full %.0f tok/s, %d at once' % (j['device_ms_per_step'], j['full_batch_tokens_per_second'], j['peak_running_requests']))" "$OUT/maxload.json" 2>/dev/null)"
fi
kill "$GPU_SMI_PID" 2>/dev/null

gpu_print_summary "power and the decode step (batch $B, context $C)" "$OUT/summary.txt"
echo; echo "clocks and power per phase (nvidia-smi every 500 ms; the phase's samples after its first 2 s):"
python3 "$ROOT/scripts/lib/smi_phases.py" "$OUT/phases.txt" "$OUT/smi.csv"
