// splice/backend/cpu/flash_decode.h: the CPU flash-decode attention kernel (spec
// decode_attention.md §5), one pass with online softmax over the live prefix, split over the key
// axis and merged by log-sum-exp. The algorithm is stated stage by stage in flash_decode.cc.
//
// Arguments are validated by the op layer (`splice::decode_attention`); this entry point assumes:
//   q      [batch, num_qo_heads, q_len, head_dim]     bf16 / f16 / f32, unit last stride
//   k, v   [batch, num_kv_heads, capacity, head_dim]  q's dtype, unit last stride
//   k_len  [batch] or [1] int32 with 0 <= k_len[b] <= capacity
//   alibi  nullptr or [num_qo_heads] f32
//   out    [batch, num_qo_heads, q_len, head_dim]     q's dtype, unit last stride, allocated
//   lse    nullptr or [batch, num_qo_heads, q_len]    f32, allocated
// All tensors on the CPU; strides other than the last may be anything.
#pragma once

#include "splice/core/tensor.h"
#include "splice/ops/decode_attention.h"

namespace splice::cpu {

void flash_decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_len,
                  const Tensor* alibi, const DecodeAttentionOptions& options, Tensor& out,
                  Tensor* lse);

// Tests: the vector width, in floats, of the kernel's blocked dot products and value updates (1,
// 2, 4, 8 or 16; halved until it divides head_dim). 0, the default, takes the CPU's widest native
// vector (16 with AVX-512, 8 with AVX2, else 4). Every width computes the same result within
// rounding; tests run each one on any CPU.
void set_flash_decode_lanes_for_testing(int lanes);

}  // namespace splice::cpu
