#!/usr/bin/env bash
# dev/step_stamps/device_run.sh OUT_DIR [MODEL]: the per-kernel breakdown of the batch-1 decode
# step on the device (issue #7: the step is ~590 us while the per-kernel chains sum to ~450).
#
#   1. Configure and build step_stamps in /tmp/bstamps (-DSPLICE_KERNEL_STAMPS=ON; only that
#      target, ~1-2 min at -j16; a warm machine keeps the build between calls).
#   2. Without MODEL: save a random bf16 SmolLM2-135M-shaped LlamaForCausalLM (transformers), as
#      dev/model_profile.sh does.
#   3. step_stamps MODEL 64 256 (tuning cache in OUT_DIR): 130 warm-up steps, then 64 stamped
#      replays at k_len 131 .. 195.
# Everything lands in OUT_DIR/step_stamps.txt (stdout too); copy OUT_DIR as one archive.
set -uo pipefail
out=${1:?usage: device_run.sh OUT_DIR [MODEL]}
model=${2:-}
mkdir -p "$out"
root=$(cd "$(dirname "$0")/../.." && pwd)
build=/tmp/bstamps
start=$(date +%s)
# The configure flags scripts/gpu-check's build uses on the device (its image lacks the host
# build deps: they travel in .deps, see gpu-check --pack-deps).
args=(-DCMAKE_BUILD_TYPE=Release -DSPLICE_KERNEL_STAMPS=ON -DSPLICE_BUILD_TESTS=OFF
      -DSPLICE_BUILD_BENCH=OFF -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20
      -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20)
command -v ninja >/dev/null && args+=(-G Ninja)
deps="$root/.deps/usr"
if [[ -d $deps ]]; then
  args+=(-DCMAKE_PREFIX_PATH="$deps" -DBLA_VENDOR=Generic)
  export LD_LIBRARY_PATH="$deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
if [[ ! -x $build/step_stamps ]]; then
  cmake -S "$root" -B "$build" "${args[@]}" >"$out/configure.txt" 2>&1
  cmake --build "$build" -j"$(nproc)" --target step_stamps >"$out/build.txt" 2>&1 ||
    { tail -30 "$out/build.txt"; exit 1; }
fi
echo "built at $(($(date +%s) - start)) s"
if [[ -z $model ]]; then
  model=/tmp/smollm2_shaped
  [[ -f $model/config.json ]] || python3 "$root/scripts/peers/smollm2_shaped.py" "$model"
fi
timeout 240 "$build/step_stamps" "$model" 64 256 "$out/tuning.json" 2>&1 | tee "$out/step_stamps.txt"
echo "done at $(($(date +%s) - start)) s"
