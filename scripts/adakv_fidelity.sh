#!/usr/bin/env bash
# Runtime non-uniform head budgets (docs/fidelity.md, "Runtime non-uniform budgets"): retrieval
# accuracy of `adakv` (SnapKV's score, one top-k per layer over its heads, chosen at run time)
# against uniform `snapkv` and calibrated `tangram` (whole prompt at once, prefill_chunk_compression=0,
# the calibrated file below) at average budgets BUDGETS per (layer, KV head), in prefill mode, on
# the one-group layout (the default) and on per-head pages (--heads-per-group 1); and `fastkvzip`
# with one global threshold against its uniform per-head budget in context mode (per-head pages).
# Each point's KV bytes: `origami bench` over the first KEPT_LIMIT documents (two output tokens:
# the prompt is compressed after the first) reports the pages its compressions left
# (kept_kv_pages), from which the kept entries per (layer, KV head), group padding and page
# rounding included, follow (KEPT_LIMIT=0: not measured). A step whose output exists is skipped,
# so an interrupted run resumes.
#
#   DATA=/tmp/tune.jsonl LIMIT=20 scripts/adakv_fidelity.sh     # tuning set (make_retrieval_set.py)
#   DATA=../shared/data/retrieval_dev.jsonl LIMIT=20 OUT=/tmp/adakv-dev scripts/adakv_fidelity.sh
#
# Settings: ORIGAMI_BIN (build/origami), DATA (required), LIMIT (20), KEPT_LIMIT (5), BUDGETS (256,512),
# CONTEXT_BUDGET (512: 25% of the ~2000-token documents), THREADS (1), CHUNK (512), OUT
# (/tmp/origami-adakv), BUDGET_FILE (docs/results/tiny_qwen3_budgets_snapkv_rho025.json).
set -euo pipefail
cd "$(dirname "$0")/.."
CLI=${ORIGAMI_BIN:-build/origami}
DATA=${DATA:?set DATA to a retrieval JSONL file}
LIMIT=${LIMIT:-20}
KEPT_LIMIT=${KEPT_LIMIT:-5}
BUDGETS=${BUDGETS:-256,512}
CONTEXT_BUDGET=${CONTEXT_BUDGET:-512}
THREADS=${THREADS:-1}
CHUNK=${CHUNK:-512}
OUT=${OUT:-/tmp/origami-adakv}
FILE=${BUDGET_FILE:-docs/results/tiny_qwen3_budgets_snapkv_rho025.json}
GATES=assets/gates/origami-tiny-qwen3.safetensors
mkdir -p "$OUT"
COMMON=(--data "$DATA" --limit "$LIMIT" --threads "$THREADS" --max-num-batched-tokens "$CHUNK" --json --quiet)

# The documents as one-output-token requests, for the byte counts.
python3 -c '
import json, sys
for i, l in enumerate(open(sys.argv[1])):
    if int(sys.argv[2]) and i >= int(sys.argv[2]): break
    print(json.dumps({"prompt": json.loads(l)["prompt"], "max_tokens": 2, "ignore_eos": True}))' "$DATA" "$KEPT_LIMIT" > "$OUT/docs.jsonl"
kept() {  # name, then bench options: writes $OUT/kept_<name>.json
  local name=$1; shift
  [ "$KEPT_LIMIT" != 0 ] && [ ! -s "$OUT/kept_$name.json" ] || return 0
  "$CLI" bench --input "$OUT/docs.jsonl" --output-len 2 --threads "$THREADS" --max-num-batched-tokens "$CHUNK" --json --quiet "$@" \
    > "$OUT/kept_$name.json"
}

run() {  # output file, then the command: skipped when the output exists
  local out=$1; shift
  [ -s "$out" ] && return 0
  "$@" > "$out.part"
  mv "$out.part" "$out"
}
for hp in 0 1; do
  run "$OUT/prefill_hp$hp.jsonl" "$CLI" eval retrieval "${COMMON[@]}" --mode prefill --heads-per-group $hp \
    --kv-policy adakv,snapkv --kv-budget "$BUDGETS"
  run "$OUT/prefill_tangram_hp$hp.jsonl" "$CLI" eval retrieval "${COMMON[@]}" --mode prefill --heads-per-group $hp \
    --kv-policy tangram --kv-budget "$BUDGETS" --kv-head-budgets "$FILE" --kv-policy-opt prefill_chunk_compression=0
  for b in ${BUDGETS//,/ }; do
    for p in adakv snapkv; do kept "${p}_${b}_hp$hp" --heads-per-group $hp --kv-policy $p --kv-budget "$b"; done
    kept "tangram_${b}_hp$hp" --heads-per-group $hp --kv-policy tangram --kv-budget "$b" --kv-head-budgets "$FILE" \
      --kv-policy-opt prefill_chunk_compression=0
  done
done
for a in uniform global; do
  run "$OUT/context_fastkvzip_$a.jsonl" "$CLI" eval retrieval "${COMMON[@]}" --mode context --heads-per-group 1 \
    --kv-gates "$GATES" --kv-policy fastkvzip --kv-budget "$CONTEXT_BUDGET" --kv-policy-opt allocation=$a
done

python3 - "$OUT" "$BUDGETS" > "$OUT/adakv_fidelity.md" <<'PY'
import json, sys
out, budgets = sys.argv[1], sys.argv[2].split(",")
L, H, B = 6, 4, 16  # origami-tiny-qwen3: layers, KV heads; block size
def rows(name): return [json.loads(l) for l in open(f"{out}/{name}.jsonl")]
def entries(name, hp):
    # Kept pages per compression over the layout's groups, in entries per (layer, KV head).
    try: k = json.load(open(f"{out}/kept_{name}.json"))
    except (OSError, ValueError): return float("nan")
    groups = 1 if hp == 0 else L * H // hp
    if name.startswith("tangram") and hp == 0: groups = L * 2  # calibrated default: 2 heads per group
    per_group = k["kept_kv_pages"] / max(1, k["num_compressions"]) / groups
    return per_group * B
print("| layout | average budget | adakv | snapkv | tangram (whole prompt) | full KV | KV kept per (layer, KV head), pages included: adakv / snapkv / tangram |")
print("|---|---|---|---|---|---|---|")
for hp in (0, 1):
    pre, tg = rows(f"prefill_hp{hp}"), rows(f"prefill_tangram_hp{hp}")
    full = next(j for j in pre if j["policy"] == "full")
    layout = "one group" if hp == 0 else "per-head pages"
    for b in budgets:
        acc = lambda rs, p: next(j["accuracy"] for j in rs if j["policy"] == p and str(j["budget"]) == b)
        print(f"| {layout} | {b} | {acc(pre, 'adakv'):.2f} | {acc(pre, 'snapkv'):.2f} | {acc(tg, 'tangram'):.2f} | {full['accuracy']:.2f} "
              f"| {entries(f'adakv_{b}_hp{hp}', hp):.0f} / {entries(f'snapkv_{b}_hp{hp}', hp):.0f} / {entries(f'tangram_{b}_hp{hp}', hp):.0f} |")
print()
print("| fastkvzip, context mode, per-head pages | accuracy | full KV |")
print("|---|---|---|")
for a in ("uniform", "global"):
    r = rows(f"context_fastkvzip_{a}")
    full = next(j for j in r if j["policy"] == "full")
    fk = next(j for j in r if j["policy"] == "fastkvzip")
    print(f"| allocation={a}, budget {fk['budget']} | {fk['accuracy']:.2f} | {full['accuracy']:.2f} |")
n = pre[0]["num_documents"]
print(f"\n{n} documents per point.")
PY
cat "$OUT/adakv_fidelity.md"
