// The aliasing rule of flash-decode attention, shared by the public op (ops/decode_attention.cc,
// both backends) and the CUDA launcher (which a decode session calls directly): `out` and `lse`
// (when given) each hold one address per element, share no memory with each other, and share none
// with q, k, v, k_len or alibi (no in-place form: one query row's output is written while other
// CTAs of its split may still read q, and an out inside the KV cache would change what later
// splits read). LayoutError naming both tensors.
#pragma once

#include "splice/core/tensor.h"

namespace splice::flash_decode_checks {

inline void check_aliasing(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_len,
                           const Tensor* alibi, const Tensor& out, const Tensor* lse) {
  static const Tensor kNone;  // an absent optional tensor: skipped
  check_output_aliasing(
      {{out, "out"}, {lse ? *lse : kNone, "lse"}},
      {{q, "q"}, {k, "k"}, {v, "v"}, {k_len, "k_len"}, {alibi ? *alibi : kNone, "alibi"}});
}

}  // namespace splice::flash_decode_checks
