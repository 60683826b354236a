#!/usr/bin/env bash
# dev/gemv_variant_call.sh: a GEMV launcher patch against head on the device, in one call:
# each variant's GEMV / SwiGLU GPU tests, the gemv bench (head and each variant, interleaved,
# GEMV_ARGS e.g. "--m 1"), then the decode step of the embedded default model and of the
# SmolLM2-135M-shaped one (bf16) through dev/model_batch_call.sh (BATCHES, ROUNDS as there).
# The pack: WITH_TESTS=1 WITH_SPLICE=1 dev/pack_binaries.sh gemv-variants dev/NAME.patch
#   run(command="dev/gemv_variant_call.sh", carry=[".gpubin/pack/gemv-variants.tgz", ".deps"])
# Each part runs where its binaries are in the pack (cuda_all_test, gemv_cuda_bench, splice): a
# pack over the 64 MiB a call carries splits into two calls (session 55: splice's 36 MB a copy).
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
PACK=${PACK:-.gpubin/pack/gemv-variants.tgz}
P=/tmp/gemv-variants; rm -rf $P; mkdir -p $P; tar xf "$PACK" -C $P
variants=(); for d in $P/*/; do d=$(basename $d); [[ $d != head ]] && variants+=($d); done
echo "variants: ${variants[*]}"
for v in "${variants[@]}"; do
  [[ -x $P/$v/cuda_all_test ]] || continue
  echo "== $v: GPU tests (at $(el) s)"
  timeout 120 $P/$v/cuda_all_test --gtest_filter='CudaGemv.*:SwigluCuda.*:LayerOps*:QkvRopeCuda.*:CudaSession*:CudaGreedyDecode.*:CudaPdl.*:PrologueOpsCuda.*' 2>&1 | tail -4
done
[[ -x $P/head/gemv_cuda_bench ]] && for round in 1 2; do
  for b in head "${variants[@]}"; do
    echo "== gemv bench $b round $round (at $(el) s)"
    timeout 120 $P/$b/gemv_cuda_bench "$OUT/gemv_${b}_$round.json" ${GEMV_ARGS:-} \
      >"$OUT/gemv_${b}_$round.txt" 2>&1 || echo "rc $?"
  done
done
[[ -x $P/head/gemv_cuda_bench ]] && for b in head "${variants[@]}"; do
  echo "-- $b"; head -60 "$OUT/gemv_${b}_2.txt"
done
[[ -x $P/head/splice ]] || { echo "done at $(el) s"; exit 0; }
echo "== default model (at $(el) s)"
PACK=$PACK BATCHES=${BATCHES:-1,4} ROUNDS=${ROUNDS:-3} bash dev/model_batch_call.sh
mv "$OUT/logs.tgz" "$OUT/logs_default.tgz"
echo "== SmolLM2-shaped model, bf16 (at $(el) s)"
python3 scripts/peers/smollm2_shaped.py /tmp/smollm2_shaped >/dev/null 2>&1 || echo "no SmolLM2 model"
PACK=$PACK BATCHES=${BATCHES:-1,4} ROUNDS=${ROUNDS:-3} \
  EXTRA_ARGS="--model /tmp/smollm2_shaped --dtype bf16 --max-seq-len 512" bash dev/model_batch_call.sh
echo "done at $(el) s"
