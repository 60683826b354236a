#!/usr/bin/env bash
# dev/kda_b/device_run.sh BUILD_DIR OUT_DIR: the one H200 run that decides issue 6's `stream`
# schedule switches (cuda::KdaTuneBits; dev/kda_b/README.md says what each is and how to read the
# result). Needs BUILD_DIR built with CUDA and -DSPLICE_BUILD_BENCH=ON, targets
# cuda_kda_decode_test and kda_decode_cuda_bench. <= ~120 s:
#   1. correctness of every switch: KdaCuda.TuneSwitchesBitIdentical (each mask bit for bit equal
#      to the default schedule, and all switches against the CPU kernel / reference), plus the
#      stream kernel's admission test and the rule table                          (<= 50 s)
#   2. the benchmark at T = 1, every N, both state dtypes: the rule's variants and `stream` with
#      tune masks 1, 2, 4, 5, 7 (A/B lines, decision table)                             (<= 30 s)
#   3. the same at T = 2, 4, 8 with masks 1 (inactive there: the noise reference) and 2  (<= 25 s)
#   4. N = 128, 512 at T = 1, 2 with >= 4 back-to-back launches per graph (PDL overlaps each
#      launch's ramp with its neighbour's tail, as inside a decode step)          (<= 12 s)
# Files under OUT_DIR: tests.txt, bench_t1.txt / .json, bench_tn.txt / .json, bench_g4.txt / .json,
# summary.txt (also printed: the decision tables and the test verdict).
set -u
BUILD=${1:?usage: device_run.sh BUILD_DIR OUT_DIR}
OUT=${2:?usage: device_run.sh BUILD_DIR OUT_DIR}
mkdir -p "$OUT"
TEST_BIN="$BUILD/tests/cuda_kda_decode_test"
BENCH="$BUILD/kda_decode_cuda_bench"
[[ -x "$BENCH" ]] || BENCH="$BUILD/bench/kda_decode_cuda_bench"
TUNES=1,2,4,5,7
VARIANTS=stream,wide,split2,split4
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }

say "== kda_b $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader 2>/dev/null)"
say "== commit $(git -C "$(dirname "$0")/../.." rev-parse --short HEAD 2>/dev/null || echo '?')"

# 1. correctness
# (the full KDA suite, StreamManyItemsPerCta included, is the lead's ctest -L gpu -R KdaCuda)
filter='KdaCuda.TuneSwitchesBitIdentical:KdaCuda.StreamKernelAdmitsItsBlock:KdaCuda.RuleTable'
if [[ -x "$TEST_BIN" ]]; then
  timeout 50 "$TEST_BIN" --gtest_filter="$filter" >"$OUT/tests.txt" 2>&1
  rc=$?
  say "== tests ($filter): rc=$rc $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/tests.txt" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]|^\[kda cuda stats\]' "$OUT/tests.txt" | tee -a "$SUMMARY"
else
  say "== tests: $TEST_BIN missing"
fi

# 2-4. benchmark (each run prints per-shape lines as it goes; the tables at its end)
bench() {  # name timeout env...
  local name=$1 limit=$2
  shift 2
  env KDA_BENCH_VARIANTS=$VARIANTS "$@" timeout "$limit" "$BENCH" "$OUT/bench_$name.json" \
    >"$OUT/bench_$name.txt" 2>&1
  local rc=$?
  say ""
  say "== bench $name ($*): rc=$rc"
  # The main table (rule's pick) and the tune decision table; the A/B lines when cut short.
  if grep -q '^stream tune A/B' "$OUT/bench_$name.txt"; then
    sed -n '/^state /,$p' "$OUT/bench_$name.txt" | tee -a "$SUMMARY"
  else  # cut short (timeout) or failed: the per-shape lines so far and the last words
    grep -E 'A/B|N=.*T=.*floor' "$OUT/bench_$name.txt" | tee -a "$SUMMARY"
    tail -n 3 "$OUT/bench_$name.txt" | tee -a "$SUMMARY"
  fi
}
if [[ -x "$BENCH" ]]; then
  bench t1 30 KDA_BENCH_TS=1 KDA_BENCH_TUNES=$TUNES
  bench tn 25 KDA_BENCH_TS=2,4,8 KDA_BENCH_TUNES=1,2  # 1: inactive at T > 1 (noise reference)
  bench g4 12 KDA_BENCH_NS=128,512 KDA_BENCH_TS=1,2 KDA_BENCH_MIN_SETS=4 KDA_BENCH_TUNES=2,5,7 \
    KDA_BENCH_VARIANTS=stream
else
  say "== bench: $BENCH missing"
fi
