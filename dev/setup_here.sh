#!/usr/bin/env bash
# dev/setup_here.sh: a fresh checkout's host-side set-up for the carried-binaries device calls
# (session 25 did these by hand in ~20 minutes on the 2 cores; run it in the background first):
#   1. the project's Debian and Python dependencies (scripts/lib/common.sh);
#   2. build/bundle (tests bundled into cuda_all_test, the CUDA benches, the CLI, a generic BLAS)
#      and build/kdaattr (the attribution build's KDA bench), configured as dev/pack_binaries.sh's
#      header says;
#   3. .deps (scripts/gpu-check --pack-deps) and the peers' wheels in .whl
#      (scripts/lib/peer_wheels.sh's header), both git-ignored through .git/info/exclude;
#   4. the refresh packs (dev/pack_binaries.sh refresh) and the timeline pack of HEAD alone.
# Then the calls of dev/refresh_call.sh, dev/timeline_call.sh and dev/variant_ab_call.sh are
# ready (variant packs: dev/pack_binaries.sh variants PATCH..., ~45 s a variant).
# Environment: SETUP_ATTR=0 skips build/kdaattr and the timeline pack.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
T0=$(date +%s)
step() { echo "== $* (at $(($(date +%s) - T0)) s)"; }

step "dependencies"
# shellcheck source=/dev/null
source scripts/lib/common.sh
splice_install_deps
splice_install_python_deps

cuda20=(-DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20
        -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20 -DCMAKE_PREFIX_PATH=/usr)
step "build/bundle"
cmake -S . -B build/bundle -DCMAKE_BUILD_TYPE=Release -DSPLICE_BUILD_TESTS=ON \
  -DSPLICE_BUILD_BENCH=ON -DSPLICE_GPU_TEST_BUNDLE=ON -DBLA_VENDOR=Generic "${cuda20[@]}" >/dev/null
cmake --build build/bundle -j"$(nproc)" --target cuda_all_test splice kda_decode_cuda_bench \
  flash_decode_cuda_bench gemv_cuda_bench layer_ops_cuda_bench >/tmp/setup_bundle.log 2>&1 || { tail -20 /tmp/setup_bundle.log; exit 1; }
if [[ ${SETUP_ATTR:-1} != 0 ]]; then
  step "build/kdaattr"
  cmake -S . -B build/kdaattr -DCMAKE_BUILD_TYPE=Release -DSPLICE_BUILD_BENCH=ON \
    -DCMAKE_CUDA_FLAGS=-DSPLICE_KDA_DEV_ATTRIBUTION "${cuda20[@]}" >/dev/null
  cmake --build build/kdaattr -j"$(nproc)" --target kda_decode_cuda_bench >/tmp/setup_attr.log 2>&1 ||
    { tail -20 /tmp/setup_attr.log; exit 1; }
fi

step ".deps and .whl"
mkdir -p .git/info
for d in /.gpubin/ /.deps/ /.whl/; do
  grep -qx "$d" .git/info/exclude 2>/dev/null || echo "$d" >>.git/info/exclude
done
scripts/gpu-check --pack-deps
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
  -d .whl fla-core==0.6.0 flash-linear-attention==0.6.0 flashinfer-python==0.5.3 \
  apache-tvm-ffi==0.1.3
du -sh .whl

step "packs"
dev/pack_binaries.sh refresh >/dev/null
[[ ${SETUP_ATTR:-1} != 0 ]] && dev/pack_binaries.sh timeline >/dev/null
ls -la .gpubin/pack
step "done"
