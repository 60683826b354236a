// Device-side conversions between the storage float types (f32, f16, bf16) and fp32 math, with
// round-to-nearest-even on the way back, and the host dispatch from a DType to those types: one
// definition for the kernels that are templated on the element type (gemv_kernel.cuh, layer_ops.cu,
// rope_kv_append.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "splice/core/dtype.h"
#include "splice/core/error.h"

namespace splice::cuda::detail {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Element `index` of a runtime-typed float array (f16, bf16, else f32): weights and tables whose
// dtype differs from the kernel's element type. `dtype` is a DType or its int value (the kernels'
// parameter structs carry it as an int).
template <typename DTypeValue>
__device__ __forceinline__ float load_any(const void* p, DTypeValue dtype, long long index) {
  switch (static_cast<DType>(dtype)) {
    case DType::f16:
      return __half2float(static_cast<const __half*>(p)[index]);
    case DType::bf16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[index]);
    default:
      return static_cast<const float*>(p)[index];
  }
}

// Calls fn(T{}) with T the device type of a float dtype (float, __half, __nv_bfloat16); `what`
// names the caller in the internal error for any other dtype (callers validate dtypes first).
template <typename Fn>
void dispatch_float(DType dtype, const char* what, Fn&& fn) {
  switch (dtype) {
    case DType::f32:
      return fn(float{});
    case DType::f16:
      return fn(__half{});
    case DType::bf16:
      return fn(__nv_bfloat16{});
    default:
      break;
  }
  SPLICE_INTERNAL_CHECK(false, what, ": dtype ", dtype_name(dtype), " is not a float dtype");
}

}  // namespace splice::cuda::detail
