#!/usr/bin/env bash
# dev/model_profile.sh CLI OUT: where a SmolLM2-135M-shaped decode step spends its time on the GPU.
#
#   1. Save a random bf16 SmolLM2-shaped LlamaForCausalLM (transformers) as safetensors.
#   2. `splice bench` once to fill a tuning cache (later runs skip tuning).
#   3. Interleaved A/B of programmatic dependent launch: SPLICE_PDL=1 / 0, four pairs, one line
#      each (p50 us, host overhead us) -> OUT/pdl_ab.txt.
#   4. ncu (hardware timer only, clocks left alone) over an 8-step bench: every kernel's duration
#      in launch order -> OUT/ncu.csv.gz. The last decode step's kernels are the tail of the file;
#      the sum of their durations against the step's wall time separates kernel time from the
#      launch gaps between dependent kernels. NCU=0 skips this step.
set -uo pipefail
cli=$1
out=$2
mkdir -p "$out"
work=$(mktemp -d)
python3 "$(dirname "$0")/../scripts/peers/smollm2_shaped.py" "$work/m"
common=(bench --model "$work/m" --device cuda --dtype bf16 --max-seq-len 264 --tuning-cache "$work/tuning.json" --json)
"$cli" "${common[@]}" --steps 128 >"$out/bench_first.json" 2>&1
: >"$out/pdl_ab.txt"
for pair in 1 2 3 4; do
  for pdl in 1 0; do
    SPLICE_PDL=$pdl "$cli" "${common[@]}" --steps 256 |
      python3 -c "import json,sys; j=json.load(sys.stdin); print('pdl=$pdl', round(j['p50_us'],1), round(j['p99_us'],1), round(j['host_overhead_us_p50'],1))" \
      >>"$out/pdl_ab.txt" 2>&1
  done
done
cat "$out/pdl_ab.txt"
[[ ${NCU:-1} == 1 ]] || exit 0
ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-count 6000 \
  "$cli" "${common[@]}" --steps 8 >"$work/ncu.csv" 2>"$work/ncu.err"
tail -3 "$work/ncu.err"
gzip -c "$work/ncu.csv" >"$out/ncu.csv.gz"
wc -l "$work/ncu.csv"
