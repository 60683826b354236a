#!/usr/bin/env bash
# dev/tail_ab_call.sh: the tail split (plan_flash_decode) checked and timed in one call: the flash
# GPU tests and attention sanitizers (dev/refresh_call.sh flash, refresh1.tgz = this tree), the
# flash bench's whole grid built before (old/) and with it (new/), then both again, alternating,
# at the points it changes (multi-wave one-split grids) and B = 1, then the peers (cuDNN, FA2,
# FlashInfer) at the changed points.
#   dev/pack_binaries.sh refresh; .gpubin/pack/tailab.tgz = {old,new}/flash_decode_cuda_bench
#   run(command="dev/tail_ab_call.sh", carry=[".gpubin/pack/refresh1.tgz", ".gpubin/pack/tailab.tgz",
#       ".deps", ".whl"])
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
source "$root/scripts/lib/peer_wheels.sh"
A=/tmp/tailab
mkdir -p "$A" && tar xzf .gpubin/pack/tailab.tgz -C "$A"
dev/refresh_call.sh flash >/dev/null 2>&1
grep -A4 '== flash tests' "$OUT/summary.txt" | head -5
S='128,32,8,1024,128;128,32,8,4096,128;128,32,8,16384,128;128,32,8,65536,128;128,64,8,1024,128;128,64,8,4096,128;128,64,8,16384,128;128,64,8,65536,128;32,32,32,1024,128;32,32,32,4096,128;32,32,32,16384,128;32,32,32,65536,128;128,32,32,1024,128;128,32,32,4096,128;128,32,32,16384,128'
B1='1,32,8,1024,128;1,32,8,4096,128;1,32,8,16384,128;1,9,3,256,64,256;1,9,3,1024,64'
for b in new old; do
  echo "== $b: the whole grid (at $(el) s)"
  timeout 200 "$A/$b/flash_decode_cuda_bench" --no-variants --json "$OUT/grid_$b.json" \
    >"/tmp/grid_$b.txt" 2>&1 || echo "rc $?"
done
for round in 1 2; do
  for b in old new; do
    echo "== round $round, $b (at $(el) s)"
    timeout 120 "$A/$b/flash_decode_cuda_bench" --no-variants --shapes "$S;$B1" 2>&1 |
      sed -n '/^shape/,$p'
  done
done
install_peer_wheels "$root"
echo "== peers (at $(el) s)"
PYTHONUNBUFFERED=1 timeout 240 python3 bench/peers/attention_peers.py --shapes "$S" \
  --json "$OUT/peers.json" 2>&1 | grep 'B='
echo "done at $(el) s"
