#!/usr/bin/env python3
"""Per-kernel totals of an ncu CSV log (--metrics gpu__time_duration.sum --csv --print-units base),
largest first: ncu_kernel_totals.py LOG LABEL [TOP] [DIVISOR] prints "NCU ..." lines; DIVISOR
divides every total (e.g. the number of identical batches profiled)."""
import collections
import csv
import sys

log, label = sys.argv[1], sys.argv[2]
top = int(sys.argv[3]) if len(sys.argv) > 3 else 14
div = float(sys.argv[4]) if len(sys.argv) > 4 else 1.0
rows = [l for l in open(log) if l.startswith('"')]
tot, cnt = collections.Counter(), collections.Counter()
for r in csv.DictReader(rows):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    name = r["Kernel Name"].split("(")[0][:70]
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}.get(r.get("Metric Unit"), 1e-3)
    tot[name] += float(r["Metric Value"].replace(",", "")) * scale / div
    cnt[name] += 1
print(f"NCU {label}: {sum(cnt.values()) / div:.0f} kernels, {sum(tot.values()) / 1e3:.3f} ms of kernel time (us below)")
for name, us in tot.most_common(top):
    print(f"NCU {us:10.1f} us {cnt[name] / div:7.0f}x {us / cnt[name] * div:8.1f} us  {name}")
