#!/usr/bin/env bash
# Runs origami's GPU tests under NVIDIA compute-sanitizer (on the GPU machine):
#   memcheck   every test executable of the `gpu` ctest label: out-of-bounds and misaligned
#              device accesses, CUDA API errors, device memory leaks (--leak-check full)
#   racecheck  the executables that test the kernels with shared memory (paged attention,
#              compression scoring, sampling / log-prob reductions, elementwise kernels):
#              shared-memory read/write hazards between threads of a block
#   scripts/gpu_sanitize.sh [memcheck|racecheck|all]      (default: all)
# A test passes a tool when the executable's tests pass and the sanitizer reports 0 errors.
# Full logs go to $OUT (default ./out), one per tool and executable; a summary table (per run:
# exit status, time, tests passed, sanitizer errors) is printed last and kept in
# $OUT/sanitize_summary.txt. Exits non-zero when any run fails or reports an error.
#
# Environment:
#   BUILD            build folder (default build-gpu, the one scripts/gpu_run.sh uses)
#   SANITIZER        compute-sanitizer binary (default: on PATH, else under /usr/local/cuda)
#   SAN_TIMEOUT      seconds per executable and tool (default 900; the tools run 10-100x slower)
#   MEMCHECK_TESTS   regex over executable names for memcheck (default: all of the gpu label)
#   RACECHECK_TESTS  regex for racecheck (default: the shared-memory kernel tests below)
#   GTEST_FILTER     passed to every executable (e.g. to sanitize one failing case)
#   RACECHECK_SIZES  ORIGAMI_GPU_TEST_SIZES for racecheck (default small: the tests sweep fewer
#                    sizes, still one and several blocks and tiles; racecheck tracks every
#                    shared-memory access and runs the full sweep for hours). "full" = all sizes.
# The tests are built with -lineinfo (CMakeLists.txt), so reports name source lines.
set -uo pipefail
source "$(dirname "$0")/lib/gpu_common.sh"
gpu_script_init ./out
TOOLS=${1:-all}
case "$TOOLS" in
  all) TOOLS="memcheck racecheck" ;;
  memcheck|racecheck) ;;
  *) echo "usage: scripts/gpu_sanitize.sh [memcheck|racecheck|all]" >&2; exit 2 ;;
esac
SAN_TIMEOUT=${SAN_TIMEOUT:-900}
MEMCHECK_TESTS=${MEMCHECK_TESTS:-.}
# Tests of the kernels declaring __shared__ memory (src/backend/cuda: paged_attention,
# compression_kernels, sampling_kernels, logprob_kernels, elementwise_kernels).
RACECHECK_TESTS=${RACECHECK_TESTS:-'^(attention_paged_test|cuda_kernels_test|cuda_compression_test|cuda_joint_selection_test|cuda_elementwise_vec_test)$'}
declare -A RESULT
T_START=$(date +%s)

SANITIZER=${SANITIZER:-$(command -v compute-sanitizer || true)}
if [ -z "$SANITIZER" ]; then
  for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    [ -x "$c" ] && SANITIZER=$c && break
  done
fi
[ -n "$SANITIZER" ] || { echo "compute-sanitizer not found (set SANITIZER)" >&2; exit 2; }

gpu_device_info "$OUT/sanitize_build.log"
RESULT[0_device]="$GPU_DEVICE"
"$SANITIZER" --version | tail -1 | tee -a "$OUT/sanitize_build.log"

# ---------------------------------------------------------------- build the GPU tests
gpu_cmake_args
t0=$(date +%s)
cmake -S . -B "$BUILD" "${GPU_CMAKE_GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DORIGAMI_CUDA=ON -DORIGAMI_CUDA_ARCH=90 \
  -DORIGAMI_SHARED_DIR="$SH" "${GPU_CMAKE_EXTRA[@]}" >> "$OUT/sanitize_build.log" 2>&1 \
  || { tail -30 "$OUT/sanitize_build.log"; echo "CONFIGURE FAILED"; exit 1; }
gpu_targets=()
for f in tests/gpu/*_test.cpp tests/gpu/*_test.cu; do
  [ -f "$f" ] && gpu_targets+=("$(basename "${f%.*}")")
done
cmake --build "$BUILD" -j16 --target "${gpu_targets[@]}" >> "$OUT/sanitize_build.log" 2>&1
rc=$?
RESULT[1_build]="rc=$rc ($(( $(date +%s) - t0 ))s, ${#gpu_targets[@]} test executables)"
# A test that does not compile is not clean: the stale executable from an earlier build would run.
[ $rc -eq 0 ] || { grep -E "error" "$OUT/sanitize_build.log" | head -20; echo "BUILD FAILED"; exit 1; }

# The executables behind the `gpu` ctest label (gtest_discover_tests registers each test case
# with its executable as the command).
mapfile -t executables < <(cd "$BUILD" && ctest -L gpu --show-only=json-v1 2>/dev/null | python3 -c '
import json, os, sys
seen = []
for t in json.load(sys.stdin).get("tests", []):
    exe = os.path.basename((t.get("command") or [""])[0])
    if exe and exe not in seen:
        seen.append(exe)
print("\n".join(seen))')
if [ ${#executables[@]} -eq 0 ]; then
  echo "no tests with the gpu label in $BUILD (is ORIGAMI_CUDA on?)"
  executables=("${gpu_targets[@]}")
fi

# ---------------------------------------------------------------- run under the tools
failed=0
run_tool() {  # tool executable flags...
  local tool=$1 exe=$2
  shift 2
  local log="$OUT/${tool}_${exe}.log" t0 rc
  t0=$(date +%s)
  local filter=(); [ -n "${GTEST_FILTER:-}" ] && filter=(--gtest_filter="$GTEST_FILTER")
  # --error-exitcode: a sanitizer error fails the run even when the tests pass; exit 86 tells
  # it apart from a failing test (1) and the timeout (124).
  local sizes=full; [ "$tool" = racecheck ] && sizes=${RACECHECK_SIZES:-small}
  # NCCL probes kernels built for other architectures with cudaFuncGetAttributes inside
  # ncclCommInit and handles the "no kernel image" error itself. API-error reports are off for
  # that test only: every CUDA call of ours is checked by the test itself (ORIGAMI_CUDA_CHECK),
  # and device memory accesses are checked as everywhere.
  local api=(); [ "$exe" = cuda_nccl_test ] && api=(--report-api-errors no)
  (cd "$BUILD/tests" && ORIGAMI_GPU_TEST_SIZES=$sizes OMP_NUM_THREADS=16 timeout --kill-after=30 "$SAN_TIMEOUT" \
     "$SANITIZER" --tool "$tool" --error-exitcode 86 --target-processes all --print-limit 200 "${api[@]}" "$@" \
     "./$exe" "${filter[@]}") > "$log" 2>&1
  rc=$?
  local passed errors verdict
  passed=$(grep -oE '^\[  PASSED  \] [0-9]+' "$log" | tail -1 | awk '{print $4}')
  local failed_tests; failed_tests=$(grep -oE '^\[  FAILED  \] [0-9]+ tests?, listed below' "$log" | awk '{print $4}')
  errors=$(grep -oE 'ERROR SUMMARY: [0-9]+ errors?' "$log" | tail -1 | awk '{print $3}')
  if [ "$tool" = racecheck ]; then
    local hazards; hazards=$(grep -oE 'RACECHECK SUMMARY: .*' "$log" | tail -1)
    [ -n "$hazards" ] && errors="${errors:-?}; ${hazards#RACECHECK SUMMARY: }"
  fi
  local skipped; skipped=$(grep -oE '^\[  SKIPPED \] [0-9]+' "$log" | tail -1 | awk '{print $4}')
  # Every test of the executable skipped itself (benchmarks that need an opt-in variable): the
  # sanitizer finds no CUDA call to instrument and exits 255; nothing ran, nothing failed.
  if [ $rc -eq 255 ] && [ -n "$skipped" ] && [ -z "$passed" ] && [ -z "$failed_tests" ] &&
     grep -q 'terminated before first instrumented API call' "$log"; then
    RESULT["2_${tool}:${exe}"]="skipped ($skipped tests skip themselves; no CUDA call)"
    return
  fi
  case $rc in
    0) verdict=clean ;;
    86) verdict="SANITIZER ERRORS" ;;
    124|137) verdict="TIMEOUT after ${SAN_TIMEOUT}s" ;;
    *) verdict="FAILED" ;;
  esac
  [ $rc -eq 0 ] || failed=1
  RESULT["2_${tool}:${exe}"]="rc=$rc ($(( $(date +%s) - t0 ))s) tests passed ${passed:-0}, failed ${failed_tests:-0}; sanitizer errors ${errors:-?}: $verdict"
  # The first reports, so the console shows what to look at.
  grep -m 5 -E '^========= (Invalid|Race|Error|Program hit|Leaked|Barrier|Uninitialized)|^\[  FAILED  \]' "$log"
}

for tool in $TOOLS; do
  if [ "$tool" = memcheck ]; then regex=$MEMCHECK_TESTS; flags=(--leak-check full); else regex=$RACECHECK_TESTS; flags=(); fi
  n=0
  for exe in "${executables[@]}"; do
    [[ "$exe" =~ $regex ]] || continue
    [ -x "$BUILD/tests/$exe" ] || { RESULT["2_${tool}:${exe}"]="not built"; failed=1; continue; }
    echo "== $tool $exe"
    run_tool "$tool" "$exe" "${flags[@]}"
    n=$((n + 1))
  done
  RESULT["3_${tool}_runs"]="$n executables (logs: $OUT/${tool}_*.log)"
done

RESULT[4_verdict]=$([ $failed -eq 0 ] && echo "all clean" || echo "FAILURES or sanitizer errors: see the rows above")
gpu_print_summary "compute-sanitizer summary ($(( $(date +%s) - T_START ))s)" "$OUT/sanitize_summary.txt"
exit $failed
