// What the CUDA benchmarks share: the error check, deterministic bf16 fills, the timing of a
// captured graph's replays (CUDA events around each replay, after warm-up replays), and the
// card's copy and read ceilings (large device-to-device copies, bytes read + written; a large
// read).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define BENCH_CHECK(call)                                                         \
  do {                                                                            \
    const cudaError_t status_ = (call);                                           \
    if (status_ != cudaSuccess) {                                                 \
      std::fprintf(stderr, "%s failed at %s:%d: %s\n", #call, __FILE__, __LINE__, \
                   cudaGetErrorString(status_));                                  \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)

namespace splice::bench {

// Deterministic pseudo-random bf16 values in [-2, 2) (a hash of the index; never zeros).
__global__ inline void fill_random(__nv_bfloat16* data, std::size_t count, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    std::uint32_t x = static_cast<std::uint32_t>(i) * 2654435761u ^ seed ^
                      static_cast<std::uint32_t>(i >> 32) * 40503u;
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    data[i] = __float2bfloat16(static_cast<float>(x & 0xFFFFu) / 16384.0f - 2.0f);
  }
}

struct ReplayTimes {
  double median_us = 0;  // per call
  double spread_us = 0;  // max - min, per call
};

// Replays `exec` on `stream` `warmup` times untimed, and further until `min_warm_ms` of device
// time have passed (batches of `warmup` replays, timed with events), then `reps` times, each
// between two CUDA events; per call = the replay's time / `calls_per_replay`.
inline ReplayTimes time_replays(cudaGraphExec_t exec, cudaStream_t stream, int warmup, int reps,
                                int calls_per_replay, double min_warm_ms = 0.0) {
  if (min_warm_ms > 0.0) {
    cudaEvent_t w0, w1;
    BENCH_CHECK(cudaEventCreate(&w0));
    BENCH_CHECK(cudaEventCreate(&w1));
    BENCH_CHECK(cudaEventRecord(w0, stream));
    for (float ms = 0.0f; ms < min_warm_ms;) {
      for (int i = 0; i < std::max(warmup, 1); ++i) BENCH_CHECK(cudaGraphLaunch(exec, stream));
      BENCH_CHECK(cudaEventRecord(w1, stream));
      BENCH_CHECK(cudaEventSynchronize(w1));
      BENCH_CHECK(cudaEventElapsedTime(&ms, w0, w1));
    }
    BENCH_CHECK(cudaEventDestroy(w0));
    BENCH_CHECK(cudaEventDestroy(w1));
  }
  for (int i = 0; i < warmup; ++i) BENCH_CHECK(cudaGraphLaunch(exec, stream));
  cudaEvent_t start, stop;
  BENCH_CHECK(cudaEventCreate(&start));
  BENCH_CHECK(cudaEventCreate(&stop));
  std::vector<double> us;
  for (int r = 0; r < reps; ++r) {
    BENCH_CHECK(cudaEventRecord(start, stream));
    BENCH_CHECK(cudaGraphLaunch(exec, stream));
    BENCH_CHECK(cudaEventRecord(stop, stream));
    BENCH_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    BENCH_CHECK(cudaEventElapsedTime(&ms, start, stop));
    us.push_back(1e3 * ms / calls_per_replay);
  }
  BENCH_CHECK(cudaEventDestroy(start));
  BENCH_CHECK(cudaEventDestroy(stop));
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us.back() - us.front()};
}

// Straight-line code larger than an SM's instruction caches: kColdCodeFmas FFMAs with distinct
// immediates in 8 independent chains (~16 B of SASS each: 256 KB), one warp on every SM. Run
// between two calls of an arm (flush_code) it leaves none of the arm's code cached, as in a
// decode step where each kernel runs once among ~30 others (docs/perf.md run 343). A bench
// times (flush, arm) and subtracts the flushes alone.
constexpr int kColdCodeFmas = 16384;
// Where cold_code_kernel would store its (never taken) result: a device array, so no allocation
// happens inside a stream capture (the benches call flush_code while capturing).
static __device__ float g_cold_code_sink[32];
__global__ inline void cold_code_kernel(float seed) {
  float acc[8];
#pragma unroll
  for (int c = 0; c < 8; ++c) acc[c] = seed + static_cast<float>(threadIdx.x + c);
#pragma unroll
  for (int i = 0; i < kColdCodeFmas / 8; ++i)
#pragma unroll
    for (int c = 0; c < 8; ++c) acc[c] = fmaf(acc[c], 0.999f + 1e-7f * (i * 8 + c), 1e-3f * c);
  float sum = 0.0f;
#pragma unroll
  for (int c = 0; c < 8; ++c) sum += acc[c];
  if (sum == 1234.5f) g_cold_code_sink[threadIdx.x] = sum;  // keeps the chains; never true here
}

// cold_code_kernel on `sms` CTAs of one warp on `stream` (capturable).
inline void flush_code(int sms, cudaStream_t stream) {
  cold_code_kernel<<<sms, 32, 0, stream>>>(0.5f);
}

// The median time in seconds of 9 calls of `enqueue` (work on `stream`), each between two CUDA
// events, after 3 untimed ones: the ceilings' timing.
template <typename Enqueue>
double median_seconds(cudaStream_t stream, Enqueue&& enqueue) {
  cudaEvent_t start, stop;
  BENCH_CHECK(cudaEventCreate(&start));
  BENCH_CHECK(cudaEventCreate(&stop));
  std::vector<double> seconds;
  for (int i = 0; i < 3 + 9; ++i) {
    BENCH_CHECK(cudaEventRecord(start, stream));
    enqueue();
    BENCH_CHECK(cudaEventRecord(stop, stream));
    BENCH_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    BENCH_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (i >= 3) seconds.push_back(1e-3 * ms);
  }
  BENCH_CHECK(cudaEventDestroy(start));
  BENCH_CHECK(cudaEventDestroy(stop));
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

inline int current_sm_count() {
  int device = 0, sms = 0;
  BENCH_CHECK(cudaGetDevice(&device));
  BENCH_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

// A plain 16-byte copy (grid-stride, four vectors in flight a thread): one of the two copies
// measure_copy_bandwidth times.
__global__ inline void copy_vectors_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                           std::size_t count) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < count; i += 4 * stride) {
    const uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    dst[i] = a;
    dst[i + stride] = b;
    dst[i + 2 * stride] = c;
    dst[i + 3 * stride] = d;
  }
  for (; i < count; i += stride) dst[i] = src[i];
}

// The card's copy ceiling in bytes/s, counting bytes read plus bytes written (METHOD.md's
// yardstick): the faster of a `bytes` device-to-device cudaMemcpyAsync and copy_vectors_kernel
// (4 CTAs of 512 threads an SM) between two fresh buffers (median_seconds each). The faster
// copy, so the floor is never set by a slow copy. The H200 read 4.24 TB/s in the issues'
// measurement (design.md), the H100 ~3.0 (KINDS.md).
inline double measure_copy_bandwidth(cudaStream_t stream,
                                     std::size_t bytes = std::size_t{1} << 30) {
  void *src = nullptr, *dst = nullptr;
  BENCH_CHECK(cudaMalloc(&src, bytes));
  BENCH_CHECK(cudaMalloc(&dst, bytes));
  BENCH_CHECK(cudaMemsetAsync(src, 0x3c, bytes, stream));
  const int sms = current_sm_count();
  const double memcpy_s = median_seconds(stream, [&] {
    BENCH_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
  });
  const double kernel_s = median_seconds(stream, [&] {
    copy_vectors_kernel<<<4 * sms, 512, 0, stream>>>(static_cast<const uint4*>(src),
                                                     static_cast<uint4*>(dst), bytes / 16);
    BENCH_CHECK(cudaGetLastError());
  });
  BENCH_CHECK(cudaFree(src));
  BENCH_CHECK(cudaFree(dst));
  return 2.0 * static_cast<double>(bytes) / std::min(memcpy_s, kernel_s);
}

// A plain 16-byte read (grid-stride, four vectors in flight a thread), its values folded into
// one word that is stored only if it equals `never` (so the loads stay).
__global__ inline void read_vectors_kernel(const uint4* __restrict__ src, std::size_t count,
                                           unsigned never, unsigned* sink) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  unsigned acc = 0;
  for (; i + 3 * stride < count; i += 4 * stride) {
    const uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^
           d.w;
  }
  for (; i < count; i += stride) acc ^= src[i].x ^ src[i].y ^ src[i].z ^ src[i].w;
  if (acc == never) *sink = acc;
}

// The card's read ceiling in bytes/s (design.md §4's yardstick for a read-bound kernel such as
// flash decode: the H200 read 4.48 TB/s with a plain 16-byte-load kernel): read_vectors_kernel
// (4 CTAs of 512 threads an SM) over `bytes` of fresh memory (median_seconds).
inline double measure_read_bandwidth(cudaStream_t stream,
                                     std::size_t bytes = std::size_t{1} << 31) {
  void* src = nullptr;
  unsigned* sink = nullptr;
  BENCH_CHECK(cudaMalloc(&src, bytes));
  BENCH_CHECK(cudaMalloc(&sink, sizeof(unsigned)));
  BENCH_CHECK(cudaMemsetAsync(src, 0x3c, bytes, stream));
  const int sms = current_sm_count();
  // 0x3c3c3c3c words fold to 0 four at a time; `never` = 1 is never met.
  const double read_s = median_seconds(stream, [&] {
    read_vectors_kernel<<<4 * sms, 512, 0, stream>>>(static_cast<const uint4*>(src), bytes / 16, 1u,
                                                     sink);
    BENCH_CHECK(cudaGetLastError());
  });
  BENCH_CHECK(cudaFree(src));
  BENCH_CHECK(cudaFree(sink));
  return static_cast<double>(bytes) / read_s;
}

// A host copy of `bytes` bytes at `device` (the benches' output checks).
inline std::vector<std::uint8_t> to_host(const void* device, std::size_t bytes) {
  std::vector<std::uint8_t> host(bytes);
  BENCH_CHECK(cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost));
  return host;
}

}  // namespace splice::bench
