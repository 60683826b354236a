// dev/experiment_util.cuh: what the standalone device experiments (dev/qkv_rope, dev/kv_prefix,
// dev/flag_handoff; dev/tile_cycles takes the error check)
// share: the error check, the PDL handshake and launcher, a cluster launch config, host bf16 conversions, deterministic
// random bf16 data, and host <-> device copies. Header-only, so each experiment still builds with
// one nvcc command.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CHECK(call)                                                               \
  do {                                                                            \
    const cudaError_t e_ = (call);                                                \
    if (e_ != cudaSuccess) {                                                      \
      std::fprintf(stderr, "%s failed at %s:%d: %s\n", #call, __FILE__, __LINE__, \
                   cudaGetErrorString(e_));                                       \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)

namespace experiment {

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// One launch of a `grid` of CTAs (a count, or a dim3) with the PDL attribute (the kernel must
// pdl_wait() before touching what its predecessor writes).
template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, int threads, int smem, cudaStream_t stream,
                Args&&... args) {
  cudaLaunchConfig_t c{};
  c.gridDim = grid;
  c.blockDim = dim3(threads);
  c.dynamicSmemBytes = smem;
  c.stream = stream;
  cudaLaunchAttribute a{};
  a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a.val.programmaticStreamSerializationAllowed = 1;
  c.attrs = &a;
  c.numAttrs = 1;
  CHECK(cudaLaunchKernelEx(&c, kernel, args...));
}

// A launch config of `grid` CTAs of `block` threads and `smem` dynamic shared-memory bytes in
// thread-block clusters of `cluster` (no cluster attribute when it holds one CTA); `attribute`
// must outlive the config.
inline cudaLaunchConfig_t cluster_launch_config(dim3 grid, dim3 block, int smem, dim3 cluster,
                                                cudaLaunchAttribute& attribute,
                                                cudaStream_t stream = nullptr) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  attribute = cudaLaunchAttribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = cluster.x;
  attribute.val.clusterDim.y = cluster.y;
  attribute.val.clusterDim.z = cluster.z;
  config.attrs = &attribute;
  config.numAttrs = cluster.x * cluster.y * cluster.z > 1 ? 1 : 0;
  return config;
}

inline float bf(std::uint16_t bits) {
  const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline std::uint16_t to_bf(float f) {  // round to nearest even (finite inputs)
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

// n bf16 values mean + scale * U[-1, 1) from a linear congruential generator seeded with `seed`.
inline std::vector<std::uint16_t> random_bf16(std::size_t n, std::uint32_t seed, float scale = 1.0f,
                                              float mean = 0.0f) {
  std::vector<std::uint16_t> v(n);
  std::uint32_t s = seed;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = to_bf(mean + scale * (static_cast<float>(s >> 8) / 16777216.0f * 2.0f - 1.0f));
  }
  return v;
}

template <typename T>
T* upload(const std::vector<T>& h) {
  T* d = nullptr;
  CHECK(cudaMalloc(&d, h.size() * sizeof(T)));
  CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
template <typename T>
std::vector<T> download(const T* d, std::size_t n) {
  std::vector<T> h(n);
  CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

}  // namespace experiment
