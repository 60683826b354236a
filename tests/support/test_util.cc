// Shared test helpers (see test_util.h).
#include "support/test_util.h"

#include <algorithm>
#include <cmath>

namespace splice::testing {

Tensor random_tensor(Rng& rng, const Dims& shape, DType dtype, double stddev, double mean) {
  Tensor t = Tensor::empty(shape, dtype);
  rng.normal(t, mean, stddev);
  return t;
}

Tensor padded_tensor(const Dims& shape, DType dtype, std::int64_t pad) {
  Dims padded = shape;
  for (auto& d : padded) d += pad;
  if (!padded.empty()) padded.back() = shape.back();  // keep the innermost axis unit-stride
  Tensor base = Tensor::empty(padded, dtype);
  poison_nan(base);
  Tensor view = base;
  for (std::size_t axis = 0; axis < shape.size(); ++axis)
    view = view.slice(static_cast<std::int64_t>(axis), 0, shape[axis]);
  return view;
}

::testing::AssertionResult close(const Tensor& actual, const Tensor& expected, Tolerance tol) {
  const CompareReport report = compare_tensors(actual, expected, tol);
  if (report.ok) return ::testing::AssertionSuccess() << report.str();
  return ::testing::AssertionFailure() << report.str();
}

Tolerance bf16_logit_tolerance(const Tensor& expected, double ulps) {
  double largest = 0;
  for (std::int64_t i = 0; i < expected.numel(); ++i)
    largest = std::max(largest, std::abs(expected.at_linear(i)));
  const double ulp = std::ldexp(1.0, std::ilogb(std::max(largest, 1.0)) - 7);  // bf16: 8 bits
  return {ulps * ulp, 0.02};
}

::testing::AssertionResult bit_equal(const Tensor& actual, const Tensor& expected) {
  const CompareReport report = compare_bits(actual, expected);
  if (report.ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "bits differ: " << report.str();
}

}  // namespace splice::testing
