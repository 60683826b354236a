#!/usr/bin/env bash
# dev/rows_check_call.sh: a short device check of a KDA kernel change from carried binaries
# (.gpubin/pack/refresh1.tgz: head/cuda_all_test, head/kda_decode_cuda_bench), ~150 s:
#   every KdaCuda test in 4 shards, memcheck and racecheck on KdaCuda.PerRowModesEveryVariant
#   (every variant, per-row / packed / t1 modes, null rows) at once, then the KDA bench at
#   NS x TS (default 4,8,16 x 1) with every variant.
#   run(command="dev/rows_check_call.sh", carry=[".gpubin/pack/refresh1.tgz", ".deps"])
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
P=/tmp/rows-check && mkdir -p $P && tar xzf .gpubin/pack/refresh1.tgz -C $P
T=$P/head/cuda_all_test
for i in 0 1 2 3; do
  GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i timeout 150 $T --gtest_filter='KdaCuda.*' >$OUT/s$i.txt 2>&1 &
done
for tool in memcheck racecheck; do
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 3 $T \
    --gtest_filter=KdaCuda.PerRowModesEveryVariant >$OUT/$tool.txt 2>&1 &
done
wait
cat $OUT/s?.txt | grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" | sort | uniq -c
grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $OUT/memcheck.txt $OUT/racecheck.txt | head -6
KDA_BENCH_NS=${NS:-4,8,16} KDA_BENCH_TS=${TS:-1} $P/head/kda_decode_cuda_bench $OUT/kda.json >$OUT/bench.txt 2>&1
grep -E "^  (bf16|f32) N=|A/B" $OUT/bench.txt; grep -E "^(bf16|f32) " $OUT/bench.txt
