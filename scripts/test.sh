#!/usr/bin/env bash
# Builds and runs every test that this machine can run:
#  1. Release build (+ the CUDA backend when nvcc is present: it must compile everywhere),
#     all CPU tests (labels unit, e2e). GPU tests (label gpu) run only when a GPU is present.
#  2. AddressSanitizer + UndefinedBehaviorSanitizer build (unit tests and the server only): unit
#     tests, then the server's load test against the sanitized server (200 concurrent streams,
#     20% of the clients disconnecting at random points; ctest server_load, when node is present).
#  3. The parsers' libFuzzer harnesses (clang): replay their seeds and regressions, then fuzz
#     each for FUZZ_SECONDS (default 20; 0 = replay only).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
# Each phase's wall time, printed when the next begins (CI has a time budget; see README).
phase_start=$SECONDS
phase() { echo "origami: phase '$1' took $((SECONDS - phase_start)) s" >&2; phase_start=$SECONDS; }

# The server tests' openai client (tests/server/node_modules), when install-deps.sh --test has not run.
if command -v npm >/dev/null 2>&1 && [ ! -d tests/server/node_modules/openai ]; then
  (cd tests/server && npm ci --no-audit --no-fund --loglevel=error)
fi
scripts/build.sh --all
gpu_label_filter=(-LE gpu)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then gpu_label_filter=(); fi
(cd build && ctest --output-on-failure -j"$jobs" "${gpu_label_filter[@]}")

phase "release build and tests"
# -O1 -g1: the sanitizers' usual level, with line tables for their stack traces; measured 2.4x
# faster to compile than RelWithDebInfo's -O2 -g (engine.cpp 24.7 s -> 10.5 s on 2 cores).
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DORIGAMI_SANITIZE=ON -DORIGAMI_CUDA=OFF >/dev/null
# Only what this phase runs: the unit tests (engine_host_bench is one) and the server (origami_cli)
# for the load test.
asan_targets=(origami_cli engine_host_bench)  # engine_host_bench: ctest engine_host_page_table_copies (label unit)
for f in tests/unit/*_test.cpp; do asan_targets+=("$(basename "${f%.cpp}")"); done
cmake --build build-asan -j"$jobs" --target "${asan_targets[@]}"
# Left out under the sanitizers: CpuThroughput (a speed report, no assertion to sanitize) and
# the tiny Qwen3 instance of CpuInvariance (the same chunking/paging/batching paths as its
# stories260k instance, at 25x the run time under ASan). The release phase runs both.
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
   ctest --output-on-failure -j"$jobs" -L unit -E '^(CpuThroughput\.|Models/CpuInvariance\..*/origami_tiny_qwen3)')
# Cancellation, disconnects and the engine thread under ASan/UBSan: the server must stay up,
# stop with exit 0 and no leak report (LeakSanitizer runs at its exit), and give every request
# that was not cancelled its prompt's greedy text alone. LOAD_MAX_TOKENS keeps it short.
if [ -d tests/server/node_modules/openai ] && (cd build-asan && ctest -N -R '^server_load$' | grep -q 'Total Tests: 1'); then
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
     LOAD_N=200 LOAD_MAX_TOKENS=16 ctest --output-on-failure -R '^server_load$')
else
  echo "origami: WARNING: no node or tests/server/node_modules: the ASan server load test did not run" >&2
fi

phase "sanitizer build and tests"
scripts/fuzz.sh all "${FUZZ_SECONDS:-20}"
phase "fuzz build and runs"
echo "origami: all tests passed"
