#!/usr/bin/env bash
# dev/kda_flashinfer_call.sh stage|run: FlashInfer's T = 1 fused_kda_decode beside FLA and
# splice's KDA kernel at T = 1 (bench/peers/flashinfer_kda.py), in two device calls back to back.
#
# FlashInfer 0.6.18's KDA decode is a CuTe DSL kernel: with its DSL (nvidia-cutlass-dsl 4.8.1,
# libs-core / libs-base / libs-cu13) and apache-tvm-ffi 0.1.15.post2 (the DSL's TVM-FFI export
# passes make_kwargs_wrapper a map_dataclass_to_tuple argument that 0.1.9 lacks: run 280) it is
# 282 MB installed, ~70 MB as one xz archive, over one call's 64 MiB carry. (Not needed on the
# device: FlashInfer's nccl4py, cuda-tile and cudnn-frontend; the image has cuda-bindings.) So the archive travels in two parts: call 1 carries
# part 1 and leaves it on the machine (an ignored path the next call's copy keeps: .gpubin/stash,
# and /tmp), call 2 carries part 2 with the bench and runs; the calls must follow each other
# before the machine is released (its idle release is ~30 s).
# Here, once (the site of a python3.12 venv where the wheels were installed with --no-deps, its
# flashinfer/data removed: the CuTe DSL kernel needs none of FlashInfer's C++ sources):
#   tar cf - -C SITE --exclude=__pycache__ flashinfer flashinfer_python-0.6.18.dist-info \
#     nvidia_cutlass_dsl nvidia_cutlass_dsl*.dist-info tvm_ffi apache_tvm_ffi-*.dist-info |
#     xz -9 -T8 | split -b 38M - .gpubin/kdafi-parts/part.
# (Any number of parts: `run` unpacks the staged ones and the carried ones in name order. The
# tracked tree, ~4.2 MB, counts against the carry too: a stage call with part.aa beside
# refresh1.tgz and .deps was refused in session 41. The calls must follow each other: issue the
# second only after the first returns. Session 41 made the site with pip install --no-deps
# --target SITE ... under python3.12.)
#   mkdir -p .gpubin/kdafi && cp .gpubin/kdafi-parts/part.aa .gpubin/kdafi/
#   run(command="dev/kda_flashinfer_call.sh stage", carry=[".gpubin/kdafi"])
#   rm .gpubin/kdafi/part.aa && cp .gpubin/kdafi-parts/part.ab .gpubin/kdafi/
#   run(command="dev/kda_flashinfer_call.sh run",
#       carry=[".gpubin/kdafi", ".gpubin/pack/kdabench.tgz", ".deps", ".whl"])
# (kdabench.tgz: head/kda_decode_cuda_bench, stripped, from build/bundle.)
# Output: summary.txt, kda_peers.log, kda_peers.txt, kda_table.txt, kda.json.
set -uo pipefail
source "$(dirname "$0")/call_env.sh"
source "$root/scripts/lib/peer_wheels.sh"
stash=$root/.gpubin/stash
case ${1:?usage: kda_flashinfer_call.sh stage|run} in
  stage)
    mkdir -p "$stash" /tmp/kdafi-stash
    cp .gpubin/kdafi/part.* "$stash"/ && cp .gpubin/kdafi/part.* /tmp/kdafi-stash/
    ls -la "$stash"
    ;;
  run)
    nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
    site=/tmp/kda-fi-site
    mkdir -p "$site"
    # The parts in name order: the staged ones (stash, else /tmp), then the carried ones.
    staged=$stash; [[ -f $staged/part.aa ]] || staged=/tmp/kdafi-stash
    parts=$(for f in "$staged"/part.* .gpubin/kdafi/part.*; do echo "$(basename "$f") $f"; done |
      sort -u -k1,1 | cut -d' ' -f2)
    ls -la $parts
    cat $parts | xz -d | tar x -C "$site" || { echo "the archive did not unpack"; exit 3; }
    install_peer_wheels "$root"  # FLA (and FlashInfer 0.5.3, shadowed by $site's 0.6.18)
    export PYTHONPATH=$site:$site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
    P=/tmp/kdafi-bench && mkdir -p "$P" && tar xzf .gpubin/pack/kdabench.tgz -C "$P"
    export KDA_BENCH_TS=1
    echo "== FlashInfer and FLA at T = 1 (at $(el) s)"
    PYTHONUNBUFFERED=1 timeout 360 python3 bench/peers/kda_peers.py "$OUT/kda_peers.txt" \
      >"$OUT/kda_peers.log" 2>&1 || echo "peers rc=$?"
    grep -E "FlashInfer|agree|not |fail|Error" "$OUT/kda_peers.log" | head -40
    echo "== splice at T = 1 (at $(el) s)"
    timeout 200 "$P/head/kda_decode_cuda_bench" "$OUT/kda.json" "$OUT/kda_peers.txt" \
      >"$OUT/kda_bench.txt" 2>&1 || echo "kda bench rc=$?"
    sed -n '/^state /,$p' "$OUT/kda_bench.txt" | tee "$OUT/kda_table.txt"
    echo "done at $(el) s"
    ;;
  *) echo "unknown phase $1" >&2; exit 2 ;;
esac
