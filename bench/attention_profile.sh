#!/bin/bash
# Where the streamed FP8 decode attention spends its time at max load's shapes, on the GPU machine
# in one call: attention_bench built as main has it and as variants of its pipeline
# (ORIGAMI_STREAM_STAGES / ORIGAMI_STREAM_MIN_BLOCKS: "stages:min_blocks" pairs in PROF_VARIANTS),
# timed at PROF_BATCHES x PROF_CONTEXTS (pages of PROF_BLOCK); the streamed kernel's SASS
# (cuobjdump, with ptxas' registers and shared memory); then ncu on one launch of main's build at
# the first batch and context: the full section set and the per-instruction stall samples (source
# page, SASS), where the hardware counters can be read.
#   PROF_BATCHES (448,896), PROF_CONTEXTS (1152,2176), PROF_BLOCK (32), PROF_VARIANTS ("4:2 2:4"),
#   PROF_NCU (1: profile; 0: not), PROF_ORIG (a copy of another revision's paged_attention.cu: built as
#   variant "orig" at 3:3 and timed beside the others, for a before / after in one call),
#   PROF_TESTS (1: the attention tests through cmake, built beside the benches; needs $BUILD and
#   ORIGAMI_SHARED_DIR as scripts/lib/gpu_common.sh has them).
# Logs go to $OUT (default /tmp/origami-attention-profile); the table last.
set -u
OUT=${OUT:-/tmp/origami-attention-profile}
mkdir -p "$OUT"
B=/tmp/attn-prof && mkdir -p $B
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader > "$OUT/device.txt"
DEPS="src/backend/cuda/paged_attention.cu src/backend/cuda/programmatic_launch.cpp"
variants="3:3 ${PROF_VARIANTS-4:2 2:4}"
TESTS="attention_paged_test attention_ragged_test cuda_balanced_attention_test"
if [ "${PROF_TESTS:-0}" = 1 ]; then
  ( source scripts/lib/gpu_common.sh; gpu_script_init /tmp/attn-prof-tests; gpu_build "$BUILD" "$OUT/tests_build.log" $TESTS ) > /dev/null 2>&1 &
fi
if [ -n "${PROF_ORIG:-}" ]; then
  variants="orig $variants"
  ( nvcc -std=c++20 -O3 -arch=sm_90 -lineinfo -Isrc -Xptxas -v bench/attention_bench.cu "$PROF_ORIG" \
      src/backend/cuda/programmatic_launch.cpp -o $B/bench_orig > $B/build_orig.log 2>&1 || echo "BUILD FAILED orig" ) &
fi
for v in $variants; do
  [ "$v" = orig ] && continue
  IFS=: read -r st mb <<< "$v"
  ( nvcc -std=c++20 -O3 -arch=sm_90 -lineinfo -Isrc -DORIGAMI_STREAM_STAGES=$st -DORIGAMI_STREAM_MIN_BLOCKS=$mb \
      -Xptxas -v bench/attention_bench.cu $DEPS -o $B/bench_s${st}b$mb > $B/build_s${st}b$mb.log 2>&1 ||
      echo "BUILD FAILED s${st}b$mb" ) &
done
wait
# ptxas' line for the streamed kernel (D 128, not balanced), per variant.
for v in $variants; do
  [ "$v" = orig ] && { grep -A2 "paged_decode_fp8_stream_kernelILi128ELb0E" $B/build_orig.log | grep -E "registers" |
    sed "s/^/orig: /" >> "$OUT/ptxas.txt"; continue; }
  IFS=: read -r st mb <<< "$v"
  grep -A2 "paged_decode_fp8_stream_kernelILi128ELb0E" $B/build_s${st}b$mb.log | grep -E "registers|spill" |
    sed "s/^/s${st}b$mb: /" >> "$OUT/ptxas.txt"
done
cuobjdump --dump-sass $B/bench_s3b3 | awk '/Function : .*paged_decode_fp8_stream_kernelILi128ELb0E/{on=1} on{print} on&&/^\t*\.\.\.\.\.\.\.\.\.\./{exit}' \
  > "$OUT/stream_kernel.sass"
SHAPES="--cache fp8 --rows 16 --blocks ${PROF_BLOCK:-32} --batches ${PROF_BATCHES:-448,896} --contexts ${PROF_CONTEXTS:-1152,2176} --no-prefill"
for round in 1 2; do
  for v in $variants; do
    name=orig
    [ "$v" != orig ] && { IFS=: read -r st mb <<< "$v"; name=s${st}b$mb; }
    timeout 200 $B/bench_$name $SHAPES > "$OUT/bench_${name}_r$round.log" 2>&1
  done
done
if [ "${PROF_NCU:-1}" = 1 ]; then
  b1=${PROF_BATCHES:-448,896}; c1=${PROF_CONTEXTS:-1152,2176}
  timeout 300 ncu --clock-control none -k regex:paged_decode_fp8_stream --launch-skip 3 --launch-count 1 --set full \
    --import-source no -f -o $B/prof $B/bench_s3b3 --cache fp8 --rows 16 --blocks ${PROF_BLOCK:-32} \
    --batches ${b1%%,*} --contexts ${c1%%,*} --no-prefill > "$OUT/ncu_run.log" 2>&1
  echo "ncu rc $?" >> "$OUT/ncu_run.log"
  if [ -f $B/prof.ncu-rep ]; then
    ncu -i $B/prof.ncu-rep --page details > "$OUT/ncu_details.txt" 2>&1
    ncu -i $B/prof.ncu-rep --page source --csv --print-source sass > "$OUT/ncu_source_sass.csv" 2>&1
    ncu -i $B/prof.ncu-rep --page raw --csv > "$OUT/ncu_raw.csv" 2>&1
  fi
fi
if [ "${PROF_TESTS:-0}" = 1 ]; then
  # (the benches' `wait` above waited for the tests' build too)
  for t in $TESTS; do
    timeout 300 "$BUILD/tests/$t" > "$OUT/$t.log" 2>&1
    echo "$t rc $? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/$t.log" | tr '\n' ' ')" >> "$OUT/tests.txt"
  done
fi
echo "================ streamed FP8 decode attention: variants (us, % of copy bandwidth) ================"
cat "$OUT/device.txt" "$OUT/ptxas.txt" "$OUT/tests.txt" 2>/dev/null
for f in "$OUT"/bench_*_r*.log; do echo "--- $(basename "$f" .log)"; grep -E "fp8|copy" "$f" | grep -v '^#' | head -12; done
grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Issued Ipc|Warp Cycles Per Issued|No Eligible" "$OUT/ncu_details.txt" 2>/dev/null | head -20
