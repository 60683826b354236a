#!/usr/bin/env bash
# dev/plans_call.sh: other plans against the plan's rule at the grid points behind or level with
# the best peer (perf.md run 214), with the peers in the same call: the flash bench's --plans
# mode (every column alternating, 3 rounds), the peers (cuDNN, FA2, FlashInfer), then both again.
#   mkdir -p /tmp/plans/new && cp build/bundle/bench/flash_decode_cuda_bench /tmp/plans/new/ &&
#   strip /tmp/plans/new/* && tar czf .gpubin/pack/plans.tgz -C /tmp/plans new
#   run(command="dev/plans_call.sh", carry=[".gpubin/pack/plans.tgz", ".deps", ".whl"])
# SHAPES / COLUMNS override the points and the columns (LABEL:WARPS:CLUSTER:SPLITS).
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
source "$root/scripts/lib/peer_wheels.sh"
A=/tmp/plans
mkdir -p "$A" && tar xzf .gpubin/pack/plans.tgz -C "$A"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
S=${SHAPES:-'128,32,8,1024,128;32,32,32,1024,128;128,32,32,1024,128;32,64,8,4096,128;128,64,8,4096,128;8,32,8,65536,128;8,64,8,65536,128;32,32,8,16384,128;32,64,8,16384,128;1,32,32,65536,128;8,32,32,65536,128;32,64,8,65536,128'}
C=${COLUMNS:-'rule:0:-1:0;g:0:0:0;w4:4:-1:0;w4g:4:0:0;w8:8:-1:0;w8g:8:0:0;s2:0:-1:2;s4:0:-1:4;s8:0:-1:8'}
install_peer_wheels "$root" >/dev/null 2>&1
for round in 1 2; do
  echo "== round $round: plans (at $(el) s)"
  timeout 240 "$A/new/flash_decode_cuda_bench" --plans "$C" --rounds $((4 - round)) \
    --shapes "$S" 2>&1 | sed -n '/^Plan columns/,$p'
  echo "== round $round: peers (at $(el) s)"
  PYTHONUNBUFFERED=1 timeout 150 python3 bench/peers/attention_peers.py --shapes "$S" \
    --json "$OUT/peers_$round.json" 2>&1 | grep 'B='
done
echo "done at $(el) s"
