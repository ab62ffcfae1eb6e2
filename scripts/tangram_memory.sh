#!/usr/bin/env bash
# Does calibrated non-uniform KV free memory for real? (docs/benchmarks.md, "TANGRAM: memory
# freed on a fixed pool"). The same random workload (long prompts, short outputs) on the same
# fixed KV pool and head-group layout (--heads-per-group 2, so every run counts the same group
# pages), under:
#   full            full KV
#   snapkv          uniform SnapKV, the whole prompt compressed once prefilled (not reserved: its
#                   prompt is paged in full first)
#   snapkv-chunked  uniform SnapKV, each prefill chunk compressed as produced (reserved)
#   tangram         calibrated non-uniform budgets, chunk by chunk, every group reserved at its own
#                   budget
# snapkv runs at the budget whose pages equal what tangram's layout holds (eval's
# kv_kept_paged_entries, rounded up). `origami bench --json` reports the peak KV pages used and the
# peak number of requests running at once. Writes $OUT/memory_<name>.json and
# $OUT/tangram_memory.md (printed).
#
#   TANGRAM_BUDGETS_FILE=budgets.json scripts/tangram_memory.sh
#
# Settings: ORIGAMI_BIN (build/origami), TANGRAM_BUDGETS_FILE (required: `origami calibrate`'s
# output, e.g. from scripts/tangram_fidelity.sh), BUDGET (average tokens per head, 256),
# PROMPTS (32), INPUT_LEN (2048), OUTPUT_LEN (64), CHUNK (256), KV_BLOCKS (300 full-layout
# blocks), THREADS (1), OUT (/tmp/origami-tangram).
set -euo pipefail
cd "$(dirname "$0")/.."
CLI=${ORIGAMI_BIN:-build/origami}
FILE=${TANGRAM_BUDGETS_FILE:?set TANGRAM_BUDGETS_FILE to a calibrated budget file}
BUDGET=${BUDGET:-256}
OUT=${OUT:-/tmp/origami-tangram}
mkdir -p "$OUT"
COMMON=(--threads "${THREADS:-1}" --heads-per-group 2 --num-prompts "${PROMPTS:-32}" --input-len "${INPUT_LEN:-2048}"
        --output-len "${OUTPUT_LEN:-64}" --max-num-batched-tokens "${CHUNK:-256}" --num-kv-blocks "${KV_BLOCKS:-300}"
        --dataset-seed 1 --json --quiet)

# The uniform budget holding tangram's bytes: one document's eval point reports it.
SNAP=$("$CLI" eval retrieval --data "${SHARED:-../shared}/data/retrieval_dev.jsonl" --mode prefill --limit 1 \
        --kv-policy tangram --kv-budget "$BUDGET" --kv-head-budgets "$FILE" --json --quiet |
       python3 -c 'import json, math, sys
print(next(math.ceil(j["kv_kept_paged_entries"]) for j in map(json.loads, sys.stdin) if j["policy"] == "tangram"))')

"$CLI" bench "${COMMON[@]}" --kv-policy full > "$OUT/memory_full.json"
"$CLI" bench "${COMMON[@]}" --kv-policy snapkv --kv-budget "$SNAP" > "$OUT/memory_snapkv.json"
"$CLI" bench "${COMMON[@]}" --kv-policy snapkv --kv-budget "$SNAP" --kv-policy-opt prefill_chunk_compression=1 \
  > "$OUT/memory_snapkv-chunked.json"
"$CLI" bench "${COMMON[@]}" --kv-policy tangram --kv-budget "$BUDGET" --kv-head-budgets "$FILE" > "$OUT/memory_tangram.json"

python3 - "$OUT" "$BUDGET" "$SNAP" > "$OUT/tangram_memory.md" <<'EOF'
import json, sys
out, budget, snap = sys.argv[1], sys.argv[2], sys.argv[3]
print("| run | budget | peak KV pages (of pool) | peak running | preemptions | output tok/s | mean TTFT ms | mean TPOT ms |")
print("|---|---|---|---|---|---|---|---|")
for name, b in [("full", "-"), ("snapkv", snap), ("snapkv-chunked", snap), ("tangram", f"{budget} (average)")]:
    j = json.load(open(f"{out}/memory_{name}.json"))
    print(f"| {name} | {b} | {j['peak_kv_blocks']} of {j['kv_blocks_total']} | {j['peak_running_requests']} "
          f"| {j['num_preemptions']} | {j['output_tokens_per_second']:.1f} | {j['mean_ttft_ms']:.0f} | {j['mean_tpot_ms']:.0f} |")
EOF
cat "$OUT/tangram_memory.md"
