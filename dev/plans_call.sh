#!/usr/bin/env bash
# dev/plans_call.sh: the flash bench's --plans columns (plan knobs forced beside the rule,
# alternating in one process) at chosen points, with the peers in the same call, from binaries
# built here and carried. Every part prints as it goes, under its own timeout.
#   run(command="SHAPES='B,Hq,Hkv,k_len,D;...' COLUMNS='rule:0:-1:0;...' dev/plans_call.sh",
#       carry=[".gpubin/pack/refresh2.tgz", ".deps"])     (+ ".whl" with FLASHINFER=1)
# Environment (defaults in parentheses):
#   SHAPES      the points (perf.md run 214's points behind the best peer)
#   COLUMNS     LABEL:WARPS:CLUSTER:SPLITS[:LATE[:SHIFT[:HALVING]]];... (widths, merges, splits)
#   ROUNDS      the bench's rounds (3); PEER_RUNS: bench, then peers, this many times (1)
#   PACK        the packs to unpack (.gpubin/pack/refresh2.tgz); BENCH the bench in them
#               (head/flash_decode_cuda_bench)
#   TESTS       a gtest filter run first from head/cuda_all_test (PACK must hold refresh1.tgz),
#               cut at TESTS_S s (120; the whole FlashDecodeCuda filter needs ~240)
#   FLASHINFER  1: the peers include FlashInfer from the carried wheels (its first use of a new
#               head_dim or group JIT-compiles for minutes of the call); else cuDNN and FA2
#   BENCH_S, PEERS_S  timeouts in s (240, 150)
# No bare `wait` in a call: call_env.sh's `>(tee ...)` is a child of the script too, so `wait`
# would wait for the script's own end (perf.md runs 220-223).
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
source "$root/scripts/lib/peer_wheels.sh"
P=/tmp/plans
mkdir -p "$P" && for pack in ${PACK:-.gpubin/pack/refresh2.tgz}; do tar xzf "$pack" -C "$P"; done
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
S=${SHAPES:-'128,32,8,1024,128;32,32,32,1024,128;128,32,32,1024,128;32,64,8,4096,128;128,64,8,4096,128;8,32,8,65536,128;8,64,8,65536,128;32,32,8,16384,128;32,64,8,16384,128;1,32,32,65536,128;8,32,32,65536,128;32,64,8,65536,128'}
C=${COLUMNS:-'rule:0:-1:0;g:0:0:0;w4:4:-1:0;w4g:4:0:0;w8:8:-1:0;w8g:8:0:0;s2:0:-1:2;s4:0:-1:4;s8:0:-1:8'}
if [[ ${FLASHINFER:-0} == 1 ]]; then install_peer_wheels "$root" >/dev/null 2>&1; fi
if [[ -n ${TESTS:-} ]]; then
  echo "== tests (at $(el) s)"
  timeout "${TESTS_S:-120}" "$P/head/cuda_all_test" --gtest_filter="$TESTS" 2>&1 |
    grep --line-buffered -E '^\[ +(OK|FAILED) +\]'
fi
for run in $(seq "${PEER_RUNS:-1}"); do
  echo "== run $run: plans (at $(el) s)"
  timeout "${BENCH_S:-240}" "$P/${BENCH:-head/flash_decode_cuda_bench}" --plans "$C" \
    --rounds "${ROUNDS:-3}" --shapes "$S" 2>&1 | sed -u -n '/^Plan columns/,$p'
  echo "== run $run: peers (at $(el) s)"
  PYTHONUNBUFFERED=1 timeout "${PEERS_S:-150}" python3 bench/peers/attention_peers.py \
    --shapes "$S" --json "$OUT/peers_$run.json" 2>&1 | grep --line-buffered 'B='
done
echo "done at $(el) s"
