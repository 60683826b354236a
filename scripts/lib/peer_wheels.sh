# Sourced by scripts/gpu-check and the dev/*_call.sh device calls: the benchmarks' peer packages
# that the device image lacks travel as wheels in .whl/ (git-ignored; FLA for the KDA peers,
# FlashInfer and its apache-tvm-ffi for the attention peers), fetched here once:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
#     -d .whl fla-core==0.6.0 flash-linear-attention==0.6.0 flashinfer-python==0.5.3 \
#     apache-tvm-ffi==0.1.3
# (FlashInfer 0.5.3: a 7 MB wheel whose imports need nothing else the image lacks, where 0.7's
# wheels are 33-101 MB of a call's 64 MiB.) install_peer_wheels ROOT installs them once into
# /tmp/peer-site (no index, no deps) and puts that on PYTHONPATH; FlashInfer then JIT-compiles its
# kernels at first use with the image's nvcc, into /tmp/flashinfer-ws.
# FlashInfer's KDA decode (bench/peers/flashinfer_kda.py) needs 0.6.18 and its CuTe DSL, 70 MB
# compressed: it travels on its own, in two calls (dev/kda_flashinfer_call.sh); with .whl's 0.5.3
# alone the KDA peer script reports it as not importable and times FLA.
install_peer_wheels() {
  [[ -n ${SPLICE_PEER_SITE:-} ]] && return 0
  export SPLICE_PEER_SITE=/tmp/peer-site
  export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/flashinfer-ws}
  ls "$1"/.whl/*.whl >/dev/null 2>&1 || return 0
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SPLICE_PEER_SITE" "$1"/.whl/*.whl &&
    export PYTHONPATH=$SPLICE_PEER_SITE${PYTHONPATH:+:$PYTHONPATH}
}
