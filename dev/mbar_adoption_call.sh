#!/usr/bin/env bash
# dev/mbar_adoption_call.sh: the device call that decides whether the precompute-group KDA
# kernel's mbarrier hand-offs enter mainline (prepared in session 20, not yet run). Binaries built
# here and carried (build/bundle and build/benchpack as in dev/carried_check.sh; stripped):
#   head/     kda_decode_cuda_bench                     HEAD
#   mbar/     cuda_all_test, kda_decode_cuda_bench      HEAD + dev/kda-ws-mbarrier-handoffs.patch
#   normed/   cuda_all_test, kda_decode_cuda_bench      mbar + dev/kda-ws-normed-mbarrier.patch
# in .gpubin/pack/adoption.tgz (tar czf ... -C /tmp/packs head mbar normed), then
#   run(command="dev/mbar_adoption_call.sh", carry=[".gpubin/pack/adoption.tgz", ".deps"])
# ~9 minutes. The pack is stale once kda_decode.cuh, cluster.cuh or the KDA launcher move.
#
#   1. Untimed, at once (each job cut at 240 s): the KdaCuda and FlashDecodeCuda tests (cluster.cuh
#      moves too) of mbar and of normed (4 shards each); KdaCuda.
#      PerRowModesEveryVariant 6 times each (the test that hung 1 run in 3 before the
#      __syncwarps); memcheck of normed on the stream tests; racecheck of mbar and normed on
#      KdaCuda.OneStreamCta* (the question of perf.md run 154: does bf16 T = 2 finish, and clean?).
#   2. Timed, alone: head / mbar / normed in interleaved processes (3 rounds), bf16 and fp32
#      state, N = 128, 512, T = 1, 2, 4, 8; each binary's median and its change against head.
# Adopt the form that passes everything, is racecheck-clean on every OneStreamCta case and times
# within noise of head; then gpu-check's racecheck takes KdaCuda.OneStreamCta*.
# Everything printed goes to $OUT/summary.txt; the logs to $OUT/logs.tgz (also every 10 s).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
OUT=${OUT:?the device tool sets OUT}
exec > >(tee -a "$OUT/summary.txt") 2>&1
export LD_LIBRARY_PATH="$root/.deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s)
el() { echo $(($(date +%s) - T0)); }
P=/tmp/adoption
L=/tmp/adoption-logs
rm -rf "$P" "$L" && mkdir -p "$P" "$L"
tar xzf .gpubin/pack/adoption.tgz -C "$P"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
( while sleep 10; do tar czf "$OUT/partial.tgz" -C "$L" . 2>/dev/null; done ) &
saver=$!

# 1. Tests and sanitizers, together (none of them is timed).
echo "== tests and sanitizers (at $(el) s)"
pids=()
for b in mbar normed; do
  for i in 0 1 2 3; do
    GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i timeout 240 "$P/$b/cuda_all_test" \
      --gtest_filter='KdaCuda.*:FlashDecodeCuda.*' >"$L/${b}_s$i.txt" 2>&1 &
    pids+=($!)
  done
  ( for r in 1 2 3 4 5 6; do
      timeout 60 "$P/$b/cuda_all_test" --gtest_filter='KdaCuda.PerRowModesEveryVariant' |
        tail -1 | sed "s/^/$b round $r: /"
    done ) >"$L/${b}_hangtest.txt" 2>&1 &
  pids+=($!)
  for t in F32T1 F32T2 Bf16T1 Bf16T2; do
    ( time timeout 240 compute-sanitizer --tool racecheck --error-exitcode 3 \
        "$P/$b/cuda_all_test" --gtest_filter="KdaCuda.OneStreamCta$t" ) >"$L/${b}_race_$t.txt" 2>&1 &
    pids+=($!)
  done
done
timeout 240 compute-sanitizer --tool memcheck --error-exitcode 3 "$P/normed/cuda_all_test" \
  --gtest_filter='KdaCuda.StreamManyItemsPerCta:KdaCuda.StableStatePromise*:KdaCuda.PrecomputeGroupRing*:KdaCuda.OneStreamCta*' \
  >"$L/normed_memcheck.txt" 2>&1 &
pids+=($!)
wait "${pids[@]}"
for b in mbar normed; do
  ok=$(cat "$L"/${b}_s*.txt | grep -c '^\[       OK \]')
  failed=$(cat "$L"/${b}_s*.txt | grep '^\[  FAILED  \] [A-Za-z]' | grep -v 'listed below' | sort -u)
  echo "$b: $ok passed, $(echo -n "$failed" | grep -c .) failed"
  [[ -n $failed ]] && echo "$failed"
  for f in "$L"/${b}_s*.txt; do
    grep -q 'PASSED\|FAILED' "$f" || echo "  cut or hung: $(basename "$f"): $(grep '^\[ RUN' "$f" | tail -1)"
  done
  cat "$L/${b}_hangtest.txt"
  for t in F32T1 F32T2 Bf16T1 Bf16T2; do
    echo "$b racecheck OneStreamCta$t: $(grep -E 'RACECHECK SUMMARY' "$L/${b}_race_$t.txt" | tail -1)" \
      "$(grep -c '^\[       OK \]' "$L/${b}_race_$t.txt") OK, $(grep real "$L/${b}_race_$t.txt")"
  done
done
echo "normed memcheck: $(grep -E 'ERROR SUMMARY' "$L/normed_memcheck.txt" | tail -1)"

# 2. Timed A/B: one process per binary and round, interleaved.
echo "== timed A/B, head / mbar / normed (at $(el) s)"
for round in 1 2 3; do
  for b in head mbar normed; do
    KDA_BENCH_NS=128,512 KDA_BENCH_TS=1,2,4,8 KDA_BENCH_STATES=bf16,f32 KDA_BENCH_VARIANTS=stream \
      timeout 100 "$P/$b/kda_decode_cuda_bench" "$L/${b}_$round.json" >"$L/${b}_bench_$round.txt" 2>&1 ||
      echo "$b round $round: bench rc=$?"
  done
done
python3 dev/ab_table.py "$L" head mbar normed
kill "$saver" 2>/dev/null
echo "done at $(el) s"
tar czf "$OUT/logs.tgz" -C "$L" .
rm -f "$OUT/partial.tgz"
