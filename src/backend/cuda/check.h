// CUDA error checks: every runtime call's return code (launch.cuh's launcher also checks the last
// error after each launch).
#pragma once

#include <cuda_runtime.h>

#include "splice/core/error.h"

#define SPLICE_CUDA_CHECK(call)                                                                \
  do {                                                                                         \
    const cudaError_t splice_status_ = (call);                                                 \
    if (splice_status_ != cudaSuccess)                                                         \
      ::splice::fail<::splice::CudaError>(#call, " failed at ", __FILE__, ":", __LINE__, ": ", \
                                          cudaGetErrorString(splice_status_));                 \
  } while (0)
