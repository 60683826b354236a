#!/usr/bin/env python3
"""The timed A/B table of the carried-binaries calls (dev/prepared_call.sh,
dev/refresh_call.sh and the one-off calls of session 21): reads LOGDIR/<binary>_bench_<round>.txt (kda_decode_cuda_bench's
output, one file per binary and round) and prints, per (state, N, T), the first binary's median
`stream` time and share of the floor, and each other binary's median and its change against it;
then the same for the times under the stable-state promise (the bench's `chosen_stable`, what a
decode step launches), where the bench printed them; then, from the bench's JSON
(LOGDIR/<binary>_<round>.json) where it wrote one, the rule's own choice at the points where that
is not `stream` (the per-head kernels at small N: the variant the launch would run), and the
times of each variant AB_VARIANTS names (a comma list) whatever the rule chose.

usage: ab_table.py LOGDIR BASELINE OTHER...
"""
import glob
import json
import os
import re
import statistics
import sys

PATTERN = re.compile(r"^\s+(bf16|f32) N=(\d+) T=(\d+) \(G=\d+\):.* stream ([\d.]+) .*floor ([\d.]+)")
STABLE = re.compile(r"^\s+A/B (bf16|f32) N=(\d+) T=(\d+): \w+ with the stable-state promise ([\d.]+) vs")


def main():
    logdir, baseline, others = sys.argv[1], sys.argv[2], sys.argv[3:]
    runs, stable, floors = {}, {}, {}
    for path in glob.glob(os.path.join(logdir, "*_bench_*.txt")):
        binary = os.path.basename(path).split("_bench_")[0]
        for line in open(path):
            m = PATTERN.match(line)
            if m:
                key = (m[1], int(m[2]), int(m[3]))
                runs.setdefault(binary, {}).setdefault(key, []).append((float(m[4]), float(m[5])))
                floors[key] = float(m[5])
            m = STABLE.match(line)
            if m:
                key = (m[1], int(m[2]), int(m[3]))
                stable.setdefault(binary, {}).setdefault(key, []).append(float(m[4]))
    table(runs, baseline, others, "")
    if stable:
        for times in stable.values():
            for key, v in times.items():
                times[key] = [(u, floors.get(key, 0.0)) for u in v]
        print()
        table(stable, baseline, others, " (stable)")
    chosen = {}
    # AB_VARIANTS (variant_ab_call.sh's BENCH_VARIANTS other than stream): each one's own time
    # from the JSON (`<name>_us`), whatever the rule chose.
    named = {v: {} for v in os.environ.get("AB_VARIANTS", "").split(",") if v and v != "stream"}
    for path in glob.glob(os.path.join(logdir, "*_*.json")):
        binary = os.path.basename(path)[: -len(".json")].rsplit("_", 1)[0]
        try:
            points = json.load(open(path))
        except (OSError, ValueError):
            continue
        for r in points:
            for v, times in named.items():
                if r.get(f"{v}_us", -1) > 0:
                    key = (r["state"], r["N"], r["T"])
                    times.setdefault(binary, {}).setdefault(key, []).append(
                        (r[f"{v}_us"], r["floor_us"]))
            if r.get("variant", "stream") != "stream" and r.get("us", -1) > 0:
                key = (r["state"], r["N"], r["T"], r["variant"])
                chosen.setdefault(binary, {}).setdefault(key, []).append((r["us"], r["floor_us"]))
    if chosen.get(baseline):
        print()
        table(chosen, baseline, others, " (chosen)")
    for v, times in named.items():
        if times.get(baseline):
            print()
            table(times, baseline, others, f" ({v})")


def table(runs, baseline, others, label):
    base = runs.get(baseline, {})
    header = f"{'state':6} {'N':>4} {'T':>2} {baseline + label + ' us':>9} {'%floor':>7}"
    for b in others:
        header += f" {b:>9} {'chg':>7}"
    print(header)
    for key in sorted(base):
        h = statistics.median(u for u, _ in base[key])
        floor = base[key][0][1]
        row = f"{key[0]:6} {key[1]:4} {key[2]:2} {h:9.2f} {100 * floor / h:6.1f}%"
        if len(key) > 3:  # the chosen table: the variant's name
            row += f" {key[3]}"
        for b in others:
            v = runs.get(b, {}).get(key)
            if v:
                m = statistics.median(u for u, _ in v)
                row += f" {m:9.2f} {100 * (m - h) / h:+6.1f}%"
            else:
                row += f" {'-':>9} {'-':>7}"
        print(row)


if __name__ == "__main__":
    main()
