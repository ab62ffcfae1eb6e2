#!/usr/bin/env bash
# A/B of source variants in one device call: each variant's files (kept by scripts/ab_snapshot.sh
# under .ab/NAME) are put in place in turn, the targets rebuilt into the same build folder and the
# command run, variant after variant for AB_ROUNDS rounds, so that the machine's drift falls on
# every variant alike. The tree's own files are put back at the end (also on failure). Prints
# a table last: one row per measured key, each variant's values in round order and its mean
# against the first variant's. Logs: $OUT/ab.txt (round, variant, key, value), build_NAME.log.
#
#   scripts/ab_snapshot.sh old HEAD -- src/backend/cuda/paged_attention.cu        # here
#   scripts/ab_snapshot.sh new -- src/backend/cuda/paged_attention.cu
#   AB_VARIANTS="old new" scripts/gpu_ab.sh                      # device, carry [".ab", ...]
#
# Environment:
#   AB_VARIANTS  folder names under .ab (required), the first one the baseline of the ratios
#   AB_TARGETS   build targets (default cuda_decode_bench_test); GPU_SKIP_BUILD=1 builds none
#   AB_ROUNDS    rounds (default 2)
#   AB_CMD       the command run for a variant (bash -c); default: the decode step
#                (cuda_decode_bench_test Roofline, graphs, fused quantization) at each AB_SHAPES
#                batch:context (default "472:1088 256:1024 64:1024 1:1024"), with
#                ORIGAMI_BENCH_CONFIG / _QUANTIZATION / _KV_DTYPE as given (default llama-3.1-8b,
#                fp8, fp8)
#   AB_KEY       Python regex on each output line, groups (key, value): the measured lines
#                (default: the Roofline lines' "batch=B context=C" and their ms/step)
set -uo pipefail
source "$(dirname "$0")/lib/gpu_common.sh"
gpu_script_init /tmp/origami-gpu-ab
[ -n "${AB_VARIANTS:-}" ] || { echo "gpu_ab: set AB_VARIANTS (folders under .ab, see scripts/ab_snapshot.sh)" >&2; exit 2; }
read -r -a variants <<< "$AB_VARIANTS"
for v in "${variants[@]}"; do
  # Plain folder names, as ab_snapshot.sh makes them: no path reaching outside .ab.
  case "$v" in .*|*/*) echo "gpu_ab: a variant is a folder name under .ab, not '$v'" >&2; exit 2 ;; esac
  [ -d "$ROOT/.ab/$v" ] || { echo "gpu_ab: no variant folder .ab/$v (carry .ab to the device)" >&2; exit 2; }
done
read -r -a targets <<< "${AB_TARGETS:-cuda_decode_bench_test}"
ROUNDS=${AB_ROUNDS:-2}
export ORIGAMI_BENCH_CONFIG=${ORIGAMI_BENCH_CONFIG:-llama-3.1-8b} ORIGAMI_BENCH_QUANTIZATION=${ORIGAMI_BENCH_QUANTIZATION:-fp8}
export ORIGAMI_BENCH_KV_DTYPE=${ORIGAMI_BENCH_KV_DTYPE:-fp8} BUILD AB_SHAPES=${AB_SHAPES:-"472:1088 256:1024 64:1024 1:1024"}
DEFAULT_CMD='for bc in $AB_SHAPES; do ORIGAMI_CUDA_BENCH=1 ORIGAMI_BENCH_FUSED_QUANTIZE=1 ORIGAMI_BENCH_BATCHES=${bc%:*} ORIGAMI_BENCH_CONTEXTS=${bc#*:} "$BUILD/tests/cuda_decode_bench_test" --gtest_filter="*Roofline*"; done'
CMD=${AB_CMD:-$DEFAULT_CMD}
KEY=${AB_KEY:-'^ROOFLINE .*(batch=\d+ context=\d+): ([0-9.]+) ms/step'}

# The files variant $1 replaces, as repository paths.
variant_files() { (cd "$ROOT/.ab/$1" && find . -type f | sed 's|^\./||'); }
# Every file some variant replaces, and the tree's own copy of each, put back on exit.
mapfile -t files < <(for v in "${variants[@]}"; do variant_files "$v"; done | sort -u)
saved=$(mktemp -d)
for f in "${files[@]}"; do
  if [ -f "$ROOT/$f" ]; then mkdir -p "$saved/$(dirname "$f")" && cp "$ROOT/$f" "$saved/$f"; fi
done
restore() {
  for f in "${files[@]}"; do
    if [ -f "$saved/$f" ]; then cp "$saved/$f" "$ROOT/$f"; else rm -f "$ROOT/$f"; fi
  done
  rm -rf "$saved"
}
trap restore EXIT

: > "$OUT/ab.txt"
for ((r = 1; r <= ROUNDS; r++)); do
  for v in "${variants[@]}"; do
    # Each variant starts from the tree's files, then takes its own.
    for f in "${files[@]}"; do [ -f "$saved/$f" ] && cp "$saved/$f" "$ROOT/$f"; done
    variant_files "$v" | while read -r f; do cp "$ROOT/.ab/$v/$f" "$ROOT/$f"; done
    gpu_build "$BUILD" "$OUT/build_$v.log" "${targets[@]}" || exit 1
    if [ "$GPU_BUILD_RC" != 0 ]; then echo "gpu_ab: variant $v does not build (build_$v.log):"; grep -E "error" "$OUT/build_$v.log" | head -5; exit 1; fi
    bash -c "$CMD" 2>&1 | python3 -c '
import re, sys
key = re.compile(sys.argv[1])
for line in sys.stdin:
    m = key.search(line)
    if m: print(sys.argv[2], sys.argv[3], m.group(1).replace(" ", "_"), m.group(2))
' "$KEY" "$r" "$v" | tee -a "$OUT/ab.txt"
  done
done

python3 - "$OUT/ab.txt" "${variants[@]}" <<'PY' | tee "$OUT/ab_table.md"
import sys
path, variants = sys.argv[1], sys.argv[2:]
values, keys = {}, []
for line in open(path):
    r, v, k, x = line.split()
    if k not in keys: keys.append(k)
    values.setdefault((k, v), []).append(float(x))
mean = lambda xs: sum(xs) / len(xs)
print("| key | " + " | ".join(variants) + " | " + " | ".join(f"{v} / {variants[0]}" for v in variants[1:]) + " |")
print("|---" * (1 + 2 * len(variants) - 1) + "|")
for k in keys:
    cells = [" / ".join(f"{x:g}" for x in values.get((k, v), [])) or "-" for v in variants]
    base = values.get((k, variants[0]))
    ratios = [f"{mean(values[(k, v)]) / mean(base):.4f}" if base and (k, v) in values else "-" for v in variants[1:]]
    print(f"| {k.replace('_', ' ')} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
PY
