#!/usr/bin/env bash
# One-off (perf.md run 165): why the 1024-unit 4K flash points trail cuDNN by 1.5-2% (forced
# split counts, 8-warp CTAs). Carry .gpubin/pack/refresh2.tgz (dev/pack_binaries.sh refresh)
# and .deps.
set -uo pipefail
source dev/call_env.sh
P=/tmp/fb; mkdir -p $P; tar xzf .gpubin/pack/refresh2.tgz -C $P
S='128,32,8,4096,128;32,32,32,4096,128;128,64,8,4096,128;128,32,8,16384,128;128,32,8,1024,128;64,32,8,4096,128;96,32,8,4096,128'
timeout 200 $P/head/flash_decode_cuda_bench --ab --shapes "$S"
timeout 200 $P/head/flash_decode_cuda_bench --warps-ab --shapes "$S"
echo "done at $(el) s"
