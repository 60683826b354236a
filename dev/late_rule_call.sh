#!/usr/bin/env bash
# dev/late_rule_call.sh: the late splits' piece count (idle share of the slots in 32nds) against
# none and the first rule's 4, on the H200, with the late splits' GPU test and the peers.
#   run(command="dev/late_rule_call.sh", carry=[".gpubin/pack/refresh1.tgz",
#       ".gpubin/pack/refresh2.tgz", ".deps", ".whl"])
# SHAPES (bench form, ";"-separated), PLANS (the bench's --plans), BENCH_S and PEERS_S (timeouts,
# s) override the defaults;
# give the call >= 300 s.
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
source "$root/scripts/lib/peer_wheels.sh"
P=/tmp/refresh
mkdir -p "$P" && for pack in .gpubin/pack/refresh*.tgz; do tar xzf "$pack" -C "$P"; done
nvidia-smi --query-gpu=name --format=csv,noheader
install_peer_wheels "$root" >/dev/null 2>&1  # in this shell: it exports PYTHONPATH
timeout 120 "$P/head/cuda_all_test" --gtest_filter='FlashDecodeCuda.LateSplits*:FlashDecodeCuda.PlanIs*' 2>&1 |
  grep -E '^\[ +(OK|FAILED) +\]'
S=${SHAPES:-'17,32,8,65536,128;20,32,8,16384,128;24,32,8,32768,128;28,32,8,32768,128;31,32,8,65536,128'}
echo "bench at $(el) s"
timeout "${BENCH_S:-240}" "$P/head/flash_decode_cuda_bench" --plans "${PLANS:-rule:0:-1:0;none:0:-1:0:0;l4:0:-1:0:4:5}" \
  --rounds 3 --shapes "$S" 2>&1 | sed -u -n '/^Plan columns/,$p'
echo "peers at $(el) s"
PYTHONUNBUFFERED=1 timeout "${PEERS_S:-150}" python3 bench/peers/attention_peers.py --shapes "$S" \
  --json "$OUT/peers.json" 2>&1 | grep --line-buffered 'B='
echo "done at $(el) s"
