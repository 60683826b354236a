#!/usr/bin/env bash
# dev/chain_latency/device_run.sh BUILD_DIR OUT_DIR: the issue #7 per-kernel latency A/B in one
# short device call (<= 90 s; every step has a timeout and the later ones an elapsed-time guard).
# Historical: the SPLICE_GEMV_VARIANT knob it sets no longer exists (its winning bits became the
# mainline; README.md), so every knob value below now runs the mainline GEMV and the A/B columns
# only show run-to-run noise. Kept as the record of how runs 10:05 and later were taken.
#
# BUILD_DIR: built with CUDA and -DSPLICE_BUILD_BENCH=ON, targets layer_ops_cuda_bench
# gemv_cuda_bench cuda_gemv_test cuda_prologue_ops_test cuda_layer_ops_test
# cuda_rope_kv_append_test (missing ones are skipped, saying so).
#   1. layer_ops_cuda_bench, SmolLM2 shapes only (100-call dependent chains in one graph, PDL on
#      and off), under SPLICE_GEMV_VARIANT = 0 (mainline) and 1 (rms_norm prologue in registers).
#      Its rms_norm_matmul rows are the GEMV A/B; rms_norm, silu_mul, rope and rope_kv_append
#      (against its 3-kernel chain) are the other per-layer kernels (the knob does not touch
#      them: their spread across the runs is the noise).
#   2. gemv_cuda_bench, M = 1 only (the SmolLM2 decode shapes, rotated weights from DRAM):
#      gemv = no prefetch, pf = constant-weight prefetch (what the model runs), ep = pf + residual
#      (MatMulAdd).
#   3. Correctness: cuda_rope_kv_append_test, cuda_layer_ops_test (the kernels edited here),
#      cuda_prologue_ops_test under 0 and 1, cuda_gemv_test in two parts (gemv_knob: the variant
#      test over every knob value, the PDL chains and the residual epilogue; gemv_rest).
#   4. chain.cu only with CHAIN=1 in the environment (its 10:05 numbers are in the README; ~25 s).
# Everything lands in OUT_DIR (one file per step: *.txt and *.json, ~16 files), then OUT_DIR.tgz
# holds it all; the device returns at most 8 files, so keep OUT_DIR outside $OUT and copy only the
# archive there (README: `device_run.sh build-dev /tmp/chain; cp /tmp/chain.tgz $OUT/`). The
# compact tables go to stdout.
set -uo pipefail
build=${1:?usage: device_run.sh BUILD_DIR OUT_DIR}
out=${2:?usage: device_run.sh BUILD_DIR OUT_DIR}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }
budget=92  # seconds: a test starts only if its timeout still fits in this
have_time() { [[ $(elapsed) -lt $1 ]]; }

layer_bench=$build/bench/layer_ops_cuda_bench
gemv_bench=$build/bench/gemv_cuda_bench
layer_variants="0 1"
gemv_variants="0"

# 1. Layer ops under the knob.
if [[ -x $layer_bench ]]; then
  for v in $layer_variants; do
    have_time 42 || { echo "(layer ops v$v skipped: time)"; continue; }
    SPLICE_GEMV_VARIANT=$v timeout 15 "$layer_bench" "$out/layer_ops_v$v.json" 20 smollm2 \
      >"$out/layer_ops_v$v.txt" 2>&1
    echo "rc $?" >>"$out/layer_ops_v$v.txt"
  done
else
  echo "(no $layer_bench: layer ops skipped)"
fi
echo "== layer ops (us per call; fused with PDL | without | primitive chain with PDL), at $(elapsed) s"
{
for v in $layer_variants; do
  f=$out/layer_ops_v$v.txt
  [[ -f $f ]] || continue
  grep -E 'FAILED|^rc [^0]' "$f" | sed "s/^/  v$v /"
  grep -E '^(rms_norm|silu_mul|rope|rope_kv_append|layer_mix|rms_norm_matmul|silu_mul_matmul_add) ' \
    "$f" | awk -v v="$v" 'NF >= 10 && !/FAILED/ {s = $2; for (i = 3; i <= NF - 8; ++i) s = s " " $i;
      printf "  v%-2s %-19s %-28s fused %6s  nopdl %6s  | chain %6s (%s kernels)\n", v, $1, s,
      $(NF-7), $(NF-6), $(NF-4), $(NF-2)}'
done
} | LC_ALL=C sort -s -b -k2,7

# 2. The GEMV bench, M = 1.
if [[ -x $gemv_bench ]]; then
  for v in $gemv_variants; do
    have_time 60 || { echo "(gemv bench v$v skipped: time)"; continue; }
    SPLICE_GEMV_VARIANT=$v timeout 12 "$gemv_bench" "$out/gemv_v$v.json" --reps 10 --m 1 \
      >"$out/gemv_v$v.txt" 2>&1
    echo "rc $?" >>"$out/gemv_v$v.txt"
  done
else
  echo "(no $gemv_bench: GEMV bench skipped)"
fi
echo "== GEMV M = 1 (us per call: gemv = no prefetch, pf = prefetch, ep = pf + residual), at $(elapsed) s"
{
for v in $gemv_variants; do
  f=$out/gemv_v$v.txt
  [[ -f $f ]] || continue
  grep -E '^rc [^0]' "$f" | sed "s/^/  v$v gemv bench /"
  grep -E '^1 +(smollm2|llama8b)' "$f" |
    awk -v v="$v" 'NF >= 20 {printf "  v%-2s %-16s %5s x %-5s gemv %6s  pf %6s  ep %6s  (cublas %s)\n",
      v, $2" "$3, $4, $5, $6, $(NF-2), $NF, $9}'
done
} | LC_ALL=C sort -s -b -k2,3

# 3. Correctness.
echo "== tests, at $(elapsed) s"
run_test() {  # name, timeout, env, binary, filter
  local name=$1 limit=$2 env=$3 bin=$4 filter=${5:-*}
  [[ -x $bin ]] || { echo "  $name: no $bin"; return; }
  have_time $((budget - limit)) || { echo "  $name: skipped (time)"; return; }
  env $env timeout "$limit" "$bin" --gtest_filter="$filter" >"$out/tests_$name.txt" 2>&1
  local rc=$?
  echo "  $name: rc $rc $(grep -E '^\[  (PASSED  |SKIPPED )\] [0-9]+ test|^\[  FAILED  \] ' \
    "$out/tests_$name.txt" | grep -v ' ms)$' | sort -u | tr '\n' ' ')"
}
run_test rope_kv_append 10 SPLICE_GEMV_VARIANT=1 "$build/tests/cuda_rope_kv_append_test"
run_test layer_ops 10 SPLICE_GEMV_VARIANT=1 "$build/tests/cuda_layer_ops_test"
run_test prologue_v0 10 SPLICE_GEMV_VARIANT=0 "$build/tests/cuda_prologue_ops_test"
run_test prologue_v1 10 SPLICE_GEMV_VARIANT=1 "$build/tests/cuda_prologue_ops_test"
run_test gemv_knob 20 SPLICE_GEMV_VARIANT=1 "$build/tests/cuda_gemv_test" \
  '*Variant*:*Pdl*:*Residual*'
run_test gemv_rest 25 SPLICE_GEMV_VARIANT=1 "$build/tests/cuda_gemv_test" \
  '-*Variant*:*Pdl*:*Residual*'


# 4. chain.cu (optional).
if [[ ${CHAIN:-0} == 1 ]] && have_time 60; then
  bin=$(mktemp -d)/chain
  if nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -o "$bin" "$here/chain.cu" \
      >"$out/chain_build.log" 2>&1; then
    timeout 30 "$bin" >"$out/chain.txt" 2>&1
    echo "== chain.cu rc $?"
    grep -E '^(gemv|rms_reg|rms_smem) +grid +(144|240) +warps 4' "$out/chain.txt"
  else
    echo "== chain.cu build FAILED (see chain_build.log)"
  fi
fi

echo "== all done at $(elapsed) s"
tar czf "$out.tgz" -C "$out" . && echo "archive: $out.tgz ($(du -h "$out.tgz" | cut -f1))"
