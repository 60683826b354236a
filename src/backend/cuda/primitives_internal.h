// Internal helpers shared by the CUDA primitive sources (primitives.cu, primitives_gemm.cc).
#pragma once

#include <cstdint>

#include "splice/core/tensor.h"

namespace splice::cuda::detail {

// Axes an iteration space may keep after merging (the kernels' index arrays).
inline constexpr int kMaxDims = 6;
// Axes a tensor may have before merging (host-side stride arrays).
inline constexpr int kMaxRank = 8;

// A fresh device tensor for intermediate results; also handed to the retain_scratch sink.
Tensor scratch(const Dims& shape, DType dtype, Device device);

// Matmuls whose residual cuBLASLt's epilogue added (primitives_gemm.cc stage 1c; process-wide,
// relaxed): tests check which route a residual took.
std::uint64_t lt_residual_epilogues();

}  // namespace splice::cuda::detail
