// Device-side conversions between the storage float types (f32, f16, bf16) and fp32 math, with
// round-to-nearest-even on the way back: one definition for the kernels that are templated on the
// element type (gemv.cu, layer_ops.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

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

}  // namespace splice::cuda::detail
