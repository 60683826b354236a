#!/usr/bin/env bash
# dev/flash_variant_check_call.sh: a flash-decode kernel variant's GPU tests and attention
# sanitizers (refresh_call.sh's `flash` phase, on the variant's own cuda_all_test), then the
# variant timed beside HEAD (dev/flash_variant_call.sh, same environment: SHAPES, ROUNDS, ...).
# Built here: WITH_TESTS=1 dev/pack_binaries.sh flash-variants dev/<variant>.patch, then
#   run(command="dev/flash_variant_check_call.sh", carry=[".gpubin/pack/flash-variants.tgz",
#       ".deps"])
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
P=/tmp/flashvar-check
rm -rf $P && mkdir -p $P && tar xzf "${PACK:-.gpubin/pack/flash-variants.tgz}" -C $P
flash_tests='FlashDecodeCuda.*:CudaGreedyDecode.*:*Llama*:CudaSessionGraph.*'
att_small='FlashDecodeCuda.RaggedBatchAndEmptySequence:FlashDecodeCuda.MisalignedQueryAndOutputRows:FlashDecodeCuda.OpEntryDispatchesToTheCudaKernel:FlashDecodeCuda.SmolLM2ShapeMatchesFloat64Reference:FlashDecodeCuda.StablePrefixReadsTheRowsItsProducerWrites'
for t in $P/*/cuda_all_test; do
  v=$(basename "$(dirname "$t")") L=$P/logs-$v
  mkdir -p "$L"
  echo "== $v: flash GPU tests (8 shards) and attention sanitizers (at $(el) s)"
  pids=()
  for i in $(seq 0 7); do
    GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$i timeout 235 "$t" --gtest_filter="$flash_tests" \
      >"$L/shard_$i.txt" 2>&1 &
    pids+=($!)
  done
  for tool in memcheck racecheck; do
    ( timeout 235 compute-sanitizer --tool $tool --error-exitcode 3 "$t" --gtest_filter="$att_small" \
        >"$L/$tool.txt" 2>&1; echo "rc $?" >>"$L/$tool.txt" ) &
    pids+=($!)
  done
  wait "${pids[@]}"
  echo "$v: $(cat "$L"/shard_*.txt | grep -c '^\[       OK \]') passed," \
    "$(cat "$L"/shard_*.txt | grep '^\[  FAILED  \] [A-Za-z]' | grep -vc 'listed below') failed"
  cat "$L"/shard_*.txt | grep '^\[  FAILED  \] [A-Za-z]' | grep -v 'listed below' | sort -u
  for tool in memcheck racecheck; do
    echo "$v $tool: $(grep -E '(ERROR|RACECHECK) SUMMARY' "$L/$tool.txt" | tail -1)" \
      "$(grep -c '^\[       OK \]' "$L/$tool.txt") OK, $(tail -1 "$L/$tool.txt")"
  done
  tar czf "$OUT/check-$v.tgz" -C "$L" .
done
PACK=${PACK:-.gpubin/pack/flash-variants.tgz} "$(dirname "$0")/flash_variant_call.sh"
