// CUDA primitive kernels (primitives.h): elementwise ops, casts and copies, gather, iota, write_at,
// reductions and softmax; matmul lives in primitives_gemm.cc (cuBLASLt).
//
//   1. Host: validate devices, dtypes and shapes with the CPU backend's typed errors; broadcast
//      every operand to the iteration shape (stride 0 on stretched axes); coalesce the iteration
//      space (drop size-1 axes, merge axis d into d+1 when stride[d] == stride[d+1] * shape[d+1]
//      for every operand) to at most kMaxDims axes; fill one POD params struct.
//   2. Elementwise kernel (one for every elementwise family): a grid-stride loop over the linear
//      index i of the iteration space; i is decomposed into a multi-index, giving each operand's
//      element offset  off_k = sum_d idx_d * stride_k[d]; the family's op reads the inputs as
//      float (fp32 math) or int64 (exact integer math), then stores into out's dtype (RNE for the
//      16-bit floats, saturating float -> int, wrapping int -> int). Same-dtype copies move raw
//      bits.
//   3. Row kernel (reduce, softmax): one warp per row of the reduced axis; lanes stride the row,
//      partials combine by butterfly shuffles:
//        sum:     s = sum_j x_j;     mean: s / n;      max: m = max_j x_j (NaN propagates)
//        softmax: m = max_j x_j,  s = sum_j exp(x_j - m),  y_j = exp(x_j - m) / s  (m = -inf: 0)
//   4. Launch (launch.cuh): every kernel opens with pdl_prologue() (single-wave grids let the next
//      kernel launch, then every thread waits for its producers before touching global memory)
//      and is launched with programmatic dependent launch on a created stream unless SPLICE_PDL=0;
//      this file also owns that switch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/primitives_internal.h"
#include "splice/backend/cuda/primitives.h"
#include "splice/backend/cuda/runtime.h"
#include "splice/core/error.h"

namespace splice::cuda {
namespace {

using detail::kMaxDims;
using Strides = std::array<long long, detail::kMaxRank>;  // one operand's strides, host side

constexpr int kThreads = 256;              // threads per block for every kernel here
constexpr int kWarp = 32;                  // lanes per warp
constexpr long long kMaxBlocks = 1 << 16;  // grid-stride loops cover the rest
constexpr int kMaxOperands = 4;            // out + up to three inputs (where)

enum Family : int { kUnary, kBinary, kCompare, kWhere, kCast, kIota, kGather, kFill };

struct ElementwiseParams {
  int family = 0;
  int op = 0;
  int rank = 0;
  long long numel = 0;
  long long shape[kMaxDims] = {};
  long long stride[kMaxOperands][kMaxDims] = {};
  void* ptr[kMaxOperands] = {};
  int dtype[kMaxOperands] = {};
  int elem_size[kMaxOperands] = {};
  // iota: value = start + index_on_axis * step; fill: value = start.
  double start = 0.0, step = 1.0;
  int axis = -1;
  // gather: operand 1 holds row indices into operand 2 (the table) along its axis 0.
  long long table_rows = 0, table_stride0 = 0;
  // write_at with a device offset: out's base moves by offset * dyn_offset_stride elements.
  const void* dyn_offset = nullptr;
  int dyn_offset_dtype = 0;
  long long dyn_offset_stride = 0, dyn_offset_max = 0;
};

struct RowParams {
  int kind = 0;  // ReduceKind for reduce, -1 for softmax
  int rank = 0;
  long long rows = 0;
  long long length = 0;
  long long shape[kMaxDims] = {};
  long long in_stride[kMaxDims] = {};
  long long out_stride[kMaxDims] = {};
  long long in_axis_stride = 0, out_axis_stride = 0;
  const void* in = nullptr;
  void* out = nullptr;
  int in_dtype = 0, out_dtype = 0;
};

// ---- device-side value conversions -------------------------------------------------------------

struct Value {
  long long i;
  float f;
  bool is_int;
};

__device__ __forceinline__ Value load(const void* p, int dtype, long long off) {
  switch (static_cast<DType>(dtype)) {
    case DType::f32:
      return {0, static_cast<const float*>(p)[off], false};
    case DType::f16:
      return {0, __half2float(static_cast<const __half*>(p)[off]), false};
    case DType::bf16:
      return {
          0,
          __uint_as_float(static_cast<unsigned>(static_cast<const unsigned short*>(p)[off]) << 16),
          false};
    case DType::i32:
      return {static_cast<const int*>(p)[off], 0.0f, true};
    case DType::i64:
      return {static_cast<const long long*>(p)[off], 0.0f, true};
    default:
      return {static_cast<const unsigned char*>(p)[off] != 0 ? 1LL : 0LL, 0.0f, true};
  }
}

__device__ __forceinline__ float as_float(Value v) {
  return v.is_int ? static_cast<float>(v.i) : v.f;
}
__device__ __forceinline__ double as_double(Value v) {
  return v.is_int ? static_cast<double>(v.i) : static_cast<double>(v.f);
}

// Float -> integer: NaN -> 0, saturation outside the range, else truncation toward zero.
__device__ __forceinline__ long long saturate(float f, long long lo, long long hi) {
  if (!(f == f)) return 0;
  if (f <= static_cast<float>(lo)) return lo;
  if (f >= static_cast<float>(hi)) return hi;
  return static_cast<long long>(f);
}

// f32 -> bf16 bits, round to nearest even, NaN kept quiet (the host's f32_to_bf16_bits).
__device__ __forceinline__ unsigned short to_bf16_bits(float value) {
  const unsigned bits = __float_as_uint(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<unsigned short>((bits >> 16) | 0x40u);
  const unsigned lsb = (bits >> 16) & 1u;
  return static_cast<unsigned short>((bits + 0x7FFFu + lsb) >> 16);
}

__device__ __forceinline__ void store(void* p, int dtype, long long off, Value v) {
  constexpr long long kI32Min = -2147483648LL, kI32Max = 2147483647LL;
  constexpr long long kI64Min = -9223372036854775807LL - 1, kI64Max = 9223372036854775807LL;
  switch (static_cast<DType>(dtype)) {
    case DType::f32:
      static_cast<float*>(p)[off] = as_float(v);
      return;
    case DType::f16:
      static_cast<__half*>(p)[off] = __float2half_rn(as_float(v));
      return;
    case DType::bf16:
      static_cast<unsigned short*>(p)[off] = to_bf16_bits(as_float(v));
      return;
    case DType::i32:
      static_cast<int*>(p)[off] = v.is_int ? static_cast<int>(static_cast<unsigned>(v.i))
                                           : static_cast<int>(saturate(v.f, kI32Min, kI32Max));
      return;
    case DType::i64:
      static_cast<long long*>(p)[off] = v.is_int ? v.i : saturate(v.f, kI64Min, kI64Max);
      return;
    default:
      static_cast<unsigned char*>(p)[off] = v.is_int ? (v.i != 0) : (v.f != 0.0f);
      return;
  }
}

__device__ __forceinline__ void copy_raw(void* dst, long long dst_off, const void* src,
                                         long long src_off, int size) {
  switch (size) {
    case 1:
      static_cast<unsigned char*>(dst)[dst_off] = static_cast<const unsigned char*>(src)[src_off];
      return;
    case 2:
      static_cast<unsigned short*>(dst)[dst_off] = static_cast<const unsigned short*>(src)[src_off];
      return;
    case 4:
      static_cast<unsigned*>(dst)[dst_off] = static_cast<const unsigned*>(src)[src_off];
      return;
    default:
      static_cast<unsigned long long*>(dst)[dst_off] =
          static_cast<const unsigned long long*>(src)[src_off];
      return;
  }
}

// ---- the ops ---------------------------------------------------------------------------------

__device__ __forceinline__ float apply_unary(int op, float z) {
  constexpr float kSoftplusLinear = 20.0f;  // softplus(z) = z above this (exp would overflow)
  switch (static_cast<UnaryKind>(op)) {
    case UnaryKind::exp:
      return expf(z);
    case UnaryKind::log:
      return logf(z);
    case UnaryKind::neg:
      return -z;
    case UnaryKind::abs:
      return fabsf(z);
    case UnaryKind::sqrt:
      return sqrtf(z);
    case UnaryKind::rsqrt:
      return 1.0f / sqrtf(z);
    case UnaryKind::reciprocal:
      return 1.0f / z;
    case UnaryKind::sigmoid:
      return 1.0f / (1.0f + expf(-z));
    case UnaryKind::silu:
      return z / (1.0f + expf(-z));
    case UnaryKind::softplus:
      return z > kSoftplusLinear ? z : log1pf(expf(z));
    default:
      return tanhf(z);
  }
}

__device__ __forceinline__ float nan_min(float a, float b) {
  return (a != a || b != b) ? __int_as_float(0x7FC00000) : fminf(a, b);
}
__device__ __forceinline__ float nan_max(float a, float b) {
  return (a != a || b != b) ? __int_as_float(0x7FC00000) : fmaxf(a, b);
}

__device__ __forceinline__ Value apply_binary(int op, Value a, Value b) {
  if (a.is_int && b.is_int) {  // exact int64 math, wrapping
    const auto ua = static_cast<unsigned long long>(a.i), ub = static_cast<unsigned long long>(b.i);
    long long r = 0;
    switch (static_cast<BinaryKind>(op)) {
      case BinaryKind::add:
        r = static_cast<long long>(ua + ub);
        break;
      case BinaryKind::sub:
        r = static_cast<long long>(ua - ub);
        break;
      case BinaryKind::mul:
        r = static_cast<long long>(ua * ub);
        break;
      case BinaryKind::div:  // truncation toward zero; a zero divisor gives 0 (no device throw)
        r = b.i == 0 ? 0 : (b.i == -1 ? static_cast<long long>(0ULL - ua) : a.i / b.i);
        break;
      case BinaryKind::minimum:
        r = a.i < b.i ? a.i : b.i;
        break;
      default:
        r = a.i > b.i ? a.i : b.i;
        break;
    }
    return {r, 0.0f, true};
  }
  const float x = as_float(a), y = as_float(b);
  float r = 0.0f;
  switch (static_cast<BinaryKind>(op)) {
    case BinaryKind::add:
      r = x + y;
      break;
    case BinaryKind::sub:
      r = x - y;
      break;
    case BinaryKind::mul:
      r = x * y;
      break;
    case BinaryKind::div:
      r = x / y;
      break;
    case BinaryKind::minimum:
      r = nan_min(x, y);
      break;
    default:
      r = nan_max(x, y);
      break;
  }
  return {0, r, false};
}

template <typename T>
__device__ __forceinline__ bool apply_compare(int op, T a, T b) {
  switch (static_cast<CompareKind>(op)) {
    case CompareKind::less:
      return a < b;
    case CompareKind::less_equal:
      return a <= b;
    case CompareKind::greater:
      return a > b;
    case CompareKind::greater_equal:
      return a >= b;
    case CompareKind::equal:
      return a == b;
    default:
      return a != b;
  }
}

__device__ __forceinline__ bool truthy(Value v) { return v.is_int ? v.i != 0 : v.f != 0.0f; }

__global__ void elementwise_kernel(ElementwiseParams p) {
  detail::pdl_prologue();  // before the offset load and every operand access (launch.cuh)
  long long shift = 0;     // write_at with a device offset: rows move by offset along the axis
  if (p.dyn_offset) {
    const long long offset = load(p.dyn_offset, p.dyn_offset_dtype, 0).i;
    if (offset < 0 || offset > p.dyn_offset_max) return;
    shift = offset * p.dyn_offset_stride;
  }
  const long long total_threads = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.numel;
       i += total_threads) {
    long long off[kMaxOperands] = {0, 0, 0, 0};
    long long rest = i, axis_index = 0;
    for (int d = p.rank - 1; d >= 0; --d) {
      const long long idx = rest % p.shape[d];
      rest /= p.shape[d];
      if (d == p.axis) axis_index = idx;
#pragma unroll
      for (int k = 0; k < kMaxOperands; ++k) off[k] += idx * p.stride[k][d];
    }
    off[0] += shift;
    switch (p.family) {
      case kUnary: {
        const float z = as_float(load(p.ptr[1], p.dtype[1], off[1]));
        store(p.ptr[0], p.dtype[0], off[0], Value{0, apply_unary(p.op, z), false});
        break;
      }
      case kBinary:
        store(p.ptr[0], p.dtype[0], off[0],
              apply_binary(p.op, load(p.ptr[1], p.dtype[1], off[1]),
                           load(p.ptr[2], p.dtype[2], off[2])));
        break;
      case kCompare: {
        const Value a = load(p.ptr[1], p.dtype[1], off[1]);
        const Value b = load(p.ptr[2], p.dtype[2], off[2]);
        bool r;
        if (a.is_int && b.is_int)
          r = apply_compare(p.op, a.i, b.i);
        else if (!a.is_int && !b.is_int)
          r = apply_compare(p.op, a.f, b.f);
        else
          r = apply_compare(p.op, as_double(a), as_double(b));
        store(p.ptr[0], p.dtype[0], off[0], Value{r ? 1LL : 0LL, 0.0f, true});
        break;
      }
      case kWhere: {
        const int k = truthy(load(p.ptr[1], p.dtype[1], off[1])) ? 2 : 3;
        if (p.dtype[k] == p.dtype[0])
          copy_raw(p.ptr[0], off[0], p.ptr[k], off[k], p.elem_size[0]);
        else
          store(p.ptr[0], p.dtype[0], off[0], load(p.ptr[k], p.dtype[k], off[k]));
        break;
      }
      case kCast:
        if (p.dtype[1] == p.dtype[0])
          copy_raw(p.ptr[0], off[0], p.ptr[1], off[1], p.elem_size[0]);
        else
          store(p.ptr[0], p.dtype[0], off[0], load(p.ptr[1], p.dtype[1], off[1]));
        break;
      case kIota: {
        const double v = p.start + static_cast<double>(axis_index) * p.step;
        const bool integer = p.dtype[0] == static_cast<int>(DType::i32) ||
                             p.dtype[0] == static_cast<int>(DType::i64);
        store(p.ptr[0], p.dtype[0], off[0],
              integer ? Value{static_cast<long long>(v), 0.0f, true}
                      : Value{0, static_cast<float>(v), false});
        break;
      }
      case kGather: {
        const long long row = load(p.ptr[1], p.dtype[1], off[1]).i;
        if (row < 0 || row >= p.table_rows) {
          store(p.ptr[0], p.dtype[0], off[0], Value{0, 0.0f, true});
          break;
        }
        const long long src = off[2] + row * p.table_stride0;
        if (p.dtype[2] == p.dtype[0])
          copy_raw(p.ptr[0], off[0], p.ptr[2], src, p.elem_size[0]);
        else
          store(p.ptr[0], p.dtype[0], off[0], load(p.ptr[2], p.dtype[2], src));
        break;
      }
      default: {  // kFill
        const bool floating = p.dtype[0] == static_cast<int>(DType::f32) ||
                              p.dtype[0] == static_cast<int>(DType::f16) ||
                              p.dtype[0] == static_cast<int>(DType::bf16);
        store(p.ptr[0], p.dtype[0], off[0],
              floating ? Value{0, static_cast<float>(p.start), false}
                       : Value{static_cast<long long>(p.start), 0.0f, true});
        break;
      }
    }
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int lane_mask = kWarp / 2; lane_mask > 0; lane_mask /= 2)
    v += __shfl_xor_sync(0xFFFFFFFFu, v, lane_mask);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int lane_mask = kWarp / 2; lane_mask > 0; lane_mask /= 2)
    v = nan_max(v, __shfl_xor_sync(0xFFFFFFFFu, v, lane_mask));
  return v;
}

__global__ void row_kernel(RowParams p) {
  detail::pdl_prologue();  // before every row access (launch.cuh)
  const long long warps = static_cast<long long>(gridDim.x) * (blockDim.x / kWarp);
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const float kNegInf = -CUDART_INF_F;
  for (long long row =
           static_cast<long long>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
       row < p.rows; row += warps) {
    long long in_off = 0, out_off = 0, rest = row;
    for (int d = p.rank - 1; d >= 0; --d) {
      const long long idx = rest % p.shape[d];
      rest /= p.shape[d];
      in_off += idx * p.in_stride[d];
      out_off += idx * p.out_stride[d];
    }
    const auto x = [&](long long j) {
      return as_float(load(p.in, p.in_dtype, in_off + j * p.in_axis_stride));
    };
    if (p.kind < 0) {  // softmax
      float m = kNegInf;
      for (long long j = lane; j < p.length; j += kWarp) m = nan_max(m, x(j));
      m = warp_max(m);
      float s = 0.0f;
      if (m != kNegInf)
        for (long long j = lane; j < p.length; j += kWarp) s += expf(x(j) - m);
      s = warp_sum(s);
      for (long long j = lane; j < p.length; j += kWarp) {
        const float y = m == kNegInf ? 0.0f : expf(x(j) - m) / s;
        store(p.out, p.out_dtype, out_off + j * p.out_axis_stride, Value{0, y, false});
      }
      continue;
    }
    float acc;
    if (p.kind == static_cast<int>(ReduceKind::max)) {
      acc = kNegInf;
      for (long long j = lane; j < p.length; j += kWarp) acc = nan_max(acc, x(j));
      acc = warp_max(acc);
    } else {
      acc = 0.0f;
      for (long long j = lane; j < p.length; j += kWarp) acc += x(j);
      acc = warp_sum(acc);
      if (p.kind == static_cast<int>(ReduceKind::mean)) acc /= static_cast<float>(p.length);
    }
    if (lane == 0) store(p.out, p.out_dtype, out_off, Value{0, acc, false});
  }
}

// ---- host side -------------------------------------------------------------------------------

void check_device(const Tensor& t, const char* name) {
  if (!t.defined()) fail<ValueError>("`", name, "` is required but was not given");
  if (!t.device().is_cuda())
    fail<DeviceError>("cuda primitives: `", name, "` must be on a CUDA device, got ",
                      t.device().str());
}

void check_same_device(const Tensor& t, const char* name, const Tensor& out) {
  if (!(t.device() == out.device()))
    fail<DeviceError>("cuda primitives: `", name, "` is on ", t.device().str(), " but `out` is on ",
                      out.device().str());
}

constexpr std::initializer_list<DType> kFloatTypes = {DType::f32, DType::f16, DType::bf16};
constexpr std::initializer_list<DType> kNumericTypes = {DType::f32, DType::f16, DType::bf16,
                                                        DType::i32, DType::i64};

std::int64_t wrap_axis(std::int64_t axis, std::int64_t rank, const char* what) {
  const std::int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= std::max<std::int64_t>(rank, 1))
    fail<ShapeError>("`", what, "` = ", axis, " is out of range for rank ", rank);
  return a;
}

// Strides of `t` aligned to `shape` (NumPy broadcasting: trailing axes align, size 1 stretches).
Strides broadcast_strides(const Tensor& t, const Dims& shape, const char* name) {
  Strides strides{};
  const std::size_t rank = shape.size();
  if (t.shape().size() > rank)
    fail<ShapeError>("`", name, "` of shape ", dims_str(t.shape()),
                     " does not broadcast to the output shape ", dims_str(shape));
  if (rank > strides.size())
    fail<ShapeError>("cuda primitives: rank ", rank, " exceeds ", strides.size());
  const std::size_t lead = rank - t.shape().size();
  for (std::size_t d = 0; d < t.shape().size(); ++d) {
    const std::int64_t size = t.shape()[d], want = shape[lead + d];
    if (size == want)
      strides[lead + d] = size == 1 ? 0 : t.strides()[d];
    else if (size == 1)
      strides[lead + d] = 0;
    else
      fail<ShapeError>("`", name, "` of shape ", dims_str(t.shape()),
                       " does not broadcast to the output shape ", dims_str(shape));
  }
  return strides;
}

// Fills shape/strides of `p` from the iteration `shape` and per-operand strides, coalesced.
void set_space(ElementwiseParams& p, const Dims& shape, const std::vector<Strides>& strides,
               bool coalesce) {
  std::vector<long long> dims;
  std::vector<Strides> per_dim;  // [dim][operand]
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (coalesce && shape[d] == 1) continue;
    Strides s{};
    for (std::size_t k = 0; k < strides.size(); ++k) s[k] = strides[k][d];
    if (coalesce && !dims.empty()) {
      bool mergeable = true;
      for (std::size_t k = 0; k < strides.size(); ++k)
        mergeable &= per_dim.back()[k] == s[k] * shape[d];
      if (mergeable) {
        dims.back() *= shape[d];
        per_dim.back() = s;
        continue;
      }
    }
    dims.push_back(shape[d]);
    per_dim.push_back(s);
  }
  if (dims.size() > static_cast<std::size_t>(kMaxDims))
    fail<ShapeError>("cuda primitives: the iteration space ", dims_str(shape), " has ", dims.size(),
                     " axes after merging contiguous ones; at most ", kMaxDims, " are supported");
  p.rank = static_cast<int>(dims.size());
  for (std::size_t d = 0; d < dims.size(); ++d) {
    p.shape[d] = dims[d];
    for (std::size_t k = 0; k < strides.size(); ++k) p.stride[k][d] = per_dim[d][k];
  }
  long long numel = 1;
  for (std::int64_t s : shape) numel *= s;
  p.numel = numel;
}

void set_operand(ElementwiseParams& p, int k, const Tensor& t) {
  p.ptr[k] = t.raw_data();
  p.dtype[k] = static_cast<int>(t.dtype());
  p.elem_size[k] = static_cast<int>(dtype_size(t.dtype()));
}

unsigned blocks_for(long long work, long long per_block) {
  return static_cast<unsigned>(
      std::clamp<long long>((work + per_block - 1) / per_block, 1, kMaxBlocks));
}

void launch(const ElementwiseParams& p) {
  if (p.numel == 0) return;
  detail::launch_kernel(elementwise_kernel, dim3(blocks_for(p.numel, kThreads)), dim3(kThreads),
                        current_stream(), p);
}

// out = op(inputs) over out's shape, inputs broadcast to it; an input shares no memory with out
// unless it is out's identical view (an in-place update).
void run_elementwise(int family, int op, Tensor& out, std::initializer_list<const Tensor*> inputs,
                     std::initializer_list<const char*> names, const char* out_name = "out") {
  auto input_name = names.begin();
  for (const Tensor* t : inputs) check_no_overlap(out, out_name, *t, *input_name++, true);
  ElementwiseParams p;
  p.family = family;
  p.op = op;
  std::vector<Strides> strides;
  strides.push_back(broadcast_strides(out, out.shape(), "out"));
  set_operand(p, 0, out);
  int k = 1;
  auto name = names.begin();
  for (const Tensor* t : inputs) {
    strides.push_back(broadcast_strides(*t, out.shape(), *name++));
    set_operand(p, k++, *t);
  }
  set_space(p, out.shape(), strides, true);
  launch(p);
}

// The broadcast shape of `a` and `b` (ShapeError naming both when they do not broadcast).
Dims broadcast_shape(const Dims& a, const Dims& b, const char* an, const char* bn) {
  const std::size_t rank = std::max(a.size(), b.size());
  Dims out(rank, 1);
  for (std::size_t i = 0; i < rank; ++i) {
    const std::int64_t x = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const std::int64_t y = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (x != y && x != 1 && y != 1)
      fail<ShapeError>("`", an, "` ", dims_str(a), " and `", bn, "` ", dims_str(b),
                       " do not broadcast");
    out[i] = x == 1 ? y : x;
  }
  return out;
}

void check_out_shape(const Tensor& out, const Dims& want, const char* what) {
  if (out.shape() != want)
    fail<ShapeError>("`out` must have ", what, " ", dims_str(want), ", got ",
                     dims_str(out.shape()));
  check_no_self_overlap(out, "out");
}

thread_local std::vector<Tensor>* t_scratch_sink = nullptr;

// hold_stream's kernel: one thread reads %globaltimer until `nanoseconds` have passed. It reads
// and writes no memory, so the launch rule's PDL safety holds trivially.
__global__ void hold_kernel(unsigned long long nanoseconds) {
  unsigned long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < nanoseconds);
}

// The PDL switch of launch.cuh: SPLICE_PDL=0 turns it off; read once, at the first launch.
std::atomic<bool>& pdl_switch() {
  static std::atomic<bool> enabled{[] {
    const char* value = std::getenv("SPLICE_PDL");
    return value == nullptr || std::strcmp(value, "0") != 0;
  }()};
  return enabled;
}

}  // namespace

bool pdl_enabled() { return pdl_switch().load(std::memory_order_relaxed); }
void set_pdl_enabled(bool enabled) { pdl_switch().store(enabled, std::memory_order_relaxed); }

namespace detail {

// launch.cuh's carveout rule: every kernel prefers the largest shared-memory carveout, set once
// per kernel, unless its LaunchShape names its own (`percent` >= 0); SPLICE_SMEM_CARVEOUT=<percent>
// overrides the rule's preference, -1 leaves the driver's default (read once, at the first
// launch).
void prefer_smem_carveout(const void* kernel, int percent) {
  static const int rule = [] {
    const char* value = std::getenv("SPLICE_SMEM_CARVEOUT");
    return value && *value ? std::atoi(value) : cudaSharedmemCarveoutMaxShared;
  }();
  const int want = percent >= 0 ? percent : rule;
  if (want < 0) return;
  // Once per (thread, device, kernel): no lock on the launch path, and every device's copy of
  // the kernel gets the preference (setting it again from another thread is harmless).
  thread_local std::set<std::pair<int, const void*>> done;
  int device = 0;
  SPLICE_CUDA_CHECK(cudaGetDevice(&device));
  if (!done.insert({device, kernel}).second) return;
  SPLICE_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, want));
}

Tensor scratch(const Dims& shape, DType dtype, Device device) {
  Tensor t = Tensor::empty(shape, dtype, device);
  if (t_scratch_sink) t_scratch_sink->push_back(t);
  return t;
}

}  // namespace detail

void retain_scratch(std::vector<Tensor>* sink) { t_scratch_sink = sink; }

void unary(UnaryKind kind, const Tensor& in, Tensor& out) {
  check_device(in, "in");
  check_device(out, "out");
  check_same_device(in, "in", out);
  check_dtype(in, "in", kFloatTypes);
  check_dtype(out, "out", kFloatTypes);
  check_out_shape(out, in.shape(), "the shape of `in`");
  run_elementwise(kUnary, static_cast<int>(kind), out, {&in}, {"in"});
}

void binary(BinaryKind kind, const Tensor& a, const Tensor& b, Tensor& out) {
  check_device(a, "a");
  check_device(b, "b");
  check_device(out, "out");
  check_same_device(a, "a", out);
  check_same_device(b, "b", out);
  check_dtype(a, "a", kNumericTypes);
  check_dtype(b, "b", kNumericTypes);
  check_dtype(out, "out", kNumericTypes);
  check_out_shape(out, broadcast_shape(a.shape(), b.shape(), "a", "b"), "the broadcast shape");
  run_elementwise(kBinary, static_cast<int>(kind), out, {&a, &b}, {"a", "b"});
}

void compare(CompareKind kind, const Tensor& a, const Tensor& b, Tensor& out) {
  check_device(a, "a");
  check_device(b, "b");
  check_device(out, "out");
  check_same_device(a, "a", out);
  check_same_device(b, "b", out);
  check_dtype(a, "a", kNumericTypes);
  check_dtype(b, "b", kNumericTypes);
  check_dtype(out, "out", {DType::boolean});
  check_out_shape(out, broadcast_shape(a.shape(), b.shape(), "a", "b"), "the broadcast shape");
  run_elementwise(kCompare, static_cast<int>(kind), out, {&a, &b}, {"a", "b"});
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) {
  check_device(cond, "cond");
  check_device(a, "a");
  check_device(b, "b");
  check_device(out, "out");
  check_same_device(cond, "cond", out);
  check_same_device(a, "a", out);
  check_same_device(b, "b", out);
  check_dtype(cond, "cond", {DType::boolean});
  const Dims shape = broadcast_shape(broadcast_shape(cond.shape(), a.shape(), "cond", "a"),
                                     b.shape(), "cond/a", "b");
  check_out_shape(out, shape, "the broadcast shape");
  run_elementwise(kWhere, 0, out, {&cond, &a, &b}, {"cond", "a", "b"});
}

void iota(Tensor& out, std::int64_t axis, double start, double step) {
  check_device(out, "out");
  check_dtype(out, "out", kNumericTypes);
  const std::int64_t a = wrap_axis(axis, out.dim(), "axis");
  if (out.dim() > kMaxDims)
    fail<ShapeError>("cuda iota: `out` rank must be at most ", kMaxDims, ", got ", out.dim());
  ElementwiseParams p;
  p.family = kIota;
  p.start = start;
  p.step = step;
  p.axis = static_cast<int>(a);
  set_operand(p, 0, out);
  set_space(p, out.shape(), {broadcast_strides(out, out.shape(), "out")}, false);
  launch(p);
}

void hold_stream(double microseconds) {
  if (!(microseconds > 0)) return;
  detail::launch_kernel(hold_kernel, dim3(1), dim3(1), current_stream(),
                        static_cast<unsigned long long>(microseconds * 1e3));
}

void fill(Tensor& out, double value) {
  check_device(out, "out");
  ElementwiseParams p;
  p.family = kFill;
  p.start = value;
  set_operand(p, 0, out);
  set_space(p, out.shape(), {broadcast_strides(out, out.shape(), "out")}, true);
  launch(p);
}

void cast(const Tensor& in, Tensor& out) {
  check_device(in, "in");
  check_device(out, "out");
  check_same_device(in, "in", out);
  check_out_shape(out, in.shape(), "the shape of `in`");
  run_elementwise(kCast, 0, out, {&in}, {"in"});
}

void concat(const std::vector<Tensor>& inputs, std::int64_t axis, Tensor& out) {
  check_device(out, "out");
  if (inputs.empty()) fail<ValueError>("cuda concat: `inputs` must not be empty");
  const std::int64_t a = wrap_axis(axis, out.dim(), "axis");
  std::int64_t total = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const std::string name = "inputs[" + std::to_string(i) + "]";
    check_device(inputs[i], name.c_str());
    check_same_device(inputs[i], name.c_str(), out);
    if (inputs[i].dim() != out.dim())
      fail<ShapeError>("cuda concat: `", name, "` has rank ", inputs[i].dim(), ", `out` has ",
                       out.dim());
    for (std::int64_t d = 0; d < out.dim(); ++d)
      if (d != a && inputs[i].size(d) != out.size(d))
        fail<ShapeError>("cuda concat: `", name, "` ", dims_str(inputs[i].shape()),
                         " must match `out` ", dims_str(out.shape()), " off axis ", a);
    check_no_overlap(out, "out", inputs[i], name.c_str(), false);
    total += inputs[i].size(a);
  }
  if (total != out.size(a))
    fail<ShapeError>("cuda concat: the inputs sum to ", total, " along axis ", a, ", `out` has ",
                     out.size(a));
  std::int64_t start = 0;
  for (const Tensor& t : inputs) {
    Tensor window = out.slice(a, start, start + t.size(a));
    run_elementwise(kCast, 0, window, {&t}, {"input"});
    start += t.size(a);
  }
}

void gather(const Tensor& table, const Tensor& indices, Tensor& out) {
  check_device(table, "table");
  check_device(indices, "indices");
  check_device(out, "out");
  check_same_device(table, "table", out);
  check_same_device(indices, "indices", out);
  check_dtype(indices, "indices", {DType::i32, DType::i64});
  if (table.dim() < 1) fail<ShapeError>("cuda gather: `table` must have rank >= 1");
  Dims shape = indices.shape();
  for (std::int64_t d = 1; d < table.dim(); ++d) shape.push_back(table.size(d));
  check_out_shape(out, shape, "indices.shape + table.shape[1:]");
  check_no_overlap(out, "out", table, "table", false);
  check_no_overlap(out, "out", indices, "indices", false);
  ElementwiseParams p;
  p.family = kGather;
  set_operand(p, 0, out);
  set_operand(p, 1, indices);
  set_operand(p, 2, table);
  p.table_rows = table.size(0);
  p.table_stride0 = table.stride(0);
  if (shape.size() > static_cast<std::size_t>(detail::kMaxRank))
    fail<ShapeError>("cuda gather: `out` rank must be at most ", detail::kMaxRank, ", got ",
                     shape.size());
  Strides idx{}, rows{};
  for (std::int64_t d = 0; d < indices.dim(); ++d)
    idx[d] = indices.shape()[d] == 1 ? 0 : indices.stride(d);
  for (std::int64_t d = 1; d < table.dim(); ++d)
    rows[indices.dim() + d - 1] = table.size(d) == 1 ? 0 : table.stride(d);
  set_space(p, shape, {broadcast_strides(out, shape, "out"), idx, rows}, true);
  launch(p);
}

namespace {

void check_write_window(const Tensor& state, const Tensor& value, std::int64_t a) {
  if (value.dim() != state.dim())
    fail<ShapeError>("write_at: `value` ", dims_str(value.shape()),
                     " must have the rank of `state` ", dims_str(state.shape()));
  for (std::int64_t d = 0; d < state.dim(); ++d)
    if (d != a && value.size(d) != state.size(d))
      fail<ShapeError>("write_at: `value` ", dims_str(value.shape()), " must match `state` ",
                       dims_str(state.shape()), " off axis ", a);
  if (value.size(a) > state.size(a))
    fail<ShapeError>("write_at: `value` has ", value.size(a), " rows on axis ", a,
                     ", more than `state`'s ", state.size(a));
}

}  // namespace

void write_at(Tensor& state, const Tensor& value, std::int64_t axis, std::int64_t offset) {
  check_device(state, "state");
  check_device(value, "value");
  check_same_device(value, "value", state);
  const std::int64_t a = wrap_axis(axis, state.dim(), "axis");
  check_write_window(state, value, a);
  if (offset < 0 || offset + value.size(a) > state.size(a))
    fail<ValueError>("write_at: rows [", offset, ", ", offset + value.size(a),
                     ") do not fit in `state` axis ", a, " of size ", state.size(a));
  Tensor window = state.slice(a, offset, offset + value.size(a));
  run_elementwise(kCast, 0, window, {&value}, {"value"}, "state window");
}

void write_at(Tensor& state, const Tensor& value, std::int64_t axis, const Tensor& offset) {
  check_device(state, "state");
  check_device(value, "value");
  check_device(offset, "offset");
  check_same_device(value, "value", state);
  check_same_device(offset, "offset", state);
  check_dtype(offset, "offset", {DType::i32, DType::i64});
  if (offset.numel() != 1)
    fail<ShapeError>("write_at: `offset` must hold one value, got ", dims_str(offset.shape()));
  const std::int64_t a = wrap_axis(axis, state.dim(), "axis");
  check_write_window(state, value, a);
  Tensor window = state.slice(a, 0, value.size(a));
  check_no_overlap(state, "state", value, "value", false);  // the window is the device's choice
  ElementwiseParams p;
  p.family = kCast;
  set_operand(p, 0, window);
  set_operand(p, 1, value);
  p.dyn_offset = offset.raw_data();
  p.dyn_offset_dtype = static_cast<int>(offset.dtype());
  p.dyn_offset_stride = state.stride(a);
  p.dyn_offset_max = state.size(a) - value.size(a);
  set_space(p, window.shape(),
            {broadcast_strides(window, window.shape(), "state"),
             broadcast_strides(value, window.shape(), "value")},
            true);
  launch(p);
}

namespace {

// Rows of `in` along `axis`: the other axes (coalesced) index rows in `in` and `out`.
void run_rows(int kind, const Tensor& in, std::int64_t a, const Dims& out_strides_full,
              std::int64_t out_axis_stride, Tensor& out) {
  RowParams p;
  p.kind = kind;
  p.length = in.size(a);
  p.in_axis_stride = in.stride(a);
  p.out_axis_stride = out_axis_stride;
  p.in = in.raw_data();
  p.out = out.raw_data();
  p.in_dtype = static_cast<int>(in.dtype());
  p.out_dtype = static_cast<int>(out.dtype());
  if (in.dim() > detail::kMaxRank)
    fail<ShapeError>("cuda primitives: rank ", in.dim(), " exceeds ", detail::kMaxRank);
  Dims shape;
  Strides si{}, so{};
  for (std::int64_t d = 0, k = 0; d < in.dim(); ++d) {
    if (d == a) continue;
    shape.push_back(in.size(d));
    si[k] = in.stride(d);
    so[k] = out_strides_full[static_cast<std::size_t>(d)];
    ++k;
  }
  ElementwiseParams space;
  set_space(space, shape, {si, so}, true);
  p.rank = space.rank;
  p.rows = space.numel;
  for (int d = 0; d < space.rank; ++d) {
    p.shape[d] = space.shape[d];
    p.in_stride[d] = space.stride[0][d];
    p.out_stride[d] = space.stride[1][d];
  }
  if (p.rows == 0) return;
  constexpr int kRowsPerBlock = kThreads / kWarp;
  detail::launch_kernel(row_kernel, dim3(blocks_for(p.rows, kRowsPerBlock)), dim3(kThreads),
                        current_stream(), p);
}

}  // namespace

void reduce(ReduceKind kind, const Tensor& in, std::int64_t axis, bool keepdim, Tensor& out) {
  check_device(in, "in");
  check_device(out, "out");
  check_same_device(in, "in", out);
  check_dtype(in, "in", kFloatTypes);
  check_dtype(out, "out", kFloatTypes);
  const std::int64_t a = wrap_axis(axis, in.dim(), "axis");
  Dims shape;
  for (std::int64_t d = 0; d < in.dim(); ++d)
    if (d != a)
      shape.push_back(in.size(d));
    else if (keepdim)
      shape.push_back(1);
  check_out_shape(out, shape, "the reduced shape");
  if (kind == ReduceKind::max && in.size(a) == 0)
    fail<ShapeError>("reduce max: axis ", a, " of `in` ", dims_str(in.shape()), " is empty");
  // out strides aligned to in's axes (the reduced axis gets 0).
  Dims strides(static_cast<std::size_t>(in.dim()), 0);
  for (std::int64_t d = 0, k = 0; d < in.dim(); ++d) {
    if (d == a) {
      if (keepdim) ++k;
      continue;
    }
    strides[static_cast<std::size_t>(d)] = out.stride(k++);
  }
  check_no_overlap(out, "out", in, "in", true);
  run_rows(static_cast<int>(kind), in, a, strides, 0, out);
}

void softmax(const Tensor& in, std::int64_t axis, Tensor& out) {
  check_device(in, "in");
  check_device(out, "out");
  check_same_device(in, "in", out);
  check_dtype(in, "in", kFloatTypes);
  check_dtype(out, "out", kFloatTypes);
  check_out_shape(out, in.shape(), "the shape of `in`");
  check_no_overlap(out, "out", in, "in", true);
  const std::int64_t a = wrap_axis(axis, in.dim(), "axis");
  run_rows(-1, in, a, out.strides(), out.stride(a), out);
}

}  // namespace splice::cuda
