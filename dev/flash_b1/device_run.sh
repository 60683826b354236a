#!/usr/bin/env bash
# dev/flash_b1/device_run.sh BUILD_DIR OUT_DIR: the issue-5 check (flash decode at B = 1) in one
# short device run (~60-90 s). BUILD_DIR holds the built targets cuda_flash_decode_test and
# flash_decode_cuda_bench (tests/ and bench/ under it).
#
#   1. Correctness of the mainline speculation (one ring stage of split 0 before k_len) and the
#      plan paths (gtest filter, < 40 s; the full suite runs the long grids): short k_len in a
#      large NaN-tailed cache, graph replays and back-to-back launches across the speculated keys
#      and the single-split limit, the single-split boundary, the SmolLM2 shape
#      -> OUT_DIR/tests.txt; one line per test is printed.
#   2. The table: flash_decode_cuda_bench --ab (B = 1 (32, 8) D 128 at 1K-64K, the SmolLM2 shape
#      (9, 3) D 64 at 64 / 256 / 1K, and at 17 / 64 / 256 in a capacity-256 cache as the model
#      runs it): us per call under graph replay, the plan twice (the noise), attribution
#      (-merge, -mrg-kv) and forced counts 1 / 4 / 16 / 32 -> OUT_DIR/ab.txt, table printed.
#   3. One file at the end: OUT_DIR/flash_b1.tar.gz holds tests.txt and ab.txt, which are then
#      removed.
#   See dev/flash_b1/README.md for what the numbers mean.
set -uo pipefail
build=${1:?usage: device_run.sh BUILD_DIR OUT_DIR}
out=${2:?usage: device_run.sh BUILD_DIR OUT_DIR}
mkdir -p "$out"
test_bin=$build/tests/cuda_flash_decode_test
bench_bin=$build/bench/flash_decode_cuda_bench
[ -x "$test_bin" ] || test_bin=$build/cuda_flash_decode_test
[ -x "$bench_bin" ] || bench_bin=$build/flash_decode_cuda_bench
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null | head -1

filter='FlashDecodeCuda.Speculat*:FlashDecodeCuda.SingleSplitAndMergeBoundary'
filter+=':FlashDecodeCuda.SmolLM2Shape*'
start=$(date +%s)
timeout 40 "$test_bin" --gtest_filter="$filter" >"$out/tests.txt" 2>&1
echo "tests rc=$? ($(($(date +%s) - start)) s)"
grep -E '^\[ +(OK|FAILED|SKIPPED|PASSED) +\]|Failure' "$out/tests.txt" | head -20

start=$(date +%s)
timeout 58 "$bench_bin" --ab --reps 13 >"$out/ab.txt" 2>&1
echo "bench rc=$? ($(($(date +%s) - start)) s)"
# The compact table: shape, sets, live, plan, plan, -merge, -mrg-kv | forced 1 / 4 / 16 / 32.
sed -n '/^A\/B/,$p' "$out/ab.txt" | sed -E 's/  +/ /g'
tmp=$(mktemp -d)
tar -czf "$tmp/flash_b1.tar.gz" -C "$out" tests.txt ab.txt && rm -f "$out/tests.txt" "$out/ab.txt" &&
  mv "$tmp/flash_b1.tar.gz" "$out/"
rmdir "$tmp" 2>/dev/null
ls "$out"
