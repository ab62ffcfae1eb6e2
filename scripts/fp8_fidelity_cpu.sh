#!/usr/bin/env bash
# FP8 against bf16 on the CPU backend, which emulates the CUDA backend's FP8 rounding bit for bit
# (KV cache: E4M3 codes with a scale per (token, KV head); weights: E4M3 per output channel with
# per-token activation scales): retrieval accuracy of origami-tiny-qwen3 on the first LIMIT
# documents of the dev set in prefill, context and stream modes, budget 512 (about 25% of a
# document), block 16, for full KV, keydiff, zipage and Fast KVzip's default (global threshold,
# page-aligned, per-head pages), under three precisions: bf16 KV (fp32 weights, as the checkpoint's
# bf16 values), FP8 KV, and FP8 weights + FP8 KV. JSON lines per run under OUT (progress in
# OUT/*.err), the table last. About 55 minutes on 2 cores at LIMIT=20.
#   LIMIT=20 OUT=docs/results/fp8_fidelity scripts/fp8_fidelity_cpu.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
LIMIT=${LIMIT:-20}
OUT=${OUT:-/tmp/origami-fp8-fidelity}
BIN=${ORIGAMI_BIN:-build/origami}
DATA=${DATA:-../shared/data/retrieval_dev.jsonl}
mkdir -p "$OUT"
common=(eval retrieval --data "$DATA" --mode prefill,context,stream --limit "$LIMIT" --kv-budget 512 --block-size 16
        --threads 2 --json)
for precision in bf16 fp8kv fp8w_fp8kv; do
  case $precision in
    bf16) flags=(--kv-cache-dtype bf16) ;;
    fp8kv) flags=(--kv-cache-dtype fp8) ;;
    fp8w_fp8kv) flags=(--kv-cache-dtype fp8 --quantization fp8) ;;
  esac
  "$BIN" "${common[@]}" "${flags[@]}" --kv-policy full,keydiff,zipage > "$OUT/$precision.jsonl" 2> "$OUT/$precision.err" \
    || echo "$precision: exit $? (a run with failed documents exits 1: the JSON's \"failed\" counts them)"
  "$BIN" "${common[@]}" "${flags[@]}" --kv-policy fastkvzip --kv-gates assets/gates/origami-tiny-qwen3.safetensors \
    >> "$OUT/$precision.jsonl" 2>> "$OUT/$precision.err" \
    || echo "$precision fastkvzip: exit $? (a run with failed documents exits 1: the JSON's \"failed\" counts them)"
done
python3 - "$OUT" <<'PY'
import json, sys, collections
out = sys.argv[1]
rows = collections.OrderedDict()
for precision in ("bf16", "fp8kv", "fp8w_fp8kv"):
    for line in open(f"{out}/{precision}.jsonl"):
        j = json.loads(line)
        key = (j["policy"], j["mode"])
        rows.setdefault(key, {})[precision] = f'{j["accuracy"]:.2f} ({j["correct"]}/{j["num_documents"]})'
print("| policy | mode | bf16 KV | FP8 KV | FP8 weights + FP8 KV |")
print("|---|---|---|---|---|")
for (policy, mode), v in rows.items():
    print(f"| {policy} | {mode} | {v.get('bf16', '-')} | {v.get('fp8kv', '-')} | {v.get('fp8w_fp8kv', '-')} |")
PY
