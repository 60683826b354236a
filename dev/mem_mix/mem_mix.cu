// dev/mem_mix/mem_mix.cu: DRAM bandwidth of read / write mixes on the H200 (issue 6: KDA's
// T > 1 floor counts bytes over the measured copy bandwidth, 4.24 TB/s, but its traffic is
// mostly writes: T checkpoint writes per source-state read). Standalone:
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -o mem_mix mem_mix.cu
//   ./mem_mix          (~2 s)
// A grid of 4 x SMs CTAs of 256 threads streams with 16-byte vector loads and stores, grid
// stride, 4 independent vectors per thread and step; each vector read is written to `writes`
// destinations
// (writes = 0: read only, folded into a per-thread value). Per mix: bytes read +
// written over the time (median of 7), and the copy mix (1 read : 1 write) for reference.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "../experiment_util.cuh"  // CHECK

namespace {

__global__ void mix_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst,
                           std::size_t vectors, int writes, std::size_t dst_stride,
                           unsigned* sink) {
  // kUnroll independent vectors per thread and step, so kUnroll loads are in flight at once.
  constexpr int kUnroll = 4;
  unsigned acc = 0;
  const std::size_t step = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i0 = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
       i0 < vectors; i0 += step * kUnroll) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::size_t i = i0 + u * step;
      v[u] = i < vectors ? (src ? __ldcs(src + i) : make_uint4(static_cast<unsigned>(i), 1, 2, 3))
                         : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::size_t i = i0 + u * step;
      if (i >= vectors) continue;
      if (writes == 0) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
      for (int w = 0; w < writes; ++w) __stcs(dst + w * dst_stride + i, v[u]);
    }
  }
  if (acc == 0x12345678u) *sink = acc;  // keeps the loads
}

}  // namespace

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const std::size_t src_bytes = std::size_t{512} << 20;  // per read pass
  const std::size_t vectors = src_bytes / 16;
  const int max_writes = 8;
  uint4 *src = nullptr, *dst = nullptr;
  unsigned* sink = nullptr;
  CHECK(cudaMalloc(&src, src_bytes));
  CHECK(cudaMalloc(&dst, src_bytes * max_writes));
  CHECK(cudaMalloc(&sink, 4));
  CHECK(cudaMemset(src, 1, src_bytes));
  CHECK(cudaMemset(dst, 0, src_bytes * max_writes));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  std::printf("DRAM read/write mixes, %d CTAs x 256 threads, 16-byte streaming loads/stores\n",
              4 * sms);
  std::printf("%-22s %10s %10s\n", "mix", "GB moved", "TB/s");
  struct Mix {
    const char* name;
    bool read;
    int writes;
  };
  const Mix mixes[] = {{"read only", true, 0},          {"write only", false, 1},
                       {"copy 1:1", true, 1},           {"1 read : 2 writes", true, 2},
                       {"1 read : 4 writes", true, 4},  {"1 read : 8 writes", true, 8},
                       {"write only x8", false, 8}};
  for (const Mix& m : mixes) {
    std::vector<float> ms;
    for (int rep = 0; rep < 7; ++rep) {
      CHECK(cudaEventRecord(start));
      mix_kernel<<<4 * sms, 256>>>(m.read ? src : nullptr, dst, vectors, m.writes, vectors, sink);
      CHECK(cudaEventRecord(stop));
      CHECK(cudaEventSynchronize(stop));
      float t = 0.0f;
      CHECK(cudaEventElapsedTime(&t, start, stop));
      ms.push_back(t);
    }
    CHECK(cudaGetLastError());
    std::sort(ms.begin(), ms.end());
    const double bytes = static_cast<double>(src_bytes) * ((m.read ? 1 : 0) + m.writes);
    std::printf("%-22s %10.2f %10.2f\n", m.name, bytes / 1e9, bytes / (ms[3] * 1e-3) / 1e12);
  }
  return 0;
}
