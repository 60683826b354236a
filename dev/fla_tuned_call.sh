#!/usr/bin/env bash
# dev/fla_tuned_call.sh (perf.md run 168): FLA's three-kernel path with its Triton kernels tuned
# per shape (bench/peers/kda_peers.py's default since session 22) against the old single tuning,
# and splice's grid beside it, T = 1 and 8, both state dtypes. Carried binaries:
#   run(command="dev/fla_tuned_call.sh", carry=[".gpubin/pack/refresh1.tgz", ".deps", ".whl"])
# (refresh1.tgz from dev/pack_binaries.sh refresh). Output: summary.txt, kda_table.txt, logs.tgz.
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
P=/tmp/flat; L=/tmp/flat-logs
rm -rf $P $L; mkdir -p $P $L; tar xzf .gpubin/pack/refresh1.tgz -C $P
source "$root/scripts/lib/peer_wheels.sh"
install_peer_wheels "$root"
( while sleep 10; do tar czf "$OUT/logs.tgz" -C "$L" . 2>/dev/null; done ) &
saver=$!
echo "== 1. FLA tuned once (the first shape's choices), T = 1 (at $(el) s)"
KDA_PEERS_TUNE_ONCE=1 KDA_BENCH_TS=1 PYTHONUNBUFFERED=1 timeout 90 \
  python3 bench/peers/kda_peers.py $L/fla_once.txt 2>&1 | tee $L/fla_once.log | grep '^FLA'
echo "== 2. FLA tuned per shape, T = 1 and 8 (at $(el) s)"
KDA_BENCH_TS=1,8 PYTHONUNBUFFERED=1 timeout 300 \
  python3 bench/peers/kda_peers.py $L/fla_tuned.txt 2>&1 | tee $L/fla_tuned.log | grep '^FLA'
echo "== 3. splice, T = 1 and 8, beside the tuned FLA (at $(el) s)"
KDA_BENCH_TS=1,8 timeout 120 $P/head/kda_decode_cuda_bench $OUT/kda.json $L/fla_tuned.txt \
  >$L/kda_bench.txt 2>&1 || echo "kda bench rc=$?"
sed -n '/^state /,$p' $L/kda_bench.txt | tee $OUT/kda_table.txt
kill $saver 2>/dev/null
tar czf "$OUT/logs.tgz" -C "$L" .
echo "done at $(el) s"
