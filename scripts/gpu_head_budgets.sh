#!/usr/bin/env bash
# Throughput with non-uniform head budgets on the GPU machine (TANGRAM, docs/benchmarks.md):
# builds origami, writes a synthetic head-budget file for the Qwen3-8B shape
# (scripts/make_synthetic_head_budgets.py: dummy weights cannot be calibrated), and runs
# `origami bench` (dummy weights, ignore_eos) for full KV, uniform budgets and non-uniform
# budgets in the same call, on two workloads:
#   reasoning  256 x (128 -> 4096): decode-time compression (zipage), uniform vs calibrated-style
#   long       256 x (4096 -> 256): prompt compression (snapkv uniform vs tangram)
# HB_RUNS overrides the runs: "name|workload|flags;..." (workload: reasoning or long).
# Logs under $OUT (or /tmp/origami-gpu-hb); the summary table comes last (summary.txt).
#   OUT=... BUILD=/tmp/build-gpu scripts/gpu_head_budgets.sh
set -uo pipefail
source "$(dirname "$0")/lib/gpu_common.sh"
gpu_script_init /tmp/origami-gpu-hb
declare -A RESULT
gpu_device_info "$OUT/build.log"
RESULT[0_device]="$GPU_DEVICE"
gpu_build "$BUILD" "$OUT/build.log" origami_cli || exit 1
RESULT[1_build]="rc=$GPU_BUILD_RC (${GPU_BUILD_SECONDS}s)"
grep -E "error" "$OUT/build.log" | head -20

BUDGETS=$OUT/budgets_qwen3_8b_synthetic.json
python3 scripts/make_synthetic_head_budgets.py --config "$SH/configs/qwen3-8b/config.json" --output "$BUDGETS" \
  | tee -a "$OUT/build.log"
declare -A WORKLOAD=(
  [reasoning]="--num-prompts 256 --input-len 128 --output-len 4096"
  [long]="--num-prompts 256 --input-len 4096 --output-len 256"
)
DEFAULT_RUNS="full|reasoning|--kv-policy full --query-slots -1;\
zipage1024|reasoning|--kv-policy zipage --kv-budget 1024;\
zipage512|reasoning|--kv-policy zipage --kv-budget 512;\
zipage1024_hb|reasoning|--kv-policy zipage --kv-budget 1024 --kv-head-budgets $BUDGETS;\
full|long|--kv-policy full --query-slots -1;\
snapkv1024|long|--kv-policy snapkv --kv-budget 1024;\
tangram1024|long|--kv-policy tangram --kv-budget 1024 --kv-head-budgets $BUDGETS"
IFS=';' read -r -a runs <<< "${HB_RUNS:-$DEFAULT_RUNS}"
for run in "${runs[@]}"; do
  IFS='|' read -r name wl flags <<< "$run"
  t0=$(date +%s)
  # shellcheck disable=SC2086
  timeout 420 "$BUILD/origami" bench --model "$SH/configs/qwen3-8b" --dummy-weights --tokenizer "$BENCH_TOKENIZER" \
    --device cuda --block-size 256 --max-num-seqs 512 --max-num-batched-tokens 8192 ${WORKLOAD[$wl]} $flags \
    --quiet --json > "$OUT/bench_${wl}_$name.json" 2> "$OUT/bench_${wl}_$name.err"
  rc=$?
  RESULT["2_${wl}_$name"]="rc=$rc ($(( $(date +%s) - t0 ))s) $(gpu_bench_summary "$OUT/bench_${wl}_$name.json")"
  tail -2 "$OUT/bench_${wl}_$name.err"
done
gpu_print_summary "head budgets" "$OUT/summary.txt"
