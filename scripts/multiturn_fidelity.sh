#!/usr/bin/env bash
# Multi-turn fidelity per turn (docs/fidelity.md, "Multi-turn fidelity per turn"): every question
# of a document asked in sequence, each turn continuing the previous turn's retained (compressed)
# KV with the model's own answers (`origami eval retrieval --mode multiturn`), for full KV,
# snapkv, keydiff, Fast KVzip (the shipped gates, its default global threshold, per-head pages),
# zipage and StreamingLLM, at budgets of 12.5 / 25 / 50% of the documents' mean token length.
# Writes a markdown table of accuracy per turn (a row per policy and budget, a column per turn,
# then the mean over turns) to $OUT/multiturn_table.md and prints it.
#
#   scripts/multiturn_fidelity.sh [--limit N] [--threads N] [--data FILE] [--out DIR]
#
#   --limit N     the first N documents (default 0: all)
#   --threads N   CPU threads of each eval (default 2)
#   --data FILE   multi-turn items (default tests/data/fidelity/retrieval_multiturn_report.jsonl)
#   --out DIR     results (default /tmp/origami-multiturn): the evals' JSON lines and stderr,
#                 budgets.txt (how they were computed), multiturn_table.md
# Environment: ORIGAMI_BIN (default build/origami), MT_FRACTIONS (default "0.125 0.25 0.5"),
# MT_POLICIES (default "snapkv,keydiff,zipage,streaming": one engine; full KV is its reference),
# MT_FASTKVZIP (1, default: also Fast KVzip in its own engine; 0: not), MT_MAIN (1, default: the
# engine of full KV and MT_POLICIES; 0: not, e.g. to rerun Fast KVzip alone), MT_TABLE_ONLY (1: no
# eval, only the table from the results already in --out), MT_TIMEOUT (seconds
# per eval, default 3600), MT_DEVICE (default cpu), MT_BLOCK (block size, default 16),
# MT_KV_MEMORY (--kv-cache-memory, default 3GiB: with the CPU default of 1 GiB, 40 conversations
# whose every turn leaves a retained context lost some contexts before their next turn, and such
# a turn fails rather than being scored).
#
# Budgets: the mean token length of all the set's documents (their "document" / "context" text,
# tokenized as the eval does; all of them, so that a --limit run uses the budgets of the whole
# set), times each fraction, rounded to the nearest multiple of the block size (KV memory is paged
# in blocks). The script also checks that every last turn's prompt (document, all questions,
# 6-token answers) stays within the tiny model's trained context of 2048 tokens.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
ROOT=$PWD
LIMIT=0
THREADS=2
DATA=$ROOT/tests/data/fidelity/retrieval_multiturn_report.jsonl
OUT=/tmp/origami-multiturn
while [ $# -gt 0 ]; do
  case "$1" in
    --limit) LIMIT=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --data) DATA=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,32p' "$0"; exit 0 ;;
    *) echo "multiturn_fidelity.sh: unknown argument '$1' (see --help)"; exit 2 ;;
  esac
done
case "$LIMIT" in ''|*[!0-9]*) echo "--limit must be a number >= 0, got '$LIMIT'"; exit 2 ;; esac
case "$THREADS" in ''|*[!0-9]*) echo "--threads must be a number >= 0, got '$THREADS'"; exit 2 ;; esac
[ -f "$DATA" ] || { echo "--data: no file '$DATA'"; exit 2; }
CLI=${ORIGAMI_BIN:-$ROOT/build/origami}
[ -x "$CLI" ] || { echo "no origami binary at '$CLI' (build the origami_cli target, or set ORIGAMI_BIN)"; exit 2; }
SH=${ORIGAMI_SHARED_DIR:-$ROOT/../shared}
MODEL=$SH/models/origami-tiny-qwen3
GATES=$ROOT/assets/gates/origami-tiny-qwen3.safetensors
DEVICE=${MT_DEVICE:-cpu}
BLOCK=${MT_BLOCK:-16}
FRACTIONS=${MT_FRACTIONS:-0.125 0.25 0.5}
POLICIES=${MT_POLICIES:-snapkv,keydiff,zipage,streaming}
TMO=${MT_TIMEOUT:-3600}
MAX_ANSWER_TOKENS=6  # the eval's default: " ", four digits and the character after them
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# Token lengths without running the model: an engine whose context is 1 token refuses every
# prompt with its length ("prompt has N tokens, ..."), after tokenizing it as generate (and eval)
# do. Lines: each document, then each of its questions.
python3 - "$DATA" 0 > "$OUT/lengths_in.jsonl" <<'PYEOF' || exit 1
import json, sys
path, limit = sys.argv[1], int(sys.argv[2])
rows = [json.loads(l) for l in open(path, encoding="utf-8") if l.strip()]
rows = rows[:limit] if limit > 0 else rows
for r in rows:
    doc = r.get("context", r.get("document"))
    if doc is None or not r.get("turns"):
        sys.exit(f"{path}: item {r.get('id')} is not multi-turn (needs \"document\" or \"context\" and \"turns\")")
    print(json.dumps({"prompt": doc, "max_tokens": 1}))
    for t in r["turns"]:
        print(json.dumps({"prompt": t["question"], "max_tokens": 1}))
PYEOF
"$CLI" generate --model "$MODEL" --input "$OUT/lengths_in.jsonl" --max-model-len 1 --num-kv-blocks 4 --threads 1 \
  2> /dev/null > "$OUT/lengths_out.jsonl"
read -r BUDGETS < <(python3 - "$DATA" 0 "$OUT/lengths_out.jsonl" "$BLOCK" "$MAX_ANSWER_TOKENS" "$OUT/budgets.txt" $FRACTIONS <<'PYEOF'
import json, re, statistics, sys
path, limit, lengths_path, block, answer = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
report, fractions = sys.argv[6], [float(f) for f in sys.argv[7:]]
rows = [json.loads(l) for l in open(path, encoding="utf-8") if l.strip()]
rows = rows[:limit] if limit > 0 else rows
counts = []
for line in open(lengths_path):
    m = re.search(r"prompt has (\d+) tokens", line)
    if not m:
        sys.exit("multiturn_fidelity.sh: could not read a token count from the tokenizer pass: " + line[:160])
    counts.append(int(m.group(1)))
docs, last = [], []
k = 0
for r in rows:
    d = counts[k]; k += 1
    q = counts[k:k + len(r["turns"])]; k += len(r["turns"])
    docs.append(d)
    # The last turn's prompt: the document, every earlier question and its answer, the last question.
    last.append(d + sum(q) + answer * (len(q) - 1))
mean = statistics.mean(docs)
budgets = [max(block, int(round(f * mean / block)) * block) for f in fractions]
lines = [f"{len(rows)} documents of {path} (all: the budgets' basis)",
         f"document tokens: mean {mean:.1f}, min {min(docs)}, max {max(docs)}",
         f"last turn's prompt (with {answer}-token answers): min {min(last)}, max {max(last)} tokens",
         "budgets: " + ", ".join(f"{f:g} x {mean:.1f} = {f * mean:.1f} -> {b}" for f, b in zip(fractions, budgets))
         + f" (nearest multiple of the block size {block})"]
if max(last) > 2048:
    lines.append(f"WARNING: a last turn's prompt has {max(last)} tokens, beyond the tiny model's trained context of 2048")
open(report, "w").write("\n".join(lines) + "\n")
print(",".join(map(str, budgets)))
PYEOF
)
[ -n "${BUDGETS:-}" ] || { echo "multiturn_fidelity.sh: computing the budgets failed"; exit 1; }
cat "$OUT/budgets.txt" >&2

[ "${MT_TABLE_ONLY:-0}" = 1 ] && { MT_MAIN=0; MT_FASTKVZIP=0; }
# One eval: $1 = name, the rest = engine / sweep flags. JSON lines to $OUT/$1.jsonl.
run_eval() {
  local name=$1; shift
  local t0; t0=$(date +%s)
  echo "== $name: $*" >&2
  timeout "$TMO" "$CLI" eval retrieval --model "$MODEL" --device "$DEVICE" --block-size "$BLOCK" --data "$DATA" \
    --mode multiturn --limit "$LIMIT" --kv-budget "$BUDGETS" --threads "$THREADS" \
    --kv-cache-memory "${MT_KV_MEMORY:-3GiB}" --json --quiet "$@" \
    > "$OUT/$name.jsonl" 2> "$OUT/$name.err"
  local rc=$?
  echo "== $name: rc=$rc, $(( $(date +%s) - t0 )) s" >&2
  [ $rc -eq 0 ] || tail -3 "$OUT/$name.err" >&2
}
# Fast KVzip in its own engine: its gates, and per-head pages (the global threshold keeps a
# different count per head: per-head pages make the memory follow them, as gpu_fidelity.sh runs it).
[ "${MT_FASTKVZIP:-1}" = 1 ] && run_eval fastkvzip --kv-policy fastkvzip --kv-gates "$GATES" --heads-per-group 1
[ "${MT_MAIN:-1}" = 1 ] && run_eval policies --kv-policy "full,$POLICIES"

python3 - "$OUT" "full,$POLICIES,fastkvzip" > "$OUT/multiturn_table.md" <<'PYEOF'
import json, os, sys
out, order = sys.argv[1], sys.argv[2].split(",")
rows = {}
for name in ("policies", "fastkvzip"):  # the first engine's full KV is the table's
    path = os.path.join(out, name + ".jsonl")
    if not os.path.exists(path):
        continue
    for line in open(path):
        if not line.strip().startswith("{"):
            continue
        r = json.loads(line)
        key = ("full", 0) if r["reference"] else (r["policy"], r["budget"])
        if key in rows:  # the second engine's reference: a cross-check of the first
            a, b = rows[key]["turn_accuracy"], r["turn_accuracy"]
            if [t["accuracy"] for t in a] != [t["accuracy"] for t in b]:
                print(f"note: full KV differs between the two engines: {[t['accuracy'] for t in a]} vs {[t['accuracy'] for t in b]}\n")
            continue
        rows[key] = r
if not rows:
    print("No results.")
    sys.exit()
turns = max(len(r["turn_accuracy"]) for r in rows.values())
any_row = next(iter(rows.values()))
docs = any_row["num_documents"] // max(1, len(any_row["turn_accuracy"]))
print(f"Accuracy per turn, {docs} documents (multiturn mode, block size {any_row.get('block_size')}, "
      f"device {any_row.get('device')}); mean = over turns.\n")
print("| policy | budget | " + " | ".join(f"turn {t + 1}" for t in range(turns)) + " | mean |")
print("|---|---:|" + "---:|" * (turns + 1))
for policy in order:
    for (p, b), r in sorted(rows.items(), key=lambda kv: kv[0][1]):
        if p != policy:
            continue
        acc = [t["accuracy"] for t in r["turn_accuracy"]]
        cells = [f"{a:.3f}" for a in acc] + ["-"] * (turns - len(acc))
        mean = sum(acc) / len(acc) if acc else 0.0
        extra = f" ({r['failed']} failed)" if r.get("failed") else ""
        extra += "" if r.get("applies", True) else " (n/a)"
        print(f"| {'full KV' if p == 'full' else p} | {'-' if p == 'full' else b} | " + " | ".join(cells) +
              f" | {mean:.3f}{extra} |")
PYEOF
cat "$OUT/multiturn_table.md"
