// safetensors reader and writer (see safetensors.h for the format and the validation stages).
//
// Conversion in `tensor_as` reads each element in its format dtype as either a double (floating
// sources, and integers into floating targets) or an exact 64-bit integer (integer and bool
// sources into integer targets), then stores it in the target dtype:
//   1. F8_E4M3 (bias 7, no infinities, S.1111.111 is NaN) and F8_E5M2 (bias 15, IEEE-like) decode
//      exactly to f32; F16/BF16 decode exactly; F64 narrows with the target's rounding.
//   2. Integer targets take integer sources only, range-checked value by value.
#include "splice/model/safetensors.h"

// <fcntl.h> is avoided: under _GNU_SOURCE it declares a function named `splice`.
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "model/file_storage.h"
#include "splice/core/error.h"

namespace splice {

namespace {

using Json = nlohmann::json;

constexpr std::size_t kLengthPrefixBytes = 8;
// Header nesting: root object -> entry object -> shape/offsets array. Anything deeper is hostile.
constexpr int kMaxJsonDepth = 16;
// The smallest valid header, "{}".
constexpr std::uint64_t kMinHeaderBytes = 2;
constexpr std::size_t kHeaderAlignment = 8;  // the writer pads the header so data starts aligned
constexpr const char* kMetadataKey = "__metadata__";

struct DTypeEntry {
  SafeTensorsDType dtype;
  const char* name;
  std::size_t size;
};
constexpr DTypeEntry kDTypes[] = {
    {SafeTensorsDType::BOOL, "BOOL", 1},       {SafeTensorsDType::U8, "U8", 1},
    {SafeTensorsDType::I8, "I8", 1},           {SafeTensorsDType::I16, "I16", 2},
    {SafeTensorsDType::U16, "U16", 2},         {SafeTensorsDType::F16, "F16", 2},
    {SafeTensorsDType::BF16, "BF16", 2},       {SafeTensorsDType::I32, "I32", 4},
    {SafeTensorsDType::U32, "U32", 4},         {SafeTensorsDType::F32, "F32", 4},
    {SafeTensorsDType::F64, "F64", 8},         {SafeTensorsDType::I64, "I64", 8},
    {SafeTensorsDType::U64, "U64", 8},         {SafeTensorsDType::F8_E4M3, "F8_E4M3", 1},
    {SafeTensorsDType::F8_E5M2, "F8_E5M2", 1},
};

bool lookup_dtype(const std::string& name, SafeTensorsDType* out) {
  for (const auto& entry : kDTypes) {
    if (name == entry.name) {
      *out = entry.dtype;
      return true;
    }
  }
  return false;
}

std::string allowed_dtypes() {
  std::string out;
  for (const auto& entry : kDTypes) out += std::string(out.empty() ? "" : ", ") + entry.name;
  return out;
}

template <typename... Args>
[[noreturn]] void bad_file(const std::string& file, Args&&... args) {
  fail<IoError>(file, ": ", std::forward<Args>(args)...);
}

template <typename... Args>
[[noreturn]] void bad_tensor(const std::string& file, const std::string& tensor, Args&&... args) {
  fail<IoError>(file, ": tensor '", tensor, "': ", std::forward<Args>(args)...);
}

std::uint64_t read_le_u64(const std::uint8_t* p) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < kLengthPrefixBytes; ++i)
    value |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return value;
}

// The deepest bracket nesting outside strings, scanning at most until it exceeds kMaxJsonDepth.
int json_depth(const char* text, std::size_t size) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < size; ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"')
      in_string = true;
    else if (c == '{' || c == '[')
      deepest = std::max(deepest, ++depth);
    else if (c == '}' || c == ']')
      --depth;
    if (deepest > kMaxJsonDepth) break;
  }
  return deepest;
}

// Reads a JSON integer that must be >= 0 and fit in int64.
bool json_nonneg_int(const Json& value, std::uint64_t* out) {
  if (!value.is_number_integer()) return false;
  if (value.is_number_unsigned()) {
    *out = value.get<std::uint64_t>();
  } else {
    const std::int64_t v = value.get<std::int64_t>();
    if (v < 0) return false;
    *out = static_cast<std::uint64_t>(v);
  }
  return *out <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
}

// F8 E4M3 ("fn" variant): 1 sign, 4 exponent (bias 7), 3 mantissa; no inf; 0x7F/0xFF are NaN.
float f8_e4m3_to_f32(std::uint8_t bits) {
  constexpr int kBias = 7, kMantissaBits = 3;
  const float sign = (bits & 0x80u) ? -1.0f : 1.0f;
  const int exponent = (bits >> kMantissaBits) & 0xF;
  const int mantissa = bits & 0x7;
  if (exponent == 0xF && mantissa == 0x7) return std::numeric_limits<float>::quiet_NaN();
  if (exponent == 0)
    return sign * std::ldexp(static_cast<float>(mantissa), 1 - kBias - kMantissaBits);
  return sign * std::ldexp(static_cast<float>(mantissa + (1 << kMantissaBits)),
                           exponent - kBias - kMantissaBits);
}

// F8 E5M2: 1 sign, 5 exponent (bias 15), 2 mantissa; the top half of an f16.
float f8_e5m2_to_f32(std::uint8_t bits) {
  return f16_bits_to_f32(static_cast<std::uint16_t>(static_cast<std::uint16_t>(bits) << 8));
}

template <typename T>
T load_unaligned(const std::uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof value);
  return value;
}

bool is_integer_source(SafeTensorsDType dtype) {
  switch (dtype) {
    case SafeTensorsDType::BOOL:
    case SafeTensorsDType::U8:
    case SafeTensorsDType::I8:
    case SafeTensorsDType::I16:
    case SafeTensorsDType::U16:
    case SafeTensorsDType::I32:
    case SafeTensorsDType::U32:
    case SafeTensorsDType::I64:
    case SafeTensorsDType::U64:
      return true;
    default:
      return false;
  }
}

double load_double(const std::uint8_t* p, SafeTensorsDType dtype) {
  switch (dtype) {
    case SafeTensorsDType::BOOL:
      return *p != 0 ? 1.0 : 0.0;
    case SafeTensorsDType::U8:
      return *p;
    case SafeTensorsDType::I8:
      return static_cast<std::int8_t>(*p);
    case SafeTensorsDType::I16:
      return load_unaligned<std::int16_t>(p);
    case SafeTensorsDType::U16:
      return load_unaligned<std::uint16_t>(p);
    case SafeTensorsDType::F16:
      return f16_bits_to_f32(load_unaligned<std::uint16_t>(p));
    case SafeTensorsDType::BF16:
      return bf16_bits_to_f32(load_unaligned<std::uint16_t>(p));
    case SafeTensorsDType::I32:
      return load_unaligned<std::int32_t>(p);
    case SafeTensorsDType::U32:
      return load_unaligned<std::uint32_t>(p);
    case SafeTensorsDType::F32:
      return load_unaligned<float>(p);
    case SafeTensorsDType::F64:
      return load_unaligned<double>(p);
    case SafeTensorsDType::I64:
      return static_cast<double>(load_unaligned<std::int64_t>(p));
    case SafeTensorsDType::U64:
      return static_cast<double>(load_unaligned<std::uint64_t>(p));
    case SafeTensorsDType::F8_E4M3:
      return f8_e4m3_to_f32(*p);
    case SafeTensorsDType::F8_E5M2:
      return f8_e5m2_to_f32(*p);
  }
  return 0.0;
}

// Integer sources only. Returns false when a U64 value exceeds int64.
bool load_int(const std::uint8_t* p, SafeTensorsDType dtype, std::int64_t* out) {
  switch (dtype) {
    case SafeTensorsDType::BOOL:
      *out = *p != 0;
      return true;
    case SafeTensorsDType::U8:
      *out = *p;
      return true;
    case SafeTensorsDType::I8:
      *out = static_cast<std::int8_t>(*p);
      return true;
    case SafeTensorsDType::I16:
      *out = load_unaligned<std::int16_t>(p);
      return true;
    case SafeTensorsDType::U16:
      *out = load_unaligned<std::uint16_t>(p);
      return true;
    case SafeTensorsDType::I32:
      *out = load_unaligned<std::int32_t>(p);
      return true;
    case SafeTensorsDType::U32:
      *out = load_unaligned<std::uint32_t>(p);
      return true;
    case SafeTensorsDType::I64:
      *out = load_unaligned<std::int64_t>(p);
      return true;
    case SafeTensorsDType::U64: {
      const std::uint64_t v = load_unaligned<std::uint64_t>(p);
      if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return false;
      *out = static_cast<std::int64_t>(v);
      return true;
    }
    default:
      return false;
  }
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

std::size_t safetensors_dtype_size(SafeTensorsDType dtype) {
  for (const auto& entry : kDTypes)
    if (entry.dtype == dtype) return entry.size;
  SPLICE_INTERNAL_CHECK(false, "unknown safetensors dtype ", static_cast<int>(dtype));
}

bool safetensors_native_dtype(SafeTensorsDType dtype, DType* out) {
  switch (dtype) {
    case SafeTensorsDType::F32:
      *out = DType::f32;
      return true;
    case SafeTensorsDType::F16:
      *out = DType::f16;
      return true;
    case SafeTensorsDType::BF16:
      *out = DType::bf16;
      return true;
    case SafeTensorsDType::I32:
      *out = DType::i32;
      return true;
    case SafeTensorsDType::I64:
      *out = DType::i64;
      return true;
    case SafeTensorsDType::BOOL:
      *out = DType::boolean;
      return true;
    default:
      return false;
  }
}

const char* safetensors_name_of(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "F32";
    case DType::f16:
      return "F16";
    case DType::bf16:
      return "BF16";
    case DType::i32:
      return "I32";
    case DType::i64:
      return "I64";
    case DType::boolean:
      return "BOOL";
  }
  return "?";
}

std::int64_t SafeTensorInfo::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

SafeTensorsFile SafeTensorsFile::open(const std::string& path) {
  SafeTensorsFile file;
  file.path_ = path;
  file.mapping_ = map_file(path, kLengthPrefixBytes, [](std::size_t size) {
    return "file is " + std::to_string(size) + " bytes, shorter than the 8-byte header length";
  });
  file.size_ = file.mapping_->bytes;
  file.index_from(static_cast<const std::uint8_t*>(file.mapping_->data), file.size_);
  return file;
}

SafeTensorsFile SafeTensorsFile::parse(const void* data, std::size_t size,
                                       const std::string& name) {
  SafeTensorsFile file;
  file.path_ = name;
  file.size_ = size;
  file.mapping_ = host_buffer(size);
  if (size) std::memcpy(file.mapping_->data, data, size);
  if (size < kLengthPrefixBytes)
    bad_file(name, "file is ", size, " bytes, shorter than the 8-byte header length");
  file.index_from(static_cast<const std::uint8_t*>(file.mapping_->data), size);
  return file;
}

void SafeTensorsFile::index_from(const std::uint8_t* base, std::size_t size) {
  const std::string& file = path_;
  // Stage 2: the frame.
  const std::uint64_t header_len = read_le_u64(base);
  const std::uint64_t room = size - kLengthPrefixBytes;
  if (header_len > room)
    bad_file(file, "header length ", header_len, " runs past the end of the file (", room,
             " bytes follow the length); the file is truncated or not safetensors");
  if (header_len > kSafeTensorsMaxHeaderBytes)
    bad_file(file, "header length ", header_len, " exceeds the limit of ",
             kSafeTensorsMaxHeaderBytes, " bytes");
  if (header_len < kMinHeaderBytes)
    bad_file(file, "header length ", header_len, " is too small for a JSON object");
  const char* text = reinterpret_cast<const char*>(base + kLengthPrefixBytes);
  const std::uint64_t data_start = kLengthPrefixBytes + header_len;
  const std::uint64_t data_size = size - data_start;

  // Stage 3: the JSON.
  if (json_depth(text, header_len) > kMaxJsonDepth)
    bad_file(file, "header JSON nests deeper than ", kMaxJsonDepth, " levels");
  Json header;
  try {
    header = Json::parse(text, text + header_len);
  } catch (const Json::exception& e) {
    bad_file(file, "header is not valid JSON: ", e.what());
  }
  if (!header.is_object()) bad_file(file, "header must be a JSON object, got ", header.type_name());

  // Stage 4: the entries.
  std::vector<SafeTensorInfo> infos;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& key = it.key();
    const Json& value = it.value();
    if (key == kMetadataKey) {
      if (!value.is_object())
        bad_file(file, "`__metadata__` must be an object of strings, got ", value.type_name());
      for (auto m = value.begin(); m != value.end(); ++m) {
        if (!m.value().is_string())
          bad_file(file, "`__metadata__` value of '", m.key(), "' must be a string, got ",
                   m.value().type_name());
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!value.is_object())
      bad_tensor(file, key, "entry must be an object, got ", value.type_name());
    for (auto field = value.begin(); field != value.end(); ++field) {
      if (field.key() != "dtype" && field.key() != "shape" && field.key() != "data_offsets")
        bad_tensor(file, key, "unknown field '", field.key(),
                   "' (allowed: dtype, shape, data_offsets)");
    }
    SafeTensorInfo info;
    info.name = key;
    // dtype
    if (!value.contains("dtype")) bad_tensor(file, key, "missing `dtype`");
    if (!value["dtype"].is_string())
      bad_tensor(file, key, "`dtype` must be a string, got ", value["dtype"].type_name());
    info.dtype_name = value["dtype"].get<std::string>();
    if (!lookup_dtype(info.dtype_name, &info.dtype))
      bad_tensor(file, key, "unknown dtype '", info.dtype_name, "' (allowed: ", allowed_dtypes(),
                 ")");
    // shape
    if (!value.contains("shape")) bad_tensor(file, key, "missing `shape`");
    const Json& shape = value["shape"];
    if (!shape.is_array())
      bad_tensor(file, key, "`shape` must be an array, got ", shape.type_name());
    std::uint64_t numel = 1;
    bool numel_overflow = false;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      std::uint64_t extent = 0;
      if (!json_nonneg_int(shape[d], &extent))
        bad_tensor(file, key, "`shape` entries must be non-negative integers, got ", shape.dump());
      info.shape.push_back(static_cast<std::int64_t>(extent));
      if (__builtin_mul_overflow(numel, extent, &numel)) numel_overflow = true;
    }
    // Tensor code multiplies extents in int64 in any order: the product of the non-zero extents
    // must fit, or an empty tensor like [2^40, 2^40, 0] would overflow there.
    std::int64_t nonzero_product = 1;
    for (auto extent : info.shape)
      if (extent != 0 && __builtin_mul_overflow(nonzero_product, extent, &nonzero_product))
        bad_tensor(file, key, "`shape` ", shape.dump(), " overflows a 64-bit element count");
    const std::size_t itemsize = safetensors_dtype_size(info.dtype);
    std::uint64_t nbytes = 0;
    if (!numel_overflow && numel != 0 && __builtin_mul_overflow(numel, itemsize, &nbytes))
      numel_overflow = true;
    if (numel == 0) nbytes = 0;
    // data_offsets
    if (!value.contains("data_offsets")) bad_tensor(file, key, "missing `data_offsets`");
    const Json& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2)
      bad_tensor(file, key, "`data_offsets` must be [begin, end], got ", offsets.dump());
    if (!json_nonneg_int(offsets[0], &info.begin) || !json_nonneg_int(offsets[1], &info.end))
      bad_tensor(file, key, "`data_offsets` must be non-negative integers, got ", offsets.dump());
    if (info.begin > info.end)
      bad_tensor(file, key, "`data_offsets` begin ", info.begin, " is past end ", info.end);
    if (info.end > data_size)
      bad_tensor(file, key, "`data_offsets` end ", info.end,
                 " is past the end of the data region (", data_size,
                 " bytes); the file is truncated or the offsets are wrong");
    if (numel_overflow || nbytes != info.end - info.begin)
      bad_tensor(file, key, "byte size ", info.end - info.begin,
                 " from `data_offsets` does not match ", info.dtype_name, dims_str(info.shape),
                 " = ", numel_overflow ? std::string("(overflow)") : std::to_string(nbytes),
                 " bytes");
    info.file_offset = data_start + info.begin;
    infos.push_back(std::move(info));
  }

  // Stage 5: no overlaps. Empty ranges hold no bytes and overlap nothing.
  std::sort(infos.begin(), infos.end(), [](const SafeTensorInfo& a, const SafeTensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.name < b.name;
  });
  const SafeTensorInfo* previous = nullptr;
  for (const auto& info : infos) {
    if (info.begin == info.end) continue;
    if (previous && info.begin < previous->end)
      bad_tensor(file, info.name, "bytes [", info.begin, ", ", info.end, ") overlap tensor '",
                 previous->name, "' at [", previous->begin, ", ", previous->end, ")");
    previous = &info;
  }
  for (auto& info : infos) {
    names_.push_back(info.name);
    index_.emplace(info.name, std::move(info));
  }
}

const SafeTensorInfo& SafeTensorsFile::info(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) bad_file(path_, "no tensor named '", name, "'");
  return it->second;
}

Tensor SafeTensorsFile::tensor(const std::string& name) const {
  const SafeTensorInfo& meta = info(name);
  DType dtype;
  if (!safetensors_native_dtype(meta.dtype, &dtype))
    fail<DTypeError>(path_, ": tensor '", name, "' has dtype ", meta.dtype_name,
                     ", which splice stores only by conversion; use tensor_as(name, dtype)");
  const std::size_t itemsize = dtype_size(dtype);
  if (meta.file_offset % itemsize != 0) {
    // Misaligned for an element offset into the mapping: hand back an aligned copy.
    Tensor copy = Tensor::empty(meta.shape, dtype);
    if (copy.nbytes())
      std::memcpy(copy.raw_data(),
                  static_cast<const std::uint8_t*>(mapping_->data) + meta.file_offset,
                  copy.nbytes());
    return copy;
  }
  return Tensor::view_of(mapping_, static_cast<std::int64_t>(meta.file_offset / itemsize),
                         meta.shape, Tensor::contiguous_strides(meta.shape), dtype);
}

Tensor SafeTensorsFile::tensor_as(const std::string& name, DType dtype) const {
  const SafeTensorInfo& meta = info(name);
  DType native;
  if (safetensors_native_dtype(meta.dtype, &native) && native == dtype) return tensor(name).clone();
  Tensor out = Tensor::empty(meta.shape, dtype);
  const std::uint8_t* src = static_cast<const std::uint8_t*>(mapping_->data) + meta.file_offset;
  const std::size_t itemsize = safetensors_dtype_size(meta.dtype);
  const std::int64_t n = meta.numel();
  void* dst = out.raw_data();
  if (dtype == DType::i32 || dtype == DType::i64) {
    if (!is_integer_source(meta.dtype))
      fail<DTypeError>(path_, ": tensor '", name, "' has floating dtype ", meta.dtype_name,
                       ", which does not convert to ", dtype_name(dtype));
    for (std::int64_t i = 0; i < n; ++i) {
      std::int64_t v = 0;
      const bool fits = load_int(src + i * itemsize, meta.dtype, &v) &&
                        (dtype == DType::i64 || (v >= std::numeric_limits<std::int32_t>::min() &&
                                                 v <= std::numeric_limits<std::int32_t>::max()));
      if (!fits)
        fail<ValueError>(path_, ": tensor '", name, "' element ", i, " does not fit in ",
                         dtype_name(dtype));
      if (dtype == DType::i32)
        static_cast<std::int32_t*>(dst)[i] = static_cast<std::int32_t>(v);
      else
        static_cast<std::int64_t*>(dst)[i] = v;
    }
    return out;
  }
  for (std::int64_t i = 0; i < n; ++i) {
    const double v = load_double(src + i * itemsize, meta.dtype);
    switch (dtype) {
      case DType::f32:
        static_cast<float*>(dst)[i] = static_cast<float>(v);
        break;
      case DType::f16:
        static_cast<std::uint16_t*>(dst)[i] = f32_to_f16_bits(static_cast<float>(v));
        break;
      case DType::bf16:
        static_cast<std::uint16_t*>(dst)[i] = f32_to_bf16_bits(static_cast<float>(v));
        break;
      case DType::boolean:
        static_cast<std::uint8_t*>(dst)[i] = v != 0.0 ? 1 : 0;
        break;
      default:
        SPLICE_INTERNAL_CHECK(false, "unhandled target dtype ", dtype_name(dtype));
    }
  }
  return out;
}

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // 1. Validate names and gather dense host copies in the caller's order.
  std::set<std::string> seen;
  std::vector<Tensor> dense;
  Json header = Json::object();
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name.empty())
      fail<ValueError>("save_safetensors(", path, "): tensor names must be non-empty");
    if (name == kMetadataKey)
      fail<ValueError>("save_safetensors(", path, "): tensor name '", name, "' is reserved");
    if (!seen.insert(name).second)
      fail<ValueError>("save_safetensors(", path, "): duplicate tensor name '", name, "'");
    check_defined(t, name.c_str());
    Tensor host = t.device().is_cpu() ? t : t.to_device(Device::cpu());
    if (!host.is_contiguous() || host.offset() != 0) host = host.contiguous();
    const std::uint64_t nbytes = host.nbytes();
    header[name] = {{"dtype", safetensors_name_of(host.dtype())},
                    {"shape", host.shape()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    dense.push_back(std::move(host));
  }
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::string text = header.dump();
  text.append((kHeaderAlignment - text.size() % kHeaderAlignment) % kHeaderAlignment, ' ');

  // 2. Write a temporary file beside the destination, then rename it over the destination.
  std::string tmp = path + ".tmp.XXXXXX";
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) fail<IoError>(path, ": cannot create a temporary file beside it: ", errno_text());
  auto write_all = [&](const void* data, std::size_t bytes) {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t written = ::write(fd, p, bytes);
      if (written < 0 && errno == EINTR) continue;
      if (written <= 0) return false;
      p += written;
      bytes -= static_cast<std::size_t>(written);
    }
    return true;
  };
  std::uint8_t prefix[kLengthPrefixBytes];
  const std::uint64_t header_len = text.size();
  for (std::size_t i = 0; i < kLengthPrefixBytes; ++i)
    prefix[i] = static_cast<std::uint8_t>(header_len >> (8 * i));
  bool ok = write_all(prefix, sizeof prefix) && write_all(text.data(), text.size());
  for (const auto& t : dense) ok = ok && write_all(t.raw_data(), t.nbytes());
  ok = ok && ::fsync(fd) == 0;
  const std::string why = errno_text();
  ok = (::close(fd) == 0) && ok;
  if (!ok) {
    ::unlink(tmp.c_str());
    fail<IoError>(path, ": writing failed: ", why);
  }
  // mkstemp creates 0600; a checkpoint should be readable like any file the user writes.
  const mode_t mask = ::umask(0);
  ::umask(mask);
  ::chmod(tmp.c_str(), 0666 & ~mask);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string rename_why = errno_text();
    ::unlink(tmp.c_str());
    fail<IoError>(path, ": cannot rename the temporary file into place: ", rename_why);
  }
}

}  // namespace splice
