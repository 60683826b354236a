#!/usr/bin/env bash
# dev/rule_peers_call.sh: the flash bench's rule (--plans 'rule', ROUNDS rounds, default 1) and
# PyTorch SDPA's cuDNN and FA2 at SHAPES in one call; no FlashInfer (its first use of a new
# configuration is a JIT build of minutes). Each part prints as it goes, under its own timeout.
#   run(command="SHAPES='B,Hq,Hkv,k_len,D;...' dev/rule_peers_call.sh",
#       carry=[".gpubin/pack/refresh2.tgz", ".deps"])
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
P=/tmp/refresh
mkdir -p "$P" && tar xzf .gpubin/pack/refresh2.tgz -C "$P"
S=${SHAPES:?SHAPES names the shapes}
nvidia-smi --query-gpu=name --format=csv,noheader
echo "splice at $(el) s"
timeout "${BENCH_S:-120}" "$P/head/flash_decode_cuda_bench" --plans 'rule:0:-1:0' \
  --rounds "${ROUNDS:-1}" --shapes "$S" 2>&1 | sed -u -n '/^Plan columns/,$p'
echo "peers at $(el) s"
PYTHONUNBUFFERED=1 timeout "${PEERS_S:-150}" python3 bench/peers/attention_peers.py --shapes "$S" \
  2>&1 | grep --line-buffered 'B='
echo "done at $(el) s"
