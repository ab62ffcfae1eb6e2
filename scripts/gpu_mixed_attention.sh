#!/usr/bin/env bash
# Mixed steps with the decode rows' attention in the decode kernels (MixedAttentionPlan,
# --mixed-decode-attention) against one 64-row launch, on the GPU machine, in one call: the tests
# (each part bit for bit its own batch's, the CPU twin; through the backend against one launch),
# then the step (cuda_decode_bench_test PrefillStep: MIXED_DECODES decode rows at MIXED_CONTEXT
# beside MIXED_TOKENS prompt tokens in prompts of MIXED_PROMPT, Llama-3.1-8B FP8 + FP8 KV, pages of
# 32, fast accumulation; ORIGAMI_BENCH_MIXED 0 / 1 alternating, MIXED_ROUNDS rounds), then
# optionally (MIXED_MAXLOAD=1) max-load 1000 -> 1000 both ways. Tables last.
#   MIXED_TESTS 1 (default) / 0; MIXED_DECODES (default 470: an H100's full batch at 1000 -> 1000;
#   950 on an H200), MIXED_CONTEXT (1500), MIXED_TOKENS (default 8192 - MIXED_DECODES: what the
#   step budget leaves the prompts), MIXED_PROMPT (1000), MIXED_ROUNDS (2);
#   MIXED_MAXLOAD 1: the max-load runs (MAXLOAD_TIMEOUT each, default 240 s; 3000 requests), both
#   ways or the one MIXED_MAXLOAD_FLAGS names (two calls when both do not fit in one).
# Logs go to $OUT (default /tmp/origami-gpu-mixed).
set -uo pipefail
source "$(dirname "$0")/lib/gpu_common.sh"
gpu_script_init /tmp/origami-gpu-mixed
gpu_device_info "$OUT/device.txt"
declare -A RESULT
targets=(cuda_decode_bench_test)
[ "${MIXED_TESTS:-1}" = 1 ] && targets+=(attention_paged_test cuda_mixed_attention_test)
[ "${MIXED_MAXLOAD:-0}" = 1 ] && targets+=(origami_cli)
gpu_build "$BUILD" "$OUT/build.log" "${targets[@]}" || exit 1
RESULT[build]="rc $GPU_BUILD_RC, ${GPU_BUILD_SECONDS} s"

if [ "${MIXED_TESTS:-1}" = 1 ]; then
  for t in attention_paged_test cuda_mixed_attention_test; do
    timeout 300 "$BUILD/tests/$t" > "$OUT/$t.log" 2>&1
    RESULT[test_$t]="rc $? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/$t.log" | tr '\n' ' ')"
  done
  grep -h "\[mixed attention\]" "$OUT/cuda_mixed_attention_test.log"
fi

gpu_fp8_bench_env llama-3.1-8b
export ORIGAMI_BENCH_PREFILL=1
export ORIGAMI_BENCH_PREFILL_DECODES=${MIXED_DECODES:-470} ORIGAMI_BENCH_CONTEXTS=${MIXED_CONTEXT:-1500}
export ORIGAMI_BENCH_PREFILL_TOKENS=${MIXED_TOKENS:-$((8192 - ${MIXED_DECODES:-470}))}
export ORIGAMI_BENCH_PREFILL_PROMPT=${MIXED_PROMPT:-1000}
for round in $(seq 1 "${MIXED_ROUNDS:-2}"); do  # MIXED_ROUNDS 0: no step bench
  for mixed in 0 1; do
    ORIGAMI_BENCH_MIXED=$mixed timeout 300 "$BUILD/tests/cuda_decode_bench_test" --gtest_filter='*PrefillStep' \
      > "$OUT/step_mixed${mixed}_round$round.log" 2>&1
    RESULT[step_${mixed}_round$round]="rc $? $(grep -h '^PREFILL' "$OUT/step_mixed${mixed}_round$round.log" | sed 's/.*: //')"
  done
done
# The decode rows alone, for what the mixed step adds to a decode step of the same rows.
[ "${MIXED_ROUNDS:-2}" != 0 ] && ORIGAMI_BENCH_PREFILL=0 ORIGAMI_BENCH_BATCHES=${MIXED_DECODES:-470} timeout 300 "$BUILD/tests/cuda_decode_bench_test" \
  --gtest_filter='*Roofline*' > "$OUT/decode_alone.log" 2>&1
[ "${MIXED_ROUNDS:-2}" != 0 ] && RESULT[decode_alone]="rc $? $(grep -h '^ROOFLINE' "$OUT/decode_alone.log" | sed 's/.*context=[0-9]*: //; s/ (weights.*//')"

if [ "${MIXED_MAXLOAD:-0}" = 1 ]; then
  for flag in ${MIXED_MAXLOAD_FLAGS:---no-mixed-decode-attention --mixed-decode-attention}; do
    name=mixed1k1k${flag//-/_}
    timeout "${MAXLOAD_TIMEOUT:-240}" "$BUILD/origami" bench --model "$SH/configs/llama-3.1-8b" --dummy-weights \
      --tokenizer "$BENCH_TOKENIZER" --device cuda --num-prompts 3000 --input-len 1000 --output-len 1000 \
      --max-num-seqs 2048 --max-num-batched-tokens 8192 --gpu-memory-utilization 0.95 --quantization fp8 \
      --kv-cache-dtype fp8 --query-slots -1 --reserve-full-kv --fp8-fast-accumulation "$flag" --quiet --json \
      > "$OUT/$name.json" 2> "$OUT/$name.err"
    RESULT[$name]="rc $? $(python3 -c "import json, sys; j = json.load(open(sys.argv[1])); print('%.0f tok/s, %.0f while full, %d done, device %.2f ms/step' % (j['output_tokens_per_second'], j['full_batch_tokens_per_second'], j['completed'], j['device_ms_per_step']))" "$OUT/$name.json" 2>/dev/null)"
  done
fi
gpu_print_summary "mixed-step attention" "$OUT/summary.txt"
