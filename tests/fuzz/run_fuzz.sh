#!/usr/bin/env bash
# Builds the safetensors libFuzzer target with clang (address + undefined sanitizers) from just the
# parser's sources, writes a seed corpus of valid files, and runs a bounded fuzzing session.
#
#   tests/fuzz/run_fuzz.sh [work dir] [runs]
#
# 1. Install clang-14 and its runtime (libFuzzer) through apt-get when they are missing.
# 2. Compile src/core/*.cc + src/model/safetensors.cc + the target into one binary.
# 3. Write seeds: valid files of several dtypes, metadata, empty tensors, misaligned offsets.
# 4. Fuzz for at most RUNS inputs or MAX_SECONDS, whichever comes first; a crash fails the script.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
work="${1:-${repo}/build-fuzz}"
runs="${2:-20000}"
max_seconds="${SPLICE_FUZZ_SECONDS:-30}"
mkdir -p "${work}/corpus" "${work}/seeds"

cxx="$(command -v clang++-14 || command -v clang++ || true)"
fuzzer_rt="$(ls /usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a 2>/dev/null || true)"
if [[ -z "${cxx}" || -z "${fuzzer_rt}" ]]; then
  echo "run_fuzz.sh: installing clang-14 and libclang-rt-14-dev"
  apt-get update -qq && apt-get install -y -qq clang-14 libclang-rt-14-dev >/dev/null
  cxx="$(command -v clang++-14)"
fi

binary="${work}/safetensors_fuzz"
sources=("${repo}"/src/core/*.cc "${repo}/src/model/safetensors.cc" "${repo}/tests/fuzz/safetensors_fuzz.cc")
stale=0
if [[ ! -x "${binary}" ]]; then stale=1; else
  for s in "${sources[@]}" "${repo}"/include/splice/core/*.h "${repo}/include/splice/model/safetensors.h"; do
    [[ "${s}" -nt "${binary}" ]] && stale=1
  done
fi
if [[ "${stale}" == 1 ]]; then
  echo "run_fuzz.sh: compiling ${binary}"
  "${cxx}" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -I"${repo}/include" -I"${repo}/src" "${sources[@]}" -o "${binary}.tmp" -lpthread
  mv "${binary}.tmp" "${binary}"
fi

python3 - "${work}/seeds" <<'PY'
import json, struct, sys, os
out = sys.argv[1]
def write(name, tensors, metadata=None, pad=True):
    header, data = {}, b""
    for tname, dtype, shape, payload in tensors:
        header[tname] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    with open(os.path.join(out, name), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)
write("f32", [("w", "F32", [2, 3], struct.pack("<6f", *range(6)))])
write("mixed", [("a", "BF16", [4], b"\x80\x3f" * 4), ("b", "I64", [2], struct.pack("<2q", -1, 7)),
                ("c", "BOOL", [3], b"\x01\x00\x01")], {"format": "pt"})
write("conv", [("d", "F64", [2], struct.pack("<2d", 1.5, -2)), ("e", "F8_E4M3", [2], b"\x38\x7e"),
               ("f", "U16", [1], b"\xff\xff"), ("g", "F8_E5M2", [1], b"\x3c")])
write("empty", [("z", "F16", [0, 4], b""), ("s", "I32", [], struct.pack("<i", 5))], pad=False)
write("misaligned", [("m", "U8", [1], b"\x01"), ("f", "F32", [1], struct.pack("<f", 3.25))])
PY

echo "run_fuzz.sh: fuzzing for at most ${runs} runs / ${max_seconds} s"
cd "${work}"
"${binary}" -runs="${runs}" -max_total_time="${max_seconds}" -max_len=4096 -timeout=10 \
  -rss_limit_mb=2048 -print_final_stats=1 corpus seeds 2>&1 | tail -n 25
echo "run_fuzz.sh: no crash in the bounded session"
