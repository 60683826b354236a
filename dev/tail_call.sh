#!/usr/bin/env bash
# dev/tail_call.sh: issue 5's multi-wave one-split grids, (128, 32, 8) at KS keys (default 1K 4K
# 16K 64K; 1024 units, 3.9 waves of 4-warp CTAs), timed by dev/flash_timeline (no stamps, two
# alternating rounds) in one split and with the last wave's units split (--split-from U; VARIANTS
# "UxS ...", the global merge: mainline's tail split is 792x4 here), then one stamped timeline of
# each. Run 211 timed the split as dev/flash-tail-split.patch (then the ft_split_* builds, with
# -I/tmp/variant); mainline's header has FlashDecodeParams::split_from_bh since.
#   binaries built here (dev/flash_timeline/flash_timeline.cu's header):
#     .gpubin/ft_n, .gpubin/ft_s   without / with stamps
#   run(command="dev/tail_call.sh", carry=[".gpubin/ft_n", ".gpubin/ft_s"])
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
B="--batch 128 --warps 4"
run() {  # run LABEL BINARY ARGS...
  local label=$1 bin=$2
  shift 2
  printf '%-34s %s\n' "$label" "$(timeout 60 ".gpubin/$bin" $B "$@" | grep -o '[0-9.]* us per call')"
}
for round in 1 2; do
  echo "== round $round (at $(el) s)"
  for k in ${KS:-1024 4096 16384 65536}; do
    run "$k plan (1 split)" ft_n --splits 1 --cluster 0 "$k"
    for v in ${VARIANTS:-792x4 660x4 528x4 792x8 792x2}; do
      run "$k split>=${v%x*} x${v#*x} global" ft_n --splits "${v#*x}" --cluster 0 \
        --split-from "${v%x*}" "$k"
    done
  done
done
echo "== stamped (at $(el) s)"
timeout 60 .gpubin/ft_s $B --splits 1 --cluster 0 4096 | tail -3
timeout 60 .gpubin/ft_s $B --splits 4 --cluster 0 --split-from 792 4096 | tail -3
echo "done at $(el) s"
