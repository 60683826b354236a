// CPU greedy sampling (see splice/backend/cpu/sampling.h for the rule).
//
//   1. Validate devices, dtypes, shapes and the unit vocab stride (sampling_checks.h) before
//      anything is written.
//   2. Per row: one pass in index order keeping the running best,
//        best = 0;  best = j  whenever  x[best] < x[j]   (x read as f32; exact for f16 / bf16)
//      which is std::max_element's comparison, so NaN and tie behaviour follow from `<` alone.
#include "splice/backend/cpu/sampling.h"

#include "backend/sampling_checks.h"
#include "splice/core/dtype.h"
#include "splice/core/error.h"

namespace splice::cpu {
namespace {

template <typename T>
float as_f32(T v) {
  return static_cast<float>(v);
}

template <typename T>
std::int64_t argmax_typed(const T* row, std::int64_t n) {
  std::int64_t best = 0;
  float best_value = as_f32(row[0]);
  for (std::int64_t j = 1; j < n; ++j) {
    const float x = as_f32(row[j]);
    if (best_value < x) {
      best = j;
      best_value = x;
    }
  }
  return best;
}

}  // namespace

std::int64_t argmax_row(const float* values, std::int64_t n) {
  if (n < 1) fail<ShapeError>("argmax_row: `n` must be >= 1, got ", n);
  return argmax_typed(values, n);
}

void argmax(const Tensor& logits, Tensor& ids) {
  const sampling_checks::ArgmaxShape s =
      sampling_checks::check_argmax(logits, ids, Device::cpu(), "cpu::argmax");
  auto* out = ids.data<std::int32_t>();
  const std::int64_t out_stride = ids.stride(0);
  for (std::int64_t r = 0; r < s.rows; ++r) {
    const std::int64_t offset = r * s.row_stride;
    std::int64_t best = 0;
    switch (logits.dtype()) {
      case DType::f32:
        best = argmax_typed(logits.data<float>() + offset, s.vocab);
        break;
      case DType::f16:
        best = argmax_typed(logits.data<Half>() + offset, s.vocab);
        break;
      case DType::bf16:
        best = argmax_typed(logits.data<BFloat16>() + offset, s.vocab);
        break;
      default:
        SPLICE_INTERNAL_CHECK(false, "argmax of ", dtype_name(logits.dtype()));
    }
    out[r * out_stride] = static_cast<std::int32_t>(best);
  }
}

}  // namespace splice::cpu
