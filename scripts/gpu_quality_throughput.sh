#!/usr/bin/env bash
# The GPU half of the quality-vs-throughput chart (scripts/quality_vs_throughput.sh): output tok/s
# of every policy at budgets that are the same shares of the context as the retrieval eval's
# (QT_SHARES of 128 + 4096 = 4224 tokens, rounded down to whole blocks), Qwen3-8B shape, dummy
# weights, 256 x (128 -> 4096), block 256, one GPU; full KV is the reference. Each `origami bench
# --json` line is tagged with "policy", "share" and "budget" and appended to
# $OUT/quality_throughput_bench.jsonl, the file the CPU half reads as QT_BENCH.
#   QT_POLICIES  comma-separated (streaming,snapkv,keydiff,pagedeviction,zipage,fastkvzip); full always
#   QT_SHARES    ("0.125 0.25 0.5"); QT_PROMPTS (256), QT_IN (128), QT_OUT (4096), QT_BLOCK (256)
#   QT_TIMEOUT   seconds per run (420); split QT_POLICIES over several calls to stay within a
#                machine's per-command limit (each run is ~1-2 min on an H100)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source scripts/lib/gpu_common.sh
OUT=${OUT:-/tmp/origami-gpu}
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
gpu_shared_dir
gpu_device_info "$OUT/build.log"
gpu_build "$BUILD" "$OUT/build.log" origami_cli || exit 1
echo "build rc=$GPU_BUILD_RC (${GPU_BUILD_SECONDS}s) on $GPU_DEVICE"
TOK=$SH/models/origami-tiny-qwen3  # any tokenizer: the bench draws random prompt ids
N=${QT_PROMPTS:-256}; IN=${QT_IN:-128}; OUTLEN=${QT_OUT:-4096}; BLOCK=${QT_BLOCK:-256}
RESULTS=$OUT/quality_throughput_bench.jsonl
POLICIES=${QT_POLICIES:-streaming,snapkv,keydiff,pagedeviction,zipage,fastkvzip}
bench() {  # $1 policy, $2 share, $3 budget, then the flags
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
bench full 1 0 --query-slots -1
for pol in ${POLICIES//,/ }; do
  for share in ${QT_SHARES:-0.125 0.25 0.5}; do
    budget=$(python3 -c "import sys; b=int(float(sys.argv[1])*(int(sys.argv[2])+int(sys.argv[3])))//int(sys.argv[4])*int(sys.argv[4]); print(max(b, int(sys.argv[4])))" \
      "$share" "$IN" "$OUTLEN" "$BLOCK")
    flags=(--kv-policy "$pol" --kv-budget "$budget")
    # fastkvzip's default is its global threshold on per-head pages; random gates of the model's shape.
    [ "$pol" = fastkvzip ] && flags+=(--kv-gates random)
    bench "$pol" "$share" "$budget" "${flags[@]}"
  done
done
echo "results: $RESULTS (pass it to scripts/quality_vs_throughput.sh as QT_BENCH)"
