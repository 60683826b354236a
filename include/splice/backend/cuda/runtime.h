// splice/backend/cuda/runtime.h: the CUDA backend's host runtime.
//
// Device tensors come from a caching allocator over cudaMalloc (freed blocks are kept per size
// class and reused, so steady-state decode allocates nothing); copies go through cudaMemcpyAsync
// on the current stream. Every CUDA call's return code is checked (SPLICE_CUDA_CHECK) and every
// launch is followed by a last-error check (SPLICE_CUDA_CHECK_LAUNCH), raising splice::CudaError.
#pragma once

#include <cstddef>
#include <string>

#include "splice/core/tensor.h"

namespace splice::cuda {

// True when a CUDA device is usable (false on machines with nvcc but no GPU).
bool device_available();
// Registers the CUDA allocator and copy hooks with core; idempotent, cheap.
void ensure_registered();
// A short description of the device, e.g. "NVIDIA H200 (sm_90, 132 SMs)".
std::string device_name(int index = 0);
void synchronize();

}  // namespace splice::cuda
