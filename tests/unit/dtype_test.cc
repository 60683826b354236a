// DType conversions: every one of the 65,536 bf16 and f16 bit patterns round-trips through f32,
// NaN stays NaN, infinities and signed zeros survive, subnormals are exact; f32 -> 16-bit rounds
// to nearest even (checked against a float64 oracle of the representable neighbours).
#include "splice/core/dtype.h"

#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "splice/core/error.h"

namespace splice {
namespace {

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_EQ(dtype_size(DType::i32), 4u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_EQ(dtype_size(DType::boolean), 1u);
  for (DType d : kAllDTypes) EXPECT_EQ(parse_dtype(dtype_name(d)), d);
  EXPECT_THROW(parse_dtype("f8"), ValueError);
}

TEST(DType, Bf16AllBitPatternsRoundTrip) {
  int nans = 0, infs = 0, subnormals = 0;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float f = bf16_bits_to_f32(bits);
    if (std::isnan(f)) {
      ++nans;
      EXPECT_TRUE(std::isnan(bf16_bits_to_f32(f32_to_bf16_bits(f))));
      continue;
    }
    if (std::isinf(f)) ++infs;
    if (f != 0 && std::fpclassify(f) == FP_SUBNORMAL) ++subnormals;
    EXPECT_EQ(f32_to_bf16_bits(f), bits) << "bits " << b;
  }
  EXPECT_EQ(nans, 2 * 127);
  EXPECT_EQ(infs, 2);
  EXPECT_EQ(subnormals, 2 * 127);
}

TEST(DType, F16AllBitPatternsRoundTrip) {
  int nans = 0, infs = 0, subnormals = 0;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float f = f16_bits_to_f32(bits);
    const std::uint32_t exponent = (b >> 10) & 0x1F, mantissa = b & 0x3FF;
    if (exponent == 0x1F && mantissa) {
      ++nans;
      EXPECT_TRUE(std::isnan(f));
      EXPECT_TRUE(std::isnan(f16_bits_to_f32(f32_to_f16_bits(f))));
      continue;
    }
    if (exponent == 0x1F) ++infs;
    if (exponent == 0 && mantissa) {
      ++subnormals;
      // Subnormal value is exactly mantissa * 2^-24.
      EXPECT_EQ(std::fabs(f), std::ldexp(static_cast<float>(mantissa), -24));
    }
    EXPECT_EQ(f32_to_f16_bits(f), bits) << "bits " << b;
  }
  EXPECT_EQ(nans, 2 * 1023);
  EXPECT_EQ(infs, 2);
  EXPECT_EQ(subnormals, 2 * 1023);
}

// Float64 oracle: the nearest of the two representable neighbours, ties to the even bit pattern.
template <typename ToF32>
std::uint16_t nearest_even(double x, std::uint16_t lo_bits, std::uint16_t hi_bits, ToF32 to_f32) {
  const double lo = to_f32(lo_bits), hi = to_f32(hi_bits);
  const double dlo = std::fabs(x - lo), dhi = std::fabs(hi - x);
  if (dlo < dhi) return lo_bits;
  if (dhi < dlo) return hi_bits;
  return (lo_bits & 1) ? hi_bits : lo_bits;
}

TEST(DType, RoundsToNearestEven) {
  std::mt19937 gen(7);
  std::uniform_int_distribution<std::uint32_t> pattern(0, 0xFFFE);
  std::uniform_real_distribution<double> frac(0.0, 1.0);
  for (int i = 0; i < 200000; ++i) {
    // bf16: pick adjacent positive finite patterns, a point between them (halfway included).
    std::uint16_t lo = static_cast<std::uint16_t>(pattern(gen) & 0x7F7E);
    std::uint16_t hi = lo + 1;
    double t = (i % 10 == 0) ? 0.5 : frac(gen);
    double x = bf16_bits_to_f32(lo) + t * (bf16_bits_to_f32(hi) - bf16_bits_to_f32(lo));
    float xf = static_cast<float>(x);
    EXPECT_EQ(f32_to_bf16_bits(xf), nearest_even(xf, lo, hi, [](std::uint16_t b) {
                return double(bf16_bits_to_f32(b));
              }));
    // f16 (finite, below the largest value).
    std::uint16_t flo = static_cast<std::uint16_t>(pattern(gen) % 0x7BFF);
    std::uint16_t fhi = flo + 1;
    double fx = f16_bits_to_f32(flo) + t * (f16_bits_to_f32(fhi) - f16_bits_to_f32(flo));
    float fxf = static_cast<float>(fx);
    EXPECT_EQ(
        f32_to_f16_bits(fxf),
        nearest_even(fxf, flo, fhi, [](std::uint16_t b) { return double(f16_bits_to_f32(b)); }))
        << "x=" << fxf << " lo=" << flo;
  }
  EXPECT_EQ(f32_to_f16_bits(65520.0f), 0x7C00);  // rounds up to inf
  EXPECT_EQ(f32_to_f16_bits(65519.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1.0f, -25)),
            0x0000);  // halfway to the first subnormal: even
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(f32_to_bf16_bits(INFINITY), 0x7F80);
  EXPECT_EQ(f32_to_bf16_bits(-0.0f), 0x8000);
}

// Every float -> integer store has a defined result (session 51: UBSan's float-cast-overflow
// found Tensor::fill / poison_nan storing NaN into integer tensors by a plain cast): NaN -> 0,
// saturation outside the range, truncation toward zero inside; the primitives' rule.
TEST(DType, FloatToIntegerStoresSaturate) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  std::int32_t i32 = 7;
  std::int64_t i64 = 7;
  const struct {
    double value;
    std::int32_t as_i32;
    std::int64_t as_i64;
  } cases[] = {
      {nan, 0, 0},
      {-nan, 0, 0},
      {inf, INT32_MAX, INT64_MAX},
      {-inf, INT32_MIN, INT64_MIN},
      {1e30, INT32_MAX, INT64_MAX},
      {-1e30, INT32_MIN, INT64_MIN},
      {2147483647.9, INT32_MAX, 2147483647},
      {2147483648.0, INT32_MAX, 2147483648LL},
      {-2147483649.0, INT32_MIN, -2147483649LL},
      {9223372036854775807.0, INT32_MAX, INT64_MAX},  // 2^63 as a double
      {-9223372036854775808.0, INT32_MIN, INT64_MIN},
      {-2.7, -2, -2},
      {2.7, 2, 2},
      {-0.0, 0, 0},
  };
  for (const auto& c : cases) {
    store_from_double(&i32, DType::i32, 0, c.value);
    store_from_double(&i64, DType::i64, 0, c.value);
    EXPECT_EQ(i32, c.as_i32) << c.value;
    EXPECT_EQ(i64, c.as_i64) << c.value;
  }
  EXPECT_EQ(saturate_cast<std::int32_t>(nan), 0);
  EXPECT_EQ(saturate_cast<std::int64_t>(3.0e9f), 3000000000LL);
}

}  // namespace
}  // namespace splice
