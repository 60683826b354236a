# dev/gpu_checks_lib.sh: sourced by the device calls that check a cuda_all_test binary
# (dev/refresh_call.sh's `tests` and `flash` phases on HEAD's, dev/flash_variant_check_call.sh on a
# variant's). Uses $TEST_BIN (the binary) and $L (the log directory).

# The attention filters of the sanitizer runs (the KDA ones are in refresh_call.sh's phase_tests).
att_small='FlashDecodeCuda.RaggedBatchAndEmptySequence:FlashDecodeCuda.MisalignedQueryAndOutputRows:FlashDecodeCuda.OpEntryDispatchesToTheCudaKernel:FlashDecodeCuda.SmolLM2ShapeMatchesFloat64Reference:FlashDecodeCuda.StablePrefixReadsTheRowsItsProducerWrites'
# sanitize NAME TOOL FILTER: compute-sanitizer's TOOL on the GPU tests FILTER names, in the
# background ($! is its pid), into $L/NAME.txt with its exit status and time last.
sanitize() {
  ( s=$SECONDS
    timeout 235 compute-sanitizer --tool "$2" --error-exitcode 3 "$TEST_BIN" \
      --gtest_filter="$3" >"$L/$1.txt" 2>&1
    echo "rc $? in $((SECONDS - s)) s" >>"$L/$1.txt" ) &
}
# sanitizer_line NAME: its summary, tests passed and exit status on one line.
sanitizer_line() {
  echo "$1: $(grep -E '(ERROR|RACECHECK) SUMMARY' "$L/$1.txt" | tail -1)" \
    "$(grep -c '^\[       OK \]' "$L/$1.txt") OK, $(tail -1 "$L/$1.txt")"
}
# flash_checks: the flash-decode GPU tests (and the model tests that run it) in 8 shards beside
# the attention sanitizer filters, then one summary line each: a kernel change's check in ~1.5
# minutes.
flash_checks() {
  local pids=() i tool
  for i in $(seq 0 7); do
    GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$i timeout 235 "$TEST_BIN" \
      --gtest_filter='FlashDecodeCuda.*:CudaGreedyDecode.*:*Llama*:CudaSessionGraph.*' \
      >"$L/flash_shard_$i.txt" 2>&1 &
    pids+=($!)
  done
  for tool in memcheck racecheck; do
    sanitize "att_$tool" "$tool" "$att_small"
    pids+=($!)
  done
  wait "${pids[@]}"
  echo "flash GPU tests: $(cat "$L"/flash_shard_*.txt | grep -c '^\[       OK \]') passed," \
    "$(cat "$L"/flash_shard_*.txt | grep '^\[  FAILED  \] [A-Za-z]' | grep -vc 'listed below') failed"
  cat "$L"/flash_shard_*.txt | grep '^\[  FAILED  \] [A-Za-z]' | grep -v 'listed below' | sort -u
  for tool in memcheck racecheck; do sanitizer_line "att_$tool"; done
}
