#!/usr/bin/env bash
# scripts/ab_snapshot.sh and scripts/gpu_ab.sh without a GPU, in a throwaway git repository
# holding copies of the two scripts and their library: a variant from a commit and one from the
# working tree are put in place in turn (the command reads the file, so each measured value names
# the variant whose file was in place), rounds alternate the variants, the table shows each
# variant's values and its ratio to the first, and the tree's own file is back afterwards, also
# after a run that fails.
# Usage: gpu_ab_cpu_test.sh SOURCE_DIR
set -euo pipefail
SRC=$1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*"; cat "$WORK/stdout.txt" 2>/dev/null || true; exit 1; }
repo=$WORK/repo
mkdir -p "$repo/scripts/lib" "$repo/src"
cp "$SRC/scripts/ab_snapshot.sh" "$SRC/scripts/gpu_ab.sh" "$repo/scripts/"
cp "$SRC/scripts/lib/gpu_common.sh" "$repo/scripts/lib/"
cd "$repo"
git init -q . && git config user.email t@t && git config user.name t
echo 2.0 > src/kernel.txt
git add -A && git commit -qm base
echo 1.5 > src/kernel.txt   # the working tree's version: the candidate
scripts/ab_snapshot.sh old HEAD -- src/kernel.txt > /dev/null || fail "snapshot from HEAD"
scripts/ab_snapshot.sh new -- src/kernel.txt > /dev/null || fail "snapshot from the tree"
[ "$(cat .ab/old/src/kernel.txt)" = 2.0 ] && [ "$(cat .ab/new/src/kernel.txt)" = 1.5 ] || fail "snapshot contents"
scripts/ab_snapshot.sh bad HEAD -- src/missing.txt > /dev/null 2>&1 && fail "a file missing from REF was accepted"
echo 9.9 > src/kernel.txt   # what the tree holds while the A/B runs; it must come back
# Each run prints the decode bench's line shape with the file's value as the step time.
CMD='for b in 1 64; do echo "ROOFLINE x graphs=1 batch=$b context=1024: $(cat src/kernel.txt) ms/step, floor 1 ms"; done'
GPU_SKIP_BUILD=1 OUT=$WORK/out AB_VARIANTS="old new" AB_ROUNDS=2 AB_CMD=$CMD scripts/gpu_ab.sh > "$WORK/stdout.txt" 2>&1 \
  || fail "gpu_ab.sh failed"
[ "$(cat src/kernel.txt)" = 9.9 ] || fail "the tree's file was not put back"
[ "$(wc -l < "$WORK/out/ab.txt")" = 8 ] || fail "expected 2 rounds x 2 variants x 2 keys = 8 lines"
# Rounds alternate: old, new, old, new.
[ "$(awk '$3 == "batch=1_context=1024" {print $1 $2}' "$WORK/out/ab.txt" | tr -d '\n')" = 1old1new2old2new ] || fail "variant order"
grep -qF '| batch=1 context=1024 | 2 / 2 | 1.5 / 1.5 | 0.7500 |' "$WORK/out/ab_table.md" || fail "table row"
grep -v '^$' "$WORK/stdout.txt" | tail -1 | grep -qF '| batch=64 context=1024 | 2 / 2 | 1.5 / 1.5 | 0.7500 |' \
  || fail "the table is not printed last"
# Variants that are not folders under .ab are refused.
GPU_SKIP_BUILD=1 OUT=$WORK/out2 AB_VARIANTS="old nosuch" AB_CMD=true scripts/gpu_ab.sh > /dev/null 2>&1 && fail "an unknown variant was accepted"
GPU_SKIP_BUILD=1 OUT=$WORK/out2 AB_VARIANTS="../.ab/old" AB_CMD=true scripts/gpu_ab.sh > /dev/null 2>&1 \
  && fail "a variant path reaching outside .ab was accepted"
# A run that fails still puts the tree's file back.
GPU_SKIP_BUILD=1 OUT=$WORK/out3 AB_VARIANTS="new" AB_CMD='exit 3' scripts/gpu_ab.sh > /dev/null 2>&1 || true
[ "$(cat src/kernel.txt)" = 9.9 ] || fail "the tree's file was not put back after a failing command"
echo "gpu_ab.sh on the CPU: OK"
