#!/usr/bin/env bash
# KdaCuda.* of the refactored test file (oracle once per problem; the longest tests split by
# state dtype), 8 shards at once, then the same tests' times.
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu"
P=/tmp/t2; L=/tmp/t2logs; mkdir -p $P $L; tar xzf .gpubin/pack/tests2.tgz -C $P
s=$SECONDS
for i in 0 1 2 3 4 5 6 7; do
  GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$i timeout 300 $P/head/cuda_all_test --gtest_filter='KdaCuda.*' >$L/s$i.txt 2>&1 &
done
wait
echo "KdaCuda.*: $(cat $L/s*.txt | grep -c '^\[       OK \]') passed, $(cat $L/s*.txt | grep '^\[  FAILED  \] [A-Za-z]' | grep -vc 'listed below') failed, wall $((SECONDS - s)) s"
cat $L/s*.txt | grep '^\[  FAILED  \] [A-Za-z]' | sort -u
for f in $L/s*.txt; do grep -q '^\[  PASSED\|^\[  FAILED' $f || echo "cut: $f $(grep '^\[ RUN' $f | tail -1)"; done
cat $L/s*.txt | grep '^\[       OK \]' | sed 's/.*OK \] \(.*\) (\([0-9]*\) ms)/\2 \1/' | sort -rn | head -14
tar czf $OUT/logs.tgz -C $L .
