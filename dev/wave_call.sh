#!/usr/bin/env bash
# dev/wave_call.sh: does a one-wave one-split grid stream slower per byte when it leaves CTA
# slots empty? (perf.md run 215: 256 units of 4-warp CTAs fill 256 of the H200's 264 slots and
# read ~4.52 TB/s at 64K where the multi-wave grids read ~4.63.) (B, 32, 8) at 16K and 64K for
# B = 30 .. 34 (240 .. 272 units) in the flash bench's --plans mode (the rule, 3 rounds), cuDNN
# and FlashInfer at the same points, and the stamped timeline (dev/flash_timeline, active CTAs
# over the call) of B = 32 and 33 at 64K.
#   carry: .gpubin/pack/plans.tgz (dev/plans_call.sh), .gpubin/ft_s, .deps, .whl
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
source "$root/scripts/lib/peer_wheels.sh"
A=/tmp/plans
mkdir -p "$A" && tar xzf .gpubin/pack/plans.tgz -C "$A"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
S=''
for k in ${KS:-16384 65536}; do for b in ${BS:-30 31 32 33 34}; do S="$S$b,32,8,$k,128;"; done; done
install_peer_wheels "$root" >/dev/null 2>&1
echo "== splice (at $(el) s)"
timeout 200 "$A/new/flash_decode_cuda_bench" --plans 'rule:0:-1:0' --rounds 3 --shapes "$S" 2>&1 |
  sed -n '/^(/,$p' | paste - - | awk '{print $1, $4, $5, $6, $7, $8}'
echo "== peers (at $(el) s)"
PYTHONUNBUFFERED=1 timeout 150 python3 bench/peers/attention_peers.py --shapes "$S" \
  --json "$OUT/peers.json" 2>&1 | grep 'B='
for b in 32 33; do
  echo "== stamped timeline, B = $b, 64K (at $(el) s)"
  timeout 60 .gpubin/ft_s --batch "$b" --warps 4 --splits 1 --cluster 0 65536 2>&1 | tail -40
done
echo "done at $(el) s"
