#!/bin/bash
# Builds attention_bench once per kernel variant (in parallel) and times each on the decode shapes
# of the FP8 work (batch 64/256/1024 x context 640/1024/4096, page 16 and 256, the decode kernel),
# optionally builds and runs attention_paged_test and profiles the max-load shape with ncu.
# Device machine only; logs in $OUT.
#   bench/fp8_attention_variants.sh "name|nvcc flags|bench flags" ...
# A variant whose flags hold -Iorig builds the kernel from orig/ (a copy of another revision of
# paged_attention.cu, next to this tree's header): before/after runs in one call.
#   env: TEST=1 (attention_paged_test, attention_ragged_test), BF16="name ..." (also the bf16
#   cache), NCU="name:items ..." (ncu of the max-load shape), RAGGED="name ..." (ragged_attention_bench
#   --per-head --fp8-only built like the variant), CMAKE_TESTS="target ..." (built by cmake in the
#   background from the start, run at the end; needs .devdata/{include,prefix,shared} carried).
set -u
OUT=${OUT:-/tmp}
B=/tmp/fa && mkdir -p $B
GT="-I$PWD/../prefix/include -L$PWD/../prefix/lib/x86_64-linux-gnu"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee $OUT/bench.log
if [ -n "${CMAKE_TESTS:-}" ]; then
  ROOT=$PWD; mkdir -p .devdata; export ORIGAMI_SHARED_DIR=$ROOT/../shared
  for d in include prefix shared; do ln -sfn $ROOT/../$d .devdata/$d; done
  ( source scripts/lib/gpu_common.sh; gpu_script_init /tmp/o > /dev/null; cd $ROOT
    gpu_build /tmp/b-fp8attn /tmp/cmake_build.log $CMAKE_TESTS; echo "cmake build rc=$GPU_BUILD_RC ${GPU_BUILD_SECONDS}s" ) \
    > /tmp/cmake_bg.log 2>&1 &
  CMAKE_PID=$!
fi
SHAPES="--rows 16 --blocks 16,256 --batches 64,256,1024 --contexts 640,1024,4096 --no-prefill"
# What paged_attention.cu links against beside itself (its programmatic launches).
KERNEL_DEPS="src/backend/cuda/programmatic_launch.cpp"
for v in "$@"; do
  IFS='|' read -r name flags _ <<< "$v"
  src=src/backend/cuda/paged_attention.cu
  [[ "$flags" == *-Iorig* ]] && src=orig/paged_attention.cu
  ( nvcc -std=c++20 -O3 -arch=sm_90 -lineinfo -Isrc $flags bench/attention_bench.cu $src $KERNEL_DEPS \
      -Xptxas -v -o $B/$name > $B/build_$name.log 2>&1 || echo "BUILD FAILED $name" ) &
  if [[ " ${RAGGED:-} " == *" $name "* ]]; then
    ( nvcc -std=c++20 -O3 -arch=sm_90 -Isrc $flags bench/ragged_attention_bench.cu $src $KERNEL_DEPS src/backend/cuda/ragged_heads.cpp \
        src/kv/kv_layout.cpp src/kv/head_grouping.cpp src/kv/head_budgets.cpp src/kv/split_map.cpp src/core/dtype.cpp \
        src/core/status.cpp src/core/file_io.cpp src/core/json_parse.cpp -o $B/ragged_$name > $B/build_ragged_$name.log 2>&1 || { echo "RAGGED BUILD FAILED $name"; tail -5 $B/build_ragged_$name.log; } ) &
  fi
done
if [ -n "${TEST:-}" ]; then
  ( nvcc -std=c++20 -O2 -arch=sm_90 -lineinfo -Isrc $GT -x cu tests/gpu/attention_paged_test.cpp \
      src/backend/cuda/paged_attention.cu src/backend/cuda/kv_cache_write.cu $KERNEL_DEPS -lgtest -lgtest_main -Xcompiler -fopenmp \
      -o $B/attention_paged_test > $B/build_test.log 2>&1 || { echo "TEST BUILD FAILED"; tail -20 $B/build_test.log; } ) &
  ( nvcc -std=c++20 -O2 -arch=sm_90 -Isrc $GT -DORIGAMI_SHARED_DIR='"/tmp"' tests/gpu/attention_ragged_test.cpp \
      src/backend/cuda/paged_attention.cu src/backend/cuda/kv_cache_write.cu $KERNEL_DEPS src/backend/cuda/ragged_heads.cpp \
      src/kv/kv_layout.cpp src/kv/head_grouping.cpp src/kv/split_map.cpp src/core/dtype.cpp src/core/status.cpp \
      -lgtest -lgtest_main -o $B/attention_ragged_test > $B/build_rtest.log 2>&1 || { echo "RAGGED TEST BUILD FAILED"; tail -20 $B/build_rtest.log; } ) &
fi
wait
for v in "$@"; do
  IFS='|' read -r name flags _ <<< "$v"
  echo "== $name: $(grep -A2 -E 'kernelILi128ELb1ELb1E|stream_kernelILi128' $B/build_$name.log | grep -o 'Used [0-9]* registers' | tr '\n' ' ')" | tee -a $OUT/bench.log
  grep -E "error|FAILED" $B/build_$name.log | head -5
done
if [ -n "${TEST:-}" ] && [ -x $B/attention_paged_test ]; then
  OMP_NUM_THREADS=16 timeout 300 $B/attention_paged_test > $OUT/test.log 2>&1
  echo "attention_paged_test rc=$?: $(grep -cE 'rel_err' $OUT/test.log) checks; worst:"
  grep rel_err $OUT/test.log | awk -F'rel_err=' '{print $2, $0}' | sort -g | tail -3
  grep -E "^\[  (PASSED|FAILED) |Failure" $OUT/test.log | head -10
  timeout 200 $B/attention_ragged_test > $OUT/rtest.log 2>&1
  echo "attention_ragged_test rc=$?: $(grep -cE 'rel_err' $OUT/rtest.log) checks; worst:"
  grep rel_err $OUT/rtest.log | awk -F'rel_err=' '{print $2, $0}' | sort -g | tail -3
  grep -E "^\[  (PASSED|FAILED) |Failure" $OUT/rtest.log | head -10
fi
for v in "$@"; do
  IFS='|' read -r name flags bflags <<< "$v"
  [ -x $B/$name ] || continue
  echo "== $name fp8 $bflags" | tee -a $OUT/bench.log
  timeout 150 $B/$name --cache fp8 $SHAPES $bflags 2>&1 | tee -a $OUT/bench.log
done
for name in ${BF16:-}; do
  echo "== $name bf16" | tee -a $OUT/bench.log
  timeout 150 $B/$name --cache bf16 $SHAPES 2>&1 | tee -a $OUT/bench.log
done
for v in ${NCU:-}; do
  name=${v%%:*}; items=${v#*:}
  timeout 150 ncu --clock-control none --set full -k regex:paged --launch-skip 3 --launch-count 1 \
    $B/$name --cache fp8 --rows 16 --blocks 256 --batches 1024 --contexts 640 --items $items --no-prefill > $OUT/ncu_$name.txt 2>&1
done
for name in ${RAGGED:-}; do
  echo "== $name ragged per-head fp8" | tee -a $OUT/bench.log
  timeout 200 $B/ragged_$name --per-head --fp8-only 2>&1 | tee -a $OUT/bench.log
done
if [ -n "${CMAKE_TESTS:-}" ]; then
  wait; cat /tmp/cmake_bg.log; grep -E "error" /tmp/cmake_build.log | head -5
  for t in $CMAKE_TESTS; do
    [ "$t" = cuda_decode_bench_test ] && continue
    [ -x /tmp/b-fp8attn/tests/$t ] || { echo "$t: not built"; continue; }
    timeout 240 /tmp/b-fp8attn/tests/$t > $OUT/$t.log 2>&1
    echo "$t rc=$?: $(grep -E '^\[  (PASSED|FAILED) ' $OUT/$t.log | tr '\n' ' ')"
    grep -E "^\[  FAILED|Failure" $OUT/$t.log | head -5
  done
fi
# DECODE_BENCH="batches:context ...": the engine's decode step (Llama-3.1-8B shape, FP8 weights
# and KV cache, cuda_decode_bench_test Roofline) per batch list and context.
for bc in ${DECODE_BENCH:-}; do
  [ -x /tmp/b-fp8attn/tests/cuda_decode_bench_test ] || { echo "cuda_decode_bench_test: not built"; break; }
  ORIGAMI_CUDA_BENCH=1 ORIGAMI_BENCH_CONFIG=llama-3.1-8b ORIGAMI_BENCH_QUANTIZATION=fp8 ORIGAMI_BENCH_KV_DTYPE=fp8 \
    ORIGAMI_BENCH_BATCHES=${bc%%:*} ORIGAMI_BENCH_CONTEXTS=${bc#*:} timeout 150 \
    /tmp/b-fp8attn/tests/cuda_decode_bench_test --gtest_filter='*Roofline*' 2>&1 | tee -a $OUT/decode_bench.log | tail -25
done
