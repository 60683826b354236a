#!/usr/bin/env bash
# dev/kda_b/device_run.sh BUILD_DIR OUT_DIR: the H200 run of KDA decode v8 (issue 6; what each
# switch is and how to read the result: dev/kda_b/README.md, "v8"). Needs BUILD_DIR built with
# CUDA and -DSPLICE_BUILD_BENCH=ON, targets cuda_kda_decode_test and kda_decode_cuda_bench.
# <= ~93 s, each step under `timeout`:
#   1. correctness first: KdaCuda.TuneSwitchesBitIdentical (tune masks 1-3 bit for bit equal to
#      the mainline schedule, which is checked against the CPU kernel / reference), the stream
#      kernel's admission, the rule's table (the new picks against the CPU, RuleBoundaryCases, run
#      in the lead's suite: ~17 s)                                                  (<= 45 s)
#   2. bench bf16 then f32, T = 1, 2, N = 1, 8, 32, 128, 512: the rule's pick, every variant
#      (stream, wide, split2, split4: the rule's cells) and `stream` at tune masks
#      1 (v7's schedule = HEAD before v8), 2 (overlap), 3 (overlap, no stagger)  (<= 22 + 18 s)
#   3. bench T = 4, 8 at N = 1, 8: the rule's inferred cells (split4 at N = 1, bf16 wide at
#      N = 8) against stream                                                       (<= 8 s)
# OUT_DIR ends holding one file, kda_b.tgz (tests.txt, bench_*.txt / .json, summary.txt); the
# summary (test verdict, each run's main table and the tune A/B table) is printed to stdout.
set -u
BUILD=${1:?usage: device_run.sh BUILD_DIR OUT_DIR}
OUT=${2:?usage: device_run.sh BUILD_DIR OUT_DIR}
mkdir -p "$OUT"
WORK=$(mktemp -d)
TEST_BIN="$BUILD/tests/cuda_kda_decode_test"
BENCH="$BUILD/kda_decode_cuda_bench"
[[ -x "$BENCH" ]] || BENCH="$BUILD/bench/kda_decode_cuda_bench"
SUMMARY="$WORK/summary.txt"
: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }

say "== kda_b v8 $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader 2>/dev/null)"
say "== commit $(git -C "$(dirname "$0")/../.." rev-parse --short HEAD 2>/dev/null || echo '?')"

# 1. correctness
filter='KdaCuda.TuneSwitchesBitIdentical:KdaCuda.StreamKernelAdmitsItsBlock:KdaCuda.RuleTable'
TUNES=1,2,3
if [[ -x "$TEST_BIN" ]]; then
  t0=$SECONDS
  timeout 45 "$TEST_BIN" --gtest_filter="$filter" >"$WORK/tests.txt" 2>&1
  rc=$?
  # A hung run or a failed switch test: time the mainline and v7 only (a hanging overlap schedule
  # would eat the benches' time).
  if [[ $rc -eq 124 ]] || grep -q 'FAILED  \] KdaCuda.TuneSwitchesBitIdentical' "$WORK/tests.txt"; then
    TUNES=1
    say "== the switch test failed or hung: tune 2, 3 (overlap) dropped from the benches"
  fi
  say "== tests ($filter): rc=$rc $((SECONDS - t0)) s $(grep -E '^\[  (PASSED|FAILED) ' "$WORK/tests.txt" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]|^\[kda cuda stats\]|Failure|tune=' "$WORK/tests.txt" | head -20 | tee -a "$SUMMARY"
else
  say "== tests: $TEST_BIN missing"
fi

# 2-3. benchmark (per-shape lines as it goes, the tables at its end)
bench() {  # name timeout env...
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  env "$@" timeout "$limit" "$BENCH" "$WORK/bench_$name.json" >"$WORK/bench_$name.txt" 2>&1
  local rc=$?
  say ""
  say "== bench $name ($*): rc=$rc $((SECONDS - t0)) s"
  # Every variant's time per shape (the rule's cells), then the main table and the tune table.
  grep -E '^  (f32|bf16) N=' "$WORK/bench_$name.txt" | tee -a "$SUMMARY"
  if grep -q '^state ' "$WORK/bench_$name.txt"; then
    sed -n '/^state /,$p' "$WORK/bench_$name.txt" | tee -a "$SUMMARY"
  else  # cut short (timeout) or failed: the A/B lines so far and the last words
    grep -E 'A/B' "$WORK/bench_$name.txt" | tee -a "$SUMMARY"
    tail -n 3 "$WORK/bench_$name.txt" | tee -a "$SUMMARY"
  fi
}
if [[ -x "$BENCH" ]]; then
  common=(KDA_BENCH_VARIANTS=stream,wide,split2,split4 KDA_BENCH_NS=1,8,32,128,512)
  bench t12_bf16 22 "${common[@]}" KDA_BENCH_STATES=bf16 KDA_BENCH_TS=1,2 KDA_BENCH_TUNES=$TUNES
  bench t12_f32 18 "${common[@]}" KDA_BENCH_STATES=f32 KDA_BENCH_TS=1,2 KDA_BENCH_TUNES=$TUNES
  bench t48 8 KDA_BENCH_VARIANTS=stream,wide,split4 KDA_BENCH_NS=1,8 KDA_BENCH_TS=4,8
else
  say "== bench: $BENCH missing"
fi

# One tar of everything; OUT_DIR holds only it.
tar czf "$OUT/kda_b.tgz" -C "$WORK" . && rm -rf "$WORK"
echo "== wrote $OUT/kda_b.tgz ($SECONDS s)"
