#!/usr/bin/env bash
# dev/peer_launch/peer_launch_call.sh: cuDNN's and FA2's decode launches (Kineto records, then
# Nsight Compute on one cuDNN launch) beside Nsight Compute on splice's flash-decode launch, at
# one shape. From the refresh pack built here:
#   run(command="SHAPE='32,64,8,65536,128' dev/peer_launch/peer_launch_call.sh",
#       carry=[".gpubin/pack/refresh2.tgz", ".deps"])
# Environment: SHAPE (32,64,8,65536,128), SET (ncu section set: full), NCU (0: Kineto only).
set -uo pipefail
source "$(dirname "$0")/../call_env.sh"
source "$root/dev/ncu_lib.sh"
S=${SHAPE:-32,64,8,65536,128}
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
echo "== kineto (at $(el) s)"
timeout 120 python3 dev/peer_launch/peer_launch.py --shapes "$S" 2>&1 | grep -v Warning
[[ ${NCU:-1} == 0 ]] && exit 0
NCU_SKIP=3 ncu_profile cudnn '[Ss]dpa|fprop|fmha|[Dd]ecode|attn' \
  python3 dev/peer_launch/peer_launch.py --shapes "$S" --backends cudnn --loop 2
F=/tmp/ncu-flash-pack
rm -rf "$F" && mkdir -p "$F" && tar xzf .gpubin/pack/refresh2.tgz -C "$F"
ncu_profile splice flash "$F/head/flash_decode_cuda_bench" --shapes "$S" --no-variants \
  --warm-ms 1 --reps 3 --json /tmp/ncu-flash.json
for n in cudnn splice; do
  echo "== $n launch"
  grep -E '"(Grid Size|Block Size|Registers Per Thread|Dynamic Shared Memory Per Block|Static Shared Memory Per Block|Waves Per SM|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Executed Ipc Active|L2 Hit Rate|Mem Busy|Max Bandwidth|Threads)"' \
    "/tmp/ncu-$n/details.csv" | awk -F'","' '{sub(/",.*$/, "", $15); print "  " $13 " = " $15}' | sort -u
  awk -F'","' 'NR == 2 {print "  kernel: " substr($5, 1, 160) " block " $8 " grid " $9}' \
    "/tmp/ncu-$n/details.csv"
done
echo "done at $(el) s"
