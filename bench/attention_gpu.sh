#!/bin/bash
# Builds and runs the attention/KV-write GPU tests and the decode bandwidth benchmark on the
# device machine; logs go to $OUT (or /tmp). Direct nvcc builds keep this independent of the
# rest of the tree.
set -u
OUT=${OUT:-/tmp}
B=/tmp/cuattn && mkdir -p $B
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv
nvcc --version | tail -1; ls /usr/include/CLI/CLI.hpp 2>&1; cmake --version | head -1
SRC="src/backend/cuda/paged_attention.cu src/backend/cuda/kv_cache_write.cu src/backend/cuda/programmatic_launch.cpp"
nvcc -std=c++20 -O2 -arch=sm_90 -lineinfo -Isrc -x cu tests/gpu/attention_paged_test.cpp $SRC \
  -lgtest -lgtest_main -Xcompiler -fopenmp -o $B/attention_paged_test 2>&1 | tee $OUT/build.log &
nvcc -std=c++20 -O3 -arch=sm_90 -lineinfo -Isrc bench/attention_bench.cu $SRC -o $B/attention_bench 2>&1 | tee -a $OUT/build.log
wait
OMP_NUM_THREADS=16 timeout 200 $B/attention_paged_test 2>&1 | tee $OUT/test.log | grep -E "^\[ *(OK|FAILED|PASSED|RUN)|Failure|Expected|rel_err=(inf|nan)"
timeout 60 compute-sanitizer --tool memcheck $B/attention_paged_test --gtest_filter='*OddGroup*:*KVCache*' 2>&1 | tail -4 | tee $OUT/memcheck.log
timeout 120 $B/attention_bench 2>&1 | tee $OUT/bench.log
echo "checks: $(grep -c rel_err $OUT/test.log)"; grep rel_err $OUT/test.log | awk -F'rel_err=' '{print $2, $0}' | sort -g | tail -3
