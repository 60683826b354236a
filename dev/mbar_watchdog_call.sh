#!/usr/bin/env bash
# dev/mbar_watchdog_call.sh: where an mbarrier wait of the KDA kernels deadlocks. Carries a
# cuda_all_test built here with dev/kda-mbar-watchdog.patch (its header says how): a wait open too
# long prints its CTA, warp, site (1 sweep: precomputed; 2 sweep: stage full; 3 precompute: stage
# full; 4 precompute: swept; 5 precompute: normed; 6 8-warp stream: stage full; 7 split:
# partials), item and the barrier's raw word, then traps. Runs KdaCuda.PerRowModesEveryVariant
# (set WD_FILTER for others) 8 times and prints each round's watchdog lines. Pack and call:
#   mkdir -p /tmp/wdpack/wd && strip -o /tmp/wdpack/wd/cuda_all_test build/wd/tests/cuda_all_test
#   tar czf .gpubin/pack/wd.tgz -C /tmp/wdpack wd
#   run(command="dev/mbar_watchdog_call.sh", carry=[".gpubin/pack/wd.tgz", ".deps"])
# Found the stage-announcement race in one call (perf.md run 159).
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
P=/tmp/wd
mkdir -p $P && tar xzf .gpubin/pack/wd.tgz -C $P
for r in 1 2 3 4 5 6 7 8; do
  s=$SECONDS
  timeout 60 $P/wd/cuda_all_test --gtest_filter="${WD_FILTER:-KdaCuda.PerRowModesEveryVariant}" >$OUT/round_$r.txt 2>&1
  rc=$?
  echo "round $r: rc $rc in $((SECONDS - s)) s; $(grep -c 'mbar watchdog' $OUT/round_$r.txt) watchdog lines"
  grep 'mbar watchdog' $OUT/round_$r.txt | sort | uniq -c | sort -rn | head -30
  grep -m3 'variant=\|Failure\|error' $OUT/round_$r.txt
done
tar czf $OUT/rounds.tgz -C $OUT $(cd $OUT && ls round_*.txt) && rm -f $OUT/round_*.txt
