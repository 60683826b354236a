#!/usr/bin/env bash
# dev/flash_b1/device_run.sh BUILD_DIR OUT_DIR: the issue-5 A/B (flash decode at B = 1) in one
# short device run (~60-80 s). BUILD_DIR holds the built targets cuda_flash_decode_test and
# flash_decode_cuda_bench (tests/ and bench/ under it).
#
#   1. Correctness of the candidates (gtest filter, < 25 s; GraphReplaySwitchesPlanPaths, 23 s,
#      and BackToBack are left to the full suite: LeanMergeGraphReplayAndBackToBack replays a
#      shorter schedule and runs the back-to-back chain): the lean merge, shallower speculation,
#      split invariance and the plan paths of the mainline (whose ring waits changed)
#      -> OUT_DIR/tests.txt; one line per test is printed.
#   2. The decision table: flash_decode_cuda_bench --ab (B = 1 (32, 8) D 128 at 1K-64K, the
#      SmolLM2 shape (9, 3) D 64 at 64 / 256 / 1K, and at 17 / 64 / 256 in a capacity-256 cache
#      as the model runs it): us per call under graph replay, mainline merge (M) and lean merge
#      (L) at the plan's split count (M L M L: the noise), spec_tiles = 1 (s1), prefetch_l2 (pf),
#      spec_all (sa), all three (L+pf+sa), attribution
#      (-merge, -mrg-kv) and forced counts 1 / 4 / 16 / 32 (M, L) -> OUT_DIR/ab.txt, table printed.
#   3. One file: OUT_DIR/flash_b1.tar.gz holds tests.txt, ab.txt (and memcheck.txt), which are
#      then removed (the device returns at most 8 files).
#   FLASH_B1_MEMCHECK=1 adds compute-sanitizer memcheck on the lean-merge test (-> memcheck.txt).
#   See dev/flash_b1/README.md for what to decide from which numbers.
set -uo pipefail
build=${1:?usage: device_run.sh BUILD_DIR OUT_DIR}
out=${2:?usage: device_run.sh BUILD_DIR OUT_DIR}
mkdir -p "$out"
test_bin=$build/tests/cuda_flash_decode_test
bench_bin=$build/bench/flash_decode_cuda_bench
[ -x "$test_bin" ] || test_bin=$build/cuda_flash_decode_test
[ -x "$bench_bin" ] || bench_bin=$build/flash_decode_cuda_bench
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null | head -1

filter='FlashDecodeCuda.LeanMerge*:FlashDecodeCuda.SpecTiles*:FlashDecodeCuda.SpecAll*'
filter+=':FlashDecodeCuda.OutputIndependentOfSplitCount:FlashDecodeCuda.SmolLM2Shape*'
filter+=':FlashDecodeCuda.SingleSplitAndMergeBoundary'
start=$(date +%s)
timeout 25 "$test_bin" --gtest_filter="$filter" >"$out/tests.txt" 2>&1
echo "tests rc=$? ($(($(date +%s) - start)) s)"
grep -E '^\[ +(OK|FAILED|SKIPPED|PASSED) +\]|Failure' "$out/tests.txt" | head -20

if [[ ${FLASH_B1_MEMCHECK:-0} == 1 ]]; then  # opt-in (~1 min more)
  timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 "$test_bin" \
    --gtest_filter='FlashDecodeCuda.LeanMergeMatchesCounterMerge' >"$out/memcheck.txt" 2>&1
  echo "memcheck rc=$? (0 = clean)"
fi

start=$(date +%s)
timeout 58 "$bench_bin" --ab --reps 13 >"$out/ab.txt" 2>&1
echo "bench rc=$? ($(($(date +%s) - start)) s)"
# The compact table: shape, sets, live, plan M/L/M/L, s1, pf, sa, L+pf+sa, -merge, -mrg-kv |
# forced M/L pairs.
sed -n '/^A\/B/,$p' "$out/ab.txt" | sed -E 's/  +/ /g'
tmp=$(mktemp -d)
tar -czf "$tmp/flash_b1.tar.gz" -C "$out" . && rm -f "$out"/*.txt && mv "$tmp/flash_b1.tar.gz" "$out/"
rmdir "$tmp"
ls "$out"
