#!/usr/bin/env bash
# dev/refresh_call.sh PHASE...: scripts/gpu-check's work from binaries built here and carried (no
# device build), in phases that fit the device tool's 10-minute calls (perf.md runs 156-157).
# Built here (build/bundle and build/benchpack as in dev/carried_check.sh), stripped, in two packs
# under the carry limit (64 MiB with .deps and .whl):
#   refresh1.tgz: head/cuda_all_test, head/kda_decode_cuda_bench
#   refresh2.tgz: head/splice, head/flash_decode_cuda_bench
#   refresh3.tgz: head/gemv_cuda_bench, head/layer_ops_cuda_bench (the `gemv` and `layer_ops`
#                 phases; carried with refresh2 or refresh1, not both)
# each `tar czf .gpubin/pack/refreshN.tgz -C /tmp/refresh-pack FILES`; then
#   run(command="dev/refresh_call.sh control tests kda",
#       carry=[".gpubin/pack/refresh1.tgz", ".deps", ".whl"])
#   run(command="dev/refresh_call.sh attention model",
#       carry=[".gpubin/pack/refresh2.tgz", ".deps", ".whl"])   (.whl: FlashInfer for attention)
# Phases:
#   control    alone on the GPU: KdaCuda.PerRowModesEveryVariant 4 times, each timed (<= 30 s): a
#              deadlock shows as a round that runs out its time (it found one: runs 155-159)
#   tests      at once, each cut at 235 s: every GPU test (12 shards) and gpu-check's sanitizer
#              filters; then, in one process cut at TAIL_S (150) s, the tests a cut shard left
#              unfinished (shard_tail.txt)
#   kda        alone: FLA's three-kernel path (bench/peers/kda_peers.py), then splice's KDA grid
#   flash      the flash-decode GPU tests (and the model tests that run it), attention sanitizers
#   attention  alone: the flash-decode grid, then PyTorch SDPA (cuDNN, FA2) and the combined table
#              (ATTENTION_PEER_ARGS="--max-kv-gb 20" on an H100: the peers copy the 34 GB points)
#   rounds     splice's flash bench and the peers in alternating processes at the close points,
#              ROUNDS (3) rounds (ROUND_SHAPES: 'B,Hq,Hkv,k_len,D;...'; after `attention` in the
#              same call, its points behind or within ROUND_WITHIN (0.5) percent), medians and a
#              verdict (scripts/lib/attention_rounds.sh; gpu-check runs the same at its misses)
#   model      the Llama cross-check and SmolLM2-shaped speed beside transformers; the default model
#              at batch 1 and 32 (`--profile 8`: every node timed)
#   gemv       the GEMV against cuBLASLt at M = 1, 2, 4, 8 (gemv_cuda_bench: the routing rule's table;
#              GEMV_ARGS: its options, e.g. "--cold --m 1": the cold-code columns at one M)
#   ptx        CUDA_FORCE_PTX_JIT=1: the KDA, flash and session-graph tests on the fatbin's
#              compute_90 PTX, JIT-compiled as on a GPU after Hopper (issue 6)
#   layer_ops  the fused layer ops against their chains (layer_ops_cuda_bench smollm2: SmolLM2's
#              shapes and the default model's batched products at M = 1, 2, 4, 8)
#   layer_ops_ab  head's layer_ops bench against base/layer_ops_cuda_bench (a pack's bench from
#              before a change), interleaved
# Output: summary.txt (everything printed), logs.tgz, kda_table.txt, attention_table.txt,
# model_table.txt, and the benches' JSON (kda.json, attention.json).
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
source "$root/scripts/lib/peer_wheels.sh"
source "$root/scripts/lib/attention_rounds.sh"
source "$root/dev/gpu_checks_lib.sh"
P=/tmp/refresh
L=/tmp/refresh-logs
mkdir -p "$L"
mkdir -p "$P" && for pack in .gpubin/pack/refresh*.tgz; do tar xzf "$pack" -C "$P"; done
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
( while sleep 10; do tar czf "$OUT/logs.tgz" -C "$L" . 2>/dev/null; done ) &
saver=$!

# One timed round of the hang test: "<label>: PASSED in S s" or "<label>: not done in LIMIT s".
hang_round() {  # hang_round BINARY_DIR LABEL LIMIT
  local s=$SECONDS
  if timeout "$3" "$P/$1/cuda_all_test" --gtest_filter='KdaCuda.PerRowModesEveryVariant' \
      >"$L/hang_$2.txt" 2>&1; then
    echo "$2: PASSED in $((SECONDS - s)) s"
  else
    echo "$2: rc $? after $((SECONDS - s)) s ($(tail -1 "$L/hang_$2.txt"))"
  fi
}

# HEAD's tests for gpu_checks_lib.sh's sanitize and flash_checks.
TEST_BIN=$P/head/cuda_all_test

phase_control() {
  echo "== control, alone (at $(el) s)"
  for r in 1 2 3 4; do hang_round head "alone_head_$r" 30; done
}

# finished_tests LOG...: the tests that reported OK, FAILED or SKIPPED in gtest logs, one
# Suite.Name a line (a failed parameterized test's line goes on ", where GetParam() = ...").
finished_tests() {
  sed -n 's/^\[  \(     OK \|FAILED  \|SKIPPED \)\] \([^ ,]*\)[ ,].*(.*/\2/p' "$@" | sort -u
}
# every_test: cuda_all_test's enabled tests, one Suite.Name a line (--gtest_list_tests prints
# "Suite." lines and indented names, either maybe followed by a "# GetParam() = ..." comment, and
# lists DISABLED_ tests too).
every_test() {
  "$P/head/cuda_all_test" --gtest_list_tests | awk '/^[^ ]/ { s = $1; next } { print s $1 }' |
    grep -v '^DISABLED_\|\.DISABLED_' | sort -u
}

phase_tests() {
  echo "== tests and sanitizers (at $(el) s)"
  local pids=() i
  for i in $(seq 0 11); do
    GTEST_TOTAL_SHARDS=12 GTEST_SHARD_INDEX=$i timeout 235 "$P/head/cuda_all_test" \
      >"$L/shard_$i.txt" 2>&1 &
    pids+=($!)
  done
  local kda_small='KdaCuda.PlainPackedT1Agree:KdaCuda.EveryAcceptedOffset'
  local kda_mem="$kda_small:KdaCuda.PreWaitReadsOfRewrittenMetadata:KdaCuda.StreamManyItemsPerCta*:KdaCuda.StableStatePromise*:KdaCuda.PrecomputeGroupRing*:KdaCuda.OneStreamCta*:KdaCuda.DynamicItems*"
  local name tool filter
  for name in att_memcheck att_racecheck kda_memcheck kda_racecheck; do
    case $name in
      att_*) filter=$att_small ;;
      kda_memcheck) filter=$kda_mem ;;
      kda_racecheck) filter="$kda_small:KdaCuda.OneStreamCta*" ;;
    esac
    tool=memcheck
    [[ $name == *race* ]] && tool=racecheck
    sanitize "$name" "$tool" "$filter"
    pids+=($!)
  done
  wait "${pids[@]}"
  # A shard cut for time leaves its test then running and the rest of its list: run them now.
  local left
  left=$(comm -23 <(every_test) <(finished_tests "$L"/shard_*.txt))
  if [[ -n $left ]]; then
    echo "tail: $(grep -c . <<<"$left") tests the cut shards left, in one process (at $(el) s)"
    timeout "${TAIL_S:-150}" "$P/head/cuda_all_test" --gtest_filter="$(paste -sd: <<<"$left")" \
      >"$L/shard_tail.txt" 2>&1
  fi
  local ok failed
  ok=$(cat "$L"/shard_*.txt | grep -c '^\[       OK \]')
  failed=$(cat "$L"/shard_*.txt | grep '^\[  FAILED  \] [A-Za-z]' | grep -v 'listed below' | sort -u)
  echo "head, every GPU test: $ok passed, $(echo -n "$failed" | grep -c .) failed"
  [[ -n $failed ]] && echo "$failed"
  for f in "$L"/shard_*.txt; do
    grep -q '^\[  PASSED  \]\|^\[  FAILED  \]' "$f" ||
      echo "  cut: $(basename "$f") in $(grep '^\[ RUN' "$f" | tail -1 | sed 's/.*\] //')"
  done
  echo "slowest tests (ms):"
  cat "$L"/shard_*.txt | grep '^\[       OK \]' | sed 's/.*OK \] \(.*\) (\([0-9]*\) ms)/\2 \1/' |
    sort -rn | head -12 | sed 's/^/  /'
  for name in att_memcheck att_racecheck kda_memcheck kda_racecheck; do sanitizer_line "$name"; done
}

# The flash-decode GPU tests and the attention sanitizer filters (gpu_checks_lib.sh): a kernel
# change's check in ~1.5 minutes (the whole `tests` phase takes ~2).
phase_flash() {
  echo "== flash tests and sanitizers (at $(el) s)"
  flash_checks
}

phase_kda() {
  echo "== kda: FLA, then splice (at $(el) s)"
  install_peer_wheels "$root"
  PYTHONUNBUFFERED=1 timeout 300 python3 bench/peers/kda_peers.py "$L/kda_peers.txt" \
    >"$L/kda_peers.log" 2>&1 || echo "FLA peers rc=$? ($(tail -2 "$L/kda_peers.log"))"
  timeout 240 "$P/head/kda_decode_cuda_bench" "$OUT/kda.json" "$L/kda_peers.txt" >"$L/kda_bench.txt" 2>&1 ||
    echo "kda bench rc=$?"
  grep -m1 "floor's copy bandwidth" "$L/kda_bench.txt"
  sed -n '/^state /,$p' "$L/kda_bench.txt" | tee "$OUT/kda_table.txt"
}

phase_attention() {
  echo "== attention: splice, then PyTorch SDPA and FlashInfer if carried (at $(el) s)"
  install_peer_wheels "$root"
  timeout 240 "$P/head/flash_decode_cuda_bench" --json "$L/flash.json" >"$L/flash_bench.txt" 2>&1 ||
    echo "flash bench rc=$?"
  grep -m1 "floor's read bandwidth" "$L/flash_bench.txt"
  PYTHONUNBUFFERED=1 timeout 420 python3 bench/peers/attention_peers.py --json "$L/attention_peers.json" \
    --splice "$L/flash.json" --combined "$OUT/attention.json" --table "$OUT/attention_table.txt" \
    ${ATTENTION_PEER_ARGS:-} >"$L/attention_peers.log" 2>&1 || echo "attention peers rc=$? ($(tail -2 "$L/attention_peers.log"))"
  cat "$OUT/attention_table.txt" 2>/dev/null
}

# Splice's flash bench and the peers in alternating processes (scripts/lib/attention_rounds.sh),
# ROUNDS (3) rounds, at the close points: ROUND_SHAPES if set; else, after an `attention` phase
# in the same call, its table's points behind or ahead by less than ROUND_WITHIN (0.5) percent;
# else the one-wave 256-unit grids and the 1024-unit 4K ones (the points that flipped between
# machines).
phase_rounds() {
  echo "== rounds: splice and the peers alternating (at $(el) s)"
  install_peer_wheels "$root"
  local shapes=${ROUND_SHAPES:-}
  if [[ -z $shapes && -f $OUT/attention.json ]]; then
    shapes=$(python3 bench/peers/attention_rounds.py --misses "$OUT/attention.json" \
      --within "${ROUND_WITHIN:-0.5}")
    echo "the attention table's close points: ${shapes:-none}"
    [[ -n $shapes ]] || return 0
  fi
  shapes=${shapes:-"32,32,8,16384,128;32,32,8,65536,128;32,64,8,16384,128;32,64,8,65536,128;8,32,32,16384,128;8,32,32,65536,128;128,32,8,4096,128;128,64,8,4096,128;128,32,32,1024,128"}
  attention_rounds "$P/head/flash_decode_cuda_bench" "$shapes" "${ROUNDS:-3}" "$L" |
    tee "$OUT/rounds_table.txt"
  grep -m1 "floor's read bandwidth" "$L/rounds_splice_1.txt"
  cp "$L/rounds.json" "$OUT/" 2>/dev/null
}

phase_model() {
  echo "== model (at $(el) s)"
  PYTHONUNBUFFERED=1 timeout 200 python3 scripts/peers/llama_peers.py "$P/head/splice" "$L" --device cuda \
    >"$OUT/model_table.txt" 2>&1 || echo "llama peers rc=$?"
  timeout 100 "$P/head/splice" bench --device cuda --steps 128 >>"$OUT/model_table.txt" 2>&1 ||
    echo "default model bench rc=$?"
  timeout 100 "$P/head/splice" bench --device cuda --batch 32 --steps 128 --profile 8 >>"$OUT/model_table.txt" 2>&1 ||
    echo "default model batch-32 bench rc=$?"
  cat "$OUT/model_table.txt"
}

phase_gemv() {
  echo "== gemv (at $(el) s)"
  timeout 240 "$P/head/gemv_cuda_bench" "$L/gemv.json" ${GEMV_ARGS:-} >"$OUT/gemv_table.txt" 2>&1 ||
    echo "gemv bench rc=$?"
  cat "$OUT/gemv_table.txt"
}

# The compute_90 PTX (what a GPU after Hopper JIT-compiles) in place of the sm_90a SASS, on the
# tests of splice's own kernels. Not the session graphs: the forced JIT applies to every module of
# the process, and cuBLASLt's own kernels carry no PTX to JIT (cublasLtCreate fails, run 326: so
# also not PrologueOpsCuda.FallbackRouteMatchesCpu, run 329); on a later GPU cuBLASLt loads its own
# SASS for that GPU.
phase_ptx() {
  echo "== ptx: CUDA_FORCE_PTX_JIT=1 (at $(el) s)"
  local s=$SECONDS
  CUDA_FORCE_PTX_JIT=1 timeout 400 "$P/head/cuda_all_test" \
    --gtest_filter='KdaCuda.T1Grid:KdaCuda.PackedGrid:KdaCuda.PlainPackedT1Agree:FlashDecodeCuda.OddLengthsWithPoisonedTails:FlashDecodeCuda.ClusterMergeIsBitwiseTheGlobalMerge:QkvRopeCuda.*:RopeKvAppendCuda.*:SwigluCuda.*:PrologueOpsCuda.*:CudaArgmax.*:-PrologueOpsCuda.FallbackRouteMatchesCpu' \
    >"$L/ptx.txt" 2>&1
  echo "ptx: rc $? in $((SECONDS - s)) s: $(grep -c '^\[       OK \]' "$L/ptx.txt") passed, $(grep '^\[  FAILED  \] [A-Za-z]' "$L/ptx.txt" | grep -v 'listed below' | cut -d' ' -f5 | sort -u | grep -c .) failed"
}

phase_layer_ops() {
  echo "== layer_ops (at $(el) s)"
  timeout 240 "$P/head/layer_ops_cuda_bench" "$L/layer_ops.json" 30 smollm2 \
    >"$OUT/layer_ops_table.txt" 2>&1 || echo "layer_ops bench rc=$?"
  cat "$OUT/layer_ops_table.txt"
}

# A same-call A/B of the layer ops: head's bench against base/layer_ops_cuda_bench (carried in a
# refresh pack: the bench built before a change), interleaved, ROUNDS (2) rounds each.
phase_layer_ops_ab() {
  echo "== layer_ops A/B: base against head (at $(el) s)"
  local round b
  for round in $(seq 1 "${ROUNDS:-2}"); do
    for b in base head; do
      timeout 120 "$P/$b/layer_ops_cuda_bench" "$L/layer_ops_${b}_$round.json" 30 smollm2 \
        >"$OUT/layer_ops_${b}_$round.txt" 2>&1 || echo "$b round $round: rc $?"
      echo "-- $b, round $round"
      grep -E "^(op|rms_norm_m|silu_mul_matmul)" "$OUT/layer_ops_${b}_$round.txt"
    done
  done
}

for phase in "$@"; do "phase_$phase"; done
kill "$saver" 2>/dev/null
echo "done at $(el) s"
tar czf "$OUT/logs.tgz" -C "$L" .
