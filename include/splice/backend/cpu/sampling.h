// splice/backend/cpu/sampling.h: greedy sampling on the CPU, the oracle of the CUDA argmax
// (include/splice/backend/cuda/sampling.h).
//
// The greedy rule is the decode loop's (Sampler with temperature 0, model/generate.h), stated
// once here and matched bit for bit by the CUDA kernel: std::max_element over the row read as
// f32 (exact for f16 and bf16), i.e.
//   best = 0;  for j = 1 .. vocab-1:  if (x[best] < x[j]) best = j
// so
//   - ties go to the lowest index (-0.0 and +0.0 tie: they compare equal);
//   - a NaN at j > 0 never wins (x[best] < NaN is false) and is skipped;
//   - a NaN at index 0 is never replaced (NaN < x is false), so a row starting with NaN gives 0;
//   - an all -inf row gives 0.
#pragma once

#include <cstdint>

#include "splice/core/tensor.h"

namespace splice::cpu {

// The greedy rule over n >= 1 f32 values with unit stride.
std::int64_t argmax_row(const float* values, std::int64_t n);

// ids[r] = the greedy rule over logits[r, :]. logits [rows, vocab] or [vocab] (one row), f32 /
// f16 / bf16 on the CPU, unit stride on the vocab axis, 1 <= vocab <= 2^31; ids [rows] i32 on the
// CPU. Typed errors (DeviceError, DTypeError, ShapeError, LayoutError) name the argument, the
// value seen and what is allowed; nothing is written when one is raised.
void argmax(const Tensor& logits, Tensor& ids);

}  // namespace splice::cpu
