#!/usr/bin/env bash
# dev/flash_b1/device_run.sh BUILD_DIR OUT_DIR: the issue-5 A/B (flash decode at B = 1) in one
# short device run (~60-90 s). BUILD_DIR holds the built targets cuda_flash_decode_test and
# flash_decode_cuda_bench (tests/ and bench/ under it).
#
#   1. Correctness of the candidate: the flag-merge tests and split invariance (gtest filter),
#      -> OUT_DIR/tests.txt; one line PASS/FAIL per test is printed.
#   2. The decision table: flash_decode_cuda_bench --ab (B = 1 (32, 8) D 128 at 1K-64K and the
#      SmolLM2 shape (9, 3) D 64 at 64 / 256 / 1K): us per call under graph replay with the
#      counter merge (C, mainline) and the flag merge (F, dev knob) at the plan's split count
#      (C F C F: the two C's and the two F's show the noise), the plan without its merge and
#      without merge and K/V (attribution), and forced counts 1-128
#      -> OUT_DIR/ab.txt, printed.
#   FLASH_B1_MEMCHECK=1 adds compute-sanitizer memcheck on the flag-merge test (-> memcheck.txt).
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

filter='FlashDecodeCuda.FlagMerge*:FlashDecodeCuda.OutputIndependentOfSplitCount'
filter+=':FlashDecodeCuda.GraphReplaySwitchesPlanPaths:FlashDecodeCuda.BackToBack*'
start=$(date +%s)
timeout 30 "$test_bin" --gtest_filter="$filter" >"$out/tests.txt" 2>&1
echo "tests rc=$? ($(($(date +%s) - start)) s)"
grep -E '^\[ +(OK|FAILED|SKIPPED|PASSED) +\]|Failure' "$out/tests.txt" | head -20

if [[ ${FLASH_B1_MEMCHECK:-0} == 1 ]]; then  # opt-in (~1 min more): the flag merge's global words
  timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 "$test_bin" \
    --gtest_filter='FlashDecodeCuda.FlagMergeMatchesCounterMerge' >"$out/memcheck.txt" 2>&1
  echo "memcheck rc=$? (0 = clean)"
fi

start=$(date +%s)
timeout 70 "$bench_bin" --ab --reps 15 >"$out/ab.txt" 2>&1
echo "bench rc=$? ($(($(date +%s) - start)) s)"
sed -n '/^A\/B/,$p' "$out/ab.txt"
