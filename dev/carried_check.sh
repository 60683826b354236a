#!/usr/bin/env bash
# dev/carried_check.sh OUT: a device call that runs binaries built here instead of building there
# (the build is ~170 s of device time; this call is ~2.5 minutes in all).
#
# Here, first:
#   cmake -S . -B build/bundle -DCMAKE_BUILD_TYPE=Release -DSPLICE_BUILD_TESTS=ON \
#     -DSPLICE_BUILD_BENCH=OFF -DSPLICE_GPU_TEST_BUNDLE=ON -DBLA_VENDOR=Generic \
#     -DCMAKE_PREFIX_PATH=/usr
#   cmake --build build/bundle -j2 --target cuda_all_test splice
# (a generic BLAS: the binaries find libblas.so.3 in .deps on the device; the device image has
# glibc 2.39), then
#   run(command="dev/carried_check.sh $OUT",
#       carry=[".deps", "build/bundle/tests/cuda_all_test", "build/bundle/splice"])
#
#   1. The SmolLM2-135M-shaped random Llama: `splice bench` three times (step_greedy's p50 / p99 /
#      host overhead, and the decode loop's p50), then the default model.
#   2. Every GPU test: cuda_all_test (every tests/cuda file in one executable) in 14 gtest shards
#      at once (no GPU test reads the source tree), each bounded by the time BUDGET leaves.
# Every line goes to summary.txt as it is printed. Session 6's one try (with the tests first, the
# summary only at the end and 240 s per shard) ran out of device time and returned nothing: keep
# BUDGET below the call's limit.
# OUT gets summary.txt (also on stdout) and the shards' logs in tests.tgz.
set -uo pipefail
F=${1:?usage: carried_check.sh OUT}
mkdir -p "$F"
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
exec > >(tee -a "$F/summary.txt") 2>&1
export LD_LIBRARY_PATH="$root/.deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s)
el() { echo $(($(date +%s) - T0)); }
tests=build/bundle/tests/cuda_all_test
splice=build/bundle/splice

L=/tmp/carried
rm -rf "$L" && mkdir -p "$L"
BUDGET=${BUDGET:-230}  # seconds this call may use in all (the device tool's limit, less margin)
left() { echo $((BUDGET - $(el))); }

# 1. The model first (the fastest result and the one a short call must not lose): three runs,
#    then the default model.
model=/tmp/smollm2_shaped
timeout 90 python3 scripts/peers/smollm2_shaped.py "$model" >"$L/model.log" 2>&1
bench() {  # bench LABEL [ENV=VALUE ...]
  local label=$1
  shift
  env "$@" timeout 60 "$splice" bench --model "$model" --device cuda --dtype bf16 \
    --max-seq-len 264 --tuning-cache "$L/tuning.json" --steps 256 --json 2>>"$L/bench.err" |
    python3 -c "
import json, sys
try:
    j = json.load(sys.stdin)
    print('$label', round(j['p50_us'], 1), round(j['p99_us'], 1),
          round(j['host_overhead_us_p50'], 1), 'loop', round(j.get('generate_p50_us', 0), 1))
except ValueError:
    print('$label: bench FAILED (see bench.err)')"
}
echo "== SmolLM2-shaped, us per token: p50 p99 host, decode loop p50 (at $(el) s)"
bench warm-up >/dev/null  # tunes the arms into the cache
# CARRIED_AB: space-separated A:B environment pairs (e.g. "SPLICE_X=0:SPLICE_X=1"), each run as
# three interleaved pairs; unset or empty: three runs as built.
if [[ -z ${CARRIED_AB:-} ]]; then
  for run in 1 2 3; do bench smollm2-shaped; done
fi
for pair in ${CARRIED_AB:-}; do
  for run in 1 2 3; do
    bench "${pair%%:*}" "${pair%%:*}"
    bench "${pair##*:}" "${pair##*:}"
  done
done
timeout 30 "$splice" bench --device cuda --steps 128 2>&1 | tail -1 | sed 's/^/default model: /'

# 2. Every GPU test in 14 gtest shards, bounded by the time left; a shard's log ends with its
#    summary line, or says it was cut.
shards=14
limit=$(($(left) - 15))
echo "== GPU tests, $shards shards, at most $limit s each, env '${CARRIED_TEST_ENV:-}' (at $(el) s)"
pids=()
for i in $(seq 0 $((shards - 1))); do
  env ${CARRIED_TEST_ENV:-} GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout "$limit" \
    "$tests" >"$L/shard$i.txt" 2>&1 &
  pids+=($!)
done
wait "${pids[@]}"  # not a bare `wait`: that would also wait for the summary's tee
passed=$(cat "$L"/shard*.txt | grep -c '^\[       OK \]')
failed=$(cat "$L"/shard*.txt | grep '^\[  FAILED  \] [A-Za-z]' | grep -v 'listed below' | sort -u)
echo "tests at $(el) s: $passed passed, $(echo -n "$failed" | grep -c .) failed"
[[ -n $failed ]] && echo "$failed"
for f in "$L"/shard*.txt; do
  grep -q 'PASSED\|FAILED' "$f" || echo "cut or crashed: $(basename "$f"), last test: $(grep '^\[ RUN' "$f" | tail -1)"
done
echo "done at $(el) s"
tar czf "$F/tests.tgz" -C "$L" .
