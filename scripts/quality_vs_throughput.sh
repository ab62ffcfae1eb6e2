#!/usr/bin/env bash
# The quality-vs-throughput chart (docs/plots/quality_vs_throughput.svg and its table): for each
# policy and budget share, retrieval accuracy on the dev set (context and stream modes, the tiny
# model, CPU) against output tok/s on the GPU (Qwen3-8B shape, 256 x (128 -> 4096), the budget the
# same share of the context), full KV the reference point.
#
#   1. GPU half (on the GPU machine): scripts/gpu_quality_throughput.sh writes tagged `origami bench
#      --json` lines to $OUT/quality_throughput_bench.jsonl; pass that file as QT_BENCH here.
#   2. CPU half (this script): `origami eval retrieval` per mode over every policy and share, then
#      scripts/quality_vs_throughput.py joins both into the chart and the table.
#
#   scripts/quality_vs_throughput.sh                 # reduced: the first 10 documents (QT_LIMIT)
#   scripts/quality_vs_throughput.sh --full          # all 100 dev documents (hours on 2 CPU cores)
#   QT_BENCH=/path/quality_throughput_bench.jsonl scripts/quality_vs_throughput.sh --full
#
# Settings (environment): ORIGAMI_BIN (build/origami), QT_POLICIES (comma-separated,
# "streaming,snapkv,keydiff,pagedeviction,zipage,fastkvzip"), QT_SHARES ("0.125 0.25 0.5"),
# QT_CONTEXT (2048: the ~2065-token dev documents; 256 / 512 / 1024 tokens), QT_MODES
# ("context stream"), QT_LIMIT (documents; 10, --full = 0 = all), QT_THREADS (0 = all cores),
# QT_DEVICE (cpu), QT_KV_MEMORY (8GiB on the CPU), QT_BENCH (the GPU half's JSON lines; none: accuracy only), OUT
# (/tmp/origami-qt), QT_SVG / QT_TABLE (docs/plots/quality_vs_throughput.{svg,md}).
set -euo pipefail
cd "$(dirname "$0")/.."
LIMIT=${QT_LIMIT:-10}
[ "${1:-}" = "--full" ] && LIMIT=0
CLI=${ORIGAMI_BIN:-build/origami}
SH=${SHARED:-../shared}
POLICIES=${QT_POLICIES:-streaming,snapkv,keydiff,pagedeviction,zipage,fastkvzip}
SHARES=${QT_SHARES:-0.125 0.25 0.5}
CONTEXT=${QT_CONTEXT:-2048}
MODES=${QT_MODES:-context stream}
OUT=${OUT:-/tmp/origami-qt}
SVG=${QT_SVG:-docs/plots/quality_vs_throughput.svg}
TABLE=${QT_TABLE:-docs/plots/quality_vs_throughput.md}
GATES=${QT_GATES:-assets/gates/origami-tiny-qwen3.safetensors}
mkdir -p "$OUT"
[ -x "$CLI" ] || { echo "no origami binary at '$CLI' (build origami_cli or set ORIGAMI_BIN)"; exit 1; }
BUDGETS=$(python3 -c 'import sys; c=int(sys.argv[1]); print(",".join(str(round(float(s)*c)) for s in sys.argv[2:]))' \
  "$CONTEXT" $SHARES)
FLAGS=(--device "${QT_DEVICE:-cpu}" --data "$SH/data/retrieval_dev.jsonl" --limit "$LIMIT" --threads "${QT_THREADS:-0}"
       --json --quiet)
# Context mode retains every document's cache until its question comes: 100 dev documents of the
# tiny model need ~2.4 GB of fp32 KV, more than the CPU's default pool of 1 GiB.
[ "${QT_DEVICE:-cpu}" = cpu ] && FLAGS+=(--kv-cache-memory "${QT_KV_MEMORY:-8GiB}")
# Fast KVzip scores with its trained gates (they cost the other policies nothing but the gate pass).
case ",$POLICIES," in *,fastkvzip,*) FLAGS+=(--kv-gates "$GATES") ;; esac
EVALS=()
for mode in $MODES; do
  echo "eval: mode $mode, policies full,$POLICIES, budgets $BUDGETS, limit $LIMIT" >&2
  "$CLI" eval retrieval "${FLAGS[@]}" --mode "$mode" --kv-policy "full,$POLICIES" --kv-budget "$BUDGETS" \
    > "$OUT/eval_$mode.jsonl" 2> "$OUT/eval_$mode.err" || { tail -5 "$OUT/eval_$mode.err"; exit 1; }
  EVALS+=("$OUT/eval_$mode.jsonl")
done
BENCH=()
[ -n "${QT_BENCH:-}" ] && BENCH=(--bench "$QT_BENCH")
mkdir -p "$(dirname "$SVG")" "$(dirname "$TABLE")"
python3 scripts/quality_vs_throughput.py --eval "${EVALS[@]}" "${BENCH[@]}" --eval-context "$CONTEXT" \
  --svg "$SVG" --table "$TABLE"
cat "$TABLE"
