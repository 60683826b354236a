#!/usr/bin/env bash
# dev/model_env_ab.sh SPLICE ROUNDS SETTING...: an interleaved A/B/... of environment settings on
# the SmolLM2-135M-shaped model's decode step (bf16, batch 1, capacity 256, 256 steps), on the
# device; AB_MODEL=default times the embedded default model instead (its own defaults). A SETTING is a space-separated list of VAR=VALUE ("-" for none); each round runs every
# setting once, in order, so drift hits all of them alike. Prints per run: step_greedy p50 / p99 /
# host overhead, and the pipelined decode loop's p50 (us per token), then each setting's median.
#   e.g. dev/model_env_ab.sh build/benchpack/splice 3 "SPLICE_PDL=0" "-"
set -uo pipefail
splice=${1:?usage: model_env_ab.sh SPLICE ROUNDS SETTING...}
rounds=${2:?rounds}
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
export LD_LIBRARY_PATH="$root/.deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cache=$(mktemp -d)
if [[ ${AB_MODEL:-} == default ]]; then
  model_args=(--tuning-cache "$cache/tuning.json")
else
  model=/tmp/smollm2_shaped
  [[ -d $model ]] || python3 "$root/scripts/peers/smollm2_shaped.py" "$model" >/dev/null 2>&1
  model_args=(--model "$model" --dtype bf16 --max-seq-len 256 --tuning-cache "$cache/tuning.json")
fi
results=$(mktemp)
# A warm-up run as built: it tunes the arms into the cache every later run reads.
timeout 90 "$splice" bench "${model_args[@]}" --device cuda --steps 16 --json >/dev/null 2>&1
for round in $(seq "$rounds"); do
  for setting in "$@"; do
    vars=()
    [[ $setting != "-" ]] && read -r -a vars <<<"$setting"
    env "${vars[@]}" timeout 60 "$splice" bench "${model_args[@]}" --device cuda --steps 256 \
      --json 2>/dev/null |
      python3 -c "
import json, sys
try:
    j = json.load(sys.stdin)
    print('$setting|%.1f|%.1f|%.1f|%.1f' % (j['p50_us'], j['p99_us'], j['host_overhead_us_p50'],
                                            j.get('generate_p50_us', 0)))
except ValueError:
    print('$setting|nan|nan|nan|nan')" | tee -a "$results"
  done
done
echo "== medians over $rounds rounds: step p50, loop p50 (us)"
python3 - "$results" "$@" <<'PY'
import statistics, sys
rows = [l.strip().split('|') for l in open(sys.argv[1]) if '|' in l]
for setting in sys.argv[2:]:
    mine = [r for r in rows if r[0] == setting]
    step = statistics.median(float(r[1]) for r in mine)
    loop = statistics.median(float(r[4]) for r in mine)
    print(f'{setting:50s} {step:8.1f} {loop:8.1f}')
PY
rm -rf "$cache" "$results"
