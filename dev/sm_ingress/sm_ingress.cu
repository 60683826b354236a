// dev/sm_ingress/sm_ingress.cu: how many bytes per second G SMs can pull into shared memory
// (issue #7, docs/perf-decode-step.md §12: could one cluster of 16 SMs stream a decode layer's
// 7 MB of weights fast enough? and issue #5: what caps flash decode's 64 long-range CTAs at
// ~64 GB/s each?). Standalone:
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -o sm_ingress sm_ingress.cu
//   ./sm_ingress          (~5 s on the H200)
//
// G CTAs (200 KB of shared memory each, so one per SM), optionally in thread-block clusters,
// each stream their own contiguous share of a 1 GB buffer (or, in the L2 rows, re-read a small
// region per CTA that stays in L2) into shared memory; nothing reads the data. Two engines:
//   bulk:  one thread keeps a 192 KB ring of slots in flight, one cp.async.bulk and one
//          mbarrier per slot, each slot refilled as soon as it lands (the copy engine alone);
//   lsu:   flash decode's loop shape: W warps each stream their own tiles t = w, w + W, ...
//          through a private ring of S stages of `tile` bytes with 16-byte cp.async.cg copies
//          (S - 1 tiles in flight ahead of the one waited for; flash decode at head_dim 128 is
//          W 8, S 3, tile 8 KB).
// Printed: GB/s in all and per CTA, median of 5 launches.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "../../src/backend/cuda/cluster.cuh"  // mbar_init, mbar_arrive_expect, mbar_wait, bulk_copy
#include "../experiment_util.cuh"               // CHECK, cluster_launch_config

namespace {

using splice::cuda::detail::bulk_copy;
using splice::cuda::detail::mbar_arrive_expect;
using splice::cuda::detail::mbar_init;
using splice::cuda::detail::mbar_wait;

constexpr int kRingBytes = 192 << 10;
constexpr int kMaxSlots = 48;

// `region` = 0: CTA b streams [b * bytes_per_cta, (b + 1) * bytes_per_cta); else it re-reads
// its own `region` bytes at b * region until it has copied bytes_per_cta.
__device__ __forceinline__ const unsigned char* chunk_src(const unsigned char* src,
                                                         std::size_t bytes_per_cta,
                                                         std::size_t region, std::size_t off) {
  if (region == 0) return src + blockIdx.x * bytes_per_cta + off;
  return src + blockIdx.x * region + off % region;
}

// Whether this CTA streams: with sm_stride > 1 only CTAs on SMs whose id is a multiple of it do
// (a subset spread over the chip instead of the block scheduler's first G SMs); they count
// themselves in *active.
__device__ __forceinline__ bool cta_active(int sm_stride, unsigned* active) {
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  if (sm % sm_stride != 0) return false;
  if (threadIdx.x == 0) atomicAdd(active, 1u);
  return true;
}

__global__ void bulk_kernel(const unsigned char* src, std::size_t bytes_per_cta,
                            std::size_t region, int slot_bytes, int sm_stride, unsigned* active) {
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ std::uint64_t bars[kMaxSlots];
  const int slots = kRingBytes / slot_bytes;
  if (!cta_active(sm_stride, active)) return;
  if (threadIdx.x != 0) return;
  for (int s = 0; s < slots; ++s) mbar_init<1>(&bars[s]);
  const std::size_t chunks = bytes_per_cta / slot_bytes;
  std::size_t issued = 0;
  for (int s = 0; s < slots && issued < chunks; ++s, ++issued) {
    mbar_arrive_expect(&bars[s], slot_bytes);
    bulk_copy(ring + s * slot_bytes, chunk_src(src, bytes_per_cta, region, issued * slot_bytes),
              slot_bytes, &bars[s]);
  }
  for (std::size_t done = 0; done < chunks; ++done) {
    const int s = static_cast<int>(done % slots);
    mbar_wait(&bars[s], static_cast<std::uint32_t>((done / slots) & 1));
    if (issued < chunks) {
      mbar_arrive_expect(&bars[s], slot_bytes);
      bulk_copy(ring + s * slot_bytes,
                chunk_src(src, bytes_per_cta, region, issued * slot_bytes), slot_bytes, &bars[s]);
      ++issued;
    }
  }
}

__device__ __forceinline__ void cp16(std::uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
template <int kPending>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Flash decode's load shape: warp w streams tiles w, w + W, ... of the CTA's share; stage
// it % S holds tile it; step it issues tile it + S - 1, then waits for tile it.
template <int kStages>
__global__ void lsu_kernel(const unsigned char* src, std::size_t bytes_per_cta, std::size_t region,
                           int tile_bytes, int sm_stride, unsigned* active) {
  extern __shared__ __align__(128) unsigned char ring[];
  if (!cta_active(sm_stride, active)) return;
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::uint32_t base =
      static_cast<std::uint32_t>(__cvta_generic_to_shared(ring)) + warp * kStages * tile_bytes;
  const int tiles = static_cast<int>(bytes_per_cta / tile_bytes);
  const int my_tiles = (tiles - warp + warps - 1) / warps;
  const int copies = tile_bytes / 16 / 32;  // per lane per tile
  auto issue = [&](int it) {
    if (it < my_tiles) {
      const std::size_t off = static_cast<std::size_t>(warp + it * warps) * tile_bytes;
      const unsigned char* p = chunk_src(src, bytes_per_cta, region, off);
      const std::uint32_t d = base + (it % kStages) * tile_bytes;
      for (int c = 0; c < copies; ++c) cp16(d + (c * 32 + lane) * 16, p + (c * 32 + lane) * 16);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
  for (int s = 0; s < kStages - 1; ++s) issue(s);
  for (int it = 0; it < my_tiles; ++it) {
    issue(it + kStages - 1);
    cp_wait<kStages - 1>();
    __syncwarp();
  }
  cp_wait<0>();
}

struct Case {
  const char* engine;  // "bulk" or "lsu"
  int ctas, cluster;
  bool l2;             // re-read a small per-CTA region (stays in L2)
  int warps, stages, chunk;  // lsu: warps, stages, tile bytes; bulk: slot bytes in `chunk`
  int sm_stride = 1;         // > 1: only CTAs on SMs with id % sm_stride == 0 stream
};

}  // namespace

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const std::size_t total = std::size_t{1} << 30;
  unsigned char* buf = nullptr;
  CHECK(cudaMalloc(&buf, total));
  CHECK(cudaMemset(buf, 1, total));
  CHECK(cudaFuncSetAttribute(bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10));
  CHECK(cudaFuncSetAttribute(bulk_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  CHECK(cudaFuncSetAttribute(lsu_kernel<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10));
  CHECK(cudaFuncSetAttribute(lsu_kernel<6>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));

  std::vector<Case> cases;
  for (int g : {1, 16, 64, 128, sms})
    for (int slot : {16384, 32768, 65536}) cases.push_back({"bulk", g, 1, false, 1, 0, slot});
  for (int g : {1, 16, 64, sms}) cases.push_back({"bulk", g, 1, true, 1, 0, 32768});
  for (int slot : {16384, 32768}) cases.push_back({"bulk", 64, 8, false, 1, 0, slot});
  cases.push_back({"bulk", 16, 16, false, 1, 0, 32768});
  // lsu: (warps, stages, tile): flash decode's (8, 3, 8K), then deeper or wider rings.
  const int lsu_shapes[][3] = {{8, 3, 8192}, {4, 6, 8192}, {16, 3, 4096}, {8, 6, 4096}};
  for (auto& s : lsu_shapes)
    for (int g : {1, 64, 128})
      for (int cl : {1, 8}) {
        if (cl == 8 && g != 64) continue;
        cases.push_back({"lsu", g, cl, false, s[0], s[1], s[2]});
      }
  for (auto& s : lsu_shapes) cases.push_back({"lsu", 64, 1, true, s[0], s[1], s[2]});
  // Half the SMs, spread over the chip (every other SM id) instead of the first 64 placed.
  for (int slot : {16384, 65536}) cases.push_back({"bulk", sms, 1, false, 1, 0, slot, 2});
  cases.push_back({"lsu", sms, 1, false, 8, 3, 8192, 2});
  cases.push_back({"lsu", sms, 1, false, 8, 6, 4096, 2});

  std::printf("shared-memory ingress, one CTA per SM (200 KB smem), median of 5\n");
  unsigned* active = nullptr;
  CHECK(cudaMalloc(&active, sizeof(unsigned)));
  std::printf("%-5s %5s %7s %3s %6s %6s %7s %6s %9s %9s\n", "eng", "CTAs", "cluster", "L2",
              "warps", "stages", "KB", "SM%", "GB/s", "GB/s/CTA");
  for (const Case& c : cases) {
    const std::size_t per_cta = c.l2 ? (std::size_t{32} << 20)
                                     : std::min<std::size_t>(total / c.ctas, std::size_t{64} << 20) >> 16 << 16;
    const std::size_t region = c.l2 ? (std::size_t{192} << 10) : 0;  // <= 26 MB over 132 CTAs
    std::vector<float> ms;
    unsigned streaming = 0;
    for (int rep = 0; rep < 5; ++rep) {
      cudaLaunchAttribute attr;
      const bool bulk = c.engine[0] == 'b';
      cudaLaunchConfig_t cfg = experiment::cluster_launch_config(
          dim3(c.ctas), dim3(bulk ? 32 : 32 * c.warps), 200 << 10, dim3(c.cluster), attr);
      CHECK(cudaMemset(active, 0, sizeof(unsigned)));
      CHECK(cudaEventRecord(start));
      if (bulk)
        CHECK(cudaLaunchKernelEx(&cfg, bulk_kernel, (const unsigned char*)buf, per_cta, region,
                                 c.chunk, c.sm_stride, active));
      else if (c.stages == 3)
        CHECK(cudaLaunchKernelEx(&cfg, lsu_kernel<3>, (const unsigned char*)buf, per_cta, region,
                                 c.chunk, c.sm_stride, active));
      else
        CHECK(cudaLaunchKernelEx(&cfg, lsu_kernel<6>, (const unsigned char*)buf, per_cta, region,
                                 c.chunk, c.sm_stride, active));
      CHECK(cudaEventRecord(stop));
      CHECK(cudaEventSynchronize(stop));
      float t = 0.0f;
      CHECK(cudaEventElapsedTime(&t, start, stop));
      ms.push_back(t);
      CHECK(cudaMemcpy(&streaming, active, sizeof(unsigned), cudaMemcpyDeviceToHost));
    }
    CHECK(cudaGetLastError());
    std::sort(ms.begin(), ms.end());
    const double gbs = static_cast<double>(per_cta) * streaming / (ms[2] * 1e-3) / 1e9;
    std::printf("%-5s %5u %7d %3s %6d %6d %7d %6d %9.1f %9.1f\n", c.engine, streaming, c.cluster,
                c.l2 ? "yes" : "no", c.warps, c.stages, c.chunk >> 10, c.sm_stride, gbs,
                gbs / streaming);
    std::fflush(stdout);
  }
  return 0;
}
