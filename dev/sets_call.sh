#!/usr/bin/env bash
# dev/sets_call.sh: issue 5's large points with one input set against two (perf.md session 28).
# With one set (K/V > 512 MB), a replay reads the same K/V as the one before it: whatever the L2
# kept from its last-read lines (up to ~50 MB of 60) serves the next replay's first reads if a
# kernel reads those first. Two sets rotate, so no replay starts on data the last one read. Times
# splice's bench and the peers (cuDNN, FA2, FlashInfer) at the shapes below both ways, then the
# flash timeline (stamped and not) at (128, 32, 8, 4K) both ways.
#   strip build/bundle/bench/flash_decode_cuda_bench into /tmp/setsp, tar czf .gpubin/pack/sets.tgz -C /tmp/setsp ., then
#   run(command="dev/sets_call.sh", carry=[".gpubin/pack/sets.tgz", ".deps", ".whl",
#       ".gpubin/flash_timeline", ".gpubin/flash_timeline_n"])
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
source "$root/scripts/lib/peer_wheels.sh"
P=/tmp/sets
mkdir -p "$P" && tar xzf .gpubin/pack/sets.tgz -C "$P"
S=${SHAPES:-'128,32,8,4096,128;128,64,8,4096,128;32,32,32,4096,128;128,32,8,16384,128;32,32,32,16384,128'}
install_peer_wheels "$root"
for m in 1 2; do
  echo "== splice, at least $m set(s) (at $(el) s)"
  timeout 150 "$P/flash_decode_cuda_bench" --no-variants --shapes "$S" --min-sets "$m" \
    --json "$OUT/splice_$m.json" 2>&1 | grep -v '^$' | tail -8
done
for m in 1 2; do
  echo "== peers, at least $m set(s) (at $(el) s)"
  PYTHONUNBUFFERED=1 timeout 200 python3 bench/peers/attention_peers.py --shapes "$S" \
    --min-sets "$m" --json "$OUT/peers_$m.json" 2>&1 | grep 'B='
done
for m in 1 2; do
  echo "== timeline (128, 32, 8, 4K), at least $m set(s) (at $(el) s)"
  timeout 60 .gpubin/flash_timeline_n --batch 128 --warps 4 --splits 1 --cluster 0 --sets "$m" 4096 |
    grep 'us per call'
  timeout 60 .gpubin/flash_timeline --batch 128 --warps 4 --splits 1 --cluster 0 --sets "$m" 4096
done
echo "done at $(el) s"
