# dev/ncu_lib.sh: sourced by the dev/ncu_*_call.sh device calls (after call_env.sh).
# ncu_profile NAME KERNEL_REGEX COMMAND...: Nsight Compute on one launch of the kernel COMMAND runs
# (the regex matched against mangled names; after NCU_SKIP launches of it, default 8), under
# section set SET (default full), clocks left alone; its details and source pages as CSV, the
# headline metrics printed, everything but the report in $OUT/ncu-NAME.tgz.
ncu_profile() {
  local name=$1 regex=$2 W=/tmp/ncu-$1
  shift 2
  rm -rf "$W" && mkdir -p "$W"
  echo "== $name (at $(el) s)"
  timeout 240 ncu --clock-control none --set "${SET:-full}" --import-source no \
    --kernel-name-base mangled --kernel-name "regex:$regex" --launch-skip "${NCU_SKIP:-8}" \
    --launch-count 1 -o "$W/prof" "$@" >"$W/ncu.log" 2>&1 || echo "$name: ncu rc $?"
  tail -2 "$W/ncu.log"
  if [[ -f $W/prof.ncu-rep ]]; then
    ncu -i "$W/prof.ncu-rep" --page details --csv >"$W/details.csv" 2>&1
    ncu -i "$W/prof.ncu-rep" --page source --csv --print-source sass >"$W/source.csv" 2>&1
    # Metric name and value columns of the headline rows.
    grep -i '"Duration"\|DRAM Throughput\|Registers Per\|Grid Size\|No Eligible\|Issued Warp\|Achieved Occupancy\|Elapsed Cycles' \
      "$W/details.csv" | awk -F'","' '$13 != "" {sub(/",.*$/, "", $15); print $13 " = " $15}' | head -12
  fi
  tar czf "$OUT/ncu-$name.tgz" -C "$W" --exclude=prof.ncu-rep .
}
