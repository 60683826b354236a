// Host-side argument checks shared by the CPU and CUDA argmax (greedy sampling) kernels: one
// wording of each typed error, so both backends reject bad input the same way.
//
// argmax(logits, ids):
//   logits  [rows, vocab] or [vocab] (one row): f32, f16 or bf16, unit stride on the vocab axis
//           (rows may have any stride, e.g. a padded row pitch), 1 <= vocab <= 2^31;
//   ids     [rows] i32 (any stride), on the logits' device.
#pragma once

#include <cstdint>

#include "splice/core/error.h"
#include "splice/core/tensor.h"

namespace splice::sampling_checks {

// The largest vocabulary an int32 id can index: ids 0 .. 2^31 - 1.
inline constexpr std::int64_t kMaxVocab = std::int64_t{1} << 31;

struct ArgmaxShape {
  std::int64_t rows = 0;
  std::int64_t vocab = 0;
  std::int64_t row_stride = 0;  // elements between consecutive rows of `logits`
};

// Validates argmax's arguments for a kernel on `device`; returns the row geometry.
inline ArgmaxShape check_argmax(const Tensor& logits, const Tensor& ids, const Device& device,
                                const char* op) {
  if (!(logits.device() == device))
    fail<DeviceError>(op, ": `logits` must be on ", device.str(), ", got ", logits.device().str());
  if (!(ids.device() == device))
    fail<DeviceError>(op, ": `ids` must be on ", device.str(), " (the logits' device), got ",
                      ids.device().str());
  if (!is_floating(logits.dtype()))
    fail<DTypeError>(op, ": `logits` must be f32, f16 or bf16, got ", dtype_name(logits.dtype()));
  if (ids.dtype() != DType::i32)
    fail<DTypeError>(op, ": `ids` must be i32, got ", dtype_name(ids.dtype()));
  if (logits.dim() != 1 && logits.dim() != 2)
    fail<ShapeError>(op, ": `logits` must be [rows, vocab] or [vocab], got shape ",
                     dims_str(logits.shape()));
  ArgmaxShape s;
  s.rows = logits.dim() == 2 ? logits.size(0) : 1;
  s.vocab = logits.size(-1);
  s.row_stride = logits.dim() == 2 ? logits.stride(0) : 0;
  if (s.vocab < 1 || s.vocab > kMaxVocab)
    fail<ShapeError>(op, ": the vocab axis of `logits` must hold 1 to 2^31 entries (int32 ids), ",
                     "got ", s.vocab, " (shape ", dims_str(logits.shape()), ")");
  if (s.vocab > 1 && logits.stride(-1) != 1)
    fail<LayoutError>(op, ": `logits` must have a unit stride on its vocab axis, got strides ",
                      dims_str(logits.strides()), " for shape ", dims_str(logits.shape()));
  if (ids.dim() != 1 || ids.size(0) != s.rows)
    fail<ShapeError>(op, ": `ids` must have shape [", s.rows, "] (one id per row of `logits` ",
                     dims_str(logits.shape()), "), got ", dims_str(ids.shape()));
  return s;
}

}  // namespace splice::sampling_checks
