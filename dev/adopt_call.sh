#!/usr/bin/env bash
# dev/adopt_call.sh: the session-20 device call (perf.md run 154), made on the last ~4 minutes of
# device time, on binaries built here and carried:
#   head/cuda_all_test   HEAD (set_kda_stream_grid_cap, KdaCuda.OneStreamCta*)
#   mbar/cuda_all_test   HEAD + the precompute-group kernel's mbarrier hand-offs and a converged
#                        warp after every whole-warp mbarrier wait (mbar_wait_warp)
# in .gpubin/pack/adopt.tgz (tar czf ... -C /tmp/prep head mbar), then
#   run(command="dev/adopt_call.sh", carry=[".gpubin/pack/adopt.tgz", ".deps"])
# Everything runs at once (nothing here is timed): every GPU test of head (6 shards), every
# KdaCuda test of mbar (2 shards), memcheck of mbar on the one-CTA and ring tests, racecheck of
# mbar on the one-CTA precompute-group cases and of head on its one-CTA cases (the 8-warp kernel,
# and the named-barrier hand-off racecheck does not model). The logs land in $OUT/logs.tgz every
# 10 s, so a cut call still returns what ran; $OUT/summary.txt at the end.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
OUT=${OUT:?the device tool sets OUT}
JOB_S=${JOB_S:-150}
export LD_LIBRARY_PATH="$root/.deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
P=/tmp/adopt
L=/tmp/adopt-logs
rm -rf "$P" "$L" && mkdir -p "$P" "$L"
tar xzf .gpubin/pack/adopt.tgz -C "$P"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >"$L/gpu.txt"
( while sleep 10; do tar czf "$OUT/.logs.tgz" -C "$L" . && mv "$OUT/.logs.tgz" "$OUT/logs.tgz"; done ) &
saver=$!

sanitize() {  # tool binary filter log
  ( time timeout "$JOB_S" compute-sanitizer --tool "$1" --error-exitcode 3 "$P/$2/cuda_all_test" \
      --gtest_filter="$3" ) >"$L/$4" 2>&1
}
pids=()
for i in 0 1 2 3 4 5; do
  GTEST_TOTAL_SHARDS=6 GTEST_SHARD_INDEX=$i timeout "$JOB_S" "$P/head/cuda_all_test" \
    >"$L/head_s$i.txt" 2>&1 &
  pids+=($!)
done
for i in 0 1; do
  GTEST_TOTAL_SHARDS=2 GTEST_SHARD_INDEX=$i timeout "$JOB_S" "$P/mbar/cuda_all_test" \
    --gtest_filter='KdaCuda.*' >"$L/mbar_s$i.txt" 2>&1 &
  pids+=($!)
done
sanitize memcheck mbar 'KdaCuda.OneStreamCta*:KdaCuda.PrecomputeGroupRing*' mbar_memcheck.txt &
pids+=($!)
sanitize racecheck mbar 'KdaCuda.OneStreamCtaBf16T1' mbar_race_bf16t1.txt &
pids+=($!)
sanitize racecheck mbar 'KdaCuda.OneStreamCtaF32T1:KdaCuda.OneStreamCtaBf16T2' mbar_race_rest.txt &
pids+=($!)
sanitize racecheck head 'KdaCuda.OneStreamCtaF32T2' head_race_f32t2.txt &
pids+=($!)
sanitize racecheck head 'KdaCuda.OneStreamCtaBf16T1' head_race_bf16t1.txt &
pids+=($!)
wait "${pids[@]}"
kill "$saver" 2>/dev/null

{
  cat "$L/gpu.txt"
  for b in head mbar; do
    ok=$(cat "$L"/${b}_s*.txt | grep -c '^\[       OK \]')
    failed=$(cat "$L"/${b}_s*.txt | grep '^\[  FAILED  \] [A-Za-z]' | grep -v 'listed below' | sort -u)
    echo "$b: $ok passed, $(echo -n "$failed" | grep -c .) failed"
    [[ -n $failed ]] && echo "$failed"
    for f in "$L"/${b}_s*.txt; do
      grep -q 'PASSED\|FAILED' "$f" || echo "  cut: $(basename "$f"): $(grep '^\[ RUN' "$f" | tail -1)"
    done
  done
  for f in mbar_memcheck mbar_race_bf16t1 mbar_race_rest head_race_f32t2 head_race_bf16t1; do
    echo "$f: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$L/$f.txt" | tail -1);" \
      "$(grep -c '^\[       OK \]' "$L/$f.txt") OK, $(grep -c '^\[  FAILED  \] [A-Za-z]' "$L/$f.txt") failed;" \
      "$(grep real "$L/$f.txt")"
  done
} | tee "$OUT/summary.txt"
tar czf "$OUT/logs.tgz" -C "$L" .
