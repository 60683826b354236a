#!/usr/bin/env python3
"""dev/tuning_diff.py CACHE.json ...: the tuning-cache entries whose winning arm differs between
runs (each file one fresh tuning of the same model), with every run's per-arm medians (us).
Usage: python3 dev/tuning_diff.py /tmp/t1.json /tmp/t2.json /tmp/t3.json"""
import json
import sys

runs = [json.load(open(path))["entries"] for path in sys.argv[1:]]
keys = sorted(set().union(*runs))
print(f"{len(keys)} entries, {len(runs)} runs")
for key in keys:
    entries = [r.get(key) for r in runs]
    winners = [e["winner"] if e else None for e in entries]
    if len(set(winners)) > 1:
        kind = key.split("|")[1] if "|" in key else key
        print(f"{kind} {key.split('|')[-1]}: winners {winners}")
        print(f"    {key[:150]}")
        for e in entries:
            if e:
                print("    medians", e["median_us"], e.get("reason", ""))
