#!/usr/bin/env bash
# THE script for the GPU machine: builds origami with the CUDA backend and runs, by mode,
#   quick     build + every GPU test (ctest -L gpu) + the backend's end-to-end numbers
#   tests     quick + the HF transformers comparison (scripts/hf_compare.py) + CLI greedy cuda vs cpu
#   roofline  decode steps of Qwen3-8B at batch 1/64/256 x context 1K/4K next to the bandwidth
#             floor, with a GEMM/attention breakdown (cuda_decode_bench_test), and the GEMM
#             algorithm bench (bench/gemm_bench.cu)
#   profile   ncu per-kernel times of one eager decode step (Qwen3-8B, batch 1 and 64, context 1K;
#             PROFILE_BATCHES, PROFILE_CONTEXT and cuda_decode_bench_test's ORIGAMI_BENCH_* settings,
#             e.g. the FP8 max-load step: ORIGAMI_BENCH_CONFIG=llama-3.1-8b ORIGAMI_BENCH_QUANTIZATION=fp8
#             ORIGAMI_BENCH_KV_DTYPE=fp8 PROFILE_BATCHES=1024 PROFILE_CONTEXT=640)
#   bench     throughput: `origami bench` (3 workloads x Qwen3-8B, Llama-3.1-8B shapes, dummy
#             weights) and HF generate() (scripts/hf_generate_bench.py) on the first workload
#   compress  throughput under KV compression: Qwen3-8B shape, 256 x (128 -> 4096), ignore_eos,
#             block 256; full KV next to each COMPRESS_RUNS entry (policy:budget:async|sync[:groups[:opts]],
#             opts = comma-separated policy options key=value, e.g. allocation=global,
#             groups = hpN for --heads-per-group N, or budgets for a synthetic
#             --kv-head-budgets file, scripts/make_synthetic_head_budgets.py, ratios uniform in
#             [0.1, 0.6]; scripts/gpu_head_budgets.sh runs the full comparison); fastkvzip runs
#             with --kv-gates random (dummy weights have no trained gates). fastkvzip's default is
#             the global threshold on per-head pages: its uniform budgets on one group are
#             fastkvzip:1024:async::allocation=uniform,page_aligned=0
#   gates     the cost of Fast KVzip's gates at the Qwen3-8B shape (cuda_gate_bench_test: the gates
#             alone, decode steps and prefill chunks with and without them)
#   fidelity  `origami eval` sweeps on origami-tiny-qwen3: scripts/gpu_fidelity.sh (every registered
#             policy, retrieval prefill / context / stream, perplexity, blocks 16 and 256)
#   ragged    head groups (TANGRAM ragged paging): the kernel and engine tests of the CUDA head
#             groups and bench/ragged_attention_bench.cu (split map vs no map vs one group, --long,
#             --per-head: per-head pages at block 256 against the bandwidth floor)
#   tune      stream-mode retrieval of policy variants on a tuning set built from the papers
#             (scripts/make_retrieval_set.py; never the dev set the results are reported on):
#             TUNE_VARIANTS="policy[,policy] [key=value ...];..." (see the default below)
#   all       everything (about 15 minutes: more than one 10-minute device call allows)
# Modes combine with commas: `scripts/gpu_run.sh tests,roofline`. Full logs go to $OUT (or
# /tmp/origami-gpu), at most 8 files; a summary table is printed last (and kept in summary.txt).
#
# Fixtures and the device's missing headers come from .devdata (see scripts/lib/gpu_common.sh).
# BUILD (default build-gpu) may point outside the tree so that a warm machine keeps it.
set -uo pipefail
source "$(dirname "$0")/lib/gpu_common.sh"
gpu_script_init /tmp/origami-gpu
MODES=",${1:-tests},"
[ "$MODES" = ",all," ] && MODES=",quick,tests,roofline,bench,"
case "$MODES" in *,tests,*) MODES="$MODES,quick," ;; esac
has() { [[ "$MODES" == *",$1,"* ]]; }
declare -A RESULT
T_START=$(date +%s)
elapsed() { echo "$(( $(date +%s) - T_START ))s"; }

gpu_device_info "$OUT/build.log"
RESULT[0_device]="$GPU_DEVICE"

# ---------------------------------------------------------------- build
targets=()
if ! has quick; then  # only what the chosen modes run
  { has roofline || has profile; } && targets+=(cuda_decode_bench_test)
  has gates && targets+=(cuda_gate_bench_test)
  { has bench || has compress || has fidelity || has tune; } && targets+=(origami_cli)
  has ragged && targets+=(attention_ragged_test engine_cuda_head_groups_test)
fi
has ragged && targets+=(ragged_attention_bench)  # not part of `all`
# Keep going past targets of modules that do not build, so the GPU tests still run.
if has quick && has ragged; then  # all, then the benchmark
  gpu_build "$BUILD" "$OUT/build.log" || exit 1
fi
gpu_build "$BUILD" "$OUT/build.log" "${targets[@]}" || exit 1
RESULT[1_build]="rc=$GPU_BUILD_RC (${GPU_BUILD_SECONDS}s, targets: ${targets[*]:-all})"
grep -E "error|FAILED" "$OUT/build.log" | head -20

# ---------------------------------------------------------------- quick: GPU tests
if has quick; then
  t0=$(date +%s)
  (cd "$BUILD" && OMP_NUM_THREADS=16 timeout 420 ctest -L gpu --output-on-failure --timeout 300 -j2) > "$OUT/ctest_gpu.log" 2>&1
  RESULT[2_ctest_gpu]="rc=$? ($(( $(date +%s) - t0 ))s) $(grep -E 'tests passed' "$OUT/ctest_gpu.log")"
  grep -E "Failure|FAILED|Expected|Which is" "$OUT/ctest_gpu.log" | head -30
  # The backend's end-to-end numbers (ctest shows output of failing tests only).
  { echo "==== cuda_backend_e2e_test"; "$BUILD/tests/cuda_backend_e2e_test"; } >> "$OUT/ctest_gpu.log" 2>&1
  RESULT[2_cuda_e2e]="rc=$? $(grep -cE '^\[       OK' "$OUT/ctest_gpu.log") OK lines"
  grep -E "^\[tiny|rel err|agrees|available" "$OUT/ctest_gpu.log" | head -30
fi

# ---------------------------------------------------------------- tests: HF comparison, CLI
if has tests; then
  t0=$(date +%s)
  PYTHONUNBUFFERED=1 timeout 300 python3 scripts/hf_compare.py "$BUILD" > "$OUT/hf_compare.log" 2>&1
  RESULT[3_hf_compare]="rc=$? ($(( $(date +%s) - t0 ))s) $(grep HF_COMPARE "$OUT/hf_compare.log" | cut -c12-)"
  grep -vE "Writing model|Loading|it/s\]" "$OUT/hf_compare.log" | tail -40
  CLI=$BUILD/origami
  M=$SH/models/origami-tiny-qwen3
  for dev in cuda cpu; do
    timeout 120 "$CLI" generate --model "$M" --device $dev --prompt "The history of the city" --max-tokens 32 \
      --temperature 0 > "/tmp/generate_$dev.txt" 2>&1
    echo "generate --device $dev rc=$?" >> "$OUT/cli.log"; tail -3 "/tmp/generate_$dev.txt" >> "$OUT/cli.log"
  done
  if diff -q <(tail -1 /tmp/generate_cuda.txt) <(tail -1 /tmp/generate_cpu.txt) >/dev/null; then
    RESULT[3_cli_greedy]="same text on cuda and cpu"
  else
    RESULT[3_cli_greedy]="differs or failed: $(tail -1 /tmp/generate_cuda.txt | cut -c1-100)"
  fi
fi

# ---------------------------------------------------------------- roofline
if has roofline; then
  t0=$(date +%s)
  ORIGAMI_CUDA_BENCH=1 timeout 300 "$BUILD/tests/cuda_decode_bench_test" > "$OUT/roofline.log" 2>&1
  RESULT[4_roofline]="rc=$? ($(( $(date +%s) - t0 ))s)"
  grep -E "^(BENCH|ROOFLINE|BREAKDOWN)" "$OUT/roofline.log"
  n=0
  while read -r line; do n=$((n+1)); RESULT[4_roofline_$n]="$line"; done < <(grep ROOFLINE "$OUT/roofline.log" \
    | sed -E 's/^ROOFLINE qwen3-8b graphs=1 //; s/ \(weights.*\)//')
  if [ "${GEMM_BENCH:-1}" = 1 ]; then
    nvcc -std=c++17 -O3 -arch=sm_90 bench/gemm_bench.cu -lcublasLt -lcublas -o /tmp/gemm_bench >> "$OUT/build.log" 2>&1 \
      && timeout 120 /tmp/gemm_bench >> "$OUT/roofline.log" 2>&1
    RESULT[4_gemm_bench]="rc=$? $(grep 'step GEMMs at m=64' "$OUT/roofline.log" | cut -c11-)"
    grep GEMMBENCH "$OUT/roofline.log"
  fi
fi

# ---------------------------------------------------------------- profile: ncu, one eager step
if has profile; then
  for b in ${PROFILE_BATCHES:-1 64}; do
    ORIGAMI_CUDA_PROFILE=1 ORIGAMI_BENCH_BATCHES=$b ORIGAMI_BENCH_CONTEXTS=${PROFILE_CONTEXT:-1024} timeout 240 \
      ncu --profile-from-start off --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --print-units base \
      --log-file /tmp/ncu_$b.csv "$BUILD/tests/cuda_decode_bench_test" --gtest_filter='*ProfileOneStep' >> "$OUT/profile.log" 2>&1
    RESULT[7_profile_b$b]="rc=$? $(grep PROFILE "$OUT/profile.log" | tail -1)"
    # Per-kernel totals of the step, largest first.
    python3 "$ROOT/scripts/lib/ncu_kernel_totals.py" "/tmp/ncu_$b.csv" "batch=$b" | tee -a "$OUT/profile.log"
  done
fi

# ---------------------------------------------------------------- bench: throughput
if has bench; then
  CLI=$BUILD/origami
  # 512 running sequences (the largest graph bucket), 8192 new tokens per step (the backend's
  # initial activation capacity): see docs/benchmarks.md.
  SCHED=${SCHED:-"--max-num-seqs 512 --max-num-batched-tokens 8192"}
  echo "origami bench flags: $SCHED" > "$OUT/bench.log"
  for cfg in ${BENCH_CONFIGS:-qwen3-8b llama-3.1-8b}; do
    # prompts:input:output
    for w in ${BENCH_WORKLOADS:-256:128:1024 1024:128:128 256:1024:1024}; do
      IFS=: read -r -a wl <<< "$w"
      set -- "${wl[@]}"
      t0=$(date +%s)
      echo "==== $cfg prompts=$1 in=$2 out=$3" >> "$OUT/bench.log"
      # shellcheck disable=SC2086
      timeout 240 "$CLI" bench --model "$SH/configs/$cfg" --dummy-weights --tokenizer "$BENCH_TOKENIZER" \
        --device cuda --num-prompts "$1" --input-len "$2" --output-len "$3" $SCHED --quiet > /tmp/bench.txt 2>&1
      rc=$?
      cat /tmp/bench.txt >> "$OUT/bench.log"
      RESULT["5_${cfg}_${1}x${2}+${3}"]="rc=$rc ($(( $(date +%s) - t0 ))s) $(grep -E 'output throughput' /tmp/bench.txt | sed 's/output throughput *//') $(grep -E 'preemptions' /tmp/bench.txt | tr -s ' ')"
    done
  done
  grep -E "^====|output throughput|wall|peak|preempt|error" "$OUT/bench.log"
  for cfg in ${HF_CONFIGS-qwen3-8b llama-3.1-8b}; do
    t0=$(date +%s)
    PYTHONUNBUFFERED=1 timeout 300 python3 scripts/hf_generate_bench.py --config "$SH/configs/$cfg" --batch 128 \
      --input-len 128 --output-len 1024 --json >> "$OUT/hf_generate.log" 2>&1
    RESULT["6_hf_${cfg}_128x128+1024"]="rc=$? ($(( $(date +%s) - t0 ))s) $(grep HF_GENERATE "$OUT/hf_generate.log" | grep "$cfg" | sed -E 's/.*= ([0-9.]+ tok\/s).*/\1/')"
  done
  grep -E "HF_GENERATE|Error|error" "$OUT/hf_generate.log" | tail -6
fi

# ---------------------------------------------------------------- compress: throughput under compression
if has compress; then
  CLI=$BUILD/origami
  SCHED=${SCHED:-"--max-num-seqs 512 --max-num-batched-tokens 8192"}
  W=${COMPRESS_WORKLOAD:-256:128:4096}
  IFS=: read -r -a wl <<< "$W"
  # full KV gets the whole pool (--query-slots -1: no query slots, no global-score pages).
  for run in ${COMPRESS_RUNS:-full:0:async zipage:2048:async zipage:1024:async zipage:2048:sync zipage:1024:sync}; do
    IFS=: read -r pol budget mode groups opts <<< "$run"
    flags=(--kv-policy "$pol")
    for o in ${opts//,/ }; do flags+=(--kv-policy-opt "$o"); done
    case "${groups:-}" in
      hp*) flags+=(--heads-per-group "${groups#hp}") ;;
      budgets)  # synthetic (dummy weights cannot be calibrated): ratios uniform in [0.1, 0.6]
        python3 scripts/make_synthetic_head_budgets.py --config "$SH/configs/qwen3-8b/config.json" \
          --output /tmp/qwen3-8b_synthetic_budgets.json --floor 0.1 --alpha 1 --beta 1 --span 0.5 --seed 7
        flags+=(--kv-head-budgets /tmp/qwen3-8b_synthetic_budgets.json) ;;
    esac
    if [ "$pol" = full ]; then flags+=(--query-slots -1); else flags+=(--kv-budget "$budget"); fi
    [ "$pol" = fastkvzip ] && flags+=(--kv-gates random)
    [ "$mode" = sync ] && flags+=(--no-async-compression)
    t0=$(date +%s)
    echo "==== qwen3-8b prompts=${wl[0]} in=${wl[1]} out=${wl[2]} block=256 $run" >> "$OUT/compress.log"
    # shellcheck disable=SC2086
    timeout 420 "$CLI" bench --model "$SH/configs/qwen3-8b" --dummy-weights --tokenizer "$BENCH_TOKENIZER" \
      --device cuda --num-prompts "${wl[0]}" --input-len "${wl[1]}" --output-len "${wl[2]}" --block-size 256 \
      "${flags[@]}" $SCHED --quiet --json > /tmp/compress.json 2> /tmp/compress.err
    rc=$?
    cat /tmp/compress.json /tmp/compress.err >> "$OUT/compress.log"
    RESULT["8_compress_$run"]="rc=$rc ($(( $(date +%s) - t0 ))s) $(gpu_bench_summary /tmp/compress.json)"
  done
  grep -E "^====|error" "$OUT/compress.log"
fi

# ---------------------------------------------------------------- gates: Fast KVzip gate cost
if has gates; then
  t0=$(date +%s)
  ORIGAMI_CUDA_BENCH=1 timeout 300 "$BUILD/tests/cuda_gate_bench_test" > "$OUT/gates.log" 2>&1
  RESULT[8_gates]="rc=$? ($(( $(date +%s) - t0 ))s)"
  grep -E "^GATE|Failure|error" "$OUT/gates.log"
fi

# ---------------------------------------------------------------- fidelity: eval sweeps, tiny model
if has fidelity; then
  # scripts/gpu_fidelity.sh runs them (every registered policy, prefill / context / stream,
  # blocks 16 and 256; its FIDELITY_* settings pass through) on the binary just built.
  t0=$(date +%s)
  ORIGAMI_BIN=$BUILD/origami OUT=$OUT scripts/gpu_fidelity.sh
  RESULT[9_fidelity]="rc=$? ($(( $(date +%s) - t0 ))s) tables in fidelity_tables.md"
fi

# ---------------------------------------------------------------- ragged: head groups (TANGRAM)
if has ragged; then
  t0=$(date +%s)
  for t in attention_ragged_test engine_cuda_head_groups_test; do
    OMP_NUM_THREADS=16 timeout 300 "$BUILD/tests/$t" >> "$OUT/ragged.log" 2>&1
    RESULT["10_$t"]="rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/ragged.log" | tail -1)"
  done
  grep -E "^\[ *(OK|FAILED)|Failure|head groups\]" "$OUT/ragged.log"
  # Head groups (split map vs plain splits, the rule's pick per row), their long-group rows at
  # batch 1-2, and per-head pages (block 256, bf16 and FP8) against the bandwidth floor.
  { timeout 300 "$BUILD/ragged_attention_bench" && timeout 120 "$BUILD/ragged_attention_bench" --long &&
      timeout 300 "$BUILD/ragged_attention_bench" --per-head; } > "$OUT/ragged_bench.log" 2>&1
  RESULT[10_ragged_bench]="rc=$? ($(( $(date +%s) - t0 ))s)"
  cat "$OUT/ragged_bench.log"
fi

# ---------------------------------------------------------------- tune: variants on the tuning set
if has tune; then
  CLI=$BUILD/origami
  M=$SH/models/origami-tiny-qwen3
  TUNE_DATA=${TUNE_DATA:-/tmp/retrieval_tune.jsonl}
  [ -f "$TUNE_DATA" ] || python3 scripts/make_retrieval_set.py --out "$TUNE_DATA" "$SH"/papers/*.txt
  TB=${TUNE_BLOCK:-16}
  DEFAULT_VARIANTS="streaming;zipage-flash,zipage-lightning;zipage-flash,zipage-lightning window=8"
  IFS=';' read -r -a variants <<< "${TUNE_VARIANTS:-$DEFAULT_VARIANTS}"
  # TUNE_PPL=1: perplexity too, on the papers' text (not the dev text either).
  tasks=(retrieval)
  if [ "${TUNE_PPL:-0}" = 1 ]; then
    tasks+=(ppl)
    cat "$SH"/papers/*.txt > /tmp/papers_text.txt
  fi
  : > "$OUT/tune.jsonl"
  for v in "${variants[@]}"; do
    read -r -a words <<< "$v"
    opts=()
    for kv in "${words[@]:1}"; do opts+=(--kv-policy-opt "$kv"); done
    for task in "${tasks[@]}"; do
      if [ "$task" = retrieval ]; then input=(--data "$TUNE_DATA" --mode stream); else input=(--text /tmp/papers_text.txt); fi
      timeout 300 "$CLI" eval "$task" --model "$M" --device cuda --block-size "$TB" "${input[@]}" \
        --kv-policy "${words[0]}" --kv-budget "${TUNE_BUDGETS:-256,512,1024}" "${opts[@]}" --json --quiet \
        --max-num-seqs 128 --query-slots 128 2>> "$OUT/tune.err" \
        | python3 -c 'import json,sys; [print(json.dumps(dict(json.loads(l), variant=sys.argv[1]))) for l in sys.stdin]' "$v" \
        >> "$OUT/tune.jsonl"
    done
  done
  python3 - "$OUT/tune.jsonl" > "$OUT/tune_table.txt" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
budgets = sorted({r["budget"] for r in rows if r["budget"]})
table = {}
for r in rows:
    key = (r["variant"], r["policy"]) if r["budget"] else ("(full KV)", "full")
    metric = "accuracy" if r["task"] == "retrieval" else "ppl"
    table.setdefault(key, {})[(r["task"], r["budget"])] = r[metric]
tasks = sorted({r["task"] for r in rows}, reverse=True)  # retrieval first
cols = [(t, b) for t in tasks for b in budgets]
print("%-56s %s" % ("variant / policy", " ".join("%9s" % ("%s@%d" % (t[:3], b)) for t, b in cols)))
for (variant, policy), got in table.items():
    if policy == "full":
        print("%-56s %s" % ("full KV", " ".join("%9.3f" % got[(t, 0)] for t in tasks if (t, 0) in got)))
        continue
    label = " ".join([policy] + variant.split()[1:])
    print("%-56s %s" % (label, " ".join("%9.3f" % got.get(c, float("nan")) for c in cols)))
PYEOF
  cat "$OUT/tune_table.txt"
  RESULT[9_tune]="$(wc -l < "$OUT/tune.jsonl") points, table in tune_table.txt"
fi

gpu_print_summary "summary ($(elapsed))" "$OUT/summary.txt"
