// splice/core/dtype.h: element types and their conversions.
//
// Six element types: f32, f16, bf16, i32, i64, bool. The 16-bit floats are stored as raw bits
// (`Half`, `BFloat16`) and converted to and from f32 with round-to-nearest-even:
//   1. f32 -> bf16: add 0x7FFF plus the lowest kept bit to the f32 bits, keep the top 16
//      (NaN is kept quiet, never rounded into inf).
//   2. f32 -> f16: rebias the exponent from 127 to 15; values below 2^-14 become subnormals by
//      shifting the mantissa with the implicit bit, rounding half to even on the dropped bits;
//      overflow gives inf; NaN stays NaN.
//   3. bf16/f16 -> f32 is exact.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

namespace splice {

enum class DType : std::uint8_t { f32, f16, bf16, i32, i64, boolean };

inline constexpr DType kAllDTypes[] = {DType::f32, DType::f16, DType::bf16,
                                       DType::i32, DType::i64, DType::boolean};

std::size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
// Parses "f32", "float32", "bf16", "bfloat16", ...; throws ValueError naming `what` otherwise.
DType parse_dtype(const std::string& name, const char* what = "dtype");
inline bool is_floating(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16;
}

inline std::uint32_t f32_bits(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}
inline float f32_from_bits(std::uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

inline std::uint16_t f32_to_bf16_bits(float value) {
  const std::uint32_t bits = f32_bits(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  const std::uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<std::uint16_t>((bits + 0x7FFFu + lsb) >> 16);
}
inline float bf16_bits_to_f32(std::uint16_t bits) {
  return f32_from_bits(static_cast<std::uint32_t>(bits) << 16);
}

std::uint16_t f32_to_f16_bits(float value);
float f16_bits_to_f32(std::uint16_t bits);

// Storage types for the 16-bit floats: plain bits, converted explicitly.
struct BFloat16 {
  std::uint16_t bits = 0;
  BFloat16() = default;
  explicit BFloat16(float value) : bits(f32_to_bf16_bits(value)) {}
  explicit operator float() const { return bf16_bits_to_f32(bits); }
  static BFloat16 from_bits(std::uint16_t b) {
    BFloat16 v;
    v.bits = b;
    return v;
  }
};
struct Half {
  std::uint16_t bits = 0;
  Half() = default;
  explicit Half(float value) : bits(f32_to_f16_bits(value)) {}
  explicit operator float() const { return f16_bits_to_f32(bits); }
  static Half from_bits(std::uint16_t b) {
    Half v;
    v.bits = b;
    return v;
  }
};

// Rounds an f32 value to the nearest value representable in `dtype` (identity for f32).
inline float round_to(DType dtype, float value) {
  switch (dtype) {
    case DType::bf16:
      return bf16_bits_to_f32(f32_to_bf16_bits(value));
    case DType::f16:
      return f16_bits_to_f32(f32_to_f16_bits(value));
    default:
      return value;
  }
}

template <typename T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_of<Half> {
  static constexpr DType value = DType::f16;
};
template <>
struct dtype_of<BFloat16> {
  static constexpr DType value = DType::bf16;
};
template <>
struct dtype_of<std::int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct dtype_of<std::int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct dtype_of<bool> {
  static constexpr DType value = DType::boolean;
};

// Float -> integer with defined results: NaN -> 0, out-of-range values saturate, else truncation
// toward zero (C++ leaves all but the last undefined). The one rule of every float -> int store:
// the primitives' casts and stores on both backends, Tensor::set / fill / copy_from.
template <typename I, typename F>
inline I saturate_cast(F value) {
  if (!(value == value)) return 0;
  constexpr F kLo = static_cast<F>(std::numeric_limits<I>::min());
  constexpr F kHi = static_cast<F>(std::numeric_limits<I>::max());
  if (value <= kLo) return std::numeric_limits<I>::min();
  if (value >= kHi) return std::numeric_limits<I>::max();
  return static_cast<I>(value);
}

// Loads element `index` of a buffer of `dtype` as double / stores a double into it (RNE to the
// floats, saturate_cast to the integers, nonzero to bool).
double load_as_double(const void* data, DType dtype, std::int64_t index);
void store_from_double(void* data, DType dtype, std::int64_t index, double value);

}  // namespace splice
