#!/usr/bin/env bash
# dev/mbar_watchdog_call.sh: where the mbarrier hand-offs deadlock. cuda_all_test built here from
# HEAD + dev/kda-ws-mbarrier-handoffs.patch + kda-ws-normed-mbarrier.patch + a watchdog
# (-DSPLICE_DEV_MBAR_WATCHDOG, dev/kda-ws-mbarrier-watchdog.patch): an mbarrier wait open for 2 s
# prints its CTA, warp, site (1 sweep: precomputed; 2 sweep: stage full; 3 precompute: stage
# full; 4 precompute: swept; 5 precompute: normed; 6 8-warp stream: stage full; 7 split:
# partials), item and the barrier's raw word, then traps. Carried as .gpubin/pack/wd.tgz:
#   run(command="dev/mbar_watchdog_call.sh", carry=[".gpubin/pack/wd.tgz", ".deps"])
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu"
OUT=${OUT:?}
P=/tmp/wd
mkdir -p $P && tar xzf .gpubin/pack/wd.tgz -C $P
exec > >(tee -a "$OUT/summary.txt") 2>&1
for r in 1 2 3 4 5 6 7 8; do
  s=$SECONDS
  timeout 25 $P/wd/cuda_all_test --gtest_filter='KdaCuda.PerRowModesEveryVariant' >$OUT/round_$r.txt 2>&1
  rc=$?
  echo "round $r: rc $rc in $((SECONDS - s)) s; $(grep -c 'mbar watchdog' $OUT/round_$r.txt) watchdog lines"
  grep 'mbar watchdog' $OUT/round_$r.txt | sort | uniq -c | sort -rn | head -30
  grep -m3 'variant=\|Failure\|error' $OUT/round_$r.txt
done
tar czf $OUT/rounds.tgz -C $OUT $(cd $OUT && ls round_*.txt) && rm -f $OUT/round_*.txt
