#!/usr/bin/env bash
# dev/ncu_call.sh: Nsight Compute on one launch of the KDA stream kernel, to see where its item
# loop waits (warp-state and PC-sampled stall reasons per SASS instruction, memory workload,
# speed of light). ncu runs the profiled launch alone, caches flushed, clocks left alone, so the
# launch-to-launch ramp is not in it: it shows the item loop. From a bench built here (the pack
# of dev/gridcap_call.sh):
#   run(command="CASES='bf16:128:1 bf16:128:2' dev/ncu_call.sh",
#       carry=[".gpubin/pack/gridcap.tgz", ".deps"])
# Environment (defaults): CASES (state:N:T, space-separated; bf16:128:1), NCU_SKIP (launches of the
# kernel to skip before the profiled one: 8), SET (ncu section set: full), FLASH (below).
# Output: $OUT/ncu-<case>.tgz per case: details.csv (every section's metrics), source.csv (per
# SASS instruction: PC-sampled stall reasons), and ncu's log.
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
P=/tmp/ncu-pack
rm -rf "$P" && mkdir -p "$P" && tar xzf .gpubin/pack/gridcap.tgz -C "$P"
which ncu || { echo "no ncu on the PATH"; exit 1; }
source "$(dirname "$0")/ncu_lib.sh"
for c in ${CASES:-bf16:128:1}; do
  IFS=: read -r st n t <<<"$c"
  KDA_BENCH_NS=$n KDA_BENCH_TS=$t KDA_BENCH_STATES=$st KDA_BENCH_VARIANTS=stream KDA_BENCH_WARM_MS=1 \
    ncu_profile "$st-$n-$t" kda_decode_stream "$P/head/kda_decode_cuda_bench" "/tmp/ncu-$st-$n-$t.json"
done
# FLASH (shapes 'B,Hq,Hkv,k_len,D;...'; carry .gpubin/pack/refresh2.tgz too): one flash-decode
# launch (of the first shape) under the same sections.
if [[ -n ${FLASH:-} ]]; then
  F=/tmp/ncu-flash-pack
  rm -rf "$F" && mkdir -p "$F" && tar xzf .gpubin/pack/refresh2.tgz -C "$F"
  ncu_profile flash flash "$F/head/flash_decode_cuda_bench" --shapes "$FLASH" --no-variants \
    --warm-ms 1 --reps 3 --json /tmp/ncu-flash.json
fi
echo "done at $(el) s"
