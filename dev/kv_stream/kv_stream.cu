// dev/kv_stream/kv_stream.cu: the K/V read ceiling of issue #5's 64K one-wave grids, by copy
// engine, with no attention math (docs/perf-gpu-attention.md, "what is left" item 2: would bulk
// copies read faster than flash decode's per-thread 16-byte cp.async?).
//
// K and V: [units, n, 128] bf16 each (units = B x Hkv = 256, n = 65536: 8.6 GB in all, the
// (32, 32, 8) / (32, 64, 8) / (8, 32, 32) points). G CTAs of 4 warps, two to an SM (96 KB rings),
// each stream a contiguous share of the units x n keys (G = 256: one unit each, as flash decode's
// one-split grid; G = 264: every slot, shares crossing unit boundaries). Engines, all with the
// kernel's ring geometry (warp w streams 16-key tiles w, w + 4, ... of its CTA's share through 3
// stages of K tile + V tile, 4 KB each) and an L2 evict_first policy on every read:
//   lsu:   16-byte cp.async.cg copies by every lane, one commit group per tile (the kernel's way);
//   bulk:  lane 0 issues one cp.async.bulk per K tile and per V tile (4 KB each) on the stage's
//          mbarrier, the warp waits on it;
//   bulk4: thread 0 streams the CTA's tiles four at a time (16 KB K + 16 KB V per stage, 3 stages)
//          and nothing else (the copy engine's ceiling at this geometry).
// Printed per (engine, G): us per pass and TB/s of K+V read, median of 7 passes after 2 warm ones.
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr \
//     -o .gpubin/kv_stream dev/kv_stream/kv_stream.cu
//   run(command=".gpubin/kv_stream", carry=[".gpubin/kv_stream"])   (~10 s)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "../../src/backend/cuda/cluster.cuh"  // mbarriers, bulk_copy_hinted, l2_evict_policy
#include "../experiment_util.cuh"              // CHECK

namespace {

namespace sd = splice::cuda::detail;

constexpr int kWarps = 4, kStages = 3, kTileKeys = 16, kHeadDim = 128;
constexpr int kTileBytes = kTileKeys * kHeadDim * 2;           // 4 KB
constexpr int kRingBytes = kWarps * kStages * 2 * kTileBytes;  // 96 KB
constexpr int kUnits = 256, kKeys = 65536;

struct Share {
  std::int64_t first_tile, tiles;  // this CTA's tiles of the units x n keys (16 keys a tile)
};
__device__ __forceinline__ Share share_of(std::int64_t total_tiles) {
  const std::int64_t per = (total_tiles + gridDim.x - 1) / gridDim.x;
  const std::int64_t first = std::min<std::int64_t>(blockIdx.x * per, total_tiles);
  return {first, std::min<std::int64_t>(per, total_tiles - first)};
}

__device__ __forceinline__ void cp16(std::uint32_t dst, const unsigned char* src,
                                     std::uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(dst),
               "l"(src), "l"(policy));
}

__global__ void __launch_bounds__(kWarps * 32)
    lsu_kernel(const unsigned char* k, const unsigned char* v, std::int64_t total_tiles) {
  extern __shared__ __align__(128) unsigned char ring[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const Share s = share_of(total_tiles);
  const std::uint64_t policy = sd::l2_evict_policy<false>();
  const std::uint32_t base =
      static_cast<std::uint32_t>(__cvta_generic_to_shared(ring)) + warp * kStages * 2 * kTileBytes;
  const std::int64_t mine = (s.tiles - warp + kWarps - 1) / kWarps;
  auto issue = [&](std::int64_t it) {
    if (it < mine) {
      const std::int64_t off = (s.first_tile + warp + it * kWarps) * kTileBytes;
      const std::uint32_t d = base + static_cast<std::uint32_t>(it % kStages) * 2 * kTileBytes;
#pragma unroll
      for (int c = 0; c < kTileBytes / 16 / 32; ++c) {
        const int o = (c * 32 + lane) * 16;
        cp16(d + o, k + off + o, policy);
        cp16(d + kTileBytes + o, v + off + o, policy);
      }
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
  for (int st = 0; st < kStages - 1; ++st) issue(st);
  for (std::int64_t it = 0; it < mine; ++it) {
    issue(it + kStages - 1);
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 1) : "memory");
    __syncwarp();
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

__global__ void __launch_bounds__(kWarps * 32)
    bulk_kernel(const unsigned char* k, const unsigned char* v, std::int64_t total_tiles) {
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ std::uint64_t bars[kWarps * kStages];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const Share s = share_of(total_tiles);
  const std::uint64_t policy = sd::l2_evict_policy<false>();
  std::uint64_t* bar = bars + warp * kStages;
  unsigned char* wring = ring + warp * kStages * 2 * kTileBytes;
  if (lane == 0) sd::mbar_init<kStages>(bar);
  __syncwarp();
  const std::int64_t mine = (s.tiles - warp + kWarps - 1) / kWarps;
  auto issue = [&](std::int64_t it) {
    if (it < mine && lane == 0) {
      const std::int64_t off = (s.first_tile + warp + it * kWarps) * kTileBytes;
      const int st = static_cast<int>(it % kStages);
      sd::mbar_arrive_expect(&bar[st], 2 * kTileBytes);
      sd::bulk_copy_hinted(wring + st * 2 * kTileBytes, k + off, kTileBytes, &bar[st], policy);
      sd::bulk_copy_hinted(wring + st * 2 * kTileBytes + kTileBytes, v + off, kTileBytes, &bar[st],
                           policy);
    }
  };
  for (int st = 0; st < kStages - 1; ++st) issue(st);
  for (std::int64_t it = 0; it < mine; ++it) {
    issue(it + kStages - 1);
    sd::mbar_wait(&bar[it % kStages], static_cast<std::uint32_t>((it / kStages) & 1));
    __syncwarp();
  }
}

__global__ void __launch_bounds__(kWarps * 32)
    bulk4_kernel(const unsigned char* k, const unsigned char* v, std::int64_t total_tiles) {
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ std::uint64_t bars[kStages];
  if (threadIdx.x != 0) return;
  const Share s = share_of(total_tiles);
  const std::uint64_t policy = sd::l2_evict_policy<false>();
  sd::mbar_init<kStages>(bars);
  constexpr int kStep = kWarps;  // tiles per stage
  const std::int64_t steps = (s.tiles + kStep - 1) / kStep;
  auto issue = [&](std::int64_t it) {
    if (it >= steps) return;
    const std::int64_t t0 = it * kStep;
    const int bytes = static_cast<int>(std::min<std::int64_t>(kStep, s.tiles - t0)) * kTileBytes;
    const std::int64_t off = (s.first_tile + t0) * kTileBytes;
    const int st = static_cast<int>(it % kStages);
    sd::mbar_arrive_expect(&bars[st], 2 * bytes);
    sd::bulk_copy_hinted(ring + st * 2 * kStep * kTileBytes, k + off, bytes, &bars[st], policy);
    sd::bulk_copy_hinted(ring + st * 2 * kStep * kTileBytes + kStep * kTileBytes, v + off, bytes,
                         &bars[st], policy);
  };
  for (int st = 0; st < kStages - 1; ++st) issue(st);
  for (std::int64_t it = 0; it < steps; ++it) {
    issue(it + kStages - 1);
    sd::mbar_wait(&bars[it % kStages], static_cast<std::uint32_t>((it / kStages) & 1));
  }
}

using Kernel = void (*)(const unsigned char*, const unsigned char*, std::int64_t);

}  // namespace

int main() {
  const std::int64_t bytes = std::int64_t{kUnits} * kKeys * kHeadDim * 2;  // one of K, V
  unsigned char *k, *v;
  CHECK(cudaMalloc(&k, bytes));
  CHECK(cudaMalloc(&v, bytes));
  CHECK(cudaMemset(k, 1, bytes));
  CHECK(cudaMemset(v, 2, bytes));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs; K + V %.2f GB, %d units x %d keys x 128 bf16\n", prop.name,
              prop.multiProcessorCount, 2.0 * bytes / 1e9, kUnits, kKeys);
  const std::int64_t total_tiles = std::int64_t{kUnits} * kKeys / kTileKeys;
  struct Engine {
    const char* name;
    Kernel kernel;
  };
  const Engine engines[] = {{"lsu", lsu_kernel}, {"bulk", bulk_kernel}, {"bulk4", bulk4_kernel}};
  for (const Engine& e : engines)
    CHECK(cudaFuncSetAttribute(e.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kRingBytes));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  const int grids[] = {kUnits, 2 * prop.multiProcessorCount};
  // Rounds alternate the engines so that drift reads as spread, not as a difference.
  std::vector<float> times[3][2];
  for (int round = 0; round < 9; ++round)
    for (int ei = 0; ei < 3; ++ei)
      for (int gi = 0; gi < 2; ++gi) {
        CHECK(cudaEventRecord(a));
        engines[ei].kernel<<<grids[gi], kWarps * 32, kRingBytes>>>(k, v, total_tiles);
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        CHECK(cudaGetLastError());
        float ms = 0.0f;
        CHECK(cudaEventElapsedTime(&ms, a, b));
        if (round >= 2) times[ei][gi].push_back(ms * 1000.0f);
      }
  std::printf("%-6s %5s %10s %10s %10s %8s\n", "engine", "CTAs", "median us", "min us", "max us",
              "TB/s");
  for (int ei = 0; ei < 3; ++ei)
    for (int gi = 0; gi < 2; ++gi) {
      std::vector<float> t = times[ei][gi];
      std::sort(t.begin(), t.end());
      const float med = t[t.size() / 2];
      std::printf("%-6s %5d %10.2f %10.2f %10.2f %8.3f\n", engines[ei].name, grids[gi], med,
                  t.front(), t.back(), 2.0 * bytes / (med * 1e-6) / 1e12);
    }
  CHECK(cudaFree(k));
  CHECK(cudaFree(v));
  return 0;
}
