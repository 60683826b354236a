// CUDA kernel of Op::RopeKvAppend (see splice/backend/cuda/rope_kv_append.h): the attention
// prologue of one decode token in one launch.
//
//   1. Host: validate devices, dtypes, shapes and unit last strides with the CPU kernel's typed
//      errors; fill one POD params struct (raw pointers, element strides); launch on
//      cuda::current_stream() through detail::launch_kernel (PDL when enabled).
//   2. Kernel: one thread per (batch b, head h of the q|k|v row, i < D/2) pair (a grid-stride
//      loop). It opens with pdl_prologue() (wait for the producers, then trigger: launch.cuh),
//      then reads p = position[0] from device memory (so a replayed CUDA graph sees each token's
//      position). With x = qkv[b, 0, h D : (h + 1) D], c = cos[p], s = sin[p]:
//        y_i = x_i c_i + (-x_{i+D/2}) s_i,   y_{i+D/2} = x_{i+D/2} c_{i+D/2} + x_i s_{i+D/2}
//      each product rounded to fp32 before the sum (__fmul_rn / __fadd_rn: cpu::rope's exact
//      operations), stored in qkv's dtype: q heads (h < Hq) into out[b, h], k heads into
//      k_cache[b, h - Hq, p]; v heads are copied into v_cache[b, h - Hq - Hkv, p] unchanged.
//      A p outside [0, min(max_seq_len, capacity)) writes zeros to out and leaves the caches.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/float_convert.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/layer_op_checks.h"
#include "splice/backend/cuda/rope_kv_append.h"
#include "splice/backend/cuda/runtime.h"
#include "splice/core/error.h"

namespace splice::cuda {
namespace {

constexpr int kThreads = 256;              // block size
constexpr long long kMaxBlocks = 1 << 16;  // the grid-stride loop covers the rest

struct RopeKvAppendParams {
  const void* qkv = nullptr;  // [B, 1, (Hq + 2 Hkv) D], unit-stride row
  long long qkv_stride0 = 0;
  void* out = nullptr;  // [B, Hq, 1, D]
  long long out_stride0 = 0, out_stride1 = 0;
  void* k_cache = nullptr;  // [B, Hkv, capacity, D]
  void* v_cache = nullptr;
  long long k_stride[3] = {}, v_stride[3] = {};  // batch, head, row (elements; unit last)
  const void* cos = nullptr;
  const void* sin = nullptr;
  int table_dtype = 0;
  long long table_rows = 0, table_stride0 = 0, table_stride1 = 0;
  long long capacity = 0;
  const int* position = nullptr;
  long long batch = 0, heads = 0, kv_heads = 0, dim = 0;
};

using detail::from_float;
using detail::to_float;

// An element of a runtime-typed float table.
__device__ __forceinline__ float load_any(const void* p, int dtype, long long off) {
  switch (static_cast<DType>(dtype)) {
    case DType::f16:
      return __half2float(static_cast<const __half*>(p)[off]);
    case DType::bf16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[off]);
    default:
      return static_cast<const float*>(p)[off];
  }
}

template <typename T>
__global__ void rope_kv_append_kernel(RopeKvAppendParams p) {
  detail::pdl_prologue();  // before the position load (launch.cuh)
  const long long half = p.dim / 2, all_heads = p.heads + 2 * p.kv_heads;
  const long long total = p.batch * all_heads * half;
  const long long pos = *p.position;
  const bool valid = pos >= 0 && pos < p.table_rows && pos < p.capacity;
  const long long base = (valid ? pos : 0) * p.table_stride0;
  for (long long t = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long i = t % half, head = (t / half) % all_heads, b = t / (half * all_heads);
    const T* x = static_cast<const T*>(p.qkv) + b * p.qkv_stride0 + head * p.dim;
    if (head >= p.heads + p.kv_heads) {  // v: an exact copy into row p
      if (!valid) continue;
      T* y = static_cast<T*>(p.v_cache) + b * p.v_stride[0] +
             (head - p.heads - p.kv_heads) * p.v_stride[1] + pos * p.v_stride[2];
      y[i] = x[i];
      y[i + half] = x[i + half];
      continue;
    }
    T* y = head < p.heads ? static_cast<T*>(p.out) + b * p.out_stride0 + head * p.out_stride1
                          : static_cast<T*>(p.k_cache) + b * p.k_stride[0] +
                                (head - p.heads) * p.k_stride[1] + pos * p.k_stride[2];
    if (!valid) {
      if (head < p.heads) {
        y[i] = from_float<T>(0.0f);
        y[i + half] = from_float<T>(0.0f);
      }
      continue;
    }
    const float x1 = to_float(x[i]), x2 = to_float(x[i + half]);
    const float c1 = load_any(p.cos, p.table_dtype, base + i * p.table_stride1);
    const float c2 = load_any(p.cos, p.table_dtype, base + (i + half) * p.table_stride1);
    const float s1 = load_any(p.sin, p.table_dtype, base + i * p.table_stride1);
    const float s2 = load_any(p.sin, p.table_dtype, base + (i + half) * p.table_stride1);
    y[i] = from_float<T>(__fadd_rn(__fmul_rn(x1, c1), __fmul_rn(-x2, s1)));
    y[i + half] = from_float<T>(__fadd_rn(__fmul_rn(x2, c2), __fmul_rn(x1, s2)));
  }
}

void check_cuda_tensor(const Tensor& t, const char* op, const char* name) {
  check_defined(t, name);
  if (!t.device().is_cuda())
    fail<DeviceError>(op, ": `", name, "` must be a CUDA tensor, got ", t.device().str());
}

unsigned grid_for(long long work) {
  return static_cast<unsigned>(
      std::clamp<long long>((work + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

template <typename Fn>
void dispatch_float(DType dtype, Fn&& fn) {
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
  SPLICE_INTERNAL_CHECK(false, "rope_kv_append: dtype ", dtype_name(dtype),
                        " is not a float dtype");
}

}  // namespace

void rope_kv_append(const Tensor& qkv, const Tensor& cos, const Tensor& sin, const Tensor& position,
                    Tensor& k_cache, Tensor& v_cache, Tensor& out) {
  constexpr const char* kOp = "rope_kv_append";
  check_cuda_tensor(qkv, kOp, "qkv");
  check_cuda_tensor(cos, kOp, "cos");
  check_cuda_tensor(sin, kOp, "sin");
  check_cuda_tensor(position, kOp, "position");
  check_cuda_tensor(k_cache, kOp, "k_cache");
  check_cuda_tensor(v_cache, kOp, "v_cache");
  check_cuda_tensor(out, kOp, "out");
  layer_op_checks::check_float(qkv, kOp, "qkv");
  layer_op_checks::check_float(cos, kOp, "cos");
  if (qkv.dim() != 3 || qkv.size(1) != 1 || qkv.stride(2) != 1 || k_cache.dim() != 4 ||
      k_cache.stride(3) != 1 || v_cache.stride(3) != 1 || out.dim() != 4 || out.stride(3) != 1)
    fail<ShapeError>(kOp,
                     ": `qkv` must be [B, 1, (Hq + 2 Hkv) D] and the caches [B, Hkv, "
                     "capacity, D] and `out` [B, Hq, 1, D] with unit last strides, got qkv ",
                     qkv.describe(), ", k_cache ", k_cache.describe(), ", out ", out.describe());
  const std::int64_t batch = qkv.size(0), kv_heads = k_cache.size(1), dim = k_cache.size(3);
  const std::int64_t heads = dim > 0 ? qkv.size(2) / dim - 2 * kv_heads : 0;
  if (dim % 2 != 0 || heads <= 0 || qkv.size(2) != (heads + 2 * kv_heads) * dim ||
      k_cache.size(0) != batch || v_cache.shape() != k_cache.shape() ||
      out.shape() != Dims{batch, heads, 1, dim})
    fail<ShapeError>(kOp, ": shapes disagree: qkv ", dims_str(qkv.shape()), ", k_cache ",
                     dims_str(k_cache.shape()), ", v_cache ", dims_str(v_cache.shape()), ", out ",
                     dims_str(out.shape()), " (out must be [B, Hq, 1, D], D even)");
  for (const Tensor* t : {&k_cache, &v_cache, &out})
    if (t->dtype() != qkv.dtype())
      fail<DTypeError>(kOp, ": every tensor must have qkv's dtype ", dtype_name(qkv.dtype()),
                       ", got ", t->describe());
  if (cos.dim() != 2 || cos.size(1) != dim || sin.shape() != cos.shape() ||
      sin.strides() != cos.strides() || sin.dtype() != cos.dtype())
    fail<ShapeError>(kOp, ": `cos` and `sin` must both be [max_seq_len, ", dim,
                     "] of one dtype and layout, got ", cos.describe(), " and ", sin.describe());
  if (position.dtype() != DType::i32 || position.shape() != Dims{1})
    fail<DTypeError>(kOp, ": `position` must be i32 [1], got ", position.describe());
  RopeKvAppendParams p;
  p.qkv = qkv.raw_data();
  p.qkv_stride0 = qkv.stride(0);
  p.out = out.raw_data();
  p.out_stride0 = out.stride(0);
  p.out_stride1 = out.stride(1);
  p.k_cache = k_cache.raw_data();
  p.v_cache = v_cache.raw_data();
  for (int d = 0; d < 3; ++d) {
    p.k_stride[d] = k_cache.stride(d);
    p.v_stride[d] = v_cache.stride(d);
  }
  p.cos = cos.raw_data();
  p.sin = sin.raw_data();
  p.table_dtype = static_cast<int>(cos.dtype());
  p.table_rows = cos.size(0);
  p.table_stride0 = cos.stride(0);
  p.table_stride1 = cos.stride(1);
  p.capacity = k_cache.size(2);
  p.position = static_cast<const int*>(position.raw_data());
  p.batch = batch;
  p.heads = heads;
  p.kv_heads = kv_heads;
  p.dim = dim;
  if (batch == 0) return;
  dispatch_float(qkv.dtype(), [&](auto tag) {
    using T = decltype(tag);
    detail::launch_kernel(rope_kv_append_kernel<T>,
                          dim3(grid_for(batch * (heads + 2 * kv_heads) * (dim / 2))),
                          dim3(kThreads), current_stream(), p);
  });
}

}  // namespace splice::cuda
