#!/usr/bin/env bash
# dev/announce_fix_call.sh: the stage announcement after barrier X (session 21, perf.md run 160).
# Run 159's watchdog found the mbarrier hand-offs' deadlock: thread 0 announced item k + kStages
# on S.full[s] before barrier X, and a null item's announcement (no bytes) completes its phase at
# once, so a sweep warp not yet past item k's wait saw the next phase and waited forever.
# Binaries built here and carried in .gpubin/pack/fix.tgz:
#   old/     kda_decode_cuda_bench                HEAD before the fix (kernel-identical to f24de3c)
#   fixed/   cuda_all_test, kda_decode_cuda_bench HEAD + the fix (announce after X)
#   normed/  cuda_all_test                        fixed + both mbarrier patches + the 20 s watchdog
#            (dev/kda-ws-mbarrier-watchdog.patch)
#   run(command="dev/announce_fix_call.sh", carry=[".gpubin/pack/fix.tgz", ".deps"])
#   1. Alone: KdaCuda.PerRowModesEveryVariant, fixed 3 rounds and normed 6, alternating.
#   2. At once, each cut at 170 s: KdaCuda.* of fixed (8 shards) and of normed (4 shards); racecheck
#      of normed on KdaCuda.OneStreamCta* (one process a case); memcheck of fixed on the stream
#      tests.
#   3. Timed alone: old / fixed in interleaved processes (3 rounds), N = 128, 512, T = 1, 2, 4, 8.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?}
exec > >(tee -a "$OUT/summary.txt") 2>&1
export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu"
P=/tmp/fix; L=/tmp/fix-logs
rm -rf $P $L; mkdir -p $P $L; tar xzf .gpubin/pack/fix.tgz -C $P
T0=$SECONDS
hang_round() {  # BINARY LABEL
  local s=$SECONDS
  timeout 40 $P/$1/cuda_all_test --gtest_filter='KdaCuda.PerRowModesEveryVariant' >$L/hang_$2.txt 2>&1
  echo "$2: rc $? in $((SECONDS - s)) s $(grep -m2 'mbar watchdog' $L/hang_$2.txt | tr '\n' ' ')"
}
echo "== 1. the hang test alone"
for r in 1 2 3 4 5 6; do
  [[ $r -le 3 ]] && hang_round fixed fixed_$r
  hang_round normed normed_$r
done
echo "== 2. tests and sanitizers (at $((SECONDS - T0)) s)"
pids=()
for i in 0 1 2 3 4 5 6 7; do
  GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$i timeout 170 $P/fixed/cuda_all_test --gtest_filter='KdaCuda.*' >$L/fixed_s$i.txt 2>&1 &
  pids+=($!)
done
for i in 0 1 2 3; do
  GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i timeout 170 $P/normed/cuda_all_test --gtest_filter='KdaCuda.*' >$L/normed_s$i.txt 2>&1 &
  pids+=($!)
done
for t in F32T1 F32T2 Bf16T1 Bf16T2; do
  ( s=$SECONDS; timeout 170 compute-sanitizer --tool racecheck --error-exitcode 3 $P/normed/cuda_all_test \
      --gtest_filter=KdaCuda.OneStreamCta$t >$L/race_$t.txt 2>&1; echo "rc $? in $((SECONDS - s)) s" >>$L/race_$t.txt ) &
  pids+=($!)
done
( s=$SECONDS; timeout 170 compute-sanitizer --tool memcheck --error-exitcode 3 $P/fixed/cuda_all_test \
    --gtest_filter='KdaCuda.OneStreamCta*:KdaCuda.PrecomputeGroupRing*:KdaCuda.StableStatePromiseBitIdentical:KdaCuda.PerRowModesEveryVariant' \
    >$L/memcheck.txt 2>&1; echo "rc $? in $((SECONDS - s)) s" >>$L/memcheck.txt ) &
pids+=($!)
wait "${pids[@]}"
for b in fixed normed; do
  echo "$b KdaCuda.*: $(cat $L/${b}_s*.txt | grep -c '^\[       OK \]') passed, $(cat $L/${b}_s*.txt | grep '^\[  FAILED  \] [A-Za-z]' | grep -vc 'listed below') failed"
  cat $L/${b}_s*.txt | grep '^\[  FAILED  \] [A-Za-z]' | grep -v 'listed below' | sort -u
  for f in $L/${b}_s*.txt; do grep -q '^\[  PASSED\|^\[  FAILED' $f || echo "  cut: $(basename $f) in $(grep '^\[ RUN' $f | tail -1)"; done
  grep -h 'mbar watchdog' $L/${b}_s*.txt | head -5
done
for t in F32T1 F32T2 Bf16T1 Bf16T2; do
  echo "normed racecheck OneStreamCta$t: $(grep 'RACECHECK SUMMARY' $L/race_$t.txt | tail -1) $(grep -c '^\[       OK \]' $L/race_$t.txt) OK, $(tail -1 $L/race_$t.txt)"
done
echo "fixed memcheck: $(grep 'ERROR SUMMARY' $L/memcheck.txt | tail -1) $(grep -c '^\[       OK \]' $L/memcheck.txt) OK, $(tail -1 $L/memcheck.txt)"
echo "== 3. timed A/B (at $((SECONDS - T0)) s)"
for round in 1 2 3; do
  for b in old fixed; do
    KDA_BENCH_NS=128,512 KDA_BENCH_TS=1,2,4,8 KDA_BENCH_STATES=bf16,f32 KDA_BENCH_VARIANTS=stream \
      timeout 60 $P/$b/kda_decode_cuda_bench $L/${b}_$round.json >$L/${b}_bench_$round.txt 2>&1 || echo "$b round $round: rc $?"
  done
done
python3 dev/ab_table.py $L old fixed
echo "done at $((SECONDS - T0)) s"
tar czf $OUT/logs.tgz -C $L .
