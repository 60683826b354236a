// Shared test helpers: random tensors, padded layouts and tolerance assertions.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>

#include "splice/core/random.h"
#include "splice/core/tensor.h"
#include "splice/core/tolerance.h"

namespace splice::testing {

// A CPU tensor of `shape` with N(mean, stddev) entries.
Tensor random_tensor(Rng& rng, const Dims& shape, DType dtype, double stddev = 1.0,
                     double mean = 0.0);

// A view of `shape` whose storage has `pad` extra elements on every axis's stride (so strides
// are not contiguous); the padding is filled with NaN so a kernel reading it is caught.
Tensor padded_tensor(const Dims& shape, DType dtype, std::int64_t pad);

// Asserts `actual` matches `expected` within `tol`, printing the report on failure.
::testing::AssertionResult close(const Tensor& actual, const Tensor& expected, Tolerance tol);
::testing::AssertionResult bit_equal(const Tensor& actual, const Tensor& expected);

}  // namespace splice::testing
