// splice/ops/decode_attention.h: the fused flash-decode attention op (spec decode_attention.md §5).
//
// Inputs (logical shapes; strides may be padded on any axis except the last, which is unit):
//   q      [batch, num_qo_heads, q_len, head_dim]        bf16 / f16 / f32
//   k, v   [batch, num_kv_heads, capacity, head_dim]     same dtype as q
//   k_len  [batch] or [1] int32 (on q's device): the live prefix per sequence (or for all)
//   alibi  optional [num_qo_heads] f32 slopes
// Output  o [batch, num_qo_heads, q_len, head_dim] in q's dtype; optional lse [batch, num_qo_heads,
// q_len] f32 (natural log; -inf for a row with no visible key, whose output is zeros).
// Query i sits at position p_i = k_len - q_len + i; key j is visible iff 0 <= j < k_len, and
// j <= p_i if causal, and p_i - window_left <= j <= p_i + window_right when those are given.
// Nothing at or beyond k_len is read into a result. The value contract 1 <= ... k_len <= capacity
// is checked on the CPU (k_len of 0 is allowed: zeros), and by the CUDA launcher only in validate
// mode (it would need a device sync).
#pragma once

#include <cstdint>
#include <optional>

#include "splice/core/tensor.h"
#include "splice/ops/contract.h"

namespace splice {

struct DecodeAttentionOptions {
  float softmax_scale = 0.0f;  // 0 means 1/sqrt(head_dim)
  bool causal = true;
  std::optional<std::int64_t> window_left;
  std::optional<std::int64_t> window_right;
  std::optional<float> softcap;
  // Number of KV splits; 0 lets the backend plan it from the live k_len (the default).
  std::int64_t num_splits = 0;
  // CUDA only: read value contracts back to the host and check them (syncs; off in the fast path).
  bool validate = false;
};

// Computes attention into `out` (allocated when undefined) and, when `lse` is non-null, the
// log-sum-exp into `*lse` (allocated when undefined). Runs on the device of `q`. Validates every
// argument against the backend's contract row and throws a typed error naming it.
Tensor decode_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_len,
                        const Tensor* alibi, const DecodeAttentionOptions& options, Tensor out = {},
                        Tensor* lse = nullptr);

}  // namespace splice
