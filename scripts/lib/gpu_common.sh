# Helpers shared by the GPU machine's scripts (scripts/gpu_*.sh). Sourced, not run; a script
# starts with
#   set -uo pipefail
#   source "$(dirname "$0")/lib/gpu_common.sh"
#   gpu_script_init /tmp/origami-gpu   # its default OUT
#
# Fixtures: the device gets only the repository, so the shared configs/models/tokenizers are
# carried in .devdata/shared (git-ignored), found through ORIGAMI_SHARED_DIR; .devdata also holds
# the headers/libs the device lacks (CLI11, nlohmann-json, GoogleTest).

# The prologue of every gpu_*.sh: cd to the repository root and set ROOT to it; OUT (default $1)
# created and made absolute; BUILD (default build-gpu); the shared fixtures (gpu_shared_dir).
gpu_script_init() {
  cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
  ROOT=$PWD
  OUT=${OUT:-$1}
  mkdir -p "$OUT"
  OUT=$(cd "$OUT" && pwd)
  BUILD=${BUILD:-build-gpu}
  gpu_shared_dir
}

# Exports ORIGAMI_SHARED_DIR (.devdata/shared, else ../shared) and sets SH to it.
gpu_shared_dir() {
  export ORIGAMI_SHARED_DIR=${ORIGAMI_SHARED_DIR:-$ROOT/.devdata/shared}
  [ -d "$ORIGAMI_SHARED_DIR/configs" ] || export ORIGAMI_SHARED_DIR=$ROOT/../shared
  SH=$ORIGAMI_SHARED_DIR
  # The tokenizer of the dummy-weight benchmarks (random prompt ids: only loaded, never used to
  # encode; any will do): the Qwen3 one where the fixtures carry it (the device's .devdata does
  # not), else the tiny model's, the smallest, which always travels.
  BENCH_TOKENIZER=$SH/tokenizers/qwen3
  [ -f "$BENCH_TOKENIZER/tokenizer.json" ] || BENCH_TOKENIZER=$SH/models/origami-tiny-qwen3
}

# Prints the GPU (name, memory, driver, clocks) and the tool versions, writing them to $1 too;
# sets GPU_DEVICE to the GPU line.
gpu_device_info() {
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader \
    | tee "$1"
  GPU_DEVICE="$(head -1 "$1")"
  { nvcc --version | tail -1; cmake --version | head -1; g++ --version | head -1; } | tee -a "$1"
}

# Sets GPU_CMAKE_EXTRA (where .devdata supplies what the machine lacks) and GPU_CMAKE_GEN
# (Ninja when present).
gpu_cmake_args() {
  GPU_CMAKE_EXTRA=()
  [ -f /usr/include/CLI/CLI.hpp ] || GPU_CMAKE_EXTRA+=(-DCLI11_INCLUDE_DIR=$ROOT/.devdata/include)
  if [ ! -f /usr/include/gtest/gtest.h ] || [ ! -d /usr/include/nlohmann ]; then
    GPU_CMAKE_EXTRA+=(-DCMAKE_PREFIX_PATH=$ROOT/.devdata/prefix)
  fi
  GPU_CMAKE_GEN=(); command -v ninja >/dev/null && GPU_CMAKE_GEN=(-G Ninja)
  return 0
}

# Starts nvidia-smi in the background, sampling every 500 ms into $1 the columns
# scripts/lib/smi_phases.py reads (timestamp, SM and memory clocks, power, temperature, throttle
# reasons); GPU_SMI_PID is its pid, to kill when the measured phases end.
gpu_smi_start() {
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv,noheader,nounits -lms 500 > "$1" 2>/dev/null &
  GPU_SMI_PID=$!
}

# cuda_decode_bench_test's settings for the max-load comparison with TensorRT-LLM: model config $1
# (default llama-3.1-8b), FP8 weights + FP8 KV, pages of 32, fused quantization, fast accumulation.
gpu_fp8_bench_env() {
  export ORIGAMI_CUDA_BENCH=1 ORIGAMI_BENCH_CONFIG=${1:-llama-3.1-8b} ORIGAMI_BENCH_QUANTIZATION=fp8
  export ORIGAMI_BENCH_KV_DTYPE=fp8 ORIGAMI_BENCH_BLOCK=32 ORIGAMI_BENCH_FUSED_QUANTIZE=1 ORIGAMI_BENCH_FAST_ACCUMULATION=1
}

# Prints the associative array RESULT sorted by key under a title ($1), keeping it in file $2.
gpu_print_summary() {
  {
    echo "================ $1 ================"
    for k in $(echo "${!RESULT[@]}" | tr ' ' '\n' | sort); do printf '%-34s %s\n' "$k" "${RESULT[$k]}"; done
  } | tee "$2"
}

# Configures $1 (the build folder) with the CUDA backend and builds the targets $3... (all when
# none), appending the output to the log $2 and keeping going past targets that do not build.
# Sets GPU_BUILD_RC and GPU_BUILD_SECONDS; returns 1 only when configuring fails.
gpu_build() {
  local build=$1 log=$2
  shift 2
  # A job of gpu_queue_run: the queue's owner built before starting the workers, and several
  # builds at once in one folder would race.
  if [ -n "${GPU_SKIP_BUILD:-}" ]; then GPU_BUILD_RC=0; GPU_BUILD_SECONDS=0; return 0; fi
  gpu_cmake_args
  # A log in a folder not made yet (a path outside $OUT) failed the configure's redirection, which
  # read as "CONFIGURE FAILED" and left the build folder's old binaries to run.
  mkdir -p "$(dirname "$log")"
  local t0; t0=$(date +%s)
  cmake -S "$ROOT" -B "$build" "${GPU_CMAKE_GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DORIGAMI_CUDA=ON -DORIGAMI_CUDA_ARCH=90 \
    -DORIGAMI_SHARED_DIR="$SH" "${GPU_CMAKE_EXTRA[@]}" >> "$log" 2>&1 \
    || { tail -30 "$log"; echo "CONFIGURE FAILED"; return 1; }
  local tflags=(); [ $# -gt 0 ] && tflags=(--target "$@")
  local keep; if [ ${#GPU_CMAKE_GEN[@]} -gt 0 ]; then keep=(-- -k 0); else keep=(-- -k); fi
  cmake --build "$build" -j16 "${tflags[@]}" "${keep[@]}" >> "$log" 2>&1
  GPU_BUILD_RC=$?
  GPU_BUILD_SECONDS=$(( $(date +%s) - t0 ))
  return 0
}

# Runs the lines of file $1 (each a bash command) on every visible GPU at once: one worker per GPU
# (GPU_WORKERS overrides the count) takes the next line whenever its last one ends, with
# CUDA_VISIBLE_DEVICES naming its GPU and GPU_SKIP_BUILD set (build before calling this). Put the
# longest jobs first: the queue is taken in file order. A job's output goes to the log it names;
# each start and end is printed with the GPU and the seconds it took.
gpu_queue_run() {
  local file=$1 workers=${GPU_WORKERS:-$(nvidia-smi -L | wc -l)}
  local counter; counter=$(mktemp)
  echo 0 > "$counter"
  local g
  for ((g = 0; g < workers; g++)); do
    (
      while true; do
        local i line t0
        i=$(flock "$counter" bash -c 'i=$(cat "$1"); echo $((i + 1)) > "$1"; echo "$i"' _ "$counter")
        line=$(sed -n "$((i + 1))p" "$file")
        [ -z "$line" ] && break
        t0=$(date +%s)
        echo "[gpu $g] start job $((i + 1)): ${line:0:160}"
        CUDA_VISIBLE_DEVICES=$g GPU_SKIP_BUILD=1 bash -c "$line"
        echo "[gpu $g] job $((i + 1)) rc=$? ($(( $(date +%s) - t0 )) s)"
      done
    ) &
  done
  wait
  rm -f "$counter"
}

# Prints one line from an `origami bench --json` file ($1): throughput, peak running requests,
# peak KV pool share, preemptions, compressions and their time shares; "no json" when unreadable.
gpu_bench_summary() {
  python3 - "$1" <<'PY'
import json, sys
try:
    j = json.load(open(sys.argv[1]))
except Exception:
    print("no json"); sys.exit()
print("%.0f tok/s, peak running %d, peak KV %.1f%% of the pool, preemptions %d, compressions %d, "
      "compression: engine %.1f%% device %.1f%% of wall" % (
      j["output_tokens_per_second"], j["peak_running_requests"],
      100.0 * j.get("peak_kv_blocks", 0) / max(1, j.get("kv_blocks_total", 1)), j.get("num_preemptions", -1),
      j.get("num_compressions", 0), 100 * j.get("compression_time_share", 0),
      100 * j.get("compression_device_time_share", 0)))
if j.get("device_ms_per_step", 0) > 0:
    print("per step (ms): wall %.3f = scheduler %.3f + backend host %.3f + device %.3f + rest; TPOT %.2f" % (
          j["wall_ms_per_step"], j["schedule_ms_per_step"], j["backend_prepare_ms_per_step"], j["device_ms_per_step"],
          j["mean_tpot_ms"]))
PY
}
