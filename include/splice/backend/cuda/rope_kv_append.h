// splice/backend/cuda/rope_kv_append.h: the CUDA launcher of Op::RopeKvAppend (a fused layer op of
// ops/layer_ops.h; the CPU kernel, its oracle, is cpu::rope_kv_append in backend/cpu/layer_ops.h).
// The launch goes to cuda::current_stream() and returns without synchronizing.
#pragma once

#include "splice/core/tensor.h"

namespace splice::cuda {

// The attention prologue of one token in ONE launch (cpu::rope_kv_append's contract; p =
// position[0] read from device memory, so a captured graph replays it per token): qkv
// [B, 1, (Hq + 2 Hkv) D] (unit-stride row) read as q, k, v heads; out [B, Hq, 1, D] = rope(q);
// k_cache[:, :, p] = rope(k), v_cache[:, :, p] = v (caches [B, Hkv, capacity, D], unit last
// stride). A p outside [0, min(max_seq_len, capacity)) writes zeros to out and leaves the caches.
void rope_kv_append(const Tensor& qkv, const Tensor& cos, const Tensor& sin, const Tensor& position,
                    Tensor& k_cache, Tensor& v_cache, Tensor& out);

}  // namespace splice::cuda
