// launch_late_copies (late_copy.h): trigger, spin on %globaltimer, then copy byte by byte over
// one warp (the copies are small: metadata, a few cache rows).
#include <cstdint>
#include <stdexcept>
#include <string>

#include "support/late_copy.h"

namespace splice::testing {
namespace {

struct Copies {
  DeviceCopy copy[kMaxLateCopies];
  int count = 0;
  unsigned long long delay_ns = 0;
};

__global__ void late_copies_kernel(Copies copies) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  auto now = [] {
    unsigned long long ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    return ns;
  };
  const unsigned long long start = now();
  while (now() - start < copies.delay_ns) __nanosleep(1000);
  for (int c = 0; c < copies.count; ++c) {
    const auto* src = static_cast<const std::uint8_t*>(copies.copy[c].src);
    auto* dst = static_cast<std::uint8_t*>(copies.copy[c].dst);
    for (std::size_t i = threadIdx.x; i < copies.copy[c].bytes; i += blockDim.x) dst[i] = src[i];
  }
}

}  // namespace

void launch_late_copies(const std::vector<DeviceCopy>& copies, unsigned delay_us,
                        cudaStream_t stream) {
  if (copies.size() > kMaxLateCopies)
    throw std::runtime_error("launch_late_copies: " + std::to_string(copies.size()) +
                             " copies, at most " + std::to_string(kMaxLateCopies));
  Copies params;
  for (const DeviceCopy& c : copies) params.copy[params.count++] = c;
  params.delay_ns = 1000ull * delay_us;
  late_copies_kernel<<<1, 32, 0, stream>>>(params);
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess)
    throw std::runtime_error(std::string("launch_late_copies: ") + cudaGetErrorString(status));
}

}  // namespace splice::testing
