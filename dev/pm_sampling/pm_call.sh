#!/usr/bin/env bash
# dev/pm_sampling/pm_call.sh: Nsight Compute's PM sampling (DRAM throughput and more over the
# launch's time) of cuDNN's decode launch and of splice's flash decode (HEAD's rule; PM_L0=1 adds
# HEAD with no late pieces; PACK, a dev/pack_binaries.sh flash-variants pack, adds each variant
# under the rule), PM_COUNT (3) launches each, at each shape: where in the call each leaves the
# DRAM idle (the start, the end) and its read rate in between (perf.md runs 404-406).
#   run(command="dev/pm_sampling/pm_call.sh", carry=[".gpubin/pack/refresh2.tgz", ".deps"])
#   run(command="PACK=.gpubin/pack/flash-variants.tgz dev/pm_sampling/pm_call.sh",
#       carry=[".gpubin/pack/refresh2.tgz", ".gpubin/pack/flash-variants.tgz", ".deps"])
# Environment: SHAPES (space-separated; files numbered by position), PM_INT
# (--pm-sampling-interval, 1000; retried at 0, ncu's choice), PM_COUNT, PM_L0, PACK.
# Out: $OUT/pm.tgz of pm-NAMEi.csv (dev/pm_sampling/pm_dump.py's long form; pm_table.py prints
# each shape's table on the device too).
set -uo pipefail
source "$(dirname "$0")/../call_env.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
ncu --version | tail -1
F=/tmp/pm-flash-pack
rm -rf "$F" && mkdir -p "$F" && tar xzf .gpubin/pack/refresh2.tgz -C "$F"
pm_profile() {  # NAME REGEX SKIP COMMAND...
  local name=$1 regex=$2 skip=$3 W=/tmp/pm-$1
  shift 3
  rm -rf "$W" && mkdir -p "$W"
  echo "== $name (at $(el) s)"
  local interval
  for interval in "${PM_INT:-1000}" 0; do
    timeout 150 ncu --clock-control none --section PmSampling --pm-sampling-interval "$interval" \
      --kernel-name-base mangled --kernel-name "regex:$regex" --launch-skip "$skip" \
      --launch-count "${PM_COUNT:-3}" -o "$W/prof" "$@" >"$W/ncu.log" 2>&1 && break
    echo "$name: ncu rc $? at interval $interval"
    tail -3 "$W/ncu.log"
  done
  tail -3 "$W/ncu.log"
  [[ -f $W/prof.ncu-rep ]] || return
  ls -la "$W/prof.ncu-rep"
  timeout 60 python3 dev/pm_sampling/pm_dump.py "$W/prof.ncu-rep" "$R/pm-$name.csv" 2>&1 | tail -3
  ncu -i "$W/prof.ncu-rep" --page details --csv 2>&1 | grep -i '"duration"\|sampling interval' |
    awk -F'","' '{sub(/",.*$/, "", $15); print "  " $13 " = " $15}' | head -8
}
benches=("rule:$F/head/flash_decode_cuda_bench")
if [[ -n ${PACK:-} ]]; then
  V=/tmp/pm-variants && rm -rf "$V" && mkdir -p "$V" && tar xzf "$PACK" -C "$V"
  for d in "$V"/*/; do
    d=$(basename "$d")
    [[ $d != head ]] && benches+=("$d:$V/$d/flash_decode_cuda_bench")
  done
fi
R=/tmp/pm-out && rm -rf "$R" && mkdir -p "$R"
i=0
for S in ${SHAPES:-32,64,8,65536,128 8,32,32,65536,128}; do
  echo "=== shape $i: $S"
  pm_profile "cudnn$i" '[Ss]dpa|fprop|fmha|attn' 3 \
    python3 dev/peer_launch/peer_launch.py --shapes "$S" --backends cudnn --loop 8
  for b in "${benches[@]}"; do
    pm_profile "${b%%:*}$i" flash 3 "${b#*:}" --shapes "$S" --no-variants --warm-ms 1 --reps 8 \
      --json /tmp/pm.json
  done
  [[ ${PM_L0:-0} == 1 ]] && SPLICE_FLASH_DECODE_LATE=0 pm_profile "l0$i" flash 3 \
    "$F/head/flash_decode_cuda_bench" --shapes "$S" --no-variants --warm-ms 1 --reps 8 \
    --json /tmp/pm.json
  tar czf "$OUT/pm.tgz" -C "$R" .
  python3 dev/pm_sampling/pm_table.py "$R"/pm-*"$i".csv
  i=$((i + 1))
done
echo "done at $(el) s"
