#!/usr/bin/env bash
# dev/flash_variant_check_call.sh: a flash-decode kernel variant's GPU tests and attention
# sanitizers (refresh_call.sh's `flash` phase, gpu_checks_lib.sh's flash_checks, on the variant's
# own cuda_all_test), then the variant timed beside HEAD (dev/flash_variant_call.sh, same
# environment: SHAPES, ROUNDS, ...). Built here:
#   WITH_TESTS=1 dev/pack_binaries.sh flash-variants dev/<variant>.patch
# then
#   run(command="dev/flash_variant_check_call.sh", carry=[".gpubin/pack/flash-variants.tgz",
#       ".deps"])
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
source "$root/dev/gpu_checks_lib.sh"
P=/tmp/flashvar-check
rm -rf $P && mkdir -p $P && tar xzf "${PACK:-.gpubin/pack/flash-variants.tgz}" -C $P
shopt -s nullglob
tests=($P/*/cuda_all_test)
shopt -u nullglob
((${#tests[@]})) || echo "no variant's cuda_all_test in the pack (built without WITH_TESTS=1?)"
for TEST_BIN in "${tests[@]}"; do
  v=$(basename "$(dirname "$TEST_BIN")")
  L=$P/logs-$v
  mkdir -p "$L"
  echo "== $v: flash GPU tests and attention sanitizers (at $(el) s)"
  flash_checks
  tar czf "$OUT/check-$v.tgz" -C "$L" .
done
PACK=${PACK:-.gpubin/pack/flash-variants.tgz} "$(dirname "$0")/flash_variant_call.sh"
