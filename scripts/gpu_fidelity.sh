#!/usr/bin/env bash
# The fidelity sweeps of docs/fidelity.md on origami-tiny-qwen3: for every registered KV policy
# (read from `origami policies --json` when the script runs, so a new policy joins by being
# registered), retrieval accuracy in each mode (prefill, context, stream; one sweep per mode) and
# perplexity (stream, its only mode), at every block size and budget. JSON lines and SVG plots go
# to $OUT; markdown tables of every result are written last (fidelity_tables.md) and printed.
#
#   scripts/gpu_fidelity.sh                      # builds build-gpu (CUDA), runs everything
#   ORIGAMI_BIN=build/origami FIDELITY_DEVICE=cpu FIDELITY_LIMIT=2 PPL_LIMIT=1 scripts/gpu_fidelity.sh
#
# Settings (environment):
#   ORIGAMI_BIN        an origami binary to use; unset: build $BUILD (default build-gpu) with CUDA
#   FIDELITY_DEVICE    cuda (default) or cpu
#   FIDELITY_POLICIES  comma-separated list; default: every registered policy
#   FIDELITY_ALIASES   1 (default): include aliases (zipage-attn, ...: the paper's ablation steps,
#                      other defaults of a registered policy); 0: leave them out
#   FIDELITY_MODES     retrieval modes, default "prefill context stream"
#   FIDELITY_BLOCKS    block sizes, default "16 256" (FIDELITY_BLOCK, one size, is still read)
#   FIDELITY_BUDGETS   default 256,512,1024
#   FIDELITY_LIMIT     retrieval documents (0 = all, the default)
#   FIDELITY_PPL       1 (default): the perplexity sweeps too; PPL_LIMIT windows (0 = all, default)
#                      of PPL_CONTEXT tokens (default: eval ppl's 2048)
#   FIDELITY_DATA / FIDELITY_TEXT   retrieval JSONL / perplexity text (default: the shared dev sets)
#   FIDELITY_TIMEOUT   seconds per sweep (default 540)
#   FIDELITY_CPU_CHECK 1 (default, cuda only): zipage@512 stream on 20 documents on both backends
#   FIDELITY_VARIANTS  policies that need engine flags of their own, each swept in its own engine
#                      in every retrieval mode, as "label|policy|flags;..." (the label names its
#                      rows in the tables). Default (when FIDELITY_POLICIES is unset): Fast KVzip
#                      with the shipped gates and one global threshold, the same with uniform
#                      budgets, and AdaKV's per-layer allocation, all on per-head pages; "" = none
#   EVAL_FLAGS         extra engine flags (default: every document at once, one query slot each)
# A device call is limited to 10 minutes: on the H100 one block size (three retrieval sweeps and
# the perplexity sweep over ~15 policies) fits in one call; run FIDELITY_BLOCKS=16 and
# FIDELITY_BLOCKS=256 as two calls when the whole does not.
set -uo pipefail
source "$(dirname "$0")/lib/gpu_common.sh"
gpu_script_init /tmp/origami-fidelity
DEVICE=${FIDELITY_DEVICE:-cuda}
case "$DEVICE" in cuda|cpu) ;; *) echo "FIDELITY_DEVICE must be cuda or cpu, got '$DEVICE'"; exit 2 ;; esac
declare -A RESULT
T_START=$(date +%s)
if [ "$DEVICE" = cuda ] && command -v nvidia-smi > /dev/null; then
  gpu_device_info "$OUT/device.txt"
  RESULT[0_device]="$GPU_DEVICE"
fi

if [ -n "${ORIGAMI_BIN:-}" ]; then
  CLI=$ORIGAMI_BIN
else
  gpu_build "$BUILD" "$OUT/build.log" origami_cli || exit 1
  RESULT[0_build]="rc=$GPU_BUILD_RC (${GPU_BUILD_SECONDS}s)"
  CLI=$BUILD/origami
fi
[ -x "$CLI" ] || { echo "no origami binary at '$CLI'"; exit 1; }

# Every registered policy, in registration order (full KV first: the reference).
if [ -n "${FIDELITY_POLICIES:-}" ]; then
  POLICIES=$FIDELITY_POLICIES
else
  POLICIES=$("$CLI" policies --json | python3 -c '
import json, sys
keep_aliases = sys.argv[1] != "0"
# KVzip (reconstruction) runs on the CPU backend only. Fast KVzip (a gates file) and runtime head
# budgets (adakv: joint selection, worth it on per-head pages) need engine flags of their own: they
# are FIDELITY_VARIANTS below.
# Policies that need calibrated head budgets (tangram) run in their own engine with a budget file:
# scripts/tangram_fidelity.sh.
print(",".join(p["name"] for p in json.load(sys.stdin)
               if (keep_aliases or "alias_of" not in p) and not p.get("needs_gates") and not p.get("needs_reconstruction")
               and not p.get("needs_joint_selection") and not p.get("needs_head_budgets")))' "${FIDELITY_ALIASES:-1}") \
    || { echo "origami policies --json failed"; exit 1; }
fi
BUDGETS=${FIDELITY_BUDGETS:-256,512,1024}
BLOCKS=${FIDELITY_BLOCKS:-${FIDELITY_BLOCK:-16 256}}
MODES=${FIDELITY_MODES:-prefill context stream}
M=$SH/models/origami-tiny-qwen3
DATA=${FIDELITY_DATA:-$SH/data/retrieval_dev.jsonl}
TEXT=${FIDELITY_TEXT:-$SH/data/wikitext2_test_dev.txt}
TMO=${FIDELITY_TIMEOUT:-540}
# Every document runs at once, each with its own query slot.
EVAL_FLAGS=${EVAL_FLAGS:-"--max-num-seqs 128 --query-slots 128"}
GATES=$ROOT/assets/gates/origami-tiny-qwen3.safetensors
if [ -z "${FIDELITY_POLICIES:-}" ]; then
  DEFAULT_VARIANTS="fastkvzip global (per-head pages)|fastkvzip|--heads-per-group 1 --kv-gates $GATES --kv-policy-opt allocation=global"
  DEFAULT_VARIANTS+=";fastkvzip uniform (per-head pages)|fastkvzip|--heads-per-group 1 --kv-gates $GATES --kv-policy-opt allocation=uniform"
  DEFAULT_VARIANTS+=";adakv (per-head pages)|adakv|--heads-per-group 1"
else
  DEFAULT_VARIANTS=""
fi
VARIANTS=${FIDELITY_VARIANTS-$DEFAULT_VARIANTS}
echo "policies: $POLICIES"
[ -n "$VARIANTS" ] && echo "variants: $VARIANTS"
echo "device $DEVICE, blocks $BLOCKS, budgets $BUDGETS, modes $MODES, limit ${FIDELITY_LIMIT:-0}, ppl limit ${PPL_LIMIT:-0}"

# One sweep: $1 = result name, the rest = the eval arguments. Writes $OUT/$1.jsonl (+ .svg, .err).
# SWEEP_POLICIES (default: $POLICIES) and SWEEP_FLAGS (extra engine flags) set a variant's engine.
sweep() {
  local name=$1
  shift
  local t0; t0=$(date +%s)
  # shellcheck disable=SC2086
  timeout "$TMO" "$CLI" eval "$@" --model "$M" --device "$DEVICE" --kv-policy "${SWEEP_POLICIES:-$POLICIES}" \
    --kv-budget "$BUDGETS" --json --quiet $EVAL_FLAGS ${SWEEP_FLAGS:-} --plot "$OUT/$name.svg" > "$OUT/$name.jsonl" \
    2> "$OUT/$name.err"
  local rc=$?
  local why=""
  [ $rc -ne 0 ] && why=" $( (grep -m1 -E 'error|failed' "$OUT/$name.err" || tail -1 "$OUT/$name.err") | cut -c1-160)"
  RESULT["1_$name"]="rc=$rc ($(( $(date +%s) - t0 ))s) $(wc -l < "$OUT/$name.jsonl") points$why"
}

for b in $BLOCKS; do
  for mode in $MODES; do
    sweep "retrieval_${mode}_b$b" retrieval --block-size "$b" --data "$DATA" --mode "$mode" --limit "${FIDELITY_LIMIT:-0}"
  done
  if [ "${FIDELITY_PPL:-1}" = 1 ]; then
    ctx=(); [ -n "${PPL_CONTEXT:-}" ] && ctx=(--context "$PPL_CONTEXT")
    sweep "ppl_b$b" ppl --block-size "$b" --text "$TEXT" --limit "${PPL_LIMIT:-0}" "${ctx[@]}"
  fi
  # The variants: each in its own engine, its rows named by its label (its full-KV reference rows
  # dropped: the main sweep's are the table's), kept as retrieval_{mode}_b{block}_v{i}.jsonl.
  IFS=';' read -r -a variant_list <<< "$VARIANTS"
  for i in "${!variant_list[@]}"; do
    IFS='|' read -r label vpolicy vflags <<< "${variant_list[$i]}"
    for mode in $MODES; do
      name="retrieval_${mode}_b${b}_v$i"
      SWEEP_POLICIES=$vpolicy SWEEP_FLAGS=$vflags sweep "$name" retrieval --block-size "$b" --data "$DATA" \
        --mode "$mode" --limit "${FIDELITY_LIMIT:-0}"
      python3 -c '
import json, sys
path, label = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(path) if l.strip().startswith("{")]
with open(path, "w") as out:
    for r in rows:
        if r.get("reference"):
            continue
        r["policy"] = label
        out.write(json.dumps(r) + "\n")' "$OUT/$name.jsonl" "$label"
      RESULT["1_$name"]="${RESULT["1_$name"]} [$label]"
    done
  done
done

# The same point on both backends (CUDA bf16 vs the CPU fp32 reference), on a GPU only.
if [ "$DEVICE" = cuda ] && [ "${FIDELITY_CPU_CHECK:-1}" = 1 ]; then
  for dev in cuda cpu; do
    # shellcheck disable=SC2086
    timeout 200 "$CLI" eval retrieval --model "$M" --device $dev --block-size 16 --data "$DATA" --mode stream --limit 20 \
      --kv-policy zipage --kv-budget 512 --json --quiet --threads 16 $EVAL_FLAGS > "$OUT/backend_check_$dev.json" 2>&1
    RESULT["3_backend_$dev"]="rc=$? $(python3 -c 'import json,sys; print(" ".join("%s@%s=%s" % (j["policy"], j["budget"], j.get("accuracy")) for j in map(json.loads, open(sys.argv[1]))))' "$OUT/backend_check_$dev.json" 2>&1 | tail -1)"
  done
fi

# The tables, last: one per task and block size; a row per policy, a column per mode and budget.
python3 - "$OUT" "$POLICIES" > "$OUT/fidelity_tables.md" <<'PYEOF'
import glob, json, os, sys
out, policies = sys.argv[1], sys.argv[2].split(",")
rows = []
paths = glob.glob(os.path.join(out, "retrieval_*_b*.jsonl")) + glob.glob(os.path.join(out, "ppl_b*.jsonl"))  # variants too
for path in sorted(paths):
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            rows.append(json.loads(line))
if not rows:
    print("No results.")
    sys.exit()

def cell(r, metric, digits):
    if not r.get("applies", True):
        return "n/a"
    v = r.get(metric)
    text = "-" if v is None else f"{v:.{digits}f}"
    return text + (f" ({r['failed']} failed)" if r.get("failed") else "")

first = rows[0]
print(f"# Fidelity: {os.path.basename(first['model'].rstrip('/'))}, device {first['device']}\n")
print("n/a: the policy compressed nothing although the documents exceed its budget "
      "(e.g. a prefill-end policy in stream mode); such a point is not a score.\n")
order = {m: i for i, m in enumerate(["prefill", "context", "stream"])}
for task, metric, digits, title in (("retrieval", "accuracy", 2, "Retrieval accuracy"), ("ppl", "ppl", 2, "Perplexity")):
    for block in sorted({r["block_size"] for r in rows if r["task"] == task}):
        sel = [r for r in rows if r["task"] == task and r["block_size"] == block]
        modes = sorted({r["mode"] for r in sel}, key=lambda m: order.get(m, 9))
        budgets = sorted({r["budget"] for r in sel if not r["reference"]})
        docs = sel[0]["num_documents"]
        print(f"## {title}, block size {block} ({docs} {'documents' if task == 'retrieval' else 'windows'})\n")
        cols = [(m, b) for m in modes for b in budgets]
        print("| policy | " + " | ".join(f"{m} {b}" for m, b in cols) + " |")
        print("|---" * (len(cols) + 1) + "|")
        refs = {r["mode"]: r for r in sel if r["reference"]}
        print("| full KV | " + " | ".join(cell(refs[m], metric, digits) if m in refs else "-" for m, b in cols) + " |")
        names = [p for p in policies if p != "full"] + sorted({r["policy"] for r in sel} - set(policies) - {"full"})
        for p in names:
            got = {(r["mode"], r["budget"]): r for r in sel if r["policy"] == p and not r["reference"]}
            if not got:
                continue
            print(f"| {p} | " + " | ".join(cell(got[c], metric, digits) if c in got else "-" for c in cols) + " |")
        print()
PYEOF
RESULT["2_tables"]="rc=$? $OUT/fidelity_tables.md"
gpu_print_summary "fidelity ($(( $(date +%s) - T_START ))s)" "$OUT/fidelity_summary.txt"
echo
cat "$OUT/fidelity_tables.md"
