#!/usr/bin/env bash
# dev/chain_latency/device_run.sh BUILD_DIR OUT_DIR: the issue #7 chain-latency experiment in one
# short device call (<= ~120 s).
#
# Worst case ~200 s (every step at its timeout); expected ~100 s (chain ~20, layer ops 7 x ~4,
# gemv bench 3 x ~10, tests ~25).
#   1. Compile and run chain.cu (standalone nvcc, sm_90a): the per-kernel floor of a CUDA-graph
#      chain of 200 dependent kernels (empty, tiny 1 KB dependent, GEMV 576x576 at grids 18-576,
#      RMSNorm prologue in registers vs shared memory), PDL on / off, with globaltimer stamps
#      splitting each kernel into body (wait -> last store) and handoff (last store -> next wait).
#   2. The SPLICE_GEMV_VARIANT knob (gemv.h, a bit mask: 1 register prologue, 2 few CTAs, 4 early
#      residual, 8 skip dead batch slots; 0 mainline) on BUILD_DIR's benches: layer_ops_cuda_bench's
#      rms_norm_matmul / silu_mul_matmul_add rows (100-call dependent chains in one graph) under
#      0 1 2 4 8 13 15, and gemv_cuda_bench's M = 1 SmolLM2 rows (default, pf = prefetch, ep = pf
#      + residual) under 0 2 12 (the bits that touch a prologue-free GEMV).
#   3. Correctness of every knob value: cuda_gemv_test's variant test (it loops over all sixteen
#      values) and PDL chain tests, and cuda_prologue_ops_test under SPLICE_GEMV_VARIANT=13 and 15.
# Everything lands in OUT_DIR (chain.txt, *_v<N>.txt / .json, tests_*.txt) and one compact table
# on stdout. Missing BUILD_DIR targets are skipped, saying so.
set -uo pipefail
build=${1:?usage: device_run.sh BUILD_DIR OUT_DIR}
out=${2:?usage: device_run.sh BUILD_DIR OUT_DIR}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }

# 1. chain.cu (the binary stays out of OUT_DIR).
bin=$(mktemp -d)/chain
if nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -split-compile=0 -o "$bin" \
    "$here/chain.cu" >"$out/chain_build.log" 2>&1; then
  echo "== chain.cu (built in $(elapsed) s)"
  timeout 60 "$bin" >"$out/chain.txt" 2>&1
  echo "rc $?" >>"$out/chain.txt"
  cat "$out/chain.txt"
else
  echo "== chain.cu build FAILED:"
  tail -20 "$out/chain_build.log"
fi
echo "== chain done at $(elapsed) s"

# 2. The knob on the benches.
layer_bench=$build/bench/layer_ops_cuda_bench
gemv_bench=$build/bench/gemv_cuda_bench
layer_variants="0 1 2 4 8 13 15"
gemv_variants="0 12 2"
for v in $layer_variants; do
  if [[ -x $layer_bench ]]; then
    SPLICE_GEMV_VARIANT=$v timeout 12 "$layer_bench" "$out/layer_ops_v$v.json" 20 \
      >"$out/layer_ops_v$v.txt" 2>&1
  fi
done
for v in $gemv_variants; do
  if [[ -x $gemv_bench && $(elapsed) -lt 75 ]]; then
    SPLICE_GEMV_VARIANT=$v timeout 15 "$gemv_bench" "$out/gemv_v$v.json" --reps 10 \
      >"$out/gemv_v$v.txt" 2>&1
  fi
done
[[ -x $layer_bench ]] || echo "(no $layer_bench: knob A/B on layer ops skipped)"
[[ -x $gemv_bench ]] || echo "(no $gemv_bench: knob A/B on the GEMV bench skipped)"
echo "== knob A/B (us per call; layer ops: fused with PDL, fused without PDL):"
for v in $layer_variants; do
  f=$out/layer_ops_v$v.txt
  [[ -f $f ]] && grep -E '^(rms_norm_matmul|silu_mul_matmul_add) ' "$f" |
    awk -v v="$v" '{s = $2; for (i = 3; i <= NF - 8; ++i) s = s " " $i;
      printf "  v%s %-19s %-26s fused %6s  nopdl %6s  (2-kernel chain %s)\n", v, $1, s, $(NF-7), $(NF-6), $(NF-4)}'
done
for v in $gemv_variants; do
  f=$out/gemv_v$v.txt
  [[ -f $f ]] && grep -E '^1 +smollm2' "$f" |
    awk -v v="$v" '{printf "  v%s M=1 %-16s %5s x %-5s gemv %6s  pf %6s  ep %6s\n", v, $2" "$3, $4, $5, $6, $(NF-2), $NF}'
done
echo "== knob A/B done at $(elapsed) s"

# 3. Every knob value stays correct.
gemv_test=$build/tests/cuda_gemv_test
prologue_test=$build/tests/cuda_prologue_ops_test
if [[ -x $gemv_test ]]; then
  timeout 30 "$gemv_test" --gtest_filter='*Variant*:*Pdl*' >"$out/tests_gemv.txt" 2>&1
  echo "cuda_gemv_test (variants, PDL): rc $? $(grep -E '^\[  (PASSED|FAILED) ' "$out/tests_gemv.txt" | tr '\n' ' ')"
fi
if [[ -x $prologue_test ]]; then
  for v in 13 15; do
    [[ $(elapsed) -lt 110 ]] || { echo "prologue_ops_test v$v: skipped (time)"; continue; }
    SPLICE_GEMV_VARIANT=$v timeout 15 "$prologue_test" >"$out/tests_prologue_v$v.txt" 2>&1
    echo "cuda_prologue_ops_test SPLICE_GEMV_VARIANT=$v: rc $? $(grep -E '^\[  (PASSED|FAILED) ' "$out/tests_prologue_v$v.txt" | tr '\n' ' ')"
  done
fi
echo "== all done at $(elapsed) s"
