// splice/model/safetensors.h: reading and writing the safetensors checkpoint format.
//
// A safetensors file is
//   [8 bytes: N, the header length, little-endian u64]
//   [N bytes: a JSON object {name: {"dtype", "shape", "data_offsets": [begin, end]}, ...,
//              optional "__metadata__": {string: string}}]
//   [the data region: each tensor's bytes, dense row-major, at data_offsets relative to its start]
//
// Reading (`SafeTensorsFile::open`):
//   1. Map the file privately (copy-on-write: the file is never modified; a caller writing into a
//      borrowed view changes only its process's private copy of that page).
//   2. Validate the frame: size >= 8, 2 <= N <= min(file size - 8, kMaxHeaderBytes).
//   3. Check JSON nesting depth by a scan (the parser must not recurse on hostile input), then
//   parse
//      the header as a JSON object.
//   4. Validate every entry: dtype among the 15 the format defines, shape of non-negative integers,
//      data_offsets [begin, end] with begin <= end <= data region size, end - begin == numel *
//      itemsize (checked without overflow), no unknown keys; `__metadata__` string -> string.
//   5. Sort the byte ranges and reject any two non-empty ranges that overlap.
// Every failure is an IoError naming the file, the tensor and the problem.
//
// Tensors: `tensor(name)` is a zero-copy view sharing the mapping (the mapping lives until the last
// view and the file object are gone) for dtypes splice has (F32, F16, BF16, I32, I64, BOOL), and a
// copy when the tensor's byte offset is not a multiple of its item size. `tensor_as(name, dtype)`
// converts every format dtype (also F64, I8, U8, I16, U16, U32, U64, F8_E4M3, F8_E5M2) into a
// dense copy of a splice dtype.
//
// Writing (`save_safetensors`): the header (keys sorted, padded with spaces to a multiple of 8
// bytes) then every tensor dense row-major in the order given, written to a temporary file in the
// destination's directory, flushed, then renamed over the destination: a failed write never leaves
// a partial file at `path`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "splice/core/tensor.h"

namespace splice {

// The header may be at most this large (the reference implementation's limit).
inline constexpr std::uint64_t kSafeTensorsMaxHeaderBytes = 100'000'000;

// The element types the safetensors format defines, by their header spelling.
enum class SafeTensorsDType : std::uint8_t {
  BOOL,
  U8,
  I8,
  I16,
  U16,
  F16,
  BF16,
  I32,
  U32,
  F32,
  F64,
  I64,
  U64,
  F8_E4M3,
  F8_E5M2
};

std::size_t safetensors_dtype_size(SafeTensorsDType dtype);
// The splice dtype a format dtype is stored as without conversion, if there is one.
bool safetensors_native_dtype(SafeTensorsDType dtype, DType* out);
// The format spelling of a splice dtype ("F32", "BF16", "BOOL", ...).
const char* safetensors_name_of(DType dtype);

struct SafeTensorInfo {
  std::string name;
  std::string dtype_name;  // as spelled in the header, e.g. "BF16"
  SafeTensorsDType dtype = SafeTensorsDType::F32;
  Dims shape;               // row-major
  std::uint64_t begin = 0;  // byte range [begin, end) relative to the data region
  std::uint64_t end = 0;
  std::uint64_t file_offset = 0;  // absolute byte offset of `begin` in the file
  std::int64_t numel() const;
};

class SafeTensorsFile {
 public:
  // Maps and validates `path`; throws IoError on any problem.
  static SafeTensorsFile open(const std::string& path);
  // Validates an in-memory image of a file (copied into owned memory), named `name` in errors.
  // The fuzzer's entry point.
  static SafeTensorsFile parse(const void* data, std::size_t size,
                               const std::string& name = "<memory>");

  const std::string& path() const { return path_; }
  // Tensor names in data order (ascending byte offset, then name).
  const std::vector<std::string>& names() const { return names_; }
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  // Throws IoError naming the file when `name` is absent.
  const SafeTensorInfo& info(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  std::size_t file_size() const { return size_; }

  // Zero-copy view of a tensor whose dtype splice has; DTypeError for other dtypes.
  Tensor tensor(const std::string& name) const;
  // A dense copy converted to `dtype`. Any format dtype converts to f32/f16/bf16 (rounding to
  // nearest even) and to bool (nonzero); integer and bool dtypes convert to i32/i64, failing with
  // ValueError on a value out of range; floating dtypes never convert to integers (DTypeError).
  Tensor tensor_as(const std::string& name, DType dtype) const;

 private:
  void index_from(const std::uint8_t* base, std::size_t size);

  std::string path_;
  std::shared_ptr<Storage> mapping_;  // the whole file; byte 0 is the header length
  std::size_t size_ = 0;
  std::vector<std::string> names_;
  std::map<std::string, SafeTensorInfo> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` (any device, any strides; written dense row-major) and `metadata` to `path`
// atomically. Throws ValueError for an empty, duplicate or reserved (`__metadata__`) name and
// IoError when the file cannot be written.
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace splice
