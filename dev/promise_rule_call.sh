#!/usr/bin/env bash
# dev/promise_rule_call.sh (perf.md run 169, one-off): run on a build whose launcher ignored the
# stable-state promise at bf16 T > 4 with many items a CTA (not kept). Carried:
# .gpubin/pack/refresh1.tgz (dev/pack_binaries.sh refresh) and .deps.
#   1. KdaCuda.* (4 shards at once);  2. alone: the KDA bench, bf16 T = 4 and 8 (plain / stable).
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
P=/tmp/pr; L=/tmp/pr-logs
rm -rf $P $L; mkdir -p $P $L; tar xzf .gpubin/pack/refresh1.tgz -C $P
echo "== 1. KdaCuda.* (at $(el) s)"
pids=()
for i in 0 1 2 3; do
  GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i timeout 150 $P/head/cuda_all_test --gtest_filter='KdaCuda.*' >$L/s$i.txt 2>&1 &
  pids+=($!)
done
wait "${pids[@]}"
echo "KdaCuda.*: $(cat $L/s*.txt | grep -c '^\[       OK \]') passed, $(cat $L/s*.txt | grep '^\[  FAILED  \] [A-Za-z]' | grep -vc 'listed below') failed"
for f in $L/s*.txt; do grep -q '^\[  PASSED\|^\[  FAILED' $f || echo "  cut: $(basename $f)"; done
echo "== 2. bench, bf16 T = 4 and 8 (at $(el) s)"
KDA_BENCH_STATES=bf16 KDA_BENCH_TS=4,8 timeout 120 $P/head/kda_decode_cuda_bench $L/kda.json >$L/bench.txt 2>&1 || echo "bench rc=$?"
sed -n '/^state /,$p' $L/bench.txt
tar czf $OUT/logs.tgz -C $L .
echo "done at $(el) s"
