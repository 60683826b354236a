#!/usr/bin/env bash
# dev/flash_variant_call.sh: flash-decode kernel variants timed beside HEAD in one device call.
#   head/        flash_decode_cuda_bench of HEAD
#   <variant>/   flash_decode_cuda_bench of HEAD + dev/<variant>.patch   (from PACK)
# Build the variants here: dev/pack_binaries.sh flash-variants dev/<variant>.patch ... (~1 min
# each), then
#   run(command="dev/flash_variant_call.sh", carry=[".gpubin/pack/refresh1.tgz",
#       ".gpubin/pack/flash-variants.tgz", ".deps"])   (refresh1 only for TESTS)
# Steps: HEAD's TESTS from refresh1 (cuda_all_test; skipped when TESTS is empty), then ROUNDS
# rounds of every binary at SHAPES, alternating (head first in odd rounds, last in even ones),
# the rule plan (--plans 'rule:0:-1:0'), medians of --rounds BENCH_ROUNDS inside each process.
# Environment (defaults): PACK (.gpubin/pack/flash-variants.tgz), SHAPES (the large 4K / 64K points
# and B = 1), ROUNDS (2), BENCH_ROUNDS (2), TESTS (a gtest filter, ''), BENCH_CUT (60 s a process),
# PEERS (1: cuDNN and FA2 at SHAPES after the rounds, PEERS_S 150 s).
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
P=/tmp/flashvar
rm -rf $P && mkdir -p $P
# PACK holds head/ beside the variants (pack_binaries.sh flash-variants puts HEAD's bench there).
tar xzf "${PACK:-.gpubin/pack/flash-variants.tgz}" -C $P
SHAPES=${SHAPES:-'128,32,8,4096,128;128,64,8,4096,128;32,32,8,65536,128;32,64,8,65536,128;1,32,8,4096,128;1,32,8,16384,128;8,32,8,16384,128;128,32,8,16384,128'}
ROUNDS=${ROUNDS:-2} BENCH_ROUNDS=${BENCH_ROUNDS:-2} TESTS=${TESTS:-} BENCH_CUT=${BENCH_CUT:-60}
variants=()
for d in $P/*/; do d=$(basename "$d"); [[ $d != head ]] && variants+=("$d"); done
echo "variants: ${variants[*]}"
if [[ -n $TESTS ]]; then
  mkdir -p /tmp/flashvar-tests && tar xzf .gpubin/pack/refresh1.tgz -C /tmp/flashvar-tests
  echo "== HEAD tests $TESTS (at $(el) s)"
  timeout 200 /tmp/flashvar-tests/head/cuda_all_test --gtest_filter="$TESTS" 2>&1 |
    grep -E '^\[  (PASSED|FAILED) |^\[  FAILED|tests ran' | tail -20
fi
for ((r = 1; r <= ROUNDS; ++r)); do
  order=(head "${variants[@]}")
  ((r % 2 == 0)) && order=("${variants[@]}" head)
  for b in "${order[@]}"; do
    echo "== round $r, $b (at $(el) s)"
    timeout "$BENCH_CUT" "$P/$b/flash_decode_cuda_bench" --plans 'rule:0:-1:0' \
      --rounds "$BENCH_ROUNDS" --shapes "$SHAPES" 2>&1 | sed -u -n '/^Plan columns/,$p'
  done
done
if [[ ${PEERS:-0} == 1 ]]; then
  echo "== peers (at $(el) s)"
  PYTHONUNBUFFERED=1 timeout "${PEERS_S:-150}" python3 bench/peers/attention_peers.py \
    --shapes "$SHAPES" --json "$OUT/peers.json" 2>&1 | grep --line-buffered 'B='
fi
echo "== done (at $(el) s)"
