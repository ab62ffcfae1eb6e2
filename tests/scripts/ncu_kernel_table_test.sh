#!/usr/bin/env bash
# scripts/ncu_kernel_table.py on a real ncu CSV (tests/data/ncu: 24 kernels of a decode step at batch
# 64, with the application's own lines before the header): kernel names' launches and totals
# against the same sums taken here from the raw rows, the names shortened, the rows longest
# first, the per-layer column, and clear failures on a file with no header or an unknown unit.
# Usage: ncu_kernel_table_test.sh SOURCE_DIR
set -euo pipefail
SRC=$1
CSV=$SRC/tests/data/ncu/decode_batch64_kernels.csv
TOOL=$SRC/scripts/ncu_kernel_table.py
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*"; cat "$WORK/table.md" 2>/dev/null || true; exit 1; }
python3 "$TOOL" "$CSV" --layers 2 > "$WORK/table.md" || fail "the tool failed"
# The raw rows, summed independently of the tool: launches and us of the kernels whose full name
# contains $1 (every kernel for "").
raw() { python3 - "$CSV" "$1" <<'PY'
import csv, sys
n, s = 0, 0.0
for row in csv.reader(open(sys.argv[1])):
    if len(row) == 15 and row[0].isdigit() and sys.argv[2] in row[4]:
        n += 1
        s += float(row[14].replace(",", ""))
print(n, f"{s / 1000:.1f}", f"{s / 2000:.2f}")  # launches, us, us over two layers
PY
}
for k in scale_product_kernel sum_scale_partials_kernel "add_rmsnorm_quantize_vec_kernel<2>" "paged_decode_fp8_stream_kernel<128>"; do
  read -r n total _ <<< "$(raw "$k")"
  [ "$n" -gt 0 ] || fail "no raw rows for $k"
  grep -qF "| $k | $n | $total |" "$WORK/table.md" || fail "row of $k: want $n launches, $total us"
done
read -r n total half <<< "$(raw "")"
[ "$n" = 24 ] || fail "the fixture should hold 24 kernels, found $n"
grep -qF "| all | 24 | $total | | 100% |" "$WORK/table.md" || fail "the total row (want $total us)"
# Per layer: the total over --layers 2.
grep -qF "| all | 24 | $total | | 100% | $half |" "$WORK/table.md" || fail "per-layer total (want $half)"
# Names without argument lists, 'void ' or the origami namespaces.
grep -E '^\| [^|]*(\(|void |origami::)' "$WORK/table.md" && fail "a name was not shortened"
# Longest total first.
awk -F'|' 'NR > 2 && $2 !~ /all/ { print $4 + 0 }' "$WORK/table.md" > "$WORK/totals"
sort -g -r -c "$WORK/totals" || fail "rows are not longest first"
# --top keeps that many rows (and the total over all kernels).
[ "$(python3 "$TOOL" "$CSV" --top 3 | grep -v -e '^| kernel ' -e '^| all ' -e '^|---' | grep -c '^| ')" = 3 ] || fail "--top 3"
# No header: a clear error, not a traceback.
printf 'just the application output\n' > "$WORK/none.csv"
python3 "$TOOL" "$WORK/none.csv" > /dev/null 2> "$WORK/err" && fail "a file without a header was accepted"
grep -q "no ncu CSV header" "$WORK/err" || fail "the no-header message"
sed 's/"ns","/"furlongs","/' "$CSV" > "$WORK/unit.csv"
python3 "$TOOL" "$WORK/unit.csv" > /dev/null 2> "$WORK/err" && fail "an unknown unit was accepted"
grep -q "unknown time unit 'furlongs'" "$WORK/err" || fail "the unit message"
# A value ncu could not measure: named, not a traceback.
sed '0,/"ns","[0-9,]*"$/s//"ns","n\/a"/' "$CSV" > "$WORK/na.csv"
python3 "$TOOL" "$WORK/na.csv" > /dev/null 2> "$WORK/err" && fail "a kernel without a time was accepted"
grep -q "has no time ('n/a')" "$WORK/err" || fail "the missing-time message"
echo "ncu_kernel_table_test: OK"
