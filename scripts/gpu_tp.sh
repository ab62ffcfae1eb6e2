#!/usr/bin/env bash
# Tensor parallelism on a multi-GPU machine: builds the CUDA backend, runs the NCCL and
# tensor-parallel GPU tests (the layer-by-layer trace against the CPU's fp32 forward included),
# times one peer all-reduce pushed and pulled (PEERREDUCE lines) and the decode step at TP = 1 /
# TP = 2 with NCCL / with the peer all-reduce / without reductions (TPSTEP lines), then `origami bench` at TP = 1 and TP = 2 (peer and NCCL all-reduce)
# on the Qwen3-8B shape (dummy weights, 256 x (128 -> 1024)) in the same run. TP_32B=1: the tests,
# then the Qwen3-32B shape at TP = 2, 256 x (128 -> 4096): full KV, zipage 1024 and Fast KVzip
# 1024 (TP_32B_RUNS picks some; TP_8B_RUNS the 8B runs). TP_SKIP_TESTS=1 skips the tests; TP_SKIP_BENCH=1 the `origami
# bench` runs. TP_BREAKDOWN=1 also times the step's parts (GEMMs, attention, rest:
# RooflineAndBreakdown) of the whole model and of one rank's share of it run alone on one GPU
# (heads, KV heads, MLP width and vocabulary / 2), so that TP = 2's step minus the rank's is what
# the splitting costs (reductions, logits, host). ORIGAMI_BENCH_QUANTIZATION=fp8 and
# ORIGAMI_BENCH_KV_DTYPE=fp8 in the environment time the TPSTEP lines with FP8 weights / KV.
# Logs under $OUT (or /tmp/origami-gpu-tp); the
# summary table
# comes last (summary.txt).
#   OUT=... BUILD=/tmp/build-gpu scripts/gpu_tp.sh
set -uo pipefail
source "$(dirname "$0")/lib/gpu_common.sh"
gpu_script_init /tmp/origami-gpu-tp
declare -A RESULT
gpu_device_info "$OUT/build.log"
RESULT[0_device]="$(nvidia-smi -L | wc -l) x $GPU_DEVICE"
RESULT[0_nccl]="$(ls /usr/lib/x86_64-linux-gnu/libnccl.so* 2>/dev/null | head -1)"

gpu_cmake_args
t0=$(date +%s)
cmake -S . -B "$BUILD" "${GPU_CMAKE_GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DORIGAMI_CUDA=ON -DORIGAMI_CUDA_ARCH=90 \
  -DORIGAMI_SHARED_DIR="$SH" "${GPU_CMAKE_EXTRA[@]}" >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
cmake --build "$BUILD" -j16 --target origami_cli engine_tensor_parallel_test tensor_parallel_trace_test cuda_nccl_test \
  cuda_peer_all_reduce_test engine_cuda_kv_memory_test cuda_decode_bench_test ${TP_EXTRA_TARGETS:-} \
  >> "$OUT/build.log" 2>&1
RESULT[1_build]="rc=$? ($(( $(date +%s) - t0 ))s)"
grep -E "error" "$OUT/build.log" | head -20

if [ "${TP_SKIP_TESTS:-0}" != 1 ]; then
  for t in cuda_nccl_test cuda_peer_all_reduce_test tensor_parallel_trace_test engine_tensor_parallel_test \
           engine_cuda_kv_memory_test; do
    t0=$(date +%s)
    timeout 300 "$BUILD/tests/$t" > "$OUT/$t.log" 2>&1
    RESULT["2_$t"]="rc=$? ($(( $(date +%s) - t0 ))s) $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$OUT/$t.log" | tr '\n' ' ')"
    grep -E "Failure|Expected|Which is|\[nccl\]|\[tp|FAILED" "$OUT/$t.log" | head -60
  done
fi
if [ "${TP_32B:-0}" != 1 ]; then
  # One reduction's time pushed and pulled at decode's row counts (PEERREDUCE lines).
  ORIGAMI_CUDA_BENCH=1 ORIGAMI_BENCH_CONFIG=qwen3-8b timeout 120 "$BUILD/tests/cuda_peer_all_reduce_test" \
    --gtest_filter='*Bench*' > "$OUT/peer_reduce_bench.log" 2>&1
  grep PEERREDUCE "$OUT/peer_reduce_bench.log"
  i=0
  while read -r line; do RESULT["2_peer_reduce_$i"]="$line"; i=$((i + 1)); done \
    < <(grep PEERREDUCE "$OUT/peer_reduce_bench.log" | cut -c1-260)
  ORIGAMI_CUDA_BENCH=1 ORIGAMI_BENCH_CONFIG=qwen3-8b ORIGAMI_BENCH_BATCHES=${TP_STEP_BATCHES:-1,64,256} \
    ORIGAMI_BENCH_CONTEXTS=1024 timeout 300 "$BUILD/tests/cuda_decode_bench_test" --gtest_filter='*TensorParallelStep*' \
    > "$OUT/tp_step.log" 2>&1
  rc=$?
  RESULT[2_tp_step]="rc=$rc"
  [ $rc = 0 ] || tail -15 "$OUT/tp_step.log"
  grep TPSTEP "$OUT/tp_step.log"
  i=0
  while read -r line; do RESULT["2_tp_step_$i"]="$line"; i=$((i + 1)); done < <(grep TPSTEP "$OUT/tp_step.log" | cut -c1-260)
fi

if [ "${TP_BREAKDOWN:-0}" = 1 ]; then
  python3 - "$SH/configs/qwen3-8b/config.json" "$SH/configs/qwen3-8b-tp2-rank" <<'PY'
import json, os, sys
c = json.load(open(sys.argv[1]))
for k in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
    c[k] //= 2
c["vocab_size"] = (c["vocab_size"] + 1) // 2
for k in ("bos_token_id", "eos_token_id"):
    c.pop(k, None)
os.makedirs(sys.argv[2], exist_ok=True)
json.dump(c, open(sys.argv[2] + "/config.json", "w"), indent=1)
PY
  for cfg in qwen3-8b qwen3-8b-tp2-rank; do
    ORIGAMI_CUDA_BENCH=1 ORIGAMI_BENCH_CONFIG=$cfg ORIGAMI_BENCH_BATCHES=${TP_STEP_BATCHES:-1,64,256} \
      ORIGAMI_BENCH_CONTEXTS=1024 timeout 300 "$BUILD/tests/cuda_decode_bench_test" --gtest_filter='*RooflineAndBreakdown*' \
      > "$OUT/breakdown_$cfg.log" 2>&1
    grep -E "BREAKDOWN|ROOFLINE" "$OUT/breakdown_$cfg.log" | sed "s/^/$cfg /"
    i=0
    while read -r line; do RESULT["2_breakdown_${cfg}_$i"]="$line"; i=$((i + 1)); done \
      < <(grep BREAKDOWN "$OUT/breakdown_$cfg.log" | cut -c1-260)
  done
fi

bench() {  # name, then bench flags
  local name=$1; shift
  t0=$(date +%s)
  timeout 420 "$BUILD/origami" bench --dummy-weights --tokenizer "$BENCH_TOKENIZER" --device cuda --quiet --json \
    --max-num-seqs 512 --max-num-batched-tokens 8192 "$@" > "$OUT/bench_$name.json" 2> "$OUT/bench_$name.err"
  local rc=$?
  RESULT["3_bench_$name"]="rc=$rc ($(( $(date +%s) - t0 ))s) $(gpu_bench_summary "$OUT/bench_$name.json")"
  tail -3 "$OUT/bench_$name.err"
}
W8="--model $SH/configs/qwen3-8b --num-prompts 256 --input-len 128 --output-len 1024"
if [ "${TP_SKIP_BENCH:-0}" = 1 ]; then
  :
elif [ "${TP_32B:-0}" != 1 ]; then
  # TP_8B_RUNS: which of tp1, tp2_peer, tp2_nccl (default all); tp1_fp8 / tp2_fp8: FP8 weights +
  # FP8 KV cache; each runs with asynchronous scheduling (the CUDA default): tp1_sync / tp2_peer_sync
  # run one step at a time (--no-async-scheduling)
  for run in ${TP_8B_RUNS:-tp1 tp2_peer tp2_nccl}; do
    case $run in
      # shellcheck disable=SC2086
      tp1) bench 8b_tp1 $W8 --tensor-parallel-size 1 ;;
      # shellcheck disable=SC2086
      tp2_peer) bench 8b_tp2_peer $W8 --tensor-parallel-size 2 ;;
      # shellcheck disable=SC2086
      tp2_nccl) bench 8b_tp2_nccl $W8 --tensor-parallel-size 2 --disable-custom-all-reduce ;;
      # shellcheck disable=SC2086
      tp1_fp8) bench 8b_tp1_fp8 $W8 --tensor-parallel-size 1 --quantization fp8 --kv-cache-dtype fp8 ;;
      # shellcheck disable=SC2086
      tp2_fp8) bench 8b_tp2_fp8 $W8 --tensor-parallel-size 2 --quantization fp8 --kv-cache-dtype fp8 ;;
      # shellcheck disable=SC2086
      tp1_sync) bench 8b_tp1_sync $W8 --tensor-parallel-size 1 --no-async-scheduling ;;
      # shellcheck disable=SC2086
      tp2_peer_sync) bench 8b_tp2_peer_sync $W8 --tensor-parallel-size 2 --no-async-scheduling ;;
    esac
  done
else
  W32="--model $SH/configs/qwen3-32b --num-prompts 256 --input-len 128 --output-len 4096 --block-size 256"
  # TP_32B_RUNS: which of full, zipage, fastkvzip (default all; fastkvzip: the default global
  # threshold on head groups of one head per rank, random gates; TP_FASTKVZIP_OPTS adds flags).
  for run in ${TP_32B_RUNS:-full zipage fastkvzip}; do
    case $run in
      # shellcheck disable=SC2086
      full) bench 32b_tp2_full $W32 --tensor-parallel-size 2 --query-slots -1 ;;
      # shellcheck disable=SC2086
      zipage) bench 32b_tp2_zipage $W32 --tensor-parallel-size 2 --kv-policy zipage --kv-budget 1024 ;;
      # shellcheck disable=SC2086
      fastkvzip) bench 32b_tp2_fastkvzip $W32 --tensor-parallel-size 2 --kv-policy fastkvzip --kv-budget 1024 \
        --kv-gates random ${TP_FASTKVZIP_OPTS:-} ;;
    esac
  done
fi
gpu_print_summary "tensor parallel" "$OUT/summary.txt"
# One archive of the logs (the device returns a bounded number of files).
tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude logs.tgz . 2>/dev/null
