#!/usr/bin/env bash
# Max-load throughput as trtllm-bench measures it: `origami bench` with every prompt submitted at
# once, up to --max-num-seqs running, dummy weights (tokenizer-free random prompts), on one GPU.
#   MAXLOAD_RUNS   space-separated runs, each  name:config:prompts:in:out:quant:kvdtype:policy:budget[:extra]
#                  (quant none|fp8, kvdtype bf16|fp8, policy full, full-reserved (--reserve-full-kv:
#                  admitted only when prompt + output fit, never preempted) or a --kv-policy, budget tokens;
#                  fastkvzip runs its default (global threshold in whole pages, per-head pages),
#                  fastkvzip-uniform its uniform budgets on one group); extra: more bench flags joined
#                  by '+', e.g. --fp8-fast-accumulation or --fp8-fast-accumulation+--fp8-fused-quantize
#   MAXLOAD_SEQS   --max-num-seqs (default 2048), MAXLOAD_TOKENS --max-num-batched-tokens (8192)
#   MAXLOAD_BLOCK  --block-size (default 256 under compression; full KV: the engine's default, 32 on CUDA)
#   MAXLOAD_GPU_MEM  --gpu-memory-utilization (default 0.9; TensorRT-LLM's table used 0.95 where it fit)
# TensorRT-LLM's published table ran 3000 requests at 128/2048 and 1000/1000 and 1500 at 128/4096
# (its perf-overview's dataset table): use the same prompt counts when comparing with it.
# "while full": the rate over the steps that ran at least 95% of the peak batch (a run of equal
# lengths is waves; its last wave may run thin for a whole output length).
# Logs and JSON per run go to $OUT (default /tmp/origami-gpu); each run's row is printed when it
# ends (MAXLOAD_ROW) and appended to $OUT/maxload_table.md; the whole table is printed last, with
# TensorRT-LLM's published FP8 numbers (Llama-3.1-8B, TP 1, on the GPU this runs on: H100 SXM or
# H200 SXM; none for others) beside the shapes they cover, and each run's mean SM clock (its
# minimum), mean power and the throttle reasons nvidia-smi saw (every 500 ms, after the run's
# first 2 s; scripts/lib/smi_phases.py).
set -uo pipefail
source "$(dirname "$0")/lib/gpu_common.sh"
gpu_script_init /tmp/origami-gpu
gpu_device_info "$OUT/build.log"
gpu_build "$BUILD" "$OUT/build.log" origami_cli || exit 1
echo "build rc=$GPU_BUILD_RC (${GPU_BUILD_SECONDS}s) on $GPU_DEVICE"
# The bench draws random prompt ids from the model's vocabulary; the engine still loads a
# tokenizer (any will do: gpu_common.sh's BENCH_TOKENIZER).
TOK=${MAXLOAD_TOKENIZER:-$BENCH_TOKENIZER}
RUNS=${MAXLOAD_RUNS:-"full:llama-3.1-8b:1024:128:4096:fp8:fp8:full:0"}
# Its perf-overview's Llama 3.1 8B table, one column per GPU: the comparison is only like for like
# on the GPU it was measured on (the H200 has the H100's compute and 1.4x its memory bandwidth),
# and for the llama-3.1-8b config only (other models' rows get none).
declare -A TRT=()
case "$GPU_DEVICE" in
  *H100*) TRT=([128:2048]=22714 [128:4096]=14325 [1000:1000]=15220) ;;
  *H200*) TRT=([128:2048]=26221 [128:4096]=18027 [1000:1000]=17744) ;;
esac
rows=()
# Clocks and power over each run (the H200 holds its 700 W cap at max load, and its SM clocks drop
# with it: docs/benchmarks.md, "The power cap"), one column of the table.
gpu_smi_start "$OUT/smi.csv"
: > "$OUT/phases.txt"
for run in $RUNS; do
  IFS=: read -r name cfg n in out quant kv pol budget extra <<< "$run"
  flags=(--quantization "$quant" --kv-cache-dtype "$kv")
  [ -n "${extra:-}" ] && { IFS=+ read -r -a more <<< "$extra"; flags+=("${more[@]}"); }
  if [ "$pol" = full ] || [ "$pol" = full-reserved ]; then
    flags+=(--query-slots -1)
    [ -n "${MAXLOAD_BLOCK:-}" ] && flags+=(--block-size "$MAXLOAD_BLOCK")
    [ "$pol" = full-reserved ] && flags+=(--reserve-full-kv)
  else
    flags+=(--kv-policy "${pol%-uniform}" --kv-budget "$budget" --block-size "${MAXLOAD_BLOCK:-256}")
    [ "$pol" = fastkvzip ] && flags+=(--kv-gates random --heads-per-group 1 --kv-policy-opt allocation=global
                                      --kv-policy-opt page_aligned=1)
    [ "$pol" = fastkvzip-uniform ] && flags+=(--kv-gates random --kv-policy-opt allocation=uniform
                                              --kv-policy-opt page_aligned=0)
  fi
  t0=$(date +%s)
  echo "$name $(date +%s.%N)" >> "$OUT/phases.txt"
  timeout "${MAXLOAD_TIMEOUT:-420}" "$BUILD/origami" bench --model "$SH/configs/$cfg" --dummy-weights --tokenizer "$TOK" \
    --device cuda --num-prompts "$n" --input-len "$in" --output-len "$out" --max-num-seqs "${MAXLOAD_SEQS:-2048}" \
    --max-num-batched-tokens "${MAXLOAD_TOKENS:-8192}" --gpu-memory-utilization "${MAXLOAD_GPU_MEM:-0.9}" \
    "${flags[@]}" --quiet --json > "$OUT/maxload_$name.json" \
    2> "$OUT/maxload_$name.err"
  rc=$?
  echo "end $(date +%s.%N)" >> "$OUT/phases.txt"
  tail -3 "$OUT/maxload_$name.err"
  rows+=("$(python3 - "$OUT/maxload_$name.json" "$name" "$cfg" "$n" "$in" "$out" "$quant" "$kv" "$pol" "$budget" \
    "$([ "$cfg" = llama-3.1-8b ] && echo "${TRT[$in:$out]:-}")" "$rc" "$(( $(date +%s) - t0 ))" <<'PY'
import json, sys
f, name, cfg, n, i, o, q, kv, pol, budget, trt, rc, secs = sys.argv[1:]
try:
    j = json.load(open(f))
except Exception:
    print(f"| {name} | {cfg} | {n} x ({i} -> {o}) | {q}/{kv} | {pol} {budget} | failed rc={rc} ({secs} s) | | | | | |"); sys.exit()
tps = j["output_tokens_per_second"]
vs = f"{tps / float(trt):.2f}x of {trt}" if trt else ""
# A run stopped by MAXLOAD_TIMEOUT reports the requests it finished: its rate is not the run's.
done = j.get("completed", int(n))
if done < int(n):
    tps_cell = f"({tps:,.0f}: cut at {float(j['wall_seconds']):.0f} s, {done} of {n} done)"
    vs = f"({vs})" if vs else ""
else:
    tps_cell = f"{tps:,.0f}"
# The rate while at least 95% of the peak batch ran (origami bench's full_batch_*): what a full
# wave sustains, apart from the run's thin last wave.
full = f"{j['full_batch_tokens_per_second']:,.0f} ({100 * j['full_batch_time_share']:.0f}% of wall)" \
    if j.get("full_batch_steps", 0) > 0 else ""
print(f"| {name} | {cfg} | {n} x ({i} -> {o}) | {q}/{kv} | {pol}{' ' + budget if not pol.startswith('full') else ''} | "
      f"{tps_cell} | {full} | {vs} | {j['peak_running_requests']} | {j['num_preemptions']} | "
      f"{j.get('schedule_ms_per_step', 0):.3f} / {1e3 * j['execute_seconds'] / max(1, j['num_steps']):.2f} / "
      f"{1e3 * j['wall_seconds'] / max(1, j['num_steps']):.2f} ms |")
PY
) $(python3 "$ROOT/scripts/lib/smi_phases.py" --cell "$name" "$OUT/phases.txt" "$OUT/smi.csv" 2>/dev/null) |")
  # Each row as soon as its run ends (and in $OUT/maxload_table.md): a call whose limit is cut
  # short still reports the runs it finished.
  echo "MAXLOAD_ROW ${rows[-1]}"
  echo "${rows[-1]}" >> "$OUT/maxload_table.md"
done
kill "$GPU_SMI_PID" 2>/dev/null
echo
echo "| run | model | workload | weights/KV | KV policy | output tok/s | while full tok/s | vs TensorRT-LLM FP8 | peak running | preemptions | scheduler / execute / wall per step | SM clock (min) / power, throttle reasons |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
