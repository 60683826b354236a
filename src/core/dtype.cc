// Element-type names and the f16 conversions (see dtype.h for the rounding rules).
#include "splice/core/dtype.h"

#include <cmath>

#include "splice/core/error.h"

namespace splice {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 4;
    case DType::f16:
      return 2;
    case DType::bf16:
      return 2;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::boolean:
      return 1;
  }
  SPLICE_INTERNAL_CHECK(false, "unknown dtype ", static_cast<int>(dtype));
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "f32";
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::boolean:
      return "bool";
  }
  return "?";
}

DType parse_dtype(const std::string& name, const char* what) {
  if (name == "f32" || name == "float32" || name == "F32") return DType::f32;
  if (name == "f16" || name == "float16" || name == "F16") return DType::f16;
  if (name == "bf16" || name == "bfloat16" || name == "BF16") return DType::bf16;
  if (name == "i32" || name == "int32" || name == "I32") return DType::i32;
  if (name == "i64" || name == "int64" || name == "I64") return DType::i64;
  if (name == "bool" || name == "BOOL") return DType::boolean;
  fail<ValueError>("`", what, "` must be one of f32, f16, bf16, i32, i64, bool; got '", name, "'");
}

std::uint16_t f32_to_f16_bits(float value) {
  const std::uint32_t bits = f32_bits(value);
  const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u)
    return sign | 0x7E00u | static_cast<std::uint16_t>((abs_bits >> 13) & 0x3FFu);
  if (abs_bits >= 0x477FF000u) return sign | 0x7C00u;  // rounds to >= 65520: inf
  const int exponent = static_cast<int>(abs_bits >> 23) - 127;
  if (exponent >= -14) {
    // Normal f16: keep 10 mantissa bits, round half to even on the 13 dropped bits.
    std::uint32_t mantissa = abs_bits & 0x7FFFFFu;
    std::uint32_t half = (static_cast<std::uint32_t>(exponent + 15) << 10) | (mantissa >> 13);
    const std::uint32_t dropped = mantissa & 0x1FFFu;
    if (dropped > 0x1000u || (dropped == 0x1000u && (half & 1u))) ++half;  // may carry to exponent
    return sign | static_cast<std::uint16_t>(half);
  }
  if (exponent < -25) return sign;  // below half the smallest subnormal: zero
  // Subnormal f16: value = m * 2^-24 with m = full mantissa (implicit bit set) >> shift.
  const std::uint32_t full = (abs_bits & 0x7FFFFFu) | 0x800000u;
  const int shift = -exponent - 14 + 13;  // 14..24
  std::uint32_t half = full >> shift;
  const std::uint32_t dropped = full & ((1u << shift) - 1u);
  const std::uint32_t halfway = 1u << (shift - 1);
  if (dropped > halfway || (dropped == halfway && (half & 1u))) ++half;
  return sign | static_cast<std::uint16_t>(half);
}

float f16_bits_to_f32(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1Fu;
  const std::uint32_t mantissa = bits & 0x3FFu;
  if (exponent == 0x1F) return f32_from_bits(sign | 0x7F800000u | (mantissa << 13));
  if (exponent != 0) return f32_from_bits(sign | ((exponent + 112) << 23) | (mantissa << 13));
  if (mantissa == 0) return f32_from_bits(sign);
  const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  return sign ? -magnitude : magnitude;
}

double load_as_double(const void* data, DType dtype, std::int64_t index) {
  switch (dtype) {
    case DType::f32:
      return static_cast<const float*>(data)[index];
    case DType::f16:
      return f16_bits_to_f32(static_cast<const std::uint16_t*>(data)[index]);
    case DType::bf16:
      return bf16_bits_to_f32(static_cast<const std::uint16_t*>(data)[index]);
    case DType::i32:
      return static_cast<const std::int32_t*>(data)[index];
    case DType::i64:
      return static_cast<double>(static_cast<const std::int64_t*>(data)[index]);
    case DType::boolean:
      return static_cast<const std::uint8_t*>(data)[index] ? 1.0 : 0.0;
  }
  return 0.0;
}

void store_from_double(void* data, DType dtype, std::int64_t index, double value) {
  switch (dtype) {
    case DType::f32:
      static_cast<float*>(data)[index] = static_cast<float>(value);
      return;
    case DType::f16:
      static_cast<std::uint16_t*>(data)[index] = f32_to_f16_bits(static_cast<float>(value));
      return;
    case DType::bf16:
      static_cast<std::uint16_t*>(data)[index] = f32_to_bf16_bits(static_cast<float>(value));
      return;
    case DType::i32:
      static_cast<std::int32_t*>(data)[index] = saturate_cast<std::int32_t>(value);
      return;
    case DType::i64:
      static_cast<std::int64_t*>(data)[index] = saturate_cast<std::int64_t>(value);
      return;
    case DType::boolean:
      static_cast<std::uint8_t*>(data)[index] = value != 0.0;
      return;
  }
}

}  // namespace splice
