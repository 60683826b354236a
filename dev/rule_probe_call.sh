#!/usr/bin/env bash
# dev/rule_probe_call.sh: the KDA launcher's rule (choose_kda_variant) against the variants it
# chooses between, on whatever card the call gets (session 50: the H100, where bf16 T = 1 at
# N = 128 / 512 ran `rows` 5 / 3% ahead of the rule's `stream`, perf.md run 361). Each probe runs
# the KDA bench (head/kda_decode_cuda_bench of PACK, default .gpubin/pack/refresh1.tgz from
# dev/pack_binaries.sh refresh) with its variants timed
# plain and under the stable-state promise (KDA_BENCH_STABLE) and prints, per point, the rule's
# pick and the fastest variant of each.
#   run(command="dev/rule_probe_call.sh", carry=[".gpubin/pack/refresh1.tgz", ".deps"])
# PROBES (default below): "name|states|Ts|Ns|variants[|VAR=value,...]" entries separated by
# spaces (the optional sixth field: more bench environment, e.g. KDA_BENCH_TUNES=256 to time
# `stream` without its L2 priorities beside the default: "A/B" lines in <name>.txt, kept in
# $OUT only through summary.txt's grep below).
# Output: summary.txt, <name>.json per probe, probes.txt (the per-point lines).
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
PACK=${PACK:-.gpubin/pack/refresh1.tgz}
P=/tmp/rule-probe && mkdir -p "$P" && tar xzf "$PACK" -C "$P" ./head/kda_decode_cuda_bench
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
PROBES=${PROBES:-"bf16t1|bf16|1|1,2,16,32,48,64,96,128,192,256,512|stream,rows,split4 \
f32t1|f32|1|1,2,16,32,48,64,96,128,192,256,512|stream,rows,split4 \
f32tn|f32|2,4,8|5,6,7,8,10,12|wide,wide512,stream \
l2hints|bf16,f32|1,2|128,512|stream|KDA_BENCH_TUNES=256"}
for probe in $PROBES; do
  IFS='|' read -r name states ts ns variants extra <<<"$probe"
  echo "== $name (at $(el) s)"
  extra_env=()
  [[ -n ${extra:-} ]] && IFS=',' read -r -a extra_env <<<"$extra"
  env "${extra_env[@]}" KDA_BENCH_STATES=$states KDA_BENCH_TS=$ts KDA_BENCH_NS=$ns \
    KDA_BENCH_VARIANTS=$variants KDA_BENCH_STABLE=1 timeout 240 "$P/head/kda_decode_cuda_bench" "$OUT/$name.json" \
    >"/tmp/rule-probe/$name.txt" 2>&1 || echo "$name: rc=$?"
  grep -m1 "copy bandwidth" "/tmp/rule-probe/$name.txt"
  grep "A/B .*tune=" "/tmp/rule-probe/$name.txt"
  python3 - "$OUT/$name.json" <<'PY' | tee -a "$OUT/probes.txt"
import json, sys
for r in json.load(open(sys.argv[1])):
    plain = {k[:-3]: v for k, v in r.items()
             if k.endswith("_us") and isinstance(v, (int, float)) and v > 0
             and k[:-3] in ("stream", "stream_plain", "wide", "wide512", "rows", "split2", "split4")}
    stable = r.get("stable_us", {})
    bp = min(plain, key=plain.get)
    line = f"{r['state']:4} N={r['N']:<4} T={r['T']} pick {r['variant']:7} {r['us']:9.2f} | best {bp:7} {plain[bp]:9.2f} ({100 * (plain[bp] / r['us'] - 1):+.1f}%)"
    if stable:
        bs = min(stable, key=stable.get)
        ps = stable.get(r["variant"], -1)
        line += f" | promised: pick {ps:9.2f}, best {bs:7} {stable[bs]:9.2f} ({100 * (stable[bs] / ps - 1):+.1f}%)"
    line += " | " + " ".join(f"{k} {v:.2f}/{stable.get(k, -1):.2f}" for k, v in sorted(plain.items()))
    print(line)
PY
done
echo "done at $(el) s"
