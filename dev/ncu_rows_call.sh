#!/usr/bin/env bash
# dev/ncu_rows_call.sh: Nsight Compute on one launch of the `rows` KDA kernel (mainline, from the
# bench) and one of its standalone probe (dev/kda_rows), N = 8 T = 1, to find where rows loses
# ~0.4 us to the probe (perf.md runs 295, 299: bf16 8.58 against 8.17 us) and the probe ~0.7 us to
# FlashInfer (7.43). Both launched without PDL in their own processes (SPLICE_PDL=0; the probe's
# "plain/2" variant), so the profiled launch is the kernel alone. Carried, built here:
#   dev/pack_binaries.sh refresh   (refresh1.tgz: head/kda_decode_cuda_bench)
#   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -Isrc -o .gpubin/kda_rows \
#     dev/kda_rows/kda_rows.cu
#   run(command="dev/ncu_rows_call.sh", carry=[".gpubin/pack/refresh1.tgz", ".gpubin/kda_rows",
#       ".deps"])
# Environment (defaults): STATES (bf16 f32), N (8), SET (full), NCU_SKIP (4).
# Output: $OUT/ncu-<kernel>-<state>.tgz: details.csv (every section), source.csv (per SASS
# instruction: PC-sampled stall reasons), ncu's log; the headline metrics printed.
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
P=/tmp/ncu-rows && rm -rf $P && mkdir -p $P && tar xzf .gpubin/pack/refresh1.tgz -C $P
which ncu || { echo "no ncu on the PATH"; exit 1; }
n=${N:-8}
source "$(dirname "$0")/ncu_lib.sh"
export NCU_SKIP=${NCU_SKIP:-4}
for st in ${STATES:-bf16 f32}; do
  if [[ $st == bf16 ]]; then rows_t=I13__nv_bfloat16E probe_t=I13__nv_bfloat16Li2E; else rows_t=IfE probe_t=IfLi2E; fi
  KDA_BENCH_NS=$n KDA_BENCH_TS=1 KDA_BENCH_STATES=$st KDA_BENCH_VARIANTS=rows KDA_BENCH_WARM_MS=1 \
    SPLICE_PDL=0 ncu_profile "rows-$st" "kda_decode_rows_kernel$rows_t" \
    "$P/head/kda_decode_cuda_bench" /tmp/ncu-rows.json
  # The probe: its check launches (5 rows) come first; KDA_ROWS_NS=$n leaves the one N after them.
  # Its launches alternate pdl/2, plain/2, pdl/1, plain/1 per graph, so the regex (2 CTAs an SM)
  # still mixes PDL and plain launches: the profiled one runs alone either way under ncu.
  KDA_ROWS_NS=$n ncu_profile "probe-$st" "kda_rows_t1$probe_t" .gpubin/kda_rows
done
echo "done at $(el) s"
