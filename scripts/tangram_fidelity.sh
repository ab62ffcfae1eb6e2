#!/usr/bin/env bash
# TANGRAM's fidelity evidence (docs/fidelity.md, "Calibrated non-uniform budgets (tangram)") on
# origami-tiny-qwen3: retrieval accuracy of calibrated non-uniform budgets (`tangram`) against
# uniform `snapkv` holding the same KV bytes, and full KV, in prefill and context mode.
#
#   1. Budgets are calibrated on the training corpus only (never the dev set): the first 3 MB of
#      train_corpus.txt.gz, snapkv scorer, 50 windows of 2048 tokens, rho 0.25, alpha 2 (skipped
#      when TANGRAM_BUDGETS names a file).
#   2. Per mode, `tangram` at average budgets BUDGETS (tokens per (layer, KV head); 256,512,1024
#      are 12.5 / 25 / 50% of the ~2065-token documents), each prefill chunk compressed as produced,
#      and again with prefill_chunk_compression=0 (the whole prompt at once, as snapkv does), so
#      that the budgets' effect and the chunking's are seen apart.
#   3. Uniform `snapkv` at the bytes tangram's layout really holds: its budget is tangram's
#      kv_kept_paged_entries (eval's JSON: every group padded to its largest head and rounded up
#      to whole pages, averaged over every (layer, KV head)), rounded up, so the uniform baseline
#      never holds fewer bytes.
# Writes $OUT/tangram_{mode}.jsonl, tangram_whole_{mode}.jsonl, snapkv_{mode}.jsonl and a markdown
# table $OUT/tangram_fidelity.md (also printed).
#
#   scripts/tangram_fidelity.sh                                   # CPU, every document
#   TANGRAM_LIMIT=25 TANGRAM_THREADS=1 scripts/tangram_fidelity.sh  # the CPU subset of docs/fidelity.md
#
# Settings (environment): ORIGAMI_BIN (default build/origami), TANGRAM_DEVICE (cpu, or cuda with a
# CUDA build: head-group layouts run there too), TANGRAM_LIMIT (documents, 0 = all),
# TANGRAM_MODES ("prefill context"), TANGRAM_BUDGETS (256,512,1024), TANGRAM_BUDGETS_FILE (a
# calibrated file to use instead of calibrating), TANGRAM_THREADS (CPU threads, 0 = all),
# TANGRAM_CHUNK (--max-num-batched-tokens, 512), OUT (/tmp/origami-tangram).
set -euo pipefail
cd "$(dirname "$0")/.."
CLI=${ORIGAMI_BIN:-build/origami}
DEVICE=${TANGRAM_DEVICE:-cpu}
LIMIT=${TANGRAM_LIMIT:-0}
MODES=${TANGRAM_MODES:-prefill context}
BUDGETS=${TANGRAM_BUDGETS:-256,512,1024}
THREADS=${TANGRAM_THREADS:-0}
CHUNK=${TANGRAM_CHUNK:-512}
OUT=${OUT:-/tmp/origami-tangram}
SH=${SHARED:-../shared}
DATA=$SH/data/retrieval_dev.jsonl
mkdir -p "$OUT"
[ -x "$CLI" ] || { echo "no origami binary at '$CLI' (build origami_cli or set ORIGAMI_BIN)"; exit 1; }

BUDGET_FILE=${TANGRAM_BUDGETS_FILE:-}
if [ -z "$BUDGET_FILE" ]; then
  BUDGET_FILE=$OUT/budgets_snapkv_rho025.json
  zcat "$SH/data/train_corpus.txt.gz" | head -c 3000000 > "$OUT/calib.txt"
  "$CLI" calibrate --data "$OUT/calib.txt" --scorer snapkv --samples 50 --alpha 2 --rho 0.25 --max-tokens 2048 \
    --threads "$THREADS" --output "$BUDGET_FILE" --quiet | tee "$OUT/calibrate.txt"
fi

COMMON=(--device "$DEVICE" --data "$DATA" --limit "$LIMIT" --threads "$THREADS" --max-num-batched-tokens "$CHUNK"
        --json --quiet)
for mode in $MODES; do
  "$CLI" eval retrieval "${COMMON[@]}" --mode "$mode" --kv-policy tangram --kv-budget "$BUDGETS" \
    --kv-head-budgets "$BUDGET_FILE" > "$OUT/tangram_$mode.jsonl"
  "$CLI" eval retrieval "${COMMON[@]}" --mode "$mode" --kv-policy tangram --kv-budget "$BUDGETS" \
    --kv-head-budgets "$BUDGET_FILE" --kv-policy-opt prefill_chunk_compression=0 > "$OUT/tangram_whole_$mode.jsonl"
  # The uniform budgets holding the bytes tangram holds at each point.
  SNAP=$(python3 -c '
import json, math, sys
print(",".join(str(math.ceil(j["kv_kept_paged_entries"])) for j in map(json.loads, open(sys.argv[1]))
               if j["policy"] == "tangram"))' "$OUT/tangram_$mode.jsonl")
  "$CLI" eval retrieval "${COMMON[@]}" --mode "$mode" --kv-policy snapkv --kv-budget "$SNAP" > "$OUT/snapkv_$mode.jsonl"
done

python3 - "$OUT" $MODES > "$OUT/tangram_fidelity.md" <<'EOF'
import json, sys
out, modes = sys.argv[1], sys.argv[2:]
print("| mode | average budget | tangram (chunked) | tangram (whole prompt) | snapkv (uniform, same bytes) | full KV | KV kept per head: tangram entries / pages, snapkv pages |")
print("|---|---|---|---|---|---|---|")
for mode in modes:
    load = lambda name: [json.loads(l) for l in open(f"{out}/{name}_{mode}.jsonl")]
    tg, whole, snap = load("tangram"), load("tangram_whole"), load("snapkv")
    full = next(j for j in tg if j["policy"] == "full")
    pts = lambda rows, p: [j for j in rows if j["policy"] == p]
    for a, b, c in zip(pts(tg, "tangram"), pts(whole, "tangram"), pts(snap, "snapkv")):
        n = a["num_documents"]
        print(f"| {mode} | {a['budget']} | {a['accuracy']:.2f} | {b['accuracy']:.2f} | {c['accuracy']:.2f} (budget {c['budget']}) "
              f"| {full['accuracy']:.2f} | {a['kv_kept_entries']:.1f} / {a['kv_kept_paged_entries']:.1f}, {c['kv_kept_paged_entries']:.0f} |")
print(f"\n{n} documents of retrieval_dev.jsonl per point.")
EOF
cat "$OUT/tangram_fidelity.md"
