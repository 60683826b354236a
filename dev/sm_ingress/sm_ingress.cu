// dev/sm_ingress/sm_ingress.cu: how many bytes per second can G SMs pull from DRAM into shared
// memory with bulk copies (issue #7, docs/perf-decode-step.md §12: could one cluster of 16 SMs
// stream a decode layer's 7 MB of weights fast enough?). Standalone:
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -o sm_ingress sm_ingress.cu
//   ./sm_ingress          (~3 s on the H200)
//
// G CTAs (one per SM: 200 KB of shared memory each) each stream their own contiguous share of a
// 1 GB buffer through a ring of kSlots slots of kSlotBytes, one cp.async.bulk per slot and an
// mbarrier per slot, refilling a slot as soon as it has landed (nothing reads the data: the copy
// engine's ingress alone). Printed per G and slot size: GB/s in all and per SM, median of 5.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "../../src/backend/cuda/cluster.cuh"  // mbar_init, mbar_arrive_expect, mbar_wait, bulk_copy
#include "../experiment_util.cuh"               // CHECK

namespace {

using splice::cuda::detail::bulk_copy;
using splice::cuda::detail::mbar_arrive_expect;
using splice::cuda::detail::mbar_init;
using splice::cuda::detail::mbar_wait;

constexpr int kRingBytes = 192 << 10;
constexpr int kMaxSlots = 48;

__global__ void ingress_kernel(const unsigned char* src, std::size_t bytes_per_cta, int slot_bytes) {
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ std::uint64_t bars[kMaxSlots];
  const int slots = kRingBytes / slot_bytes;
  if (threadIdx.x != 0) return;
  for (int s = 0; s < slots; ++s) mbar_init<1>(&bars[s]);
  const unsigned char* base = src + blockIdx.x * bytes_per_cta;
  const std::size_t chunks = bytes_per_cta / slot_bytes;
  // Prologue: every slot in flight; then each landed slot is refilled with the next chunk.
  std::size_t issued = 0;
  for (int s = 0; s < slots && issued < chunks; ++s, ++issued) {
    mbar_arrive_expect(&bars[s], slot_bytes);
    bulk_copy(ring + s * slot_bytes, base + issued * slot_bytes, slot_bytes, &bars[s]);
  }
  for (std::size_t done = 0; done < chunks; ++done) {
    const int s = static_cast<int>(done % slots);
    mbar_wait(&bars[s], static_cast<std::uint32_t>((done / slots) & 1));
    if (issued < chunks) {
      mbar_arrive_expect(&bars[s], slot_bytes);
      bulk_copy(ring + s * slot_bytes, base + issued * slot_bytes, slot_bytes, &bars[s]);
      ++issued;
    }
  }
}

}  // namespace

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const std::size_t total = std::size_t{1} << 30;
  unsigned char* buf = nullptr;
  CHECK(cudaMalloc(&buf, total));
  CHECK(cudaMemset(buf, 1, total));
  CHECK(cudaFuncSetAttribute(ingress_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kRingBytes));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  std::printf("bulk-copy ingress from DRAM, one CTA per SM, %d KB ring\n", kRingBytes >> 10);
  std::printf("%5s %8s %10s %10s\n", "SMs", "slot KB", "GB/s", "GB/s/SM");
  for (int g : {1, 4, 8, 16, 32, 66, sms}) {
    for (int slot : {4096, 16384}) {
      // Each CTA's share: at least 8 MB, and the grid's shares inside the buffer.
      const std::size_t per_cta =
          std::min<std::size_t>(total / g, std::size_t{64} << 20) / slot * slot;
      std::vector<float> ms;
      for (int rep = 0; rep < 5; ++rep) {
        CHECK(cudaEventRecord(start));
        ingress_kernel<<<g, 32, kRingBytes>>>(buf, per_cta, slot);
        CHECK(cudaEventRecord(stop));
        CHECK(cudaEventSynchronize(stop));
        float t = 0.0f;
        CHECK(cudaEventElapsedTime(&t, start, stop));
        ms.push_back(t);
      }
      CHECK(cudaGetLastError());
      std::sort(ms.begin(), ms.end());
      const double gbs = static_cast<double>(per_cta) * g / (ms[2] * 1e-3) / 1e9;
      std::printf("%5d %8d %10.1f %10.1f\n", g, slot >> 10, gbs, gbs / g);
      std::fflush(stdout);
    }
  }
  return 0;
}
