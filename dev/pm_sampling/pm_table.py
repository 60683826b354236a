#!/usr/bin/env python3
"""dev/pm_sampling/pm_table.py CSV...: per launch of each dev/pm_sampling/pm_dump.py file, the
launch's window (first to last PM sample with an SM active, 1.5 us samples), its DRAM read rate
(% of peak) over the plateau (100 us .. 1900 us), after it and over the last 100 us, and the drain:
the time from the last sample at >= 90% read to the window's end. Reads here, after a
dev/pm_sampling/pm_call.sh device call."""
import collections
import csv
import os
import sys

READ = "dramc__read_throughput.avg.pct_of_peak_sustained_elapsed"
ACTIVE = "sm__cycles_active.avg"


def launches(path):
    series = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in csv.DictReader(open(path)):
        if r["correlation"] and "Triage" in r["metric"]:
            series[int(r["launch"])][r["metric"].split(".", 2)[2]].append(
                (int(r["correlation"]), float(r["value"])))
    for launch in sorted(series):
        read, active = series[launch][READ], series[launch][ACTIVE]
        samples = [(t, v, a[1]) for (t, v), a in zip(read, active) if t > 0]
        on = [t for t, _, a in samples if a > 0]
        t0, t1 = on[0], on[-1]
        yield [((t - t0) / 1000, v) for t, v, _ in samples if t0 <= t <= t1]


def mean(samples, lo, hi):
    w = [v for t, v in samples if lo <= t < hi]
    return sum(w) / len(w) if w else float("nan")


print(f"{'launch':12s} {'window us':>9s} {'plateau %':>9s} {'after %':>8s} {'last100 %':>9s} "
      f"{'drain us':>8s} {'read us@100%':>12s}")
for path in sys.argv[1:]:
    name = os.path.basename(path)[3:-4]
    for i, s in enumerate(launches(path)):
        end = s[-1][0]
        last_full = max(t for t, v in s if v >= 90)
        print(f"{name + '/' + str(i):12s} {end:9.1f} {mean(s, 100, 1900):9.3f} "
              f"{mean(s, 1900, end - 100):8.3f} {mean(s, end - 100, end + 1):9.2f} "
              f"{end - last_full:8.1f} {sum(v for _, v in s) * 1.5 / 100:12.1f}")
