#!/usr/bin/env bash
# Keeps one variant of some source files for scripts/gpu_ab.sh: copies each FILE (a repository
# path) as of REF, or as the working tree has it when REF is left out, to .ab/NAME/FILE. .ab is
# git-ignored: name it in the device call's carry.
#   scripts/ab_snapshot.sh old HEAD -- src/backend/cuda/paged_attention.cu
#   scripts/ab_snapshot.sh new -- src/backend/cuda/paged_attention.cu src/backend/cuda/paged_attention_mma.cuh
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { echo "usage: scripts/ab_snapshot.sh NAME [REF] -- FILE..." >&2; exit 2; }
[ $# -ge 3 ] || usage
name=$1; shift
ref=""
if [ "$1" != "--" ]; then ref=$1; shift; fi
[ "${1:-}" = "--" ] || usage
shift
[ $# -ge 1 ] || usage
case "$name" in ""|.*|*/*) echo "ab_snapshot: NAME must be a plain folder name, not '$name'" >&2; exit 2 ;; esac
for f in "$@"; do
  mkdir -p ".ab/$name/$(dirname "$f")"
  if [ -n "$ref" ]; then
    git show "$ref:$f" > ".ab/$name/$f" || { echo "ab_snapshot: $f is not in $ref" >&2; exit 1; }
  else
    [ -f "$f" ] || { echo "ab_snapshot: no file $f" >&2; exit 1; }
    cp "$f" ".ab/$name/$f"
  fi
done
echo "ab_snapshot: .ab/$name holds $# file(s)${ref:+ as of $ref}"
