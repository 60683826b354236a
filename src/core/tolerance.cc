// Tolerance policy and tensor comparison reports (see tolerance.h).
#include "splice/core/tolerance.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "splice/core/error.h"

namespace splice {

Tolerance default_tolerance(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return {1e-5, 1e-4};
    case DType::f16:
      return {1e-3, 4e-3};
    case DType::bf16:
      return {8e-3, 1.6e-2};
    default:
      return {0.0, 0.0};
  }
}

static Dims unravel(std::int64_t linear, const Dims& shape) {
  Dims index(shape.size());
  for (std::size_t i = shape.size(); i-- > 0;) {
    index[i] = shape[i] ? linear % shape[i] : 0;
    linear = shape[i] ? linear / shape[i] : 0;
  }
  return index;
}

std::string CompareReport::str() const {
  std::ostringstream out;
  out << (ok ? "ok" : "FAIL") << ": " << mismatches << "/" << count
      << " outside tolerance, max abs err " << max_abs_error << ", max rel err " << max_rel_error;
  if (!worst_index.empty() || count > 0)
    out << ", worst at " << dims_str(worst_index) << " (actual " << worst_actual << ", expected "
        << worst_expected << ")";
  return out.str();
}

CompareReport compare_tensors(const Tensor& actual, const Tensor& expected, Tolerance tol,
                              bool nan_equal) {
  if (actual.shape() != expected.shape())
    fail<ShapeError>("compare: actual shape ", dims_str(actual.shape()), " != expected shape ",
                     dims_str(expected.shape()));
  CompareReport report;
  report.count = actual.numel();
  double worst_excess = -1.0;
  const void* actual_data = actual.storage() ? actual.storage()->data : nullptr;
  const void* expected_data = expected.storage() ? expected.storage()->data : nullptr;
  std::int64_t i = 0;  // the row-major position
  for_each_offset(
      [&](std::int64_t actual_at, std::int64_t expected_at) {
        const double a = load_as_double(actual_data, actual.dtype(), actual_at);
        const double e = load_as_double(expected_data, expected.dtype(), expected_at);
        double excess;
        if (std::isnan(a) || std::isnan(e)) {
          excess = (nan_equal && std::isnan(a) && std::isnan(e)) ? -1.0 : INFINITY;
        } else if (std::isinf(a) || std::isinf(e)) {
          excess = (a == e) ? -1.0 : INFINITY;
        } else {
          const double abs_err = std::fabs(a - e);
          const double rel_err = abs_err / std::max(std::fabs(e), 1e-30);
          report.max_abs_error = std::max(report.max_abs_error, abs_err);
          if (std::fabs(e) > tol.atol)
            report.max_rel_error = std::max(report.max_rel_error, rel_err);
          excess = abs_err - (tol.atol + tol.rtol * std::fabs(e));
        }
        if (excess > 0) {
          ++report.mismatches;
          if (std::isinf(excess)) report.max_abs_error = INFINITY;
        }
        if (excess > worst_excess) {
          worst_excess = excess;
          report.worst_index = unravel(i, actual.shape());
          report.worst_actual = a;
          report.worst_expected = e;
        }
        ++i;
      },
      actual, expected);
  report.ok = report.mismatches == 0;
  return report;
}

CompareReport compare_bits(const Tensor& actual, const Tensor& expected) {
  if (actual.shape() != expected.shape() || actual.dtype() != expected.dtype())
    fail<ShapeError>("compare_bits: ", actual.describe(), " vs ", expected.describe());
  CompareReport report;
  report.count = actual.numel();
  const std::size_t es = dtype_size(actual.dtype());
  const char* a = static_cast<const char*>(actual.storage()->data);
  const char* e = static_cast<const char*>(expected.storage()->data);
  std::int64_t i = 0;  // the row-major position
  for_each_offset(
      [&](std::int64_t actual_at, std::int64_t expected_at) {
        if (std::memcmp(a + actual_at * es, e + expected_at * es, es) != 0 &&
            report.mismatches++ == 0) {
          report.worst_index = unravel(i, actual.shape());
          report.worst_actual = load_as_double(a, actual.dtype(), actual_at);
          report.worst_expected = load_as_double(e, expected.dtype(), expected_at);
        }
        ++i;
      },
      actual, expected);
  report.ok = report.mismatches == 0;
  return report;
}

}  // namespace splice
