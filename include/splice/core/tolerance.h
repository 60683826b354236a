// splice/core/tolerance.h: the written tolerance policy, one place for every comparison.
//
// Copies and cache writes are compared bit for bit. Everything else passes when, element-wise,
// |actual - expected| <= atol + rtol * |expected|, with (atol, rtol) chosen by the dtype the result
// is stored in (and loosened by a kernel contract where its math rounds more). NaN never passes
// unless both sides are NaN at the same place and `nan_equal` is set. A report names the max abs
// error, the max rel error, the worst index (multi-index) and both values there.
#pragma once

#include <cstdint>
#include <string>

#include "splice/core/tensor.h"

namespace splice {

struct Tolerance {
  double atol = 0.0;
  double rtol = 0.0;
};

// Default tolerance for results stored in `dtype` and accumulated in fp32:
//   f32: atol 1e-5, rtol 1e-4    f16: atol 1e-3, rtol 4e-3    bf16: atol 8e-3, rtol 1.6e-2
// (bf16 has 8 mantissa bits: one rounding is 2^-9 relative; the bound allows two roundings plus
// fp32 reassociation). Integers and bool: exact.
Tolerance default_tolerance(DType dtype);

struct CompareReport {
  bool ok = true;
  std::int64_t count = 0;       // elements compared
  std::int64_t mismatches = 0;  // elements outside the tolerance
  double max_abs_error = 0.0;
  double max_rel_error = 0.0;
  Dims worst_index;  // where |a-e| - (atol + rtol|e|) is largest
  double worst_actual = 0.0;
  double worst_expected = 0.0;
  std::string str() const;  // one line: ok/FAIL, max abs, max rel, worst index and values
};

// Element-wise comparison of two CPU tensors of one shape (any dtypes, read as double).
CompareReport compare_tensors(const Tensor& actual, const Tensor& expected, Tolerance tol,
                              bool nan_equal = false);
// Bit-for-bit comparison (same dtype and shape); `ok` iff every element's bits match.
CompareReport compare_bits(const Tensor& actual, const Tensor& expected);

}  // namespace splice
