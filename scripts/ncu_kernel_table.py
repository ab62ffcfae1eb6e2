#!/usr/bin/env python3
"""Per-kernel table of an ncu CSV of gpu__time_duration.sum (scripts/gpu_kernel_breakdown.sh).

Reads `ncu --csv --print-units base --metrics gpu__time_duration.sum` output (the application's own
lines mixed in are skipped), groups the kernels by name (argument lists, `void ` and the
`origami::<unnamed>::` / `origami::cuda::` prefixes dropped; template arguments kept, so
fp8_gemv_kernel<1> and <2> stay apart), and prints one markdown row per name, longest total first:
launches, total us, us per launch and share of the profiled time. --layers N adds us per layer
(total / N), for a profile of N layers' kernels.

Usage: ncu_kernel_table.py CSV [--layers N] [--top K]
"""
import argparse
import csv
import re
import sys
from collections import OrderedDict


def short_name(name):
    name = re.sub(r"\(.*$", "", name)  # the argument list
    name = re.sub(r"^void ", "", name)
    return re.sub(r"^origami::(<unnamed>::|cuda::(<unnamed>::)?)*", "", name)


def kernel_times(path):
    """(name, ns) per profiled kernel, in launch order."""
    rows, header = [], None
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if header is None:
                if "Kernel Name" in row and "Metric Value" in row:
                    header = row
                continue
            if len(row) != len(header):
                continue  # the application's output
            rec = dict(zip(header, row))
            if rec.get("Metric Name") != "gpu__time_duration.sum":
                continue
            try:
                value = float(rec["Metric Value"].replace(",", ""))
            except ValueError:
                sys.exit(f"ncu_kernel_table: kernel {rec['ID']} of {path} has no time ('{rec['Metric Value']}')")
            unit = rec.get("Metric Unit", "ns")
            scale = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}.get(unit)
            if scale is None:
                sys.exit(f"ncu_kernel_table: unknown time unit '{unit}' in {path}")
            rows.append((short_name(rec["Kernel Name"]), value * scale))
    if header is None:
        sys.exit(f"ncu_kernel_table: no ncu CSV header (Kernel Name, Metric Value) in {path}")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--layers", type=int, default=0, help="layers the profile spans: adds us per layer")
    ap.add_argument("--top", type=int, default=0, help="only the K longest kernels (0: all)")
    args = ap.parse_args()
    times = kernel_times(args.csv)
    if not times:
        sys.exit(f"ncu_kernel_table: no kernel times in {args.csv}")
    agg = OrderedDict()
    for name, ns in times:
        count, total = agg.get(name, (0, 0.0))
        agg[name] = (count + 1, total + ns)
    grand = sum(total for _, total in agg.values())
    if grand <= 0:
        sys.exit(f"ncu_kernel_table: the kernels of {args.csv} add up to no time")
    rows = sorted(agg.items(), key=lambda kv: -kv[1][1])
    if args.top > 0:
        rows = rows[: args.top]
    per_layer = args.layers > 0
    print("| kernel | launches | total us | us each | share |" + (" us a layer |" if per_layer else ""))
    print("|---|---|---|---|---|" + ("---|" if per_layer else ""))
    for name, (count, total) in rows:
        line = f"| {name} | {count} | {total / 1e3:.1f} | {total / count / 1e3:.2f} | {100 * total / grand:.1f}% |"
        if per_layer:
            line += f" {total / args.layers / 1e3:.2f} |"
        print(line)
    print(f"| all | {len(times)} | {grand / 1e3:.1f} | | 100% |" + (f" {grand / args.layers / 1e3:.2f} |" if per_layer else ""))


if __name__ == "__main__":
    main()
