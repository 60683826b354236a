#!/usr/bin/env bash
# dev/model_batch_call.sh: the embedded default model's decode step at several batches, for head
# and each variant of a pack built with WITH_SPLICE=1 (dev/pack_binaries.sh), interleaved over
# ROUNDS processes each: `splice bench --batch B --json`, the median p50 per (binary, B) and its
# change against head. The default model has 2 KDA heads with f32 state, so B = 17-32 runs the
# `rows` KDA kernel inside a real step, beside the step's GEMMs and attention (what the
# back-to-back KDA bench cannot show, e.g. a carveout change's cost beside its neighbours).
#   run(command="BATCHES=1,8,32 dev/model_batch_call.sh", carry=[".gpubin/pack/variants.tgz", ".deps"])
# Environment (defaults): PACK (.gpubin/pack/variants.tgz; any compression tar reads: three `splice`
# copies, ~36 MB stripped each, fit a call as one tar through `xz -T1 --lzma2=preset=9e,
# dict=96MiB`, ~36 MB in all, where gzip takes ~21 MB a copy), BATCHES (1,8,32), STEPS (256), ROUNDS
# (3), DEVICE (cuda), ENV_VARIANTS (as dev/variant_ab_call.sh's: head's binaries, or ENV_BASE's or a
# `name@base` variant's own base (call_env.sh), again under environment variables; e.g.
# "nopdl:SPLICE_PDL=0 nopdl-v@v:SPLICE_PDL=0", perf.md run 342), EXTRA_ARGS (more `splice bench`
# options, e.g. --kda-state-dtype bf16). Each binary keeps its arm decisions in a tuning cache, so
# only its first process times the arms (session 42, perf.md run 317: ~10 s a process without one,
# so 24 processes ran a 170 s call out before any table).
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
P=/tmp/model-batch; L=/tmp/model-batch-logs
rm -rf $P $L; mkdir -p $P $L; tar xf "${PACK:-.gpubin/pack/variants.tgz}" -C $P
make_env_variants $P "${ENV_BASE:-head}" splice
binaries=(head)
for d in $P/*/; do d=$(basename $d); [[ $d != head && -x $P/$d/splice ]] && binaries+=($d); done
echo "binaries: ${binaries[*]}"
BATCHES=${BATCHES:-1,8,32} STEPS=${STEPS:-256} ROUNDS=${ROUNDS:-3} DEVICE=${DEVICE:-cuda}
# The logs so far every 10 s (a call cut short still returns what ran).
( while sleep 10; do tar czf "$OUT/logs.tgz" -C $L . 2>/dev/null; done ) &
saver=$!
for round in $(seq 1 $ROUNDS); do
  for b in "${binaries[@]}"; do
    variant_env $P/$b
    for batch in ${BATCHES//,/ }; do
      echo "round $round $b batch $batch (at $(el) s)"
      env "${benv[@]}" timeout 120 $P/$b/splice bench --device $DEVICE --batch $batch \
        --steps $STEPS --tuning-cache $L/tuning_${b}.json ${EXTRA_ARGS:-} --json >$L/${b}_b${batch}_$round.json 2>$L/${b}_b${batch}_$round.err ||
        echo "$b batch $batch round $round: rc $? ($(tail -1 $L/${b}_b${batch}_$round.err))"
    done
  done
done
python3 - "$L" "$BATCHES" "${binaries[@]}" <<'PY'
import glob, json, statistics, sys
logdir, batches, binaries = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]
def p50(b, batch):
    v = []
    for f in glob.glob(f"{logdir}/{b}_b{batch}_*.json"):
        try:
            v.append(json.load(open(f))["p50_us"])
        except (ValueError, KeyError):
            pass
    return statistics.median(v) if v else None
print(f"{'batch':>5} " + " ".join(f"{b:>24}" for b in binaries) + "   (p50 us a step; change vs head)")
for batch in batches:
    base = p50("head", batch)
    cells = []
    for b in binaries:
        t = p50(b, batch)
        if t is None:
            cells.append(f"{'-':>24}")
        elif b == "head" or base is None:
            cells.append(f"{t:>24.2f}")
        else:
            cells.append(f"{t:>14.2f} ({100 * (t / base - 1):+6.1f}%)")
    print(f"{batch:>5} " + " ".join(cells))
PY
echo "done at $(el) s"
kill $saver 2>/dev/null
tar czf $OUT/logs.tgz -C $L .
