#!/usr/bin/env bash
# scripts/gpu_fidelity.sh on the CPU backend with a tiny setting: every mode gets its sweep and
# its JSON lines, the markdown tables come last with full KV and each policy, and SnapKV in
# stream mode (it never compresses there) is n/a, not full KV's score; a variant (AdaKV on per-head
# pages, its own engine) gets its own labelled row.
# Usage: gpu_fidelity_cpu_test.sh ORIGAMI_BIN SOURCE_DIR
set -euo pipefail
BIN=$1
SRC=$2
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
ORIGAMI_BIN=$BIN FIDELITY_DEVICE=cpu FIDELITY_DATA=$SRC/tests/data/fidelity/retrieval_tiny.jsonl FIDELITY_LIMIT=1 \
  FIDELITY_BLOCKS=16 FIDELITY_POLICIES=full,snapkv FIDELITY_BUDGETS=64 PPL_LIMIT=1 PPL_CONTEXT=96 OUT=$OUT \
  FIDELITY_VARIANTS="adakv (per-head pages)|adakv|--heads-per-group 1" \
  "$SRC/scripts/gpu_fidelity.sh" > "$OUT/stdout.txt" 2>&1 || { cat "$OUT/stdout.txt"; exit 1; }
fail() { echo "FAIL: $*"; cat "$OUT/stdout.txt"; exit 1; }
for mode in prefill context stream; do
  [ "$(wc -l < "$OUT/retrieval_${mode}_b16.jsonl")" = 2 ] || fail "retrieval $mode: expected 2 JSON lines"
  grep -q "\"mode\":\"$mode\"" "$OUT/retrieval_${mode}_b16.jsonl" || fail "retrieval $mode: mode missing"
  [ -s "$OUT/retrieval_${mode}_b16.svg" ] || fail "retrieval $mode: no plot"
done
[ "$(wc -l < "$OUT/ppl_b16.jsonl")" = 2 ] || fail "ppl: expected 2 JSON lines"
# The tables are the last thing printed.
grep -v "^$" "$OUT/stdout.txt" | tail -1 | grep -q '^| snapkv | n/a |$' || fail "the stdout does not end with the ppl table's n/a row"
grep -q '^| policy | prefill 64 | context 64 | stream 64 |$' "$OUT/fidelity_tables.md" || fail "retrieval table header"
grep -qE '^\| snapkv \| [0-9.]+ \| [0-9.]+ \| n/a \|$' "$OUT/fidelity_tables.md" || fail "snapkv row: scores in prefill/context, n/a in stream"
grep -qE '^\| full KV \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|$' "$OUT/fidelity_tables.md" || fail "full KV row"
grep -qE '^\| adakv \(per-head pages\) \| [0-9.]+ \| [0-9.]+ \| n/a \|$' "$OUT/fidelity_tables.md" || fail "the variant's row"
[ "$(grep -c '"reference":true' "$OUT/retrieval_prefill_b16_v0.jsonl")" = 0 ] || fail "the variant kept its reference rows"
echo "gpu_fidelity.sh on the CPU: OK"
