#!/usr/bin/env bash
# dev/prepared_call.sh: one device call on binaries built on a machine without a GPU. Ran as
# perf.md run 151 (session 19; the test it racechecks was split into KdaCuda.PrecomputeGroupRing*
# after it): kept as the template for a carried-binaries call that tests and times HEAD against
# builds with dev/*.patch applied. ~7 minutes.
#
# Here, first (build/bundle and build/benchpack as in dev/carried_check.sh and the README of
# .gpubin; a generic BLAS, the libraries in .deps):
#   head/     cuda_all_test, kda_decode_cuda_bench            built at HEAD (session 19: b9067ed)
#   mbar/     cuda_all_test, kda_decode_cuda_bench            HEAD + the mbarrier hand-offs (in mainline since run 161)
#   t1plain/  kda_decode_cuda_bench                           HEAD + dev/kda-t1-plain-checkpoint-stores.patch
#   handoff                                                   dev/racecheck_handoff/handoff.cu
# stripped, in .gpubin/pack/prepared.tgz (tar czf ... -C /tmp/prepared .), then
#   run(command="dev/prepared_call.sh", carry=[".gpubin/pack/prepared.tgz", ".deps"])
#
#   1. Tests, at once: every GPU test of head (7 gtest shards); every KdaCuda test of mbar (2
#      shards); memcheck of mbar on the ring tests; racecheck of head and of mbar on
#      KdaCuda.PrecomputeGroupRingSmall (the precompute-group kernel, ring wrapped twice).
#   2. racecheck of the hand-off shapes alone (handoff modes 3-6; README there says what each
#      outcome means).
#   3. Timed, alone: head / mbar / t1plain in interleaved processes (3 rounds), bf16 and fp32
#      state, N = 128, 512, T = 1, 2, 4, 8; the median of each binary's rounds and its change
#      against head.
# Everything printed goes to $OUT/summary.txt too; the logs to $OUT/logs.tgz.
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
P=/tmp/prepared
L=/tmp/prepared-logs
rm -rf "$P" "$L" && mkdir -p "$P" "$L"
tar xzf .gpubin/pack/prepared.tgz -C "$P"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader

# 1. Tests and sanitizers, together (none of them is timed).
echo "== tests and sanitizers (at $(el) s)"
pids=()
for i in 0 1 2 3 4 5 6; do
  GTEST_TOTAL_SHARDS=7 GTEST_SHARD_INDEX=$i timeout 300 "$P/head/cuda_all_test" \
    >"$L/head_s$i.txt" 2>&1 &
  pids+=($!)
done
for i in 0 1; do
  GTEST_TOTAL_SHARDS=2 GTEST_SHARD_INDEX=$i timeout 300 "$P/mbar/cuda_all_test" \
    --gtest_filter='KdaCuda.*' >"$L/mbar_s$i.txt" 2>&1 &
  pids+=($!)
done
timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 "$P/mbar/cuda_all_test" \
  --gtest_filter='KdaCuda.StreamManyItemsPerCta:KdaCuda.StableStatePromise*:KdaCuda.PrecomputeGroupRingSmall' \
  >"$L/mbar_memcheck.txt" 2>&1 &
pids+=($!)
for b in head mbar; do
  ( time timeout 300 compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 3 \
      "$P/$b/cuda_all_test" --gtest_filter='KdaCuda.PrecomputeGroupRingSmall' ) \
    >"$L/${b}_racecheck.txt" 2>&1 &
  pids+=($!)
done
wait "${pids[@]}"
for b in head mbar; do
  ok=$(cat "$L"/${b}_s*.txt | grep -c '^\[       OK \]')
  failed=$(cat "$L"/${b}_s*.txt | grep '^\[  FAILED  \] [A-Za-z]' | grep -v 'listed below' | sort -u)
  echo "$b: $ok passed, $(echo -n "$failed" | grep -c .) failed"
  [[ -n $failed ]] && echo "$failed"
  for f in "$L"/${b}_s*.txt; do
    grep -q 'PASSED\|FAILED' "$f" || echo "  cut or crashed: $(basename "$f"): $(grep '^\[ RUN' "$f" | tail -1)"
  done
done
echo "mbar memcheck: $(grep -E 'ERROR SUMMARY' "$L/mbar_memcheck.txt" | tail -1)"
for b in head mbar; do
  echo "$b racecheck on PrecomputeGroupRingSmall: $(grep -E 'RACECHECK SUMMARY' "$L/${b}_racecheck.txt" | tail -1)" \
    "$(grep -c '^\[       OK \]' "$L/${b}_racecheck.txt") test(s) OK, $(grep real "$L/${b}_racecheck.txt")"
  grep -E 'hazard' "$L/${b}_racecheck.txt" | sed 's/0x[0-9a-f]*/X/g' | sort | uniq -c | sort -rn | head -4
done

# 2. The hand-off shapes alone.
echo "== handoff modes (at $(el) s)"
for m in 3 4 5 6; do
  "$P/handoff" $m
  timeout 60 compute-sanitizer --tool racecheck --racecheck-report all "$P/handoff" $m 2>&1 |
    grep -E 'RACECHECK SUMMARY|hazard' | sed 's/0x[0-9a-f]*/X/g' | sort | uniq -c | head -4
done

# 3. Timed A/B: one process per binary and round, interleaved.
echo "== timed A/B, head / mbar / t1plain (at $(el) s)"
for round in 1 2 3; do
  for b in head mbar t1plain; do
    KDA_BENCH_NS=128,512 KDA_BENCH_TS=1,2,4,8 KDA_BENCH_STATES=bf16,f32 KDA_BENCH_VARIANTS=stream \
      timeout 100 "$P/$b/kda_decode_cuda_bench" "$L/${b}_$round.json" >"$L/${b}_bench_$round.txt" 2>&1 ||
      echo "$b round $round: bench rc=$?"
  done
done
python3 dev/ab_table.py "$L" head mbar t1plain
echo "done at $(el) s"
tar czf "$OUT/logs.tgz" -C "$L" .
