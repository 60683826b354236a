// dev/tile_cycles: where flash decode's time goes, warm and alone, in SM cycles (issues #5, #7).
//
// The model's stamps (dev/step_stamps) time kernels with %globaltimer, which ticks coarsely. This
// tool builds flash_decode_kernel.cuh with SPLICE_KERNEL_STAMPS and SPLICE_KERNEL_STAMPS_CYCLES
// (launch.cuh: each mark is the SM's %clock64, stored with st.global), launches the real kernel
// directly with <<<>>> (no PDL predecessor: the wait returns at once) and prints the median
// cycles from the wait return to each mark of CTA 0's thread 0 over many launches, per k_len,
// and the output's largest error against a float64 reference in units of its tolerance
// (2e-2 + 2e-2 |ref|: <= 1 passes; a quick check of an experiment, not a test).
//
//   tile_cycles [LAUNCHES] [CASE]     CASE: model (default) | b1
//
//   model: the SmolLM2 decode step's call: B = 1, 9 / 3 heads, head_dim 64, one split, the
//          stable-prefix path, k_len 16-512 (capacity 1024).
//   b1:    issue #5's B = 1 rows: 32 / 8 heads, head_dim 128, capacity = k_len in {1K, 4K, 16K},
//          the plan of flash_decode.h for 132 SMs (mirrored below: 4-warp CTAs and 16 splits at
//          1K, 8-warp CTAs and 16 splits from 4K), speculative split 0, no stable prefix. CTA 0
//          is split 0; its marks end at its partial's store ("stored"); the merge runs in
//          whichever split arrives last, so its cost is the bench's time less this timeline.
//
// Build (here, nvcc 13): nvcc -O3 -DNDEBUG -DSPLICE_WITH_CUDA=1 -arch=sm_90a -std=c++20
//   --expt-relaxed-constexpr -Iinclude -Isrc -o tile_cycles dev/tile_cycles/tile_cycles.cu
#define SPLICE_KERNEL_STAMPS 1
#define SPLICE_KERNEL_STAMPS_CYCLES 1
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <random>
#include <vector>

#include "../experiment_util.cuh"  // CHECK
#include "backend/cuda/flash_decode_kernel.cuh"

namespace splice::cuda::kernel_stamps {
namespace {
void (*g_setter)(Stamp*, std::uint64_t) = nullptr;
}
void register_unit(void (*set_ring)(Stamp*, std::uint64_t)) { g_setter = set_ring; }
void note_launch(const void*, void*) {}
}  // namespace splice::cuda::kernel_stamps

namespace {

using splice::cuda::detail::FlashDecodeConfig;
using splice::cuda::detail::FlashDecodeParams;
using splice::cuda::kernel_stamps::Stamp;
using T = __nv_bfloat16;

constexpr int kRingSlots = 1024;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

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
  p.speculate = c.stable_prefix ? 0 : 1;  // a one-wave grid with no left window
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

const int kShown[] = {2, 6, 8, 9, 10, 11, 3, 5, 7, 4};
const char* const kNames[16] = {"wait",   "arrive",  "q ready", "loop done", "stored", "warps",
                                "tile 1", "scratch", "t2 wait", "t2 S",      "t2 P",   "t2 PV",
                                "",       "",        "",        ""};

template <int kHeadDim, int kWarps>
void run_case(const Case& c, std::initializer_list<int> k_lens, int launches, Stamp* ring) {
  using Cfg = FlashDecodeConfig<kHeadDim, kWarps>;
  auto kernel = splice::cuda::detail::flash_decode_kernel<T, kHeadDim, kWarps, false, false>;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             Cfg::kSmemBytes));
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
  Buffers b = allocate(c);
  const FlashDecodeParams p = params_for(c, b);
  const dim3 grid(1, c.splits, c.kv_heads), block(Cfg::kThreads);
  std::printf("\nflash_decode_kernel<bf16, %d, %d>: %d / %d heads, %d split(s) in the grid, %s\n",
              kHeadDim, kWarps, c.kv_heads * c.group, c.kv_heads, c.splits,
              c.stable_prefix ? "stable prefix" : "speculative split 0");
  std::printf("%6s %9s", "k_len", "max err");
  for (int m : kShown) std::printf(" %9s", kNames[m]);
  std::printf("\n");
  std::vector<Stamp> got(kRingSlots);
  for (int kl : k_lens) {
    if (kl > c.capacity) continue;
    CHECK(cudaMemcpy(b.k_len, &kl, sizeof kl, cudaMemcpyHostToDevice));
    for (int w = 0; w < 20; ++w) kernel<<<grid, block, Cfg::kSmemBytes>>>(p);
    CHECK(cudaDeviceSynchronize());
    std::vector<std::vector<double>> marks(16);
    for (int n = 0; n < launches; ++n) {
      CHECK(cudaMemset(ring, 0, kRingSlots * sizeof(Stamp)));
      kernel<<<grid, block, Cfg::kSmemBytes>>>(p);
      CHECK(cudaMemcpy(got.data(), ring, kRingSlots * sizeof(Stamp), cudaMemcpyDeviceToHost));
      std::uint64_t base = 0;
      bool have_base = false;
      for (const Stamp& s : got)
        if (s.grid_id != 0 && s.mark == 0) base = s.ns, have_base = true;
      if (!have_base) continue;
      for (const Stamp& s : got)
        if (s.grid_id != 0 && s.ns != 0 && s.mark < 16)
          marks[s.mark].push_back(static_cast<double>(static_cast<std::int64_t>(s.ns - base)));
    }
    std::printf("%6d %9.3f", kl, max_error(c, b, kl));
    for (int m : kShown) {
      if (marks[m].empty())
        std::printf(" %9s", "-");
      else
        std::printf(" %9.0f", median(marks[m]));
    }
    std::printf("\n");
  }
  CHECK(cudaGetLastError());
  release(b);
}

}  // namespace

int main(int argc, char** argv) {
  const int launches = argc > 1 ? std::atoi(argv[1]) : 200;
  const char* which = argc > 2 ? argv[2] : "model";
  Stamp* ring = nullptr;
  CHECK(cudaMalloc(&ring, kRingSlots * sizeof(Stamp)));
  splice::cuda::kernel_stamps::g_setter(ring, kRingSlots - 1);
  std::printf("median cycles after the wait returned (CTA 0, thread 0), %d launches each\n",
              launches);
  if (std::strcmp(which, "b1") == 0) {
    // flash_decode.h's plan for B = 1, (32, 8), head_dim 128 on 132 SMs, capacity = k_len:
    // one row block, 8 units; 4-warp CTAs (2 per SM) fill 33 slots per unit but at most
    // ceil(1024 / 64) = 16 splits at 1K; from 4K the wide rule (units <= 33, >= 256 keys per
    // wide split) takes 8-warp CTAs (1 per SM): 16 splits.
    run_case<128, 4>(Case{8, 4, 128, 1024, false, 16}, {1024}, launches, ring);
    run_case<128, 8>(Case{8, 4, 128, 4096, false, 16}, {4096}, launches, ring);
    run_case<128, 8>(Case{8, 4, 128, 16384, false, 16}, {16384}, launches, ring);
  } else {
    run_case<64, 4>(Case{3, 3, 64, 1024, true, 1},
                    {16, 64, 65, 128, 129, 192, 193, 256, 320, 512}, launches, ring);
  }
  CHECK(cudaFree(ring));
  return 0;
}
