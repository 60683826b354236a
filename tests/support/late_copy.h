// A predecessor that rewrites device memory while its PDL dependent already runs: for the GPU
// tests of kernels that read memory before their PDL wait (launch.cuh's rule), so the value
// they read there is stale and the value they read after it is new. Built with the CUDA layer
// only (tests/support/late_copy.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

namespace splice::testing {

// One device-to-device copy of `bytes` bytes.
struct DeviceCopy {
  void* dst = nullptr;
  const void* src = nullptr;
  std::size_t bytes = 0;
};

// A delay that outlasts a dependent's start and its reads before the wait (a few us).
inline constexpr unsigned kLateCopyDelayUs = 50;

// The most copies one launch makes (they travel in the kernel's parameters).
inline constexpr std::size_t kMaxLateCopies = 64;

// Launches one 32-thread kernel on `stream` (without the PDL attribute: it follows the stream's
// earlier work) that first lets its dependent launch (griddepcontrol.launch_dependents: the next
// kernel on `stream`, launched with the PDL attribute, then runs its code before its wait beside
// this one), spins for `delay_us` microseconds of the global timer and then makes `copies`. The
// dependent's wait returns after the copies are visible. Throws std::runtime_error on a launch
// error or more than kMaxLateCopies copies.
void launch_late_copies(const std::vector<DeviceCopy>& copies, unsigned delay_us,
                        cudaStream_t stream);

}  // namespace splice::testing
