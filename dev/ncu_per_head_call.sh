#!/usr/bin/env bash
# dev/ncu_per_head_call.sh: Nsight Compute on one launch of the per-head KDA kernels (wide, split4) at
# bf16 N = 8 T = 1, without PDL (session 38: FlashInfer's T = 1 kernel ran N = 8 in 7.5 us against
# wide's 10.8). run(command="dev/ncu_per_head_call.sh", carry=[".gpubin/pack/kdabench.tgz", ".deps"])
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
P=/tmp/ncuw && rm -rf $P && mkdir -p $P && tar xzf .gpubin/pack/kdabench.tgz -C $P
for vk in wide:ILi256ELi1E split4:ILi128ELi4E; do
v=${vk%%:*} k=${vk#*:}
for st in bf16; do
W=/tmp/ncu-$v-$st; rm -rf $W; mkdir -p $W
KDA_BENCH_NS=8 KDA_BENCH_TS=1 KDA_BENCH_STATES=$st KDA_BENCH_VARIANTS=$v KDA_BENCH_WARM_MS=1 SPLICE_PDL=0 \
  timeout 200 ncu --clock-control none --set full --import-source no --kernel-name-base mangled --kernel-name regex:kda_decode_kernel$k \
  --launch-skip 8 --launch-count 1 -o $W/prof $P/head/kda_decode_cuda_bench /tmp/x.json > $W/ncu.log 2>&1 || echo "rc $?"
tail -2 $W/ncu.log
ncu -i $W/prof.ncu-rep --page details --csv > $W/details.csv 2>&1
ncu -i $W/prof.ncu-rep --page source --csv --print-source sass > $W/source.csv 2>&1
grep -i '"Duration"\|DRAM Throughput\|Registers Per\|Grid Size\|Block Size\|No Eligible\|Issued Warp\|Achieved Occupancy\|Theoretical Occupancy' $W/details.csv | cut -d, -f13-15 | head -14
tar czf $OUT/ncu-$v-$st.tgz -C $W --exclude=prof.ncu-rep .
done; done
