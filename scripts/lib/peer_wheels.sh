# Sourced by scripts/gpu-check and the dev/*_call.sh device calls: the benchmarks' peer packages
# that the device image lacks travel as wheels in .whl/ (git-ignored; FLA for the KDA peers,
# FlashInfer and its apache-tvm-ffi for the attention peers; README's GPU line says how to fetch
# them). install_peer_wheels ROOT installs them once into /tmp/peer-site (no index, no deps) and
# puts that on PYTHONPATH; FlashInfer then JIT-compiles its kernels at first use with the image's
# nvcc, into /tmp/flashinfer-ws.
install_peer_wheels() {
  [[ -n ${SPLICE_PEER_SITE:-} ]] && return 0
  export SPLICE_PEER_SITE=/tmp/peer-site
  export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/flashinfer-ws}
  ls "$1"/.whl/*.whl >/dev/null 2>&1 || return 0
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SPLICE_PEER_SITE" "$1"/.whl/*.whl &&
    export PYTHONPATH=$SPLICE_PEER_SITE${PYTHONPATH:+:$PYTHONPATH}
}
