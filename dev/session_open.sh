#!/usr/bin/env bash
# dev/session_open.sh OUT: the first device call of a session that inherits unverified CUDA work
# (< 10 minutes on nvidia-h200, one archive back). Run as
#   run(command="dev/session_open.sh $OUT", carry=[".deps"])   (add ".gg1" for the real GGUF's
#   first half and cat it with .gg2 in a second call; see README's device notes)
#
#   1. Build the CUDA tree (scripts/gpu-check build + the benches and the CLI) in /tmp/bg, so a warm
#      machine keeps it for the next call.
#   2. ctest -L gpu: every GPU test (the verification the earlier commits are waiting for;
#      OPEN_CTEST=0 skips it).
#   3. The SmolLM2-135M-shaped random Llama (transformers, bf16): `splice bench` (p50, p99, host
#      overhead, and the decode loop's p50 as generate() runs it), three interleaved pairs of each
#      A:B environment pair in OPEN_AB (default: SPLICE_PDL 1 vs 0;
#      empty: three runs as built); then the default model.
#   4. The standalone experiments in OPEN_EXPERIMENTS (default: dev/qkv_rope and dev/kv_prefix).
#   5. The per-kernel breakdown of the same model's step (dev/step_stamps): a carried binary
#      (STAMPS_BIN, built here with -DSPLICE_KERNEL_STAMPS=ON and a generic BLAS) or the
#      kernel-stamp build on the device (only the step_stamps target, ~2.5 min).
# About 8-9 minutes on a cold nvidia-h200 (the two builds ~2 min each); give the call 600 s.
# Every step has a timeout and logs under /tmp/open; OUT gets summary.txt (the short results,
# also on stdout) and open.tgz (every log).
set -uo pipefail
F=${1:?usage: session_open.sh OUT}
mkdir -p "$F"
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
R=/tmp/open
rm -rf "$R" && mkdir -p "$R"
exec > >(tee -a "$F/summary.txt") 2>&1
export LD_LIBRARY_PATH="$root/.deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s)
el() { echo $(($(date +%s) - T0)); }
B=/tmp/bg

# 1. Build.
{ OUT=/tmp/gc BUILD=$B scripts/gpu-check build &&
  cmake --build $B -j"$(nproc)" --target splice flash_decode_cuda_bench kda_decode_cuda_bench \
    layer_ops_cuda_bench gemv_cuda_bench; } >"$R/build.log" 2>&1
echo "build rc=$? at $(el) s"
tail -3 "$R/build.log"

# 2. Every GPU test (OPEN_CTEST=0 skips them).
if [[ ${OPEN_CTEST:-1} != 0 ]]; then
  (cd $B && timeout 200 ctest -L gpu -j 14 --output-on-failure --timeout 180) >"$R/ctest.log" 2>&1
  echo "ctest at $(el) s: $(grep -E 'tests passed' "$R/ctest.log")"
  grep -E '\(Failed\)|\(Timeout\)|Subprocess aborted|\*\*\*Exception' "$R/ctest.log" | head -20
fi

# 3. The model: GEMV prologue A/B, then PDL A/B (p50 / p99 / host us per token).
model=/tmp/smollm2_shaped
timeout 120 python3 scripts/peers/smollm2_shaped.py "$model" >"$R/model.log" 2>&1
bench() {  # label, env...
  local label=$1
  shift
  env "$@" timeout 40 $B/splice bench --model $model --device cuda --dtype bf16 --max-seq-len 264 \
    --tuning-cache "$R/tuning.json" --steps 256 --json 2>>"$R/bench.err" |
    python3 -c "
import json, sys
try:
    j = json.load(sys.stdin)
    print('$label', round(j['p50_us'], 1), round(j['p99_us'], 1), round(j['host_overhead_us_p50'], 1),
          'generate', round(j.get('generate_p50_us', 0), 1), 'pipelined' if j.get('generate_pipelined') else '')
except ValueError:
    print('$label FAILED (see bench.err)')"
}
echo "== SmolLM2-shaped, us per token: p50 p99 host (at $(el) s)"
bench warm-up >/dev/null
# OPEN_AB: space-separated A:B environment pairs, each run as 3 interleaved pairs (empty: three
# runs of the build as it is).
ab=${OPEN_AB-"SPLICE_PDL=1:SPLICE_PDL=0"}
if [[ -z $ab ]]; then
  for run in 1 2 3; do bench "as built" SPLICE_UNUSED=0; done
fi
for pair in $ab; do
  for run in 1 2 3; do
    bench "${pair%%:*}" "${pair%%:*}"
    bench "${pair##*:}" "${pair##*:}"
  done
done
timeout 30 $B/splice bench --device cuda --steps 128 2>&1 | tail -1 | sed 's/^/default model: /'

# 4. The standalone experiments (OPEN_EXPERIMENTS, default both; empty: none).
for exp in ${OPEN_EXPERIMENTS-qkv_rope kv_prefix}; do
  echo "== dev/$exp (at $(el) s)"
  if nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -o "$R/$exp" \
      "dev/$exp/$exp.cu" >"$R/${exp}_build.log" 2>&1; then
    timeout 60 "$R/$exp" 2>&1 | tee "$R/$exp.txt"
  else
    tail -5 "$R/${exp}_build.log"
  fi
done
# 5. Kernel stamps (last: its build is the slowest step; summary.txt keeps what came before).
echo "== step_stamps (at $(el) s)"
left=$((570 - $(el)))  # the call's 600 s, less the archive's time
if [[ -n ${STAMPS_BIN:-} ]]; then  # a step_stamps built elsewhere (carried)
  timeout "$left" "$STAMPS_BIN" "$model" 64 256 "$R/tuning.json" >"$R/stamps.log" 2>&1
elif [[ $left -gt 60 ]]; then
  timeout "$left" dev/step_stamps/device_run.sh "$R/stamps" "$model" >"$R/stamps.log" 2>&1
else
  echo "(skipped: $left s left)" >"$R/stamps.log"
fi
echo "rc $?"
sed -n '/== per kernel/,/sum of medians/p' "$R/stamps.log" | head -24
grep -E "stamped span|expected|error|refuses" "$R/stamps.log" | head -5

echo "done at $(el) s"
tar czf "$F/open.tgz" -C "$R" .
