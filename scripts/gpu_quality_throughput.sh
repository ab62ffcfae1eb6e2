#!/usr/bin/env bash
# Both halves of the quality-vs-throughput chart on the GPU machine, spread over its GPUs:
# - throughput: output tok/s of every policy at budgets that are the same shares of the context as
#   the retrieval eval's (QT_SHARES of 128 + 4096 = 4224 tokens, rounded down to whole blocks),
#   Qwen3-8B shape, dummy weights, 256 x (128 -> 4096), block 256, one GPU a run; full KV is the
#   reference. Each `origami bench --json` line is tagged with "policy", "share" and "budget" and
#   appended to $OUT/quality_throughput_bench.jsonl;
# - accuracy (QT_EVAL=1): `origami eval retrieval` on the dev set with the CUDA backend, per mode
#   and policy (the tiny model; budgets QT_SHARES of 2048 tokens as scripts/quality_vs_throughput.sh
#   uses), written to $OUT/eval_<mode>_<policy>.jsonl.
# Every run is one job of gpu_queue_run (scripts/lib/gpu_common.sh): one worker per GPU, longest
# jobs first. Then join them here or on any machine:
#   scripts/quality_vs_throughput.py --eval $OUT/eval_*.jsonl --bench $OUT/quality_throughput_bench.jsonl \
#     --svg docs/plots/quality_vs_throughput.svg --table docs/plots/quality_vs_throughput.md
#   QT_POLICIES  comma-separated (streaming,snapkv,keydiff,pagedeviction,zipage,fastkvzip)
#   QT_SHARES    ("0.125 0.25 0.5"); QT_PROMPTS (256), QT_IN (128), QT_OUT (4096), QT_BLOCK (256)
#   QT_FULL      1: bench full KV too (0 when an earlier call measured it)
#   QT_EVAL      1: the accuracy half too (0: throughput only); QT_MODES ("context stream"),
#                QT_EVAL_LIMIT (documents, 0 = all 100), QT_EVAL_SHARES (QT_SHARES)
#   QT_EXTRA_JOBS a file of more job lines (bash commands) to run first on the same queue
#   QT_TIMEOUT   seconds per run (420); each bench run is ~1-4 min on an H100, an eval well under
#   QT_RESULTS   where the results go ($OUT). The device tool brings back only a few files of $OUT:
#                give a folder outside it, and the script packs it into $OUT/quality_throughput.tgz at
#                the end (wrap the script in `timeout` below the call's limit so that the end comes)
# Internal: `--bench POLICY SHARE BUDGET FLAGS...` and `--eval MODE POLICY` run one job.
set -uo pipefail
source "$(dirname "$0")/lib/gpu_common.sh"
gpu_script_init /tmp/origami-gpu
PACK_TO=
if [ -n "${QT_RESULTS:-}" ] && [ "${1:-}" != --bench ] && [ "${1:-}" != --eval ]; then
  mkdir -p "$QT_RESULTS"
  PACK_TO=$OUT
  OUT=$(cd "$QT_RESULTS" && pwd)
fi
export OUT BUILD
TOK=$BENCH_TOKENIZER  # any tokenizer: the bench draws random prompt ids (gpu_common.sh)
N=${QT_PROMPTS:-256}; IN=${QT_IN:-128}; OUTLEN=${QT_OUT:-4096}; BLOCK=${QT_BLOCK:-256}
RESULTS=$OUT/quality_throughput_bench.jsonl
POLICIES=${QT_POLICIES:-streaming,snapkv,keydiff,pagedeviction,zipage,fastkvzip}
SHARES=${QT_SHARES:-0.125 0.25 0.5}
EVAL_CONTEXT=2048  # the dev documents' ~2065 tokens, as scripts/quality_vs_throughput.sh

bench_one() {  # $1 policy, $2 share, $3 budget, then the flags
  local pol=$1 share=$2 budget=$3; shift 3
  timeout "${QT_TIMEOUT:-420}" "$BUILD/origami" bench --model "$SH/configs/qwen3-8b" --dummy-weights --tokenizer "$TOK" \
    --device cuda --num-prompts "$N" --input-len "$IN" --output-len "$OUTLEN" --block-size "$BLOCK" "$@" --quiet --json \
    > "$OUT/qt_${pol}_$budget.json" 2> "$OUT/qt_${pol}_$budget.err"
  local rc=$?
  python3 - "$OUT/qt_${pol}_$budget.json" "$pol" "$share" "$budget" "$rc" >> "$RESULTS" <<'PY'
import json, sys
f, pol, share, budget, rc = sys.argv[1:]
try:
    j = json.load(open(f))
except Exception:
    print(f"{pol} {budget}: failed rc={rc}", file=sys.stderr); sys.exit()
j.update(policy=pol, share=float(share), budget=int(budget))
print(json.dumps(j))
print(f"{pol:>14} share {share:>6} budget {budget:>5}: {j['output_tokens_per_second']:,.0f} tok/s, "
      f"peak running {j['peak_running_requests']}, preemptions {j['num_preemptions']}", file=sys.stderr)
PY
}

eval_one() {  # $1 mode, $2 policy (full: no budget)
  local mode=$1 pol=$2 flags=()
  if [ "$pol" != full ]; then
    flags+=(--kv-budget "$(python3 -c 'import sys; c=int(sys.argv[1]); print(",".join(str(round(float(s)*c)) for s in sys.argv[2:]))' \
      "$EVAL_CONTEXT" ${QT_EVAL_SHARES:-$SHARES})")
    # Fast KVzip scores with the tiny model's trained gates.
    [ "$pol" = fastkvzip ] && flags+=(--kv-gates "$ROOT/assets/gates/origami-tiny-qwen3.safetensors")
  fi
  timeout "${QT_TIMEOUT:-420}" "$BUILD/origami" eval retrieval --model "$SH/models/origami-tiny-qwen3" --device cuda \
    --data "$SH/data/retrieval_dev.jsonl" --limit "${QT_EVAL_LIMIT:-0}" --mode "$mode" --kv-policy "$pol" "${flags[@]}" \
    --json --quiet > "$OUT/eval_${mode}_$pol.jsonl" 2> "$OUT/eval_${mode}_$pol.err"
  echo "eval $mode $pol rc=$?: $(python3 -c 'import json,sys; print(" ".join("%s:%.3f" % (j.get("budget", "-"), j["accuracy"]) for j in map(json.loads, open(sys.argv[1])) if "accuracy" in j))' \
    "$OUT/eval_${mode}_$pol.jsonl" 2>/dev/null)"
}

case "${1:-}" in
  --bench) shift; bench_one "$@"; exit ;;
  --eval) shift; eval_one "$@"; exit ;;
esac

gpu_device_info "$OUT/build.log"
gpu_build "$BUILD" "$OUT/build.log" origami_cli || exit 1
echo "build rc=$GPU_BUILD_RC (${GPU_BUILD_SECONDS}s) on $GPU_DEVICE"
JOBS=$OUT/qt_jobs.txt
: > "$JOBS"
[ -n "${QT_EXTRA_JOBS:-}" ] && cat "$QT_EXTRA_JOBS" >> "$JOBS"
SELF=$ROOT/scripts/gpu_quality_throughput.sh
[ "${QT_FULL:-1}" = 1 ] && echo "$SELF --bench full 1 0 --query-slots -1" >> "$JOBS"
# The larger the budget the longer the run: largest shares first.
for share in $(printf '%s\n' $SHARES | sort -gr); do
  budget=$(python3 -c "import sys; b=int(float(sys.argv[1])*(int(sys.argv[2])+int(sys.argv[3])))//int(sys.argv[4])*int(sys.argv[4]); print(max(b, int(sys.argv[4])))" \
    "$share" "$IN" "$OUTLEN" "$BLOCK")
  for pol in ${POLICIES//,/ }; do
    flags=(--kv-policy "$pol" --kv-budget "$budget")
    # fastkvzip's default is its global threshold on per-head pages; random gates of the model's shape.
    [ "$pol" = fastkvzip ] && flags+=(--kv-gates random)
    echo "$SELF --bench $pol $share $budget ${flags[*]}" >> "$JOBS"
  done
done
if [ "${QT_EVAL:-1}" = 1 ]; then
  for mode in ${QT_MODES:-context stream}; do
    for pol in full ${POLICIES//,/ }; do echo "$SELF --eval $mode $pol" >> "$JOBS"; done
  done
fi
echo "$(wc -l < "$JOBS") jobs on $(nvidia-smi -L | wc -l) GPU(s)"
gpu_queue_run "$JOBS"
echo "results: $RESULTS and $OUT/eval_*.jsonl (join them with scripts/quality_vs_throughput.py)"
[ -s "$RESULTS" ] && python3 -c 'import json,sys
for j in map(json.loads, open(sys.argv[1])):
    print("%-14s share %-6s budget %5d: %8.0f tok/s, peak running %d, preemptions %d" % (j["policy"], j["share"], j["budget"],
          j["output_tokens_per_second"], j["peak_running_requests"], j["num_preemptions"]))' "$RESULTS"
[ -n "$PACK_TO" ] && tar czf "$PACK_TO/quality_throughput.tgz" -C "$OUT" --exclude=build.log . && echo "packed: $PACK_TO/quality_throughput.tgz"
