// dev/flash_case.cuh: one flash-decode call's buffers and params for the standalone device tools
// that launch flash_decode_kernel.cuh's kernel directly (dev/tile_cycles, dev/cluster_placement):
// B = 1, q_len 1, bf16, no window, softcap or ALiBi; random q/K/V; the params flash_decode.cu
// fills for them; the output's largest error against a float64 reference. Include it after
// backend/cuda/flash_decode_kernel.cuh (and after any SPLICE_KERNEL_STAMPS defines).
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "experiment_util.cuh"  // CHECK

namespace flash_case {

using splice::cuda::detail::FlashDecodeParams;
using T = __nv_bfloat16;

// One shape: heads, head_dim, and how the launcher would plan it.
struct Case {
  int kv_heads, group, head_dim, capacity;
  bool stable_prefix;
  int splits;  // the grid's split dimension (1: one split)
};

// Device buffers of one case; host[] holds the values q, K and V are read from (q = its head).
struct Buffers {
  std::vector<T> host;
  T *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr;
  int* k_len = nullptr;
  float *partial_o = nullptr, *partial_lse = nullptr;
  unsigned* counters = nullptr;
  std::size_t q_elems = 0, kv_elems = 0;
};

Buffers allocate(const Case& c) {
  Buffers b;
  b.q_elems = static_cast<std::size_t>(c.kv_heads) * c.group * c.head_dim;
  b.kv_elems = static_cast<std::size_t>(c.kv_heads) * c.capacity * c.head_dim;
  b.host.resize(std::max(b.q_elems, b.kv_elems));
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& x : b.host) x = __float2bfloat16(normal(rng));
  CHECK(cudaMalloc(&b.q, b.q_elems * sizeof(T)));
  CHECK(cudaMalloc(&b.out, b.q_elems * sizeof(T)));
  CHECK(cudaMalloc(&b.k, b.kv_elems * sizeof(T)));
  CHECK(cudaMalloc(&b.v, b.kv_elems * sizeof(T)));
  CHECK(cudaMalloc(&b.k_len, sizeof(int)));
  CHECK(cudaMemcpy(b.q, b.host.data(), b.q_elems * sizeof(T), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(b.k, b.host.data(), b.kv_elems * sizeof(T), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(b.v, b.host.data(), b.kv_elems * sizeof(T), cudaMemcpyHostToDevice));
  if (c.splits > 1) {  // flash_decode.cu's workspace: one row block per (b, kv head)
    const std::size_t rows = static_cast<std::size_t>(c.kv_heads) * c.splits * 16;
    CHECK(cudaMalloc(&b.partial_lse, rows * sizeof(float)));
    CHECK(cudaMalloc(&b.partial_o, rows * c.head_dim * sizeof(float)));
    CHECK(cudaMalloc(&b.counters, c.kv_heads * sizeof(unsigned)));
    CHECK(cudaMemset(b.counters, 0, c.kv_heads * sizeof(unsigned)));
  }
  return b;
}

void release(Buffers& b) {
  for (void* p : {static_cast<void*>(b.q), static_cast<void*>(b.k), static_cast<void*>(b.v),
                  static_cast<void*>(b.out), static_cast<void*>(b.k_len),
                  static_cast<void*>(b.partial_o), static_cast<void*>(b.partial_lse),
                  static_cast<void*>(b.counters)})
    if (p) CHECK(cudaFree(p));
}

// The params flash_decode.cu fills for these buffers (B = 1, q_len 1, no window, softcap or
// ALiBi).
FlashDecodeParams params_for(const Case& c, const Buffers& b) {
  FlashDecodeParams p{};
  p.q = b.q;
  p.k = b.k;
  p.v = b.v;
  p.out = b.out;
  p.k_len = b.k_len;
  p.partial_o = b.partial_o;
  p.partial_lse = b.partial_lse;
  p.counters = b.counters;
  p.q_stride_b = static_cast<std::int64_t>(b.q_elems);
  p.q_stride_h = c.head_dim;
  p.q_stride_s = c.head_dim;
  p.k_stride_b = p.v_stride_b = static_cast<std::int64_t>(b.kv_elems);
  p.k_stride_h = p.v_stride_h = static_cast<std::int64_t>(c.capacity) * c.head_dim;
  p.k_stride_s = p.v_stride_s = c.head_dim;
  p.o_stride_b = static_cast<std::int64_t>(b.q_elems);
  p.o_stride_h = c.head_dim;
  p.o_stride_s = c.head_dim;
  p.num_kv_heads = c.kv_heads;
  p.group = c.group;
  p.q_len = 1;
  p.rows = c.group;
  p.q_len_shift = 0;
  p.q_len_mul = 1u << 31;
  p.capacity = c.capacity;
  p.min_chunk = 64;                                    // kFlashDecodeMinChunk
  p.single_split_keys = (128 << 10) / (4 * c.head_dim);  // kFlashDecodeSingleSplitBytes
  p.stable_prefix = c.stable_prefix ? 1 : 0;
  p.head_plan = 1;  // a one-wave grid with no left window
  p.window_left = p.window_right = -1;
  p.causal = 1;
  p.q_vec16 = p.o_vec8 = 1;
  p.softmax_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  p.scale_log2 = p.softmax_scale * splice::cuda::detail::kLog2e;
  return p;
}

// The output's largest error against a float64 reference, in units of the tolerance.
double max_error(const Case& c, const Buffers& b, int k_len) {
  std::vector<T> got(b.q_elems);
  CHECK(cudaMemcpy(got.data(), b.out, b.q_elems * sizeof(T), cudaMemcpyDeviceToHost));
  const auto at = [&](std::size_t i) { return static_cast<double>(__bfloat162float(b.host[i])); };
  double worst = 0.0;
  for (int h = 0; h < c.kv_heads * c.group; ++h) {
    const std::size_t kv_base = static_cast<std::size_t>(h / c.group) * c.capacity * c.head_dim;
    std::vector<double> w(k_len);
    double big = -1e300, sum = 0.0;
    for (int j = 0; j < k_len; ++j) {
      double dot = 0.0;
      for (int d = 0; d < c.head_dim; ++d)
        dot += at(static_cast<std::size_t>(h) * c.head_dim + d) *
               at(kv_base + static_cast<std::size_t>(j) * c.head_dim + d);
      w[j] = dot / std::sqrt(static_cast<double>(c.head_dim));
      big = std::max(big, w[j]);
    }
    for (int j = 0; j < k_len; ++j) sum += (w[j] = std::exp(w[j] - big));
    for (int d = 0; d < c.head_dim; ++d) {
      double ref = 0.0;
      for (int j = 0; j < k_len; ++j)
        ref += w[j] / sum * at(kv_base + static_cast<std::size_t>(j) * c.head_dim + d);
      const double err =
          std::abs(__bfloat162float(got[static_cast<std::size_t>(h) * c.head_dim + d]) - ref) /
          (2e-2 + 2e-2 * std::abs(ref));
      worst = std::max(worst, err);
    }
  }
  return worst;
}


}  // namespace flash_case
