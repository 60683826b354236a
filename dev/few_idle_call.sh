#!/usr/bin/env bash
# dev/few_idle_call.sh: one device call for issue #5's 64K one-wave 256-unit grids (the few-idle
# late-split rule, session 60): the verdict against cuDNN, the rule against the one it replaced,
# and the late-split GPU test with its memcheck. From the refresh packs built here:
#   run(command="dev/few_idle_call.sh", kind="nvidia-h200",
#       carry=[".gpubin/pack/refresh1.tgz", ".gpubin/pack/refresh2.tgz", ".deps"])   (~5 min)
# Parts, in order of value, each under its own timeout:
#   rounds   splice's rule and cuDNN in alternating processes, ROUNDS (7) rounds
#            (dev/refresh_call.sh rounds; a verdict per point)
#   plans    the bench's --plans columns in one process, PLAN_ROUNDS (4) rounds: rule (five
#            halving pieces from n / 16), eq1 (one piece of n / 16: the rule before session 60),
#            h4 (four halving pieces), l0 (none)
#   tests    FlashDecodeCuda.LateSplitsOfAOneWaveGrid (~90 s on an H100), then the same under
#            compute-sanitizer memcheck (MEMCHECK_S, 240 s)
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
P=/tmp/few-idle
mkdir -p "$P" && for pack in .gpubin/pack/refresh1.tgz .gpubin/pack/refresh2.tgz; do
  tar xzf "$pack" -C "$P"
done
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
S='8,32,32,65536,128;32,32,8,65536,128;32,64,8,65536,128'
echo "== rounds (at $(el) s)"
ROUNDS=${ROUNDS:-7} ROUND_SHAPES="$S" timeout 150 "$root/dev/refresh_call.sh" rounds 2>&1 |
  grep -A4 '^B,Hq'
echo "== plans (at $(el) s)"
timeout 100 "$P/head/flash_decode_cuda_bench" --rounds "${PLAN_ROUNDS:-4}" --shapes "$S" \
  --plans 'rule:0:-1:0;eq1:0:-1:0:1:4:0;h4:0:-1:0:4:4:1;l0:0:-1:0:0' 2>&1 | sed -n '/^(/,$p'
echo "== tests (at $(el) s)"
timeout 150 "$P/head/cuda_all_test" --gtest_filter='FlashDecodeCuda.LateSplitsOfAOneWaveGrid' 2>&1 |
  grep -E '^\[ +(OK|FAILED|PASSED) +\]|Failure'
echo "== memcheck (at $(el) s)"
timeout "${MEMCHECK_S:-240}" compute-sanitizer --tool memcheck "$P/head/cuda_all_test" \
  --gtest_filter='FlashDecodeCuda.LateSplitsOfAOneWaveGrid' 2>&1 |
  grep -E 'ERROR SUMMARY|^\[ +(OK|FAILED) +\]'
echo "done at $(el) s"
