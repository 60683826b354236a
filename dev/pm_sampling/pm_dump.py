#!/usr/bin/env python3
"""dev/pm_sampling/pm_dump.py REPORT OUT_CSV: every instanced metric of each profiled launch of an
Nsight Compute report (the PmSampling section's timelines among them) as long-form CSV: launch,
metric, instance, correlation id (the sample's timestamp in ns for the sampled metrics), value.
Only metrics matching PM_METRICS (a regex; default the DRAM read rate, SM activity, CTA launches,
instruction rate and the profiler's timestamps). Uses ncu's own python module (extras/python/ncu_report.py, found beside the ncu binary)."""
import csv
import glob
import os
import re
import shutil
import sys

ncu = os.path.realpath(shutil.which("ncu"))
for d in glob.glob(os.path.join(os.path.dirname(ncu), "extras", "python")) + glob.glob(
        "/opt/nvidia/nsight-compute/*/extras/python") + glob.glob("/usr/local/cuda*/nsight-compute*/extras/python"):
    sys.path.insert(0, d)
import ncu_report  # noqa: E402

ctx = ncu_report.load_report(sys.argv[1])
launches = [ctx.range_by_idx(r).action_by_idx(a) for r in range(ctx.num_ranges())
            for a in range(ctx.range_by_idx(r).num_actions())]
print("kernel:", launches[0].name()[:120], "launches:", len(launches))
keep = re.compile(os.environ.get(
    "PM_METRICS", r"dramc__read_throughput|sm__cycles_active|ctas_launched|inst_executed_realtime.avg.per|profiler__"))
rows = 0
with open(sys.argv[2], "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["launch", "metric", "instance", "correlation", "value"])
    for launch, action in enumerate(launches):
        for name in action.metric_names():
            m = action.metric_by_name(name)
            n = m.num_instances()
            if n == 0 or not keep.search(name):
                continue
            ids = m.correlation_ids() if m.has_correlation_ids() else None
            for i in range(n):
                try:
                    v = m.as_double(i)
                except Exception:  # string-valued instances
                    v = m.as_string(i)
                c = ids.as_uint64(i) if ids is not None else ""
                w.writerow([launch, name, i, c, v])
                rows += 1
print("instanced rows:", rows)
