#!/usr/bin/env bash
# dev/adopt_mbar_call.sh: the precompute-group kernel's mbarrier hand-offs in mainline (session 21,
# perf.md run 161), after run 160's fix of the stage announcement. Carried in .gpubin/pack/adopt2.tgz:
#   fixed/    kda_decode_cuda_bench                HEAD 25c3eaa (named-barrier hand-offs, the fix)
#   adopted/  cuda_all_test, kda_decode_cuda_bench the working tree (mbarrier hand-offs)
#   run(command="dev/adopt_mbar_call.sh", carry=[".gpubin/pack/adopt2.tgz", ".deps"])
#   1. Alone: KdaCuda.PerRowModesEveryVariant 4 times.
#   2. At once, each cut at 100 s: KdaCuda.* (8 shards), FlashDecodeCuda.* (4 shards; cluster.cuh
#      moved), racecheck on KdaCuda.OneStreamCta* (one process a case), memcheck on the stream
#      tests.
#   3. Timed alone: fixed / adopted, 2 interleaved rounds, N = 128, 512, T = 1, 2, 4, 8.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?}
exec > >(tee -a "$OUT/summary.txt") 2>&1
export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu"
P=/tmp/adopt2; L=/tmp/adopt2-logs
rm -rf $P $L; mkdir -p $P $L; tar xzf .gpubin/pack/adopt2.tgz -C $P
T0=$SECONDS
echo "== 1. the hang test alone"
for r in 1 2 3 4; do
  s=$SECONDS
  timeout 30 $P/adopted/cuda_all_test --gtest_filter='KdaCuda.PerRowModesEveryVariant' >$L/hang_$r.txt 2>&1
  echo "round $r: rc $? in $((SECONDS - s)) s"
done
echo "== 2. tests and sanitizers (at $((SECONDS - T0)) s)"
pids=()
for i in 0 1 2 3 4 5 6 7; do
  GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$i timeout 100 $P/adopted/cuda_all_test --gtest_filter='KdaCuda.*' >$L/kda_s$i.txt 2>&1 &
  pids+=($!)
done
for i in 0 1 2 3; do
  GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i timeout 100 $P/adopted/cuda_all_test --gtest_filter='FlashDecodeCuda.*' >$L/flash_s$i.txt 2>&1 &
  pids+=($!)
done
for t in F32T1 F32T2 Bf16T1 Bf16T2; do
  ( s=$SECONDS; timeout 100 compute-sanitizer --tool racecheck --error-exitcode 3 $P/adopted/cuda_all_test \
      --gtest_filter=KdaCuda.OneStreamCta$t >$L/race_$t.txt 2>&1; echo "rc $? in $((SECONDS - s)) s" >>$L/race_$t.txt ) &
  pids+=($!)
done
( s=$SECONDS; timeout 100 compute-sanitizer --tool memcheck --error-exitcode 3 $P/adopted/cuda_all_test \
    --gtest_filter='KdaCuda.OneStreamCta*:KdaCuda.PrecomputeGroupRing*:KdaCuda.StableStatePromiseBitIdentical:KdaCuda.PerRowModesEveryVariant' \
    >$L/memcheck.txt 2>&1; echo "rc $? in $((SECONDS - s)) s" >>$L/memcheck.txt ) &
pids+=($!)
wait "${pids[@]}"
for b in kda flash; do
  echo "$b: $(cat $L/${b}_s*.txt | grep -c '^\[       OK \]') passed, $(cat $L/${b}_s*.txt | grep '^\[  FAILED  \] [A-Za-z]' | grep -vc 'listed below') failed"
  cat $L/${b}_s*.txt | grep '^\[  FAILED  \] [A-Za-z]' | grep -v 'listed below' | sort -u
  for f in $L/${b}_s*.txt; do grep -q '^\[  PASSED\|^\[  FAILED' $f || echo "  cut: $(basename $f) in $(grep '^\[ RUN' $f | tail -1)"; done
done
for t in F32T1 F32T2 Bf16T1 Bf16T2; do
  echo "racecheck OneStreamCta$t: $(grep 'RACECHECK SUMMARY' $L/race_$t.txt | tail -1) $(grep -c '^\[       OK \]' $L/race_$t.txt) OK, $(tail -1 $L/race_$t.txt)"
done
echo "memcheck: $(grep 'ERROR SUMMARY' $L/memcheck.txt | tail -1) $(grep -c '^\[       OK \]' $L/memcheck.txt) OK, $(tail -1 $L/memcheck.txt)"
echo "== 3. timed A/B (at $((SECONDS - T0)) s)"
for round in 1 2; do
  for b in fixed adopted; do
    KDA_BENCH_NS=128,512 KDA_BENCH_TS=1,2,4,8 KDA_BENCH_STATES=bf16,f32 KDA_BENCH_VARIANTS=stream \
      timeout 40 $P/$b/kda_decode_cuda_bench $L/${b}_$round.json >$L/${b}_bench_$round.txt 2>&1 || echo "$b round $round: rc $?"
  done
done
python3 dev/ab_table.py $L fixed adopted
echo "done at $((SECONDS - T0)) s"
tar czf $OUT/logs.tgz -C $L .
