#!/usr/bin/env bash
# dev/split0_call.sh: split 0's share under the late splits (perf.md runs 228-229). For each
# point, the flash bench's --plans columns with pieces of n / 2^s, s = 4, 5, 6, and split 0 at
# the largest whole number of pieces <= units / slots of its unit (`sS`), one piece more (`sS+`,
# split 0 shorter) and one less (`sS-`), beside the rule.
#   run(command="dev/split0_call.sh", carry=[".gpubin/pack/refresh2.tgz", ".deps"])
# Environment: POINTS 'B,Hq,Hkv,k_len,D,slots;...' (slots: 4-warp CTA slots at that head_dim,
# 264 at 128 and 396 at 64 on the H200), ROUNDS (3), SHIFTS ('4 5 6'), TESTS and TESTS_S (a
# gtest filter from head/cuda_all_test first, PACK must hold refresh1.tgz; 300 s).
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
P=/tmp/split0
mkdir -p "$P" && for pack in ${PACK:-.gpubin/pack/refresh2.tgz}; do tar xzf "$pack" -C "$P"; done
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
if [[ -n ${TESTS:-} ]]; then
  echo "== tests (at $(el) s)"
  timeout "${TESTS_S:-300}" "$P/head/cuda_all_test" --gtest_filter="$TESTS" 2>&1 |
    grep --line-buffered -E '^\[ +(OK|FAILED) +\]|Failure|Expected|Which is'
fi
points=${POINTS:-'9,32,8,32768,128,264;12,32,8,32768,128,264;15,32,8,32768,128,264;18,32,8,32768,128,264;21,32,8,32768,128,264;24,32,8,32768,128,264;15,32,8,65536,128,264;5,32,32,65536,128,264;20,32,8,65536,64,396'}
IFS=';' read -ra list <<<"$points"
for point in "${list[@]}"; do
  IFS=',' read -r b hq hkv klen d slots <<<"$point"
  units=$((b * hkv * ((hq / hkv + 15) / 16)))
  cols='rule:0:-1:0'
  for s in ${SHIFTS:-4 5 6}; do
    pieces=$((1 << s))
    late=$((pieces - pieces * units / slots))
    cols+=";s$s-:0:-1:0:$((late - 1)):$s;s$s:0:-1:0:$late:$s;s$s+:0:-1:0:$((late + 1)):$s"
  done
  echo "== $point: $units units (at $(el) s)"
  timeout 120 "$P/head/flash_decode_cuda_bench" --plans "$cols" --rounds "${ROUNDS:-3}" \
    --shapes "$b,$hq,$hkv,$klen,$d" 2>&1 | sed -u -n '/^(/,$p'
done
echo "done at $(el) s"
