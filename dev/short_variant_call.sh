#!/usr/bin/env bash
# dev/short_variant_call.sh FILTER STATES TS NS [RACE]: a short call (a session's last device
# minutes) on .gpubin/pack/variants.tgz (dev/pack_binaries.sh variants PATCH...): each variant's
# GPU tests matching FILTER (4 shards at once, cut at 75 s) and racecheck on the test RACE
# (default KdaCuda.OneStreamCtaF32T1), then head and the variants timed alone in interleaved
# processes (3 rounds) at the given KDA_BENCH_STATES / _TS / _NS (dev/ab_table.py). Carry
# variants.tgz and .deps. E.g. (perf.md run 170):
#   dev/short_variant_call.sh 'KdaCuda.*F32*:KdaCuda.T1Grid' f32 1 32,128,512
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
FILTER=${1:?filter}; STATES=${2:?states}; TS=${3:?ts}; NS=${4:?ns}; RACE=${5:-KdaCuda.OneStreamCtaF32T1}
P=/tmp/sv; L=/tmp/sv-logs
rm -rf $P $L; mkdir -p $P $L; tar xzf .gpubin/pack/variants.tgz -C $P
variants=()
for d in $P/*/; do d=$(basename $d); [[ $d != head ]] && variants+=($d); done
echo "== 1. tests ($FILTER) and racecheck (at $(el) s)"
pids=()
for v in "${variants[@]}"; do
  for i in 0 1 2 3; do
    GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i timeout 75 $P/$v/cuda_all_test --gtest_filter="$FILTER" >$L/${v}_s$i.txt 2>&1 &
    pids+=($!)
  done
  ( timeout 60 compute-sanitizer --tool racecheck --error-exitcode 3 $P/$v/cuda_all_test \
      --gtest_filter=$RACE >$L/${v}_race.txt 2>&1; echo "rc $?" >>$L/${v}_race.txt ) &
  pids+=($!)
done
wait "${pids[@]}"
for v in "${variants[@]}"; do
  echo "$v: $(cat $L/${v}_s*.txt | grep -c '^\[       OK \]') passed, $(cat $L/${v}_s*.txt | grep '^\[  FAILED  \] [A-Za-z]' | grep -vc 'listed below') failed"
  cat $L/${v}_s*.txt | grep '^\[  FAILED  \] [A-Za-z]' | grep -v 'listed below' | sort -u
  for f in $L/${v}_s*.txt; do grep -q '^\[  PASSED\|^\[  FAILED' $f || echo "  cut: $(basename $f)"; done
  echo "$v racecheck $RACE: $(grep 'RACECHECK SUMMARY' $L/${v}_race.txt | tail -1) $(tail -1 $L/${v}_race.txt)"
done
echo "== 2. timed A/B (at $(el) s)"
for round in 1 2 3; do
  for b in head "${variants[@]}"; do
    KDA_BENCH_NS=$NS KDA_BENCH_TS=$TS KDA_BENCH_STATES=$STATES KDA_BENCH_VARIANTS=stream \
      timeout 30 $P/$b/kda_decode_cuda_bench $L/${b}_$round.json >$L/${b}_bench_$round.txt 2>&1 || echo "$b round $round: rc $?"
  done
done
python3 dev/ab_table.py $L head "${variants[@]}"
tar czf $OUT/logs.tgz -C $L .
echo "done at $(el) s"
