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
//          the global-merge instance with the plan of flash_decode.h before session 10's cluster
//          rule (4-warp CTAs and 16 splits at 1K, 8-warp CTAs and 16 splits from 4K; the plan
//          now takes 8 clustered splits at 1K, which <<<>>> cannot launch), speculative split 0,
//          no stable prefix. CTA 0 is split 0; its marks end at its partial's store ("stored");
//          the merge runs in whichever split arrives last, so its cost is the bench's time less
//          this timeline (perf.md run 57).
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
#include "../flash_case.cuh"  // Case, Buffers, params_for, max_error

namespace splice::cuda::kernel_stamps {
namespace {
void (*g_setter)(Stamp*, std::uint64_t) = nullptr;
}
void register_unit(void (*set_ring)(Stamp*, std::uint64_t)) { g_setter = set_ring; }
void note_launch(const void*, void*) {}
}  // namespace splice::cuda::kernel_stamps

namespace {

using splice::cuda::detail::FlashDecodeConfig;
using splice::cuda::kernel_stamps::Stamp;

constexpr int kRingSlots = 1024;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

using namespace flash_case;

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
