#!/usr/bin/env bash
# Builds the safetensors, GGUF and JSON (config.json, tokenizer.json) libFuzzer targets with clang (address + undefined sanitizers)
# from just the parsers' sources, writes seed corpora of valid files, and runs a bounded session of
# each.
#
#   tests/fuzz/run_fuzz.sh [work dir] [runs]      (SPLICE_FUZZ_SECONDS caps each session, 30 s)
#
# 1. Install clang-14 and its runtime (libFuzzer) through apt-get when they are missing.
# 2. Compile src/core/*.cc + the model loader sources + each target into one binary.
# 3. Write seeds: safetensors files of several dtypes, metadata, empty tensors, misaligned
#    offsets; GGUF files with every metadata type, nested arrays and plain/quantized tensors;
#    Llama and KDA config.json files and a tokenizer.json.
# 4. Fuzz each for at most RUNS inputs or MAX_SECONDS; a crash or leak fails the script.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
work="${1:-${repo}/build-fuzz}"
runs="${2:-20000}"
max_seconds="${SPLICE_FUZZ_SECONDS:-30}"
mkdir -p "${work}"/{corpus,seeds,gguf_corpus,gguf_seeds,json_corpus,json_seeds}

cxx="$(command -v clang++-14 || command -v clang++ || true)"
fuzzer_rt="$(ls /usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a 2>/dev/null || true)"
if [[ -z "${cxx}" || -z "${fuzzer_rt}" ]]; then
  echo "run_fuzz.sh: installing clang-14 and libclang-rt-14-dev"
  apt-get update -qq && apt-get install -y -qq clang-14 libclang-rt-14-dev >/dev/null
  cxx="$(command -v clang++-14)"
fi

# build TARGET SOURCES...: (re)compiles ${work}/TARGET when any source or header is newer.
build() {
  local target="$1"
  shift
  local binary="${work}/${target}" stale=0 s
  if [[ ! -x "${binary}" ]]; then stale=1; else
    for s in "$@" "${repo}"/include/splice/core/*.h "${repo}"/include/splice/model/*.h; do
      [[ "${s}" -nt "${binary}" ]] && stale=1
    done
  fi
  if [[ "${stale}" == 1 ]]; then
    echo "run_fuzz.sh: compiling ${binary}"
    "${cxx}" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
      -I"${repo}/include" -I"${repo}/src" "$@" -o "${binary}.tmp" -lpthread
    mv "${binary}.tmp" "${binary}"
  fi
}
core=("${repo}"/src/core/*.cc)
model=("${repo}"/src/model/{file_storage,safetensors,gguf,config,tokenizer}.cc)
build safetensors_fuzz "${core[@]}" "${repo}/src/model/file_storage.cc" "${repo}/src/model/safetensors.cc" \
  "${repo}/tests/fuzz/safetensors_fuzz.cc"
build gguf_fuzz "${core[@]}" "${model[@]}" "${repo}/tests/fuzz/gguf_fuzz.cc"
build json_fuzz "${core[@]}" "${model[@]}" "${repo}/tests/fuzz/json_fuzz.cc"

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

python3 - "${work}/gguf_seeds" <<'PY'
import os, struct, sys
out = sys.argv[1]
def s(text):
    b = text.encode()
    return struct.pack("<Q", len(b)) + b
def kv(key, vtype, payload):
    return s(key) + struct.pack("<I", vtype) + payload
def gguf(name, kvs, tensors, align=32):
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs)
    data, infos = b"", b""
    for tname, ne, ttype, payload in tensors:
        data += b"\0" * ((-len(data)) % align)
        infos += s(tname) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        infos += struct.pack("<IQ", ttype, len(data))
        data += payload
    blob = head + infos
    blob += b"\0" * ((-len(blob)) % align)
    open(os.path.join(out, name), "wb").write(blob + data)
half = struct.pack("<e", 0.01)
meta = [kv("general.architecture", 8, s("llama")), kv("llama.block_count", 4, struct.pack("<I", 1)),
        kv("llama.embedding_length", 4, struct.pack("<I", 32)),
        kv("llama.feed_forward_length", 4, struct.pack("<I", 64)),
        kv("llama.attention.head_count", 4, struct.pack("<I", 2)),
        kv("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 2) + s("a") + s("b")),
        kv("scores", 9, struct.pack("<IQ", 6, 2) + struct.pack("<2f", 0.5, -1)),
        kv("nested", 9, struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 0, 1) + b"\x07"),
        kv("flag", 7, b"\x01"), kv("f64", 12, struct.pack("<d", 2.5)), kv("i64", 11, struct.pack("<q", -3))]
gguf("plain", meta, [("token_embd.weight", [32, 4], 0, struct.pack("<128f", *range(128))),
                     ("output_norm.weight", [32], 1, struct.pack("<32e", *([1.0] * 32)))])
gguf("quant", meta[:5], [("q8", [32], 8, half + bytes(range(32))), ("q4_1", [32], 3, half + half + bytes(16)),
                         ("q4k", [256], 12, half + half + bytes(range(12)) + bytes(128)),
                         ("q6k", [256], 14, bytes(range(128)) + bytes(64) + bytes(16) + half),
                         ("q3k", [256], 11, bytes(32) + bytes(range(64)) + bytes(12) + half)])
gguf("aligned64", [kv("general.alignment", 4, struct.pack("<I", 64))], [("w", [4], 26, struct.pack("<4i", 1, 2, 3, 4))], 64)
PY

python3 - "${work}/json_seeds" <<'PY'
import json, os, sys
out = sys.argv[1]
def write(name, obj):
    open(os.path.join(out, name), "w").write(json.dumps(obj))
write("llama", {"architectures": ["LlamaForCausalLM"], "vocab_size": 10, "hidden_size": 8,
                "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
                "num_key_value_heads": 1, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                "eos_token_id": [1, 2], "tie_word_embeddings": True})
write("kda", {"architectures": ["KDAForCausalLM"], "model_type": "kda", "vocab_size": 10,
              "hidden_size": 8, "num_hidden_layers": 3, "num_heads": 2, "head_dim": 4, "expand_v": 2.0,
              "attn": {"layers": [1], "num_heads": 2, "num_kv_heads": 1, "rope_theta": 10000.0},
              "lower_bound": -5.0})
write("tokenizer", {"added_tokens": [{"id": 4, "content": "<|end|>", "special": True}],
                    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                        {"type": "Digits", "individual_digits": True},
                        {"type": "ByteLevel", "add_prefix_space": False}]},
                    "model": {"type": "BPE", "vocab": {"H": 0, "i": 1, "Hi": 2, "\u0120": 3, "1": 5, "2": 6},
                              "merges": [["H", "i"]]}})
PY

cd "${work}"
for target in safetensors gguf json; do
  case "${target}" in
    safetensors) dirs=(corpus seeds) ;;
    *) dirs=("${target}_corpus" "${target}_seeds") ;;
  esac
  echo "run_fuzz.sh: fuzzing ${target} for at most ${runs} runs / ${max_seconds} s"
  "./${target}_fuzz" -runs="${runs}" -max_total_time="${max_seconds}" -max_len=4096 -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 "${dirs[@]}" 2>&1 | tail -n 8
done
echo "run_fuzz.sh: no crash in the bounded sessions"
