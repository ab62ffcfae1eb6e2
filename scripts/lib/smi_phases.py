#!/usr/bin/env python3
"""Clocks and power per phase of a GPU script, from nvidia-smi's samples.

  smi_phases.py PHASES SMI_CSV            a table: each phase's samples, mean SM MHz (min), mean
                                          power and the throttle reasons seen
  smi_phases.py --cell NAME PHASES SMI_CSV  one phase's "MHz (min) / W, reasons" for a table cell

PHASES: lines "name <start epoch s>" then "end <end epoch s>", as the scripts write them.
SMI_CSV: nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,
clocks_event_reasons.active --format=csv,noheader,nounits -lms 500, as gpu_common.sh's gpu_smi_start
writes it. A phase's first 2 s are left out
(start-up: allocation, graph capture), so a phase shorter than that has no samples.
"""
import datetime
import sys


def load(phases_path, smi_path):
    marks = [line.split() for line in open(phases_path) if line.strip()]
    phases = [(marks[i][0], float(marks[i][1]), float(marks[i + 1][1])) for i in range(0, len(marks) - 1, 2)]
    samples = []
    for line in open(smi_path):
        f = [x.strip() for x in line.split(",")]
        try:
            t = datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            samples.append((t, float(f[1]), float(f[3]), f[5]))
        except (ValueError, IndexError):
            pass
    return phases, samples


def summary(samples, t0, t1):
    s = [x for x in samples if t0 + 2 <= x[0] <= t1]
    if not s:
        return None
    clk = [x[1] for x in s]
    pw = [x[2] for x in s]
    return len(s), sum(clk) / len(clk), min(clk), sum(pw) / len(pw), " ".join(sorted(set(x[3] for x in s)))


def main(argv):
    if argv[:1] == ["--cell"]:
        name, phases, samples = argv[1], *load(argv[2], argv[3])
        for n, t0, t1 in phases:
            if n == name:
                r = summary(samples, t0, t1)
                print("" if r is None else "%.0f (%.0f) MHz / %.0f W, %s" % (r[1], r[2], r[3], r[4]))
                return
        print("")
        return
    phases, samples = load(argv[0], argv[1])
    print("%-16s %8s %14s %14s %s" % ("phase", "samples", "SM MHz (min)", "power W", "throttle reasons seen"))
    for name, t0, t1 in phases:
        r = summary(samples, t0, t1)
        if r is None:
            print("%-16s %8d" % (name, 0))
        else:
            print("%-16s %8d %8.0f (%4.0f) %14.0f %s" % (name, r[0], r[1], r[2], r[3], r[4]))


if __name__ == "__main__":
    main(sys.argv[1:])
