// dev/tile_cycles: where flash decode's tile loop spends its cycles, warm and alone (issue #7).
//
// The model's stamps (dev/step_stamps) put a 16-key tile of the SmolLM2-shaped decode at ~0.6-1 us
// for warp 0, with warm code and its K/V in shared memory. %globaltimer ticks coarsely, so this
// tool times the same kernel with %clock64 instead: it builds flash_decode_kernel.cuh with
// SPLICE_KERNEL_STAMPS and SPLICE_KERNEL_STAMPS_CYCLES (launch.cuh: each mark is the SM's cycle
// counter, stored with st.global), launches the real kernel for the model's shape (B = 1, 9 query
// / 3 KV heads, head_dim 64, bf16, one split, the stable-prefix path the model takes) directly
// with <<<>>> (no PDL predecessor: the wait returns at once), and prints the median cycles from
// the wait return to each mark of CTA 0's thread 0 over many launches, per k_len, and the output's
// largest error against a float64 reference in units of its tolerance (2e-2 + 2e-2 |ref|: <= 1
// passes; a quick check of an experiment, not a test).
//
//   tile_cycles [LAUNCHES]
//
// Build (here, nvcc 13): nvcc -O3 -DNDEBUG -DSPLICE_WITH_CUDA=1 -arch=sm_90a -std=c++20
//   --expt-relaxed-constexpr -Iinclude -Isrc -o tile_cycles dev/tile_cycles/tile_cycles.cu
#define SPLICE_KERNEL_STAMPS 1
#define SPLICE_KERNEL_STAMPS_CYCLES 1
#include <cuda_bf16.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

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

#define CHECK(call)                                                                  \
  do {                                                                               \
    cudaError_t e_ = (call);                                                         \
    if (e_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s: %s (line %d)\n", #call, cudaGetErrorString(e_), __LINE__); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

constexpr int kHeadDim = 64, kWarps = 4, kKvHeads = 3, kGroup = 3, kCapacity = 1024;
constexpr int kRingSlots = 1024;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int launches = argc > 1 ? std::atoi(argv[1]) : 200;
  using T = __nv_bfloat16;
  using Cfg = FlashDecodeConfig<kHeadDim, kWarps>;
  const std::size_t q_elems = std::size_t{kKvHeads} * kGroup * kHeadDim;
  const std::size_t kv_elems = std::size_t{kKvHeads} * kCapacity * kHeadDim;
  std::vector<T> host(kv_elems);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& x : host) x = __float2bfloat16(normal(rng));
  T *q, *k, *v, *out;
  int* k_len;
  Stamp* ring;
  CHECK(cudaMalloc(&q, q_elems * sizeof(T)));
  CHECK(cudaMalloc(&out, q_elems * sizeof(T)));
  CHECK(cudaMalloc(&k, kv_elems * sizeof(T)));
  CHECK(cudaMalloc(&v, kv_elems * sizeof(T)));
  CHECK(cudaMalloc(&k_len, sizeof(int)));
  CHECK(cudaMalloc(&ring, kRingSlots * sizeof(Stamp)));
  CHECK(cudaMemcpy(q, host.data(), q_elems * sizeof(T), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(k, host.data(), kv_elems * sizeof(T), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(v, host.data(), kv_elems * sizeof(T), cudaMemcpyHostToDevice));
  splice::cuda::kernel_stamps::g_setter(ring, kRingSlots - 1);

  FlashDecodeParams p{};
  p.q = q;
  p.k = k;
  p.v = v;
  p.out = out;
  p.k_len = k_len;
  p.q_stride_b = q_elems;
  p.q_stride_h = kHeadDim;
  p.q_stride_s = kHeadDim;
  p.k_stride_b = p.v_stride_b = kv_elems;
  p.k_stride_h = p.v_stride_h = std::int64_t{kCapacity} * kHeadDim;
  p.k_stride_s = p.v_stride_s = kHeadDim;
  p.o_stride_b = q_elems;
  p.o_stride_h = kHeadDim;
  p.o_stride_s = kHeadDim;
  p.num_kv_heads = kKvHeads;
  p.group = kGroup;
  p.q_len = 1;
  p.rows = kGroup;
  p.q_len_shift = 0;
  p.q_len_mul = 1u << 31;
  p.capacity = kCapacity;
  p.min_chunk = 64;
  p.single_split_keys = 512;  // kFlashDecodeSingleSplitBytes at head_dim 64
  p.stable_prefix = 1;
  p.window_left = p.window_right = -1;
  p.causal = 1;
  p.q_vec16 = p.o_vec8 = 1;
  p.softmax_scale = 0.125f;
  p.scale_log2 = p.softmax_scale * splice::cuda::detail::kLog2e;

  auto kernel = splice::cuda::detail::flash_decode_kernel<T, kHeadDim, kWarps, false>;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             Cfg::kSmemBytes));
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
  const dim3 grid(1, 1, kKvHeads), block(Cfg::kThreads);

  static const char* names[16] = {"wait",   "arrive", "q ready", "loop done", "stored",
                                  "warps",  "tile 1", "scratch", "t2 wait",   "t2 S",
                                  "t2 P",   "t2 PV",  "",        "",          "",
                                  ""};
  std::printf("flash_decode_kernel<bf16, 64, 4>, B = 1, 9 / 3 heads, one split, stable prefix;\n"
              "median cycles after the wait returned (CTA 0, thread 0), %d launches each\n",
              launches);
  std::printf("%6s %9s", "k_len", "max err");
  const int shown[] = {2, 6, 8, 9, 10, 11, 3, 5, 7, 4};
  for (int m : shown) std::printf(" %9s", names[m]);
  std::printf("\n");
  std::vector<Stamp> got(kRingSlots);
  for (int kl : {16, 64, 65, 128, 129, 192, 193, 256, 320, 512}) {
    CHECK(cudaMemcpy(k_len, &kl, sizeof kl, cudaMemcpyHostToDevice));
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
    // The output against a float64 reference (q, K and V are the same bf16 values, host[]).
    std::vector<T> got_out(q_elems);
    CHECK(cudaMemcpy(got_out.data(), out, q_elems * sizeof(T), cudaMemcpyDeviceToHost));
    double max_err = 0.0;
    for (int h = 0; h < kKvHeads * kGroup; ++h) {
      const int kvh = h / kGroup;
      std::vector<double> w(kl);
      double big = -1e300, sum = 0.0;
      for (int j = 0; j < kl; ++j) {
        double dot = 0.0;
        for (int d = 0; d < kHeadDim; ++d)
          dot += static_cast<double>(__bfloat162float(host[h * kHeadDim + d])) *
                 __bfloat162float(host[(static_cast<std::size_t>(kvh) * kCapacity + j) * kHeadDim + d]);
        w[j] = dot * p.softmax_scale;
        big = std::max(big, w[j]);
      }
      for (int j = 0; j < kl; ++j) sum += (w[j] = std::exp(w[j] - big));
      for (int d = 0; d < kHeadDim; ++d) {
        double ref = 0.0;
        for (int j = 0; j < kl; ++j)
          ref += w[j] / sum * __bfloat162float(host[(static_cast<std::size_t>(kvh) * kCapacity + j) * kHeadDim + d]);
        const double err = std::abs(__bfloat162float(got_out[h * kHeadDim + d]) - ref) /
                           (2e-2 + 2e-2 * std::abs(ref));
        max_err = std::max(max_err, err);
      }
    }
    std::printf("%6d %9.3f", kl, max_err);
    for (int m : shown) {
      if (marks[m].empty())
        std::printf(" %9s", "-");
      else
        std::printf(" %9.0f", median(marks[m]));
    }
    std::printf("\n");
  }
  CHECK(cudaGetLastError());
  return 0;
}
