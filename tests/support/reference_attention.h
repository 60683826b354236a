// Float64 reference of decode attention, straight from spec decode_attention.md §5.
//
// Plain loops over CPU tensors of any strides and any float dtype (read as double):
//  1. Query i of q_len sits at p_i = k_len[b] - q_len + i; query head h reads kv head
//     h / (Hq / Hkv).
//  2. Key j is visible iff 0 <= j < k_len[b], and j <= p_i if causal, and
//     p_i - window_left <= j <= p_i + window_right for the bounds that are given.
//  3. s_j = scale * (q . k_j); softcap: s_j = cap * tanh(s_j / cap); ALiBi: s_j += -slope[h](p_i -
//  j).
//  4. o_i = sum_j softmax(s)_j v_j over visible keys; lse = max_j s_j + log(sum_j exp(s_j - max)).
//     No visible key: o_i = 0, lse = -inf.
// Only visible keys are read, so NaN elsewhere never reaches the result.
#pragma once

#include "splice/core/tensor.h"
#include "splice/ops/decode_attention.h"

namespace splice::testing {

// Returns o [batch, num_qo_heads, q_len, head_dim] as f32 (values computed in f64). When `lse` is
// non-null it receives an f32 [batch, num_qo_heads, q_len] tensor.
Tensor reference_decode_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& k_len, const Tensor* alibi,
                                  const DecodeAttentionOptions& options, Tensor* lse = nullptr);

}  // namespace splice::testing
