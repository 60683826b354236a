#!/usr/bin/env bash
# dev/gridcap_call.sh: is the bf16 stream item loop bound by the chip's bandwidth? HEAD's KDA
# bench at its own grid (132 CTAs on the H200) against KDA_BENCH_GRID_CAP CTAs (default 128, so
# N = 128's 4096 items are 32 whole rounds instead of 31 and 4 leftovers), interleaved processes.
# From a bench built here:
#   mkdir -p /tmp/gc/head && cp build/bundle/bench/kda_decode_cuda_bench /tmp/gc/head/ &&
#   strip /tmp/gc/head/* && tar czf .gpubin/pack/gridcap.tgz -C /tmp/gc .
#   run(command="dev/gridcap_call.sh", carry=[".gpubin/pack/gridcap.tgz", ".deps"])
# Environment (defaults): CAP (128), STATES (bf16), TS (1,2,4,8), NS (128,512), ROUNDS (2).
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
P=/tmp/gridcap
L=/tmp/gridcap-logs
rm -rf "$P" "$L" && mkdir -p "$P" "$L" && tar xzf .gpubin/pack/gridcap.tgz -C "$P"
CAP=${CAP:-128} STATES=${STATES:-bf16} TS=${TS:-1,2,4,8} NS=${NS:-128,512} ROUNDS=${ROUNDS:-2}
for round in $(seq 1 "$ROUNDS"); do
  for cap in 0 "$CAP"; do
    KDA_BENCH_GRID_CAP=$cap KDA_BENCH_NS=$NS KDA_BENCH_TS=$TS KDA_BENCH_STATES=$STATES \
      KDA_BENCH_VARIANTS=stream timeout 60 "$P/head/kda_decode_cuda_bench" "$L/cap${cap}_$round.json" \
      >"$L/cap${cap}_bench_$round.txt" 2>&1 || echo "cap $cap round $round: rc $?"
  done
done
python3 dev/ab_table.py "$L" cap0 "cap$CAP"
echo "done at $(el) s"
