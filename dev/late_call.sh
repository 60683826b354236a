#!/usr/bin/env bash
# dev/late_call.sh: the late splits of one-wave one-split grids (plan_flash_decode) checked and
# timed in one call: the flash GPU tests and attention sanitizers (dev/refresh_call.sh flash on
# refresh1.tgz = this tree), then the flash bench's --plans mode at one-wave points: the rule
# (late splits), none, and other piece counts / sizes (LABEL:WARPS:CLUSTER:SPLITS:LATE:SHIFT),
# alternating, then the peers (cuDNN, FA2, FlashInfer) at the same points.
#   dev/pack_binaries.sh refresh; plans.tgz as in dev/plans_call.sh (or refresh2.tgz instead)
#   run(command="dev/late_call.sh", carry=[".gpubin/pack/refresh1.tgz", ".gpubin/pack/plans.tgz",
#       ".deps", ".whl"])
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
source "$root/scripts/lib/peer_wheels.sh"
dev/refresh_call.sh flash >/dev/null 2>&1
grep -A6 '== flash tests' "$OUT/summary.txt" | head -8
grep -h 'LateSplits\|FAILED' /tmp/refresh-logs/flash_*.txt 2>/dev/null | sort | uniq | head -12
echo "== memcheck, the late splits' test (at $(el) s)"
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 3 /tmp/refresh/head/cuda_all_test \
  --gtest_filter='FlashDecodeCuda.LateSplitsOfAOneWaveGrid' 2>&1 | grep -E 'ERROR SUMMARY|OK \]|FAILED' | head -4
# The bench: plans.tgz's, else refresh2.tgz's (dev/refresh_call.sh unpacked it into /tmp/refresh).
A=/tmp/plans
if [[ -f .gpubin/pack/plans.tgz ]]; then
  mkdir -p "$A" && tar xzf .gpubin/pack/plans.tgz -C "$A"
else
  A=/tmp/refresh && ln -sfn head "$A/new"
fi
S=${SHAPES:-'32,32,8,4096,128;32,64,8,4096,128;8,32,32,16384,128;32,32,8,16384,128;30,32,8,65536,128;32,32,8,65536,128;33,32,8,65536,128;8,32,32,65536,128;32,64,8,65536,128'}
C=${COLUMNS:-'rule:0:-1:0;none:0:-1:0:0;l2:0:-1:0:2:5;l4s4:0:-1:0:4:4;l8:0:-1:0:8:5;l8s6:0:-1:0:8:6;l16s6:0:-1:0:16:6'}
install_peer_wheels "$root" >/dev/null 2>&1
echo "== plans (at $(el) s)"
timeout 300 "$A/new/flash_decode_cuda_bench" --plans "$C" --rounds 3 --shapes "$S" 2>&1 |
  sed -n '/^Plan columns/,$p'
echo "== peers (at $(el) s)"
PYTHONUNBUFFERED=1 timeout 150 python3 bench/peers/attention_peers.py --shapes "$S" \
  --json "$OUT/peers.json" 2>&1 | grep 'B='
echo "done at $(el) s"
