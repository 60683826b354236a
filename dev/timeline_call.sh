#!/usr/bin/env bash
# dev/timeline_call.sh: the attribution build's whole-launch timeline (KDA_BENCH_TIMELINE: every
# CTA's %globaltimer stamps over 4 launches back to back, perf.md runs 174 and 179) of HEAD and of
# each patched variant, from binaries built here:
#   dev/pack_binaries.sh timeline dev/<variant>.patch ...    (.gpubin/pack/timeline.tgz)
#   run(command="STATES=bf16 TS=1 NS=128,512 dev/timeline_call.sh",
#       carry=[".gpubin/pack/timeline.tgz", ".deps"])
# ~20-40 s a binary. The attribution build runs 1-6% slower than mainline: read the timeline's
# shape, and time variants with dev/variant_ab_call.sh.
# Environment (defaults): PACK (.gpubin/pack/timeline.tgz), STATES (bf16,f32), TS (1,2),
# NS (128,512), CUT (150 s a binary), STABLE (unset; 1: each shape's timeline also under the
# stable-state promise).
# Output: $OUT/timeline.tgz (each binary's full output and JSON); summary.txt holds the timeline
# lines (two files of the 8 a call returns, so it can share a call with dev/refresh_call.sh).
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
P=/tmp/timeline
L=/tmp/timeline-logs
rm -rf "$P" "$L" && mkdir -p "$P" "$L" && tar xzf "${PACK:-.gpubin/pack/timeline.tgz}" -C "$P"
STATES=${STATES:-bf16,f32} TS=${TS:-1,2} NS=${NS:-128,512} CUT=${CUT:-150}
mode=1
[[ -n ${STABLE:-} ]] && mode=stable  # KDA_BENCH_TIMELINE=stable: also under the promise
for d in "$P"/head "$P"/*/; do
  b=$(basename "$d")
  [[ $b == head && $d != "$P/head" ]] && continue  # head runs first
  echo "== $b (at $(el) s)"
  KDA_BENCH_TIMELINE=$mode KDA_BENCH_STATES=$STATES KDA_BENCH_TS=$TS KDA_BENCH_NS=$NS \
    KDA_BENCH_VARIANTS=stream timeout "$CUT" "$d/kda_decode_cuda_bench" "$L/${b}.json" \
    >"$L/${b}.txt" 2>&1 || echo "$b: rc $? ($(tail -1 "$L/${b}.txt"))"
  grep 'timeline\|(G=' "$L/${b}.txt" | grep -v 'timeline   finest\|sm periods\|cta periods'
done
tar czf "$OUT/timeline.tgz" -C "$L" .
echo "done at $(el) s"
