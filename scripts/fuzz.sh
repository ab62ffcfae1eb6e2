#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz) into build-fuzz/ with clang and runs them.
#   scripts/fuzz.sh [TARGET|all] [SECONDS]
# TARGET: a harness name (safetensors, model_config, tokenizer_json, tokenizer_encode,
# chat_template, request_jsonl, policy_options, openai_request) or all (default). Each harness first replays its
# seeds (tests/fuzz/seeds/<name>) and regressions (tests/fuzz/regressions/<name>); then, when
# SECONDS > 0 (default 60), fuzzes for that long, one harness after another. New inputs go to
# build-fuzz/corpus/<name> (kept between runs), crashes to build-fuzz/artifacts/<name>/, logs
# to $FUZZ_LOGS (default build-fuzz/logs). A summary table (executions, edges covered, corpus,
# result) is printed last. Exits non-zero when a harness crashes, leaks, hangs or fails a check.
# The kept corpus (tests/fuzz/corpus/<name>.tar.gz: inputs that reach the coverage long runs
# found, minimized) is unpacked into build-fuzz/corpus/<name>, which the fuzzing starts from (its
# first pass runs every input), so every run, CI's 20 seconds included, checks what long runs
# reached; with SECONDS 0 it is replayed with the seeds.
# Environment: FUZZ_RUNS=N stops each harness after N executions (whichever of time and runs is
# first); FUZZ_ARGS adds libFuzzer flags; FUZZ_NO_BUILD=1 skips the build; FUZZ_SAVE_CORPUS=1
# rewrites the kept corpus from build-fuzz/corpus/<name> after the run (libFuzzer -merge=1: the
# fewest inputs that keep the coverage), for a long run to hand on what it found.
# A crash input becomes a regression: copy it to tests/fuzz/regressions/<name>/ and fix the parser.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TARGET=${1:-all}
SECONDS_EACH=${2:-60}
BUILD=${FUZZ_BUILD:-build-fuzz}
LOGS=${FUZZ_LOGS:-$BUILD/logs}
ALL=(safetensors model_config tokenizer_json tokenizer_encode chat_template request_jsonl policy_options openai_request)
if [ "$TARGET" = all ]; then targets=("${ALL[@]}"); else targets=("$TARGET"); fi
for t in "${targets[@]}"; do
  [[ " ${ALL[*]} " == *" $t "* ]] || { echo "unknown fuzz target '$t' (one of: ${ALL[*]}, all)" >&2; exit 2; }
done
export ORIGAMI_SHARED_DIR=${ORIGAMI_SHARED_DIR:-$(cd "$ROOT/.." && pwd)/shared}

# ---------------------------------------------------------------- build
if [ "${FUZZ_NO_BUILD:-0}" != 1 ]; then
  CXX_BIN=${FUZZ_CXX:-$(command -v clang++ || command -v clang++-14 || true)}
  [ -n "$CXX_BIN" ] || { echo "scripts/fuzz.sh needs clang++ (scripts/install-deps.sh --test installs it)" >&2; exit 2; }
  launcher=(); command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" -DCMAKE_CXX_COMPILER="$CXX_BIN" "${launcher[@]}" \
    -DORIGAMI_FUZZ=ON -DORIGAMI_TESTS=OFF -DORIGAMI_CUDA=OFF -DORIGAMI_SHARED_DIR="$ORIGAMI_SHARED_DIR" >/dev/null \
    || { echo "fuzz: configure failed" >&2; exit 1; }
  cmake --build "$BUILD" -j"$(nproc)" --target "${targets[@]/#/fuzz_}" || { echo "fuzz: build failed" >&2; exit 1; }
fi

# ---------------------------------------------------------------- run
# The largest seeds are the cut-down tokenizers (20 KB) and chat templates (6 KB).
max_len() {
  case "$1" in
    tokenizer_json) echo 32768 ;;
    chat_template) echo 16384 ;;
    safetensors) echo 8192 ;;
    *) echo 4096 ;;
  esac
}
# JSON harnesses share the JSON syntax dictionary; libFuzzer takes one -dict file.
dict_for() {
  local d="$BUILD/dict/$1.dict"
  mkdir -p "$BUILD/dict"
  cat "$ROOT/tests/fuzz/dict/$1.dict" > "$d"
  case "$1" in tokenizer_encode|policy_options) ;; *) cat "$ROOT/tests/fuzz/dict/json.dict" >> "$d" ;; esac
  echo "$d"
}
stat_of() { grep -E "^stat::$2:" "$1" | tail -1 | awk '{print $2}'; }

mkdir -p "$LOGS"
declare -A RESULT
failed=0
for t in "${targets[@]}"; do
  bin="$BUILD/tests/fuzz/fuzz_$t"
  corpus="$BUILD/corpus/$t"
  artifacts="$BUILD/artifacts/$t/"
  mkdir -p "$corpus" "$artifacts"
  inputs=("$ROOT/tests/fuzz/seeds/$t")
  [ -d "$ROOT/tests/fuzz/regressions/$t" ] && inputs+=("$ROOT/tests/fuzz/regressions/$t")
  # The kept corpus runs once either way: replayed here when there is no fuzzing to follow, else
  # as the fuzzing's first pass over its corpus (libFuzzer runs every input before mutating; a
  # failure there fails the harness as a replay failure would).
  replayed=("${inputs[@]}")
  kept="$ROOT/tests/fuzz/corpus/$t.tar.gz"
  if [ -f "$kept" ]; then  # file names are content hashes: unpacking over an earlier run's corpus is safe
    tar -xzf "$kept" -C "$corpus" --strip-components=1 || { echo "fuzz: cannot unpack $kept" >&2; exit 1; }
    [ "$SECONDS_EACH" -le 0 ] && replayed+=("$corpus")
  fi
  common=(-max_len="$(max_len "$t")" -timeout=10 -rss_limit_mb=2560 -malloc_limit_mb=2048
          -artifact_prefix="$artifacts" -print_final_stats=1)
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

  # Replay: every seed and regression once.
  "$bin" "${common[@]}" -runs=0 "${replayed[@]}" > "$LOGS/$t.replay.log" 2>&1
  rc=$?
  n_replayed=$(find "${replayed[@]}" -type f | wc -l)
  if [ $rc -ne 0 ]; then
    RESULT[$t]="REPLAY FAILED rc=$rc ($n_replayed inputs; see $LOGS/$t.replay.log)"
    failed=1
    grep -E "ERROR|FUZZ_CHECK|runtime error|Test unit written" "$LOGS/$t.replay.log" | head -5
    continue
  fi
  if [ "$SECONDS_EACH" -le 0 ]; then
    RESULT[$t]="replayed $n_replayed inputs: ok"
    continue
  fi
  runs=(); [ -n "${FUZZ_RUNS:-}" ] && runs=(-runs="$FUZZ_RUNS")
  t0=$(date +%s)
  # The corpus folder (the kept corpus unpacked into it) is libFuzzer's first argument: it starts
  # from those inputs and writes new ones there.
  # shellcheck disable=SC2086
  "$bin" "${common[@]}" -dict="$(dict_for "$t")" -max_total_time="$SECONDS_EACH" "${runs[@]}" ${FUZZ_ARGS:-} \
    "$corpus" "${inputs[@]}" > "$LOGS/$t.log" 2>&1
  rc=$?
  execs=$(stat_of "$LOGS/$t.log" number_of_executed_units)
  rate=$(stat_of "$LOGS/$t.log" average_exec_per_sec)
  cov=$(grep -oE "cov: [0-9]+" "$LOGS/$t.log" | tail -1 | awk '{print $2}')
  ft=$(grep -oE "ft: [0-9]+" "$LOGS/$t.log" | tail -1 | awk '{print $2}')
  n_corpus=$(find "$corpus" -type f | wc -l)
  if [ $rc -eq 0 ]; then
    status=ok
  else
    status="FAILED rc=$rc: $(grep -oE "Test unit written to [^ ]+" "$LOGS/$t.log" | tail -1 | sed 's/Test unit written to //')"
    failed=1
    grep -E "ERROR|FUZZ_CHECK|runtime error|SUMMARY" "$LOGS/$t.log" | head -5
  fi
  RESULT[$t]="$(printf '%10s execs %6s/s %6s edges %7s features %5s corpus %4ss  %s' \
    "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "$n_corpus" "$(( $(date +%s) - t0 ))" "$status")"
  if [ "${FUZZ_SAVE_CORPUS:-0}" = 1 ] && [ $rc -eq 0 ]; then
    minimized=$(mktemp -d); mkdir -p "$minimized/$t"
    if ASAN_OPTIONS=detect_leaks=0 "$bin" -merge=1 -max_len="$(max_len "$t")" -timeout=10 -rss_limit_mb=2560 \
         "$minimized/$t" "$corpus" > "$LOGS/$t.merge.log" 2>&1; then
      mkdir -p "$ROOT/tests/fuzz/corpus"
      tar -czf "$kept" -C "$minimized" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 "$t"
      RESULT[$t]+="; kept $(find "$minimized/$t" -type f | wc -l) inputs"
    else
      RESULT[$t]+="; corpus merge FAILED (see $LOGS/$t.merge.log)"
      failed=1
    fi
    rm -rf "$minimized"
  fi
done

echo "================ fuzz summary (replayed seeds + regressions; then ${SECONDS_EACH}s each) ================"
for t in "${targets[@]}"; do printf '%-18s %s\n' "$t" "${RESULT[$t]}"; done
exit $failed
