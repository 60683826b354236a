#!/usr/bin/env bash
# dev/pack_binaries.sh KIND [PATCH...]: the carried-binaries packs of the dev/*_call.sh device
# calls, built here from build/bundle (no device build; ~1 minute a KDA variant).
#
# build/bundle, once (tests bundled into cuda_all_test, the CUDA benches, a generic BLAS whose
# libblas.so.3 travels in .deps, `scripts/gpu-check --pack-deps`):
#   cmake -S . -B build/bundle -DCMAKE_BUILD_TYPE=Release -DSPLICE_BUILD_TESTS=ON \
#     -DSPLICE_BUILD_BENCH=ON -DSPLICE_GPU_TEST_BUNDLE=ON -DBLA_VENDOR=Generic \
#     -DCMAKE_PREFIX_PATH=/usr -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 \
#     -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20
#   cmake --build build/bundle -j2 --target cuda_all_test splice kda_decode_cuda_bench \
#     flash_decode_cuda_bench gemv_cuda_bench layer_ops_cuda_bench
# KIND:
#   refresh   .gpubin/pack/refresh1.tgz (head/cuda_all_test, head/kda_decode_cuda_bench),
#             refresh2.tgz (head/splice, head/flash_decode_cuda_bench) and refresh3.tgz
#             (head/gemv_cuda_bench, head/layer_ops_cuda_bench) for dev/refresh_call.sh
#   variants  .gpubin/pack/variants.tgz for dev/variant_ab_call.sh: head/kda_decode_cuda_bench,
#             and for each PATCH (a dev/*.patch touching src/backend/cuda/kda_decode*) a directory
#             named after it with cuda_all_test and kda_decode_cuda_bench: kda_decode.cu of a
#             patched copy of the tree compiled with build/bundle's command, swapped into a copy
#             of libsplice_backend_cuda.a, both executables relinked with their link.txt.
#   (WITH_SPLICE=1: head's and each variant's `splice` CLI too, relinked the same way, for
#   dev/model_batch_call.sh's decode steps.)
#   (PACK_NAME=name: .gpubin/pack/name.tgz instead, e.g. two variant packs side by side; the
#   calls take PACK=.gpubin/pack/name.tgz. BENCH_ONLY=1: the variants' benches alone, ~3.5 MB
#   each instead of ~22, so five variants share a call; dev/variant_ab_call.sh then only times
#   them)
#   flash-variants  .gpubin/pack/flash-variants.tgz for dev/flash_variant_call.sh: for each PATCH
#             (touching src/backend/cuda/flash_decode*) a directory named after it with
#             flash_decode_cuda_bench, built as the KDA variants are (flash_decode.cu swapped in),
#             and head/flash_decode_cuda_bench (WITH_TESTS=1: each variant's cuda_all_test too, e.g.
#             the mutation checks dev/flash-mutant-*.patch)
#   gemv-variants  .gpubin/pack/gemv-variants.tgz: the same for a PATCH touching
#             src/backend/cuda/gemv.cu (gemv_cuda_bench; WITH_TESTS=1 cuda_all_test, WITH_SPLICE=1
#             splice for dev/model_batch_call.sh's decode steps)
#   timeline  .gpubin/pack/timeline.tgz for dev/timeline_call.sh: the same from build/kdaattr (the
#             attribution build, KDA_BENCH_TIMELINE; kda_decode_cuda_bench only), once:
#               cmake -S . -B build/kdaattr -DCMAKE_BUILD_TYPE=Release -DSPLICE_BUILD_BENCH=ON \
#                 -DCMAKE_CUDA_FLAGS=-DSPLICE_KDA_DEV_ATTRIBUTION (+ the CUDA20 options above)
#               cmake --build build/kdaattr -j2 --target kda_decode_cuda_bench
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
B=$root/build/bundle
kind=${1:?usage: pack_binaries.sh refresh|variants|flash-variants|gemv-variants|timeline [PATCH...]}
shift
[[ $kind == timeline ]] && B=$root/build/kdaattr
# Every packed executable newer than every source (session 42: a bench linked before the
# library's last rebuild went out as `head`, carrying a patch the sources had lost).
for exe in tests/cuda_all_test bench/kda_decode_cuda_bench bench/flash_decode_cuda_bench \
    bench/gemv_cuda_bench bench/layer_ops_cuda_bench splice; do
  [[ -e $B/$exe ]] || continue
  dirs="src include"; [[ $exe == splice ]] && dirs+=" tools"
  stale=$(find $dirs -newer "$B/$exe" -type f | head -3)
  [[ -z $stale ]] || { echo "$B/$exe is older than $(echo $stale): build it first" >&2; exit 2; }
done
mkdir -p .gpubin/pack
W=$(mktemp -d /tmp/pack.XXXXXX)
trap 'rm -rf "$W"' EXIT

put() {  # put SRC DIR: a stripped copy of SRC in $W/DIR/
  mkdir -p "$W/$2"
  cp "$1" "$W/$2/" && strip "$W/$2/$(basename "$1")"
}

relink() {  # relink LINK_DIR TARGET ARCHIVE OUTPUT: TARGET's link line with ARCHIVE for the backend
  local dir=$1 target=$2 archive=$3 out=$4 cmd
  cmd=$(sed -e "s#[^ ]*libsplice_backend_cuda\.a#$archive#g" \
            -e "s#-o [^ ]*$target\b#-o $out#" "$dir/CMakeFiles/$target.dir/link.txt")
  (cd "$dir" && eval "$cmd")
}

case $kind in
  refresh)
    put "$B/tests/cuda_all_test" r1/head
    put "$B/bench/kda_decode_cuda_bench" r1/head
    put "$B/splice" r2/head
    put "$B/bench/flash_decode_cuda_bench" r2/head
    put "$B/bench/gemv_cuda_bench" r3/head
    put "$B/bench/layer_ops_cuda_bench" r3/head
    tar czf .gpubin/pack/refresh1.tgz -C "$W/r1" .
    tar czf .gpubin/pack/refresh2.tgz -C "$W/r2" .
    tar czf .gpubin/pack/refresh3.tgz -C "$W/r3" .
    ;;
  variants | timeline | flash-variants | gemv-variants)
    # The kernel's translation unit and the binaries relinked with it.
    unit=kda_decode bench=kda_decode_cuda_bench
    [[ $kind == flash-variants ]] && unit=flash_decode bench=flash_decode_cuda_bench
    [[ $kind == gemv-variants ]] && unit=gemv bench=gemv_cuda_bench
    put "$B/bench/$bench" v/head
    [[ -n ${WITH_SPLICE:-} ]] && put "$B/splice" v/head
    compile=$(python3 -c "
import json, sys
for e in json.load(open('$B/compile_commands.json')):
    if e['file'].endswith('src/backend/cuda/$unit.cu'): print(e['command'])")
    for patch in "$@"; do
      name=$(basename "$patch" .patch)
      tree=$W/tree_$name
      mkdir -p "$tree" && git archive HEAD src include | tar x -C "$tree"
      # Only the kernel's sources are rebuilt: a patch's test hunks (a RuleTable row) wait for it to land.
      git -C "$tree" init -q && git -C "$tree" apply --include='src/*' --include='include/*' "$root/$patch"
      # $B's command on the patched copy: its include paths first, the same flags.
      obj=$W/$name.o
      (cd "$B" && eval "$(echo "$compile" | sed -e "s#--options-file [^ ]*#-I$tree/include -I$tree/src -isystem=/usr/local/cuda/include#" \
        -e "s#-c [^ ]*$unit.cu#-c $tree/src/backend/cuda/$unit.cu#" -e "s#-o [^ ]*#-o $obj#")")
      cp "$B/libsplice_backend_cuda.a" "$W/$name.a"
      (cd "$W" && cp "$obj" $unit.cu.o && ar r "$name.a" $unit.cu.o)
      mkdir -p "$W/v/$name"
      if [[ $kind == variants && -z ${BENCH_ONLY:-} ]] ||
         [[ $kind != variants && -n ${WITH_TESTS:-} ]]; then
        relink "$B/tests" cuda_all_test "$W/$name.a" "$W/v/$name/cuda_all_test"
      fi
      relink "$B/bench" $bench "$W/$name.a" "$W/v/$name/$bench"
      [[ -n ${WITH_SPLICE:-} ]] && relink "$B" splice "$W/$name.a" "$W/v/$name/splice"
      strip "$W/v/$name/"*
      echo "$name: $(nm -C "$W/$name.a" 2>/dev/null | grep -c "${unit}_") kernel symbols"
    done
    tar czf ".gpubin/pack/${PACK_NAME:-$kind}.tgz" -C "$W/v" .
    ;;
  *) echo "unknown KIND $kind" >&2; exit 2 ;;
esac
ls -la .gpubin/pack/
