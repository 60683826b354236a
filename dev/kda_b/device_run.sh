#!/usr/bin/env bash
# dev/kda_b/device_run.sh BUILD_DIR OUT_DIR: the H200 confirmation run of KDA decode v9 (issue 6;
# the schedule and what to expect: dev/kda_b/README.md, "v9"). Needs BUILD_DIR built with CUDA
# and -DSPLICE_BUILD_BENCH=ON, targets cuda_kda_decode_test and kda_decode_cuda_bench.
# <= ~60 s, each step under `timeout`:
#   1. correctness first: KdaCuda.TuneSwitchesBitIdentical (the mainline, bf16 T = 1 overlapped,
#      bit for bit equal to the knob's pre-overlap item loop; the mainline against the CPU kernel
#      and the reference), the stream kernel's admission, the rule's table              (<= 32 s)
#   2. bench bf16 then f32, T = 1, 2, N = 1, 8, 32, 128, 512: the rule's pick, `stream`, and
#      `stream` under the knob (tune=1: bf16 T = 1 without the overlap, the A/B)    (<= 12 + 12 s)
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

say "== kda_b v9 $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader 2>/dev/null)"
say "== commit $(git -C "$(dirname "$0")/../.." rev-parse --short HEAD 2>/dev/null || echo '?')"

# 1. correctness
filter='KdaCuda.TuneSwitchesBitIdentical:KdaCuda.StreamKernelAdmitsItsBlock:KdaCuda.RuleTable'
if [[ -x "$TEST_BIN" ]]; then
  t0=$SECONDS
  timeout 32 "$TEST_BIN" --gtest_filter="$filter" >"$WORK/tests.txt" 2>&1
  rc=$?
  say "== tests ($filter): rc=$rc $((SECONDS - t0)) s $(grep -E '^\[  (PASSED|FAILED) ' "$WORK/tests.txt" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]|^\[kda cuda stats\]|Failure|tune=' "$WORK/tests.txt" | head -20 | tee -a "$SUMMARY"
else
  say "== tests: $TEST_BIN missing"
fi

# 2. benchmark (per-shape lines as it goes, the tables at its end)
bench() {  # name timeout env...
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  env "$@" timeout "$limit" "$BENCH" "$WORK/bench_$name.json" >"$WORK/bench_$name.txt" 2>&1
  local rc=$?
  say ""
  say "== bench $name ($*): rc=$rc $((SECONDS - t0)) s"
  grep -E '^  (f32|bf16) N=' "$WORK/bench_$name.txt" | tee -a "$SUMMARY"
  if grep -q '^state ' "$WORK/bench_$name.txt"; then
    sed -n '/^state /,$p' "$WORK/bench_$name.txt" | tee -a "$SUMMARY"
  else  # cut short (timeout) or failed: the A/B lines so far and the last words
    grep -E 'A/B' "$WORK/bench_$name.txt" | tee -a "$SUMMARY"
    tail -n 3 "$WORK/bench_$name.txt" | tee -a "$SUMMARY"
  fi
}
if [[ -x "$BENCH" ]]; then
  common=(KDA_BENCH_VARIANTS=stream KDA_BENCH_NS=1,8,32,128,512 KDA_BENCH_TS=1,2 KDA_BENCH_TUNES=1)
  bench t12_bf16 12 "${common[@]}" KDA_BENCH_STATES=bf16
  bench t12_f32 12 "${common[@]}" KDA_BENCH_STATES=f32
else
  say "== bench: $BENCH missing"
fi

# One tar of everything; OUT_DIR holds only it.
tar czf "$OUT/kda_b.tgz" -C "$WORK" . && rm -rf "$WORK"
echo "== wrote $OUT/kda_b.tgz ($SECONDS s)"
