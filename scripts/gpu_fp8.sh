#!/usr/bin/env bash
# FP8 weights and the FP8 KV cache on the GPU machine: builds the FP8 tests and benchmarks (CUDA
# backend), runs
#   cuda_kv_fp8_write_test   the FP8 KV write kernel = the CPU emulation, bit for bit
#   attention_paged_test     paged attention over bf16 and FP8 caches against an fp64 twin
#   cuda_fp8_test            quantize kernel = host, FP8 GEMM vs CPU reference, engine FP8 = CPU FP8
#                            (weights, KV cache, both)
#   cuda_fp8_fused_quantize_test  the quantization fused into the norms / SiLU = unfused, bit for
#                            bit (kernels; tiny-qwen3 logits with --fp8-fused-quantize on and off)
#   cuda_fp8_gemv_test       the FP8 GEMV of decode's 1-4 rows (--fp8-gemv-rows) and the few-row
#                            tensor-core GEMM (1-16 rows, BackendOptions::fp8_small_gemm_rows) against an
#                            fp64 reference
#   cuda_backend_e2e_test    the bf16 path, unchanged
#   cuda_fp8_gemm_bench_test bf16 vs FP8 GEMM time at the Llama-3.1-8B shapes, m = 1/64/256/1024, and
#                            the GEMV and the small GEMM against cuBLASLt at m = 1-16 (FP8GEMV lines),
#                            the SiLU + quantize and the add + RMSNorm + quantize kernels against
#                            their bytes' floor (FUSEDQ lines);
#                            FP8_ALGO_SEARCH=1: every cuBLASLt FP8 algorithm, tile and split-K against
#                            the heuristic's pick at m = FP8_ALGO_ROWS (default 16,64,128,256,512;
#                            FP8ALGO lines)
#   (FP8_SPLITK=1, default)  cuda_fp8_gemm_bench_test's SplitKAtDecodeRows: split-K 1-4 ways against
#                            the unsplit GEMM at 8-512 rows (FP8SPLIT lines; layer lines in the summary)
#   (FP8_OVERLAP=1)          overlap_bench: attention of one half of a max-load batch beside the
#                            projections of the other on two streams, against both on one stream
#   (FP8_TESTS=0 skips the tests, for benchmark-only calls)
#   cuda_decode_bench_test   decode steps of Llama-3.1-8B (dummy weights), bf16 and FP8, batch
#                            1/64/256 at context 1024, bf16 / FP8 weights / FP8 weights + FP8 KV,
#                            FP8 with the quantization separate and fused ("fused-q"), and FP8 +
#                            FP8 KV with the GEMV (decode_gemv: batches 1 and 2, where it is the default;
#                            the rows above run with ORIGAMI_BENCH_FP8_GEMV=0, cuBLASLt alone), and
#                            batches 4/8/16 without and with the small GEMM (decode_small0 / _small16)
#                            (FP8_DECODE=0 skips it)
# and prints a summary table last (about 75 s on an H100 with a cold build). Logs go to $OUT (or
# /tmp/origami-gpu). Fixtures come from .devdata (scripts/lib/gpu_common.sh): shared/ with
# configs, golden, data/wikitext2_test_dev.txt and models/{origami-tiny-qwen3,stories260k}, and,
# where the machine lacks them, CLI11 (include/) and GoogleTest + nlohmann-json (prefix/).
set -uo pipefail
source "$(dirname "$0")/lib/gpu_common.sh"
gpu_script_init /tmp/origami-gpu
declare -A RESULT
gpu_device_info "$OUT/build.log"
RESULT[0_device]="$GPU_DEVICE"

targets=(cuda_fp8_test cuda_fp8_fused_quantize_test cuda_fp8_gemv_test cuda_kv_fp8_write_test attention_paged_test cuda_fp8_gemm_bench_test
         cuda_backend_e2e_test)
[ "${FP8_DECODE:-1}" = 1 ] && targets+=(cuda_decode_bench_test)
[ "${FP8_OVERLAP:-0}" = 1 ] && targets+=(overlap_bench)
gpu_build "$BUILD" "$OUT/build.log" "${targets[@]}" || exit 1
RESULT[1_build]="rc=$GPU_BUILD_RC (${GPU_BUILD_SECONDS}s)"
grep -E "error|FAILED" "$OUT/build.log" | head -20

if [ "${FP8_TESTS:-1}" = 1 ]; then
for t in cuda_kv_fp8_write_test attention_paged_test cuda_fp8_fused_quantize_test cuda_fp8_gemv_test; do
  t0=$(date +%s)
  OMP_NUM_THREADS=16 timeout 300 "$BUILD/tests/$t" > "$OUT/$t.log" 2>&1
  RESULT[2_$t]="rc=$? ($(( $(date +%s) - t0 ))s) $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$t.log" | tr '\n' ' ')"
  grep -E "Failure|FAILED|Expected|Which is|fp8 " "$OUT/$t.log" | head -30
done

t0=$(date +%s)
OMP_NUM_THREADS=16 timeout 300 "$BUILD/tests/cuda_fp8_test" > "$OUT/fp8_test.log" 2>&1
RESULT[2_cuda_fp8_test]="rc=$? ($(( $(date +%s) - t0 ))s) $(grep -E '^\[  (PASSED|FAILED)' "$OUT/fp8_test.log" | tr '\n' ' ')"
grep -E "Failure|FAILED|Expected|Which is|^\[fp8|^\[tiny|error" "$OUT/fp8_test.log" | head -60

t0=$(date +%s)
OMP_NUM_THREADS=16 timeout 200 "$BUILD/tests/cuda_backend_e2e_test" > "$OUT/e2e.log" 2>&1
RESULT[3_cuda_e2e_bf16]="rc=$? ($(( $(date +%s) - t0 ))s) $(grep -E '^\[  (PASSED|FAILED)' "$OUT/e2e.log" | tr '\n' ' ')"
grep -E "Failure|FAILED" "$OUT/e2e.log" | head -10
fi  # FP8_TESTS

if [ "${FP8_OVERLAP:-0}" = 1 ]; then
  # Attention beside the projections on two streams, two halves of the batch (OVERLAP lines).
  t0=$(date +%s)
  timeout 240 "$BUILD/overlap_bench" --batches "${FP8_OVERLAP_BATCHES:-512,1024}" \
    --contexts "${FP8_OVERLAP_CONTEXTS:-640,1024}" > "$OUT/overlap.log" 2>&1
  RESULT[4_overlap]="rc=$? ($(( $(date +%s) - t0 ))s)"
  n=0
  while read -r line; do n=$((n+1)); RESULT[4_overlap_$n]="$line"; done < <(grep "^OVERLAP" "$OUT/overlap.log" \
    | cut -c1-150)
fi

[ "${FP8_GEMM_BENCH:-1}" = 1 ] && {
t0=$(date +%s)
ORIGAMI_CUDA_BENCH=1 timeout 200 "$BUILD/tests/cuda_fp8_gemm_bench_test" --gtest_filter='-*AlgorithmSearch*:*SplitK*:*GraphBuckets*' \
  > "$OUT/gemm_bench.log" 2>&1
RESULT[4_gemm_bench]="rc=$? ($(( $(date +%s) - t0 ))s)"
grep -E "FP8BENCH|FP8GEMV|FUSEDQ" "$OUT/gemm_bench.log"
n=0
while read -r line; do n=$((n+1)); RESULT[4_gemm_layer_$n]="$line"; done < <(grep "FP8BENCH layer" "$OUT/gemm_bench.log")
n=0
while read -r line; do n=$((n+1)); RESULT[4_gemv_layer_$n]="$line"; done < <(grep "FP8GEMV layer" "$OUT/gemm_bench.log")
n=0
while read -r line; do n=$((n+1)); RESULT[4_fusedq_$n]="$line"; done < <(grep -E "FUSEDQ (silu|add)" "$OUT/gemm_bench.log")
}  # FP8_GEMM_BENCH
if [ "${FP8_ALGO_SEARCH:-0}" = 1 ]; then
  # Every cuBLASLt FP8 algorithm, tile and split-K against the heuristic's choice (FP8ALGO lines).
  t0=$(date +%s)
  ORIGAMI_CUDA_BENCH=1 ORIGAMI_BENCH_ALGO_ROWS=${FP8_ALGO_ROWS:-16,64,128,256,512} timeout "${FP8_ALGO_TIMEOUT:-240}" \
    "$BUILD/tests/cuda_fp8_gemm_bench_test" --gtest_filter='*AlgorithmSearch*' > "$OUT/algo_search.log" 2>&1
  RESULT[4_algo_search]="rc=$? ($(( $(date +%s) - t0 ))s)"
  grep FP8ALGO "$OUT/algo_search.log"
  n=0
  while read -r line; do n=$((n+1)); RESULT[4_algo_$n]="$line"; done < <(grep "FP8ALGO" "$OUT/algo_search.log" | cut -c1-200)
fi

if [ "${FP8_SPLITK:-1}" = 1 ]; then
  # Split-K against the unsplit GEMM at decode's rows, every projection of Llama-3.1-8B and
  # Qwen3-8B at TP = 1 and 2, both accumulations (FP8SPLIT lines), and the bf16 projections of
  # Qwen3-8B at TP = 1 and 2 (BF16SPLIT lines); the layer lines in the summary.
  t0=$(date +%s)
  ORIGAMI_CUDA_BENCH=1 timeout "${FP8_SPLITK_TIMEOUT:-300}" "$BUILD/tests/cuda_fp8_gemm_bench_test" \
    --gtest_filter="${FP8_SPLITK_FILTER:-*SplitK*:*GraphBuckets*}" > "$OUT/split_k.log" 2>&1
  RESULT[4_split_k]="rc=$? ($(( $(date +%s) - t0 ))s)"
  grep -E "FP8SPLIT|FP8BUCKET" "$OUT/split_k.log" | grep -v " layer "
  n=0
  while read -r line; do n=$((n+1)); RESULT[4_split_k_$(printf %03d $n)]="$line"; done < <(grep -E "(FP8|BF16)SPLIT.* layer |FP8BUCKET" \
    "$OUT/split_k.log" | sed -E 's/^FP8SPLIT //')
fi

if [ "${FP8_DECODE:-1}" = 1 ]; then
  for q in none fp8 fp8+kv; do
    t0=$(date +%s)
    kv=bf16; [ "$q" = fp8+kv ] && kv=fp8
    ORIGAMI_CUDA_BENCH=1 ORIGAMI_BENCH_CONFIG=llama-3.1-8b ORIGAMI_BENCH_QUANTIZATION=${q%+kv} ORIGAMI_BENCH_KV_DTYPE=$kv \
      ORIGAMI_BENCH_FP8_GEMV=0 \
      ORIGAMI_BENCH_CONTEXTS=${FP8_CONTEXTS:-1024} \
      ORIGAMI_BENCH_BATCHES=${FP8_BATCHES:-1,64,256} timeout 300 "$BUILD/tests/cuda_decode_bench_test" \
      --gtest_filter='*Roofline*' > "$OUT/decode_$q.log" 2>&1
    RESULT[5_decode_$q]="rc=$? ($(( $(date +%s) - t0 ))s)"
    grep -E "^(BENCH|ROOFLINE)" "$OUT/decode_$q.log"
    n=0
    while read -r line; do n=$((n+1)); RESULT[5_decode_${q}_$n]="$line"; done < <(grep ROOFLINE "$OUT/decode_$q.log" \
      | sed -E 's/^ROOFLINE llama-3.1-8b( fp8)?( fused-q)?( kv-fp8)? graphs=1 /\2 /; s/ \(weights.*\)//')
  done
  # The GEMV (the default at 1-2 rows; the rows above without it): batches 1 and 2 with FP8
  # weights + FP8 KV, fused quantization.
  t0=$(date +%s)
  ORIGAMI_CUDA_BENCH=1 ORIGAMI_BENCH_CONFIG=llama-3.1-8b ORIGAMI_BENCH_QUANTIZATION=fp8 ORIGAMI_BENCH_KV_DTYPE=fp8 \
    ORIGAMI_BENCH_FUSED_QUANTIZE=1 ORIGAMI_BENCH_FP8_GEMV=2 ORIGAMI_BENCH_CONTEXTS=${FP8_CONTEXTS:-1024} \
    ORIGAMI_BENCH_BATCHES=1,2 timeout 200 "$BUILD/tests/cuda_decode_bench_test" --gtest_filter='*Roofline*' \
    > "$OUT/decode_gemv.log" 2>&1
  RESULT[5_decode_gemv]="rc=$? ($(( $(date +%s) - t0 ))s)"
  n=0
  while read -r line; do n=$((n+1)); RESULT[5_decode_gemv_$n]="$line"; done < <(grep ROOFLINE "$OUT/decode_gemv.log" \
    | sed -E 's/ \(weights.*\)//')
  # One FP8 weights + FP8 KV decode run (Llama-3.1-8B, fused quantization, context FP8_CONTEXTS)
  # per value of the bench variable $2 at batches $3: logs decode_$1<value>.log, summary rows
  # 5_decode_$1<value>_<n>.
  fp8_decode_variants() {
    local name=$1 var=$2 batches=$3 value n t0
    shift 3
    for value in "$@"; do
      t0=$(date +%s)
      env ORIGAMI_CUDA_BENCH=1 ORIGAMI_BENCH_CONFIG=llama-3.1-8b ORIGAMI_BENCH_QUANTIZATION=fp8 ORIGAMI_BENCH_KV_DTYPE=fp8 \
        ORIGAMI_BENCH_FUSED_QUANTIZE=1 "$var=$value" ORIGAMI_BENCH_CONTEXTS="${FP8_CONTEXTS:-1024}" \
        ORIGAMI_BENCH_BATCHES="$batches" timeout 200 "$BUILD/tests/cuda_decode_bench_test" --gtest_filter='*Roofline*' \
        > "$OUT/decode_$name$value.log" 2>&1
      RESULT[5_decode_$name$value]="rc=$? ($(( $(date +%s) - t0 ))s)"
      n=0
      while read -r line; do n=$((n+1)); RESULT[5_decode_$name${value}_$n]="$line"; done < <(grep ROOFLINE \
        "$OUT/decode_$name$value.log" | sed -E 's/ \(weights.*\)//; s/^ROOFLINE llama-3.1-8b //')
    done
  }
  # Split-K (on by default, Fp8Gemm::split_k_rule) against none, at the batches where the rule
  # splits (FP8_SPLITK_BATCHES).
  fp8_decode_variants splitk ORIGAMI_BENCH_FP8_SPLIT_K "${FP8_SPLITK_BATCHES:-16,64,128,192,256}" 0 1
  # Graph buckets the FP8 GEMMs are slower at (448; 160-224 and 320 without fast accumulation)
  # served by the next larger one (the default) against all buckets, at batches that fall in them.
  [ "${FP8_BUCKET_DECODE:-1}" = 1 ] &&
    fp8_decode_variants buckets ORIGAMI_BENCH_FP8_BUCKETS "${FP8_BUCKET_BATCHES:-300,320,420,448}" 0 1
  # The few-row tensor-core GEMM (off by default: slower on the H100): batches 4, 8 and 16 without
  # it (cuBLASLt) and with it.
  [ "${FP8_SMALL_DECODE:-1}" = 1 ] && fp8_decode_variants small ORIGAMI_BENCH_FP8_SMALL_GEMM 4,8,16 0 16
fi
gpu_print_summary "FP8 summary" "$OUT/summary.txt"
