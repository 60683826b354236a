#!/usr/bin/env bash
# dev/variant_ab_call.sh: tests, sanitizers and a timed A/B of KDA kernel variants, on binaries
# built here and carried in .gpubin/pack/variants.tgz:
#   head/       kda_decode_cuda_bench                  HEAD
#   <variant>/  cuda_all_test, kda_decode_cuda_bench   HEAD + dev/<variant>.patch (any number)
# (dev/pack_binaries.sh variants dev/<variant>.patch ... builds it), then
#   run(command="dev/variant_ab_call.sh", carry=[".gpubin/pack/variants.tgz", ".deps"])
# ~3 minutes for two variants:
#   1. Alone: KdaCuda.PerRowModesEveryVariant HANG_ROUNDS times a variant (a deadlock runs out its
#      30 s).
#   2. At once, cut at TEST_CUT s: each variant's TESTS (4 shards) and racecheck on each
#      KdaCuda.OneStreamCta* case matching RACE.
#   3. Timed alone: head and the variants in interleaved processes, 3 rounds, at STATES x TS x NS
#      (dev/ab_table.py).
# Environment (defaults): PACK (.gpubin/pack/variants.tgz), ENV_VARIANTS (below), HANG_ROUNDS (3), TESTS ('KdaCuda.*'), TEST_CUT (110), RACE (a glob of
# the OneStreamCta suffixes, '*'), STATES (bf16,f32), TS (1,2,4,8), NS (128,512), BENCH_CUT (40 s
# a bench process), ROUNDS (3), BENCH_VARIANTS (stream: the variants each bench process times,
# KDA_BENCH_VARIANTS; the table adds one for each other than stream). A session's last
# device minutes (perf.md run 170, ~1 minute):
#   HANG_ROUNDS=0 TESTS='KdaCuda.*F32*:KdaCuda.T1Grid:KdaCuda.PerRowModesEveryVariant' TEST_CUT=75
#   RACE=F32T1 STATES=f32 TS=1 NS=32,128,512 dev/variant_ab_call.sh
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
P=/tmp/variants; L=/tmp/variants-logs
rm -rf $P $L; mkdir -p $P $L; tar xzf "${PACK:-.gpubin/pack/variants.tgz}" -C $P
# ENV_VARIANTS="name:VAR=value[,VAR=value...] ...": head's bench (ENV_BASE's, a variant of the
# pack, if set) timed again as variant `name` under those environment variables (bench only;
# e.g. carveout-default:SPLICE_SMEM_CARVEOUT=-1).
make_env_variants $P "${ENV_BASE:-head}" kda_decode_cuda_bench
variants=()
for d in $P/*/; do d=$(basename $d); [[ $d != head ]] && variants+=($d); done
echo "variants: ${variants[*]}"
# A bench-only pack (pack_binaries.sh BENCH_ONLY=1) carries no cuda_all_test: timed A/B alone.
tested=()
for v in "${variants[@]}"; do [[ -x $P/$v/cuda_all_test ]] && tested+=($v); done
(( ${#tested[@]} < ${#variants[@]} )) && echo "untested (bench only): $(( ${#variants[@]} - ${#tested[@]} )) variant(s)"
HANG_ROUNDS=${HANG_ROUNDS:-3} TESTS=${TESTS:-KdaCuda.*} TEST_CUT=${TEST_CUT:-110} RACE=${RACE:-*}
STATES=${STATES:-bf16,f32} TS=${TS:-1,2,4,8} NS=${NS:-128,512} BENCH_CUT=${BENCH_CUT:-40}
ROUNDS=${ROUNDS:-3} BENCH_VARIANTS=${BENCH_VARIANTS:-stream}
# The OneStreamCta* cases matching RACE that a variant's cuda_all_test holds (F32T1, ...).
race_cases() {
  $P/$1/cuda_all_test --gtest_list_tests --gtest_filter="KdaCuda.OneStreamCta$RACE" |
    sed -n 's/^  OneStreamCta//p'
}
T0=$SECONDS
echo "== 1. the hang test alone"
for v in "${tested[@]}"; do
  for ((r = 1; r <= HANG_ROUNDS; ++r)); do
    s=$SECONDS
    timeout 30 $P/$v/cuda_all_test --gtest_filter='KdaCuda.PerRowModesEveryVariant' >$L/${v}_hang_$r.txt 2>&1
    echo "$v round $r: rc $? in $((SECONDS - s)) s"
  done
done
echo "== 2. tests and racecheck (at $((SECONDS - T0)) s)"
pids=()
for v in "${tested[@]}"; do
  for i in 0 1 2 3; do
    GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i timeout $TEST_CUT $P/$v/cuda_all_test --gtest_filter="$TESTS" >$L/${v}_s$i.txt 2>&1 &
    pids+=($!)
  done
  for t in $(race_cases $v); do
    ( s=$SECONDS; timeout $TEST_CUT compute-sanitizer --tool racecheck --error-exitcode 3 $P/$v/cuda_all_test \
        --gtest_filter=KdaCuda.OneStreamCta$t >$L/${v}_race_$t.txt 2>&1; echo "rc $? in $((SECONDS - s)) s" >>$L/${v}_race_$t.txt ) &
    pids+=($!)
  done
done
# (Never a bare `wait`: it would also wait for call_env.sh's tee, forever: run 185.)
(( ${#pids[@]} > 0 )) && wait "${pids[@]}"
for v in "${tested[@]}"; do
  echo "$v $TESTS: $(cat $L/${v}_s*.txt | grep -c '^\[       OK \]') passed, $(cat $L/${v}_s*.txt | grep '^\[  FAILED  \] [A-Za-z]' | grep -vc 'listed below') failed"
  cat $L/${v}_s*.txt | grep '^\[  FAILED  \] [A-Za-z]' | grep -v 'listed below' | sort -u
  for f in $L/${v}_s*.txt; do grep -q '^\[  PASSED\|^\[  FAILED' $f || echo "  cut: $(basename $f) in $(grep '^\[ RUN' $f | tail -1)"; done
  for t in $(race_cases $v); do
    echo "$v racecheck OneStreamCta$t: $(grep 'RACECHECK SUMMARY' $L/${v}_race_$t.txt | tail -1) $(tail -1 $L/${v}_race_$t.txt)"
  done
done
echo "== 3. timed A/B (at $((SECONDS - T0)) s)"
for round in $(seq 1 $ROUNDS); do
  for b in head "${variants[@]}"; do
    variant_env $P/$b
    env "${benv[@]}" KDA_BENCH_NS=$NS KDA_BENCH_TS=$TS KDA_BENCH_STATES=$STATES KDA_BENCH_VARIANTS=$BENCH_VARIANTS \
      timeout $BENCH_CUT $P/$b/kda_decode_cuda_bench $L/${b}_$round.json >$L/${b}_bench_$round.txt 2>&1 || echo "$b round $round: rc $?"
  done
done
AB_VARIANTS=$BENCH_VARIANTS python3 dev/ab_table.py $L head "${variants[@]}"
echo "done at $((SECONDS - T0)) s"
tar czf $OUT/logs.tgz -C $L .
