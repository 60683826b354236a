#!/usr/bin/env bash
# dev/sass_size.sh [FILTER]: the SASS bytes of every kernel instance of the CUDA backend (sm_90a),
# largest first; FILTER (a grep -E pattern on the demangled name) narrows the list.
#
# Why: in a decode step every kernel runs with cold instruction caches, and cold code costs ~0.06
# us per KB executed (docs/perf.md runs 26-27), so code size is a cost to review like registers.
# The size here is the whole instance; the bytes a decode call executes are a part of it (the
# path between ACQBULK, i.e. griddepcontrol.wait, and EXIT matters most): read that part with
# nvdisasm -c on the cubin this script leaves in /tmp/sass_size/.
# Runs here (nvcc only, no GPU); ~3 minutes on this 2-core machine.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
filter=${1:-.}
out=/tmp/sass_size
mkdir -p "$out"
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
for src in "$root"/src/backend/cuda/*.cu; do
  name=$(basename "$src" .cu)
  "$nvcc" -O3 -DNDEBUG -DSPLICE_WITH_CUDA=1 -arch=sm_90a --expt-relaxed-constexpr -std=c++20 \
    -I"$root/include" -I"$root/src" -cubin -o "$out/$name.cubin" "$src"
  readelf -SW "$out/$name.cubin" 2>/dev/null | awk '$2 ~ /^\.text\./ {print $6, $2}' |
    while read -r hex section; do
      printf '%8d  %-14s %s\n' "$((16#$hex))" "$name" "$(echo "${section#.text.}" | c++filt)"
    done
done | grep -E -- "$filter" | sort -rn | cut -c1-180
