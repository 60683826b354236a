// CUDA kernels of the fused layer ops (see splice/backend/cuda/layer_ops.h).
//
//   1. Host: validate devices, dtypes, shapes and the unit last stride with the CPU kernels' typed
//      errors; describe each operand's rows by its leading axes (size-1 axes dropped) and their
//      strides, so permuted head views need no copy; fill one POD params struct; launch on
//      cuda::current_stream().
//   2. rms_norm: one CTA per row (a grid-stride loop over rows). Pass 1 loads the row in 16-byte
//      vectors when the row start is 16-byte aligned and H is a multiple of the vector width
//      (scalar loads otherwise) and sums  s = sum_j x_j^2  per thread, then by warp shuffles and
//      one shared-memory step across warps; each thread's first vector of the row and its weights
//      (loaded with it in pass 1) stay in registers. Pass 2 takes them from there (re-reads the
//      rest of a long row: L1/L2 resident) and stores
//        y_j = (x_j * inv) * w_j,   inv = 1 / sqrt(s / H + eps)   (IEEE sqrt and division).
//   3. silu_mul: one thread per 16-byte vector (or element) of the [rows, n] space:
//        t = round(a / (1 + e^-a)),   y = round(t * b)
//      (the first rounding is the primitive Silu node's store).
//   4. rope: one thread per (row, i < D/2) pair; p = position[0] is read from device memory, with
//      the pair's x (both loads issued together after the wait; cos and sin at row p follow):
//        y_i = x_i c_i + (-x_{i+h}) s_i,   y_{i+h} = x_{i+h} c_{i+h} + x_i s_{i+h}
//      with each product rounded to fp32 before the sum (__fmul_rn / __fadd_rn: no contraction,
//      the CPU's exact operations). A position outside [0, max_seq_len) writes zeros.
//   6. rms_norm_matmul, silu_mul_matmul_add (host only): validate, then one GEMV launch with the
//      rms_norm / silu_mul prologue (gemv.h: each CTA computes its x rows into shared memory, then
//      streams the weight) when prologue_gemv_applies (rms_norm: at most kRmsNormPrologueMaxRows
//      rows, or gemv::norm_rows_supported), else the two-kernel chain (rms_norm or
//      silu_mul into scratch, then cuda::matmul, with the residual for silu_mul_matmul_add).
//      rms_norm_matmul_swiglu (host only): validate, then one launch of gemv.h's swiglu epilogue
//      kernel when gemv::swiglu_supported (one decode row of 16-bit x, w and out in launch()'s
//      one-batch shape, or 2-8 rows on norm_rows_kernel) and either the routing rule or, at 2-8
//      rows, norm_rows_kernel's one resident wave takes it, else rms_norm_matmul into a [..., M,
//      2I] scratch row of out's dtype, then silu_mul of its two halves (bitwise the same where both
//      run at one row).
//   5. Launch (launch.cuh): every kernel opens with pdl_prologue() (single-wave grids let the next
//      kernel launch, then every thread waits for its producers before touching global memory)
//      and is launched with programmatic dependent launch on a created stream unless SPLICE_PDL=0.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "backend/cuda/check.h"
#include "backend/cuda/float_convert.cuh"
#include "backend/cuda/gemv.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/primitives_internal.h"
#include "backend/layer_op_checks.h"
#include "splice/backend/cuda/layer_ops.h"
#include "splice/backend/cuda/primitives.h"
#include "splice/backend/cuda/runtime.h"
#include "splice/core/error.h"

namespace splice::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kMaxLead = 7;                // leading (row) axes after dropping size-1 axes
constexpr int kVectorBytes = 16;           // one 128-bit load / store
constexpr int kMaxRowThreads = 1024;       // rms_norm CTA size cap
constexpr int kElementwiseThreads = 256;   // silu_mul / rope block size
constexpr long long kMaxBlocks = 1 << 16;  // grid-stride loops cover the rest

// The rows of an operand: row r (row-major over the leading axes) starts at
// sum_d index_d(r) * stride[d] elements from the base pointer.
struct RowLayout {
  int lead = 0;
  long long shape[kMaxLead] = {};
  long long stride[kMaxLead] = {};
};

struct RmsNormParams {
  const void* x = nullptr;
  void* out = nullptr;
  const void* weight = nullptr;
  int weight_dtype = 0;
  long long weight_stride = 1;
  RowLayout x_rows, out_rows;
  long long rows = 0, hidden = 0;
  float eps = 0.0f;
};

struct SiluMulParams {
  const void* a = nullptr;
  const void* b = nullptr;
  void* out = nullptr;
  RowLayout a_rows, b_rows, out_rows;
  long long rows = 0, n = 0;
  bool vectorized = false;  // every row start 16-byte aligned and n a multiple of the width
};

struct RopeParams {
  const void* x = nullptr;
  void* out = nullptr;
  const void* cos = nullptr;
  const void* sin = nullptr;
  int table_dtype = 0;
  long long table_rows = 0, table_stride0 = 0, table_stride1 = 0;
  const int* position = nullptr;
  RowLayout x_rows, out_rows;
  long long rows = 0, dim = 0;
};

// ---- device-side conversions -------------------------------------------------------------------

using detail::dispatch_float;  // float_convert.cuh
using detail::from_float;      // float_convert.cuh
using detail::load_any;        // float_convert.cuh
using detail::load_in_order;   // launch.cuh
using detail::to_float;

// v rounded to T's precision, kept as fp32.
template <typename T>
__device__ __forceinline__ float round_as(float v) {
  return to_float(from_float<T>(v));
}

template <typename T>
struct VectorOf {
  static constexpr int kWidth = kVectorBytes / static_cast<int>(sizeof(T));
};

template <typename T>
__device__ __forceinline__ void load_vector(const T* p, float* out) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < VectorOf<T>::kWidth; ++i) out[i] = to_float(e[i]);
}

template <typename T>
__device__ __forceinline__ void store_vector(T* p, const float* v) {
  uint4 raw;
  T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int i = 0; i < VectorOf<T>::kWidth; ++i) e[i] = from_float<T>(v[i]);
  *reinterpret_cast<uint4*>(p) = raw;
}

__device__ __forceinline__ long long row_offset(const RowLayout& l, long long row) {
  long long off = 0;
  for (int d = l.lead - 1; d >= 0; --d) {
    off += (row % l.shape[d]) * l.stride[d];
    row /= l.shape[d];
  }
  return off;
}

__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & (kVectorBytes - 1)) == 0;
}

// ---- kernels -----------------------------------------------------------------------------------
//
// Post-wait discipline (PDL, launch.cuh): whatever depends on the launch parameters alone (row
// offsets: 64-bit divisions by runtime extents, a software routine of ~100 instructions each) is
// computed before pdl_prologue()'s wait for the first item, so the loads go out right after it;
// loads that do not depend on each other are issued together before any is used (rms_norm's weight
// with its row, rope's x pair with the position).

template <typename TX, typename TO>
__global__ void rms_norm_kernel(RmsNormParams p) {
  constexpr int kW = VectorOf<TX>::kWidth;
  __shared__ float partial[kMaxRowThreads / kWarp];
  __shared__ float inv_shared;
  const long long hidden = p.hidden;
  // The first row's operands, before the wait (parameters only).
  long long row = blockIdx.x;
  const auto x_of = [&](long long r) {
    return static_cast<const TX*>(p.x) + row_offset(p.x_rows, r);
  };
  const auto y_of = [&](long long r) {
    return static_cast<TO*>(p.out) + row_offset(p.out_rows, r);
  };
  const TX* x = row < p.rows ? x_of(row) : nullptr;
  TO* y = row < p.rows ? y_of(row) : nullptr;
  detail::pdl_prologue();  // before the first row access (launch.cuh)
  for (; row < p.rows; row += gridDim.x) {
    if (row != blockIdx.x) {
      x = x_of(row);
      y = y_of(row);
    }
    const bool vec = hidden % kW == 0 && aligned16(x);
    const bool vec_out = vec && VectorOf<TO>::kWidth == kW && aligned16(y);
    // Pass 1: s = sum_j x_j^2. The thread's first vector and, on the vector path, its weights
    // stay in registers for pass 2 (every vector of a row of <= blockDim vectors, hidden <= 8192
    // in 16-bit: pass 2 then re-reads nothing, and the weight's L2 round trip overlaps x's instead
    // of following the reduction).
    float ss = 0.0f;
    float first_x[kW] = {}, first_w[kW] = {};
    const long long first = threadIdx.x;
    if (vec) {
      for (long long v = first; v < hidden / kW; v += blockDim.x) {
        float e[kW];
        load_vector(x + v * kW, e);
        if (v == first) {
#pragma unroll
          for (int i = 0; i < kW; ++i) {
            first_x[i] = e[i];
            if (vec_out)
              first_w[i] = load_any(p.weight, p.weight_dtype, (v * kW + i) * p.weight_stride);
          }
        }
#pragma unroll
        for (int i = 0; i < kW; ++i) ss += e[i] * e[i];
      }
    } else {
      for (long long j = threadIdx.x; j < hidden; j += blockDim.x) {
        const float e = to_float(x[j]);
        ss += e * e;
      }
    }
#pragma unroll
    for (int offset = kWarp / 2; offset > 0; offset /= 2)
      ss += __shfl_xor_sync(0xffffffffu, ss, offset);
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    if (lane == 0) partial[warp] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
      float total = 0.0f;
      for (int w = 0; w < static_cast<int>(blockDim.x / kWarp); ++w) total += partial[w];
      inv_shared = 1.0f / sqrtf(total / static_cast<float>(hidden) + p.eps);
    }
    __syncthreads();
    const float inv = inv_shared;
    // Pass 2: y_j = (x_j * inv) * w_j.
    if (vec_out) {
      for (long long v = first; v < hidden / kW; v += blockDim.x) {
        float e[kW];
        if (v == first) {
#pragma unroll
          for (int i = 0; i < kW; ++i) e[i] = __fmul_rn(__fmul_rn(first_x[i], inv), first_w[i]);
        } else {
          load_vector(x + v * kW, e);
#pragma unroll
          for (int i = 0; i < kW; ++i)
            e[i] = __fmul_rn(__fmul_rn(e[i], inv),
                             load_any(p.weight, p.weight_dtype, (v * kW + i) * p.weight_stride));
        }
        store_vector(y + v * kW, e);
      }
    } else {
      for (long long j = threadIdx.x; j < hidden; j += blockDim.x)
        y[j] = from_float<TO>(__fmul_rn(__fmul_rn(to_float(x[j]), inv),
                                        load_any(p.weight, p.weight_dtype, j * p.weight_stride)));
    }
    __syncthreads();  // partial / inv_shared are reused by the next row
  }
}

template <typename T>
__device__ __forceinline__ float silu_mul_one(float a, float b) {
  const float s = round_as<T>(a / (1.0f + expf(-a)));
  return __fmul_rn(s, b);
}

template <typename T>
__global__ void silu_mul_kernel(SiluMulParams p) {
  constexpr int kW = VectorOf<T>::kWidth;
  const long long per_row = p.vectorized ? p.n / kW : p.n;
  const long long total = p.rows * per_row;
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  // Item i: element (or vector) `col` of row i / per_row of each operand.
  struct Item {
    const T* a;
    const T* b;
    T* y;
    long long col;
  };
  const auto item_at = [&](long long i) {
    const long long row = i / per_row;
    return Item{static_cast<const T*>(p.a) + row_offset(p.a_rows, row),
                static_cast<const T*>(p.b) + row_offset(p.b_rows, row),
                static_cast<T*>(p.out) + row_offset(p.out_rows, row), i % per_row};
  };
  long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  Item it = i < total ? item_at(i) : Item{};  // the first item, before the wait
  detail::pdl_prologue();                     // before the first operand access (launch.cuh)
  for (; i < total; i += step) {
    if (p.vectorized) {
      float va[kW], vb[kW];
      load_vector(it.a + it.col * kW, va);
      load_vector(it.b + it.col * kW, vb);
#pragma unroll
      for (int k = 0; k < kW; ++k) va[k] = silu_mul_one<T>(va[k], vb[k]);
      store_vector(it.y + it.col * kW, va);
    } else {
      it.y[it.col] = from_float<T>(silu_mul_one<T>(to_float(it.a[it.col]), to_float(it.b[it.col])));
    }
    if (i + step < total) it = item_at(i + step);
  }
}

template <typename T>
__global__ void rope_kernel(RopeParams p) {
  const long long half = p.dim / 2;
  const long long total = p.rows * half;
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  // Item t: the pair (i, i + half) of row t / half; its operands before the wait for the first.
  struct Item {
    const T* x;
    T* y;
    long long i;
  };
  const auto item_at = [&](long long t) {
    const long long row = t / half;
    return Item{static_cast<const T*>(p.x) + row_offset(p.x_rows, row),
                static_cast<T*>(p.out) + row_offset(p.out_rows, row), t % half};
  };
  long long t = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  Item it = t < total ? item_at(t) : Item{};
  detail::pdl_prologue();  // before the x and position loads (launch.cuh)
  // The first item's x pair (read whether or not the position is valid), then the position:
  // [x, p] -> [cos, sin at row p] -> stores.
  T x_lo{}, x_hi{};
  if (t < total) {
    x_lo = load_in_order(it.x + it.i);
    x_hi = load_in_order(it.x + it.i + half);
  }
  const long long pos = load_in_order(p.position);
  const bool valid = pos >= 0 && pos < p.table_rows;
  const long long base = (valid ? pos : 0) * p.table_stride0;
  while (t < total) {
    const long long i = it.i;
    T* y = it.y;
    if (!valid) {
      y[i] = from_float<T>(0.0f);
      y[i + half] = from_float<T>(0.0f);
    } else {
      const float x1 = to_float(x_lo), x2 = to_float(x_hi);
      const float c1 = load_any(p.cos, p.table_dtype, base + i * p.table_stride1);
      const float c2 = load_any(p.cos, p.table_dtype, base + (i + half) * p.table_stride1);
      const float s1 = load_any(p.sin, p.table_dtype, base + i * p.table_stride1);
      const float s2 = load_any(p.sin, p.table_dtype, base + (i + half) * p.table_stride1);
      y[i] = from_float<T>(__fadd_rn(__fmul_rn(x1, c1), __fmul_rn(-x2, s1)));
      y[i + half] = from_float<T>(__fadd_rn(__fmul_rn(x2, c2), __fmul_rn(x1, s2)));
    }
    t += step;  // the grid-stride loop's next item (decode grids cover every item at once)
    if (t < total) {
      it = item_at(t);
      x_lo = it.x[it.i];
      x_hi = it.x[it.i + half];
    }
  }
}

// ---- host side ---------------------------------------------------------------------------------

void check_cuda_tensor(const Tensor& t, const char* op, const char* name) {
  check_defined(t, name);
  if (!t.device().is_cuda())
    fail<DeviceError>(op, ": `", name, "` must be a CUDA tensor, got ", t.device().str());
}

RowLayout rows_of(const Tensor& t, const char* op, const char* name) {
  RowLayout l;
  for (std::int64_t d = 0; d + 1 < t.dim(); ++d) {
    if (t.size(d) == 1) continue;
    if (l.lead == kMaxLead)
      fail<ShapeError>(op, ": `", name, "` has more than ", kMaxLead, " leading axes of size > 1 (",
                       dims_str(t.shape()), ")");
    l.shape[l.lead] = t.size(d);
    l.stride[l.lead] = t.stride(d);
    ++l.lead;
  }
  return l;
}

long long row_count(const Tensor& t) { return t.size(-1) ? t.numel() / t.size(-1) : 0; }

unsigned grid_for(long long work, int threads) {
  return static_cast<unsigned>(
      std::clamp<long long>((work + threads - 1) / threads, 1, kMaxBlocks));
}

template <typename T>
const T* typed(const Tensor& t) {
  return static_cast<const T*>(t.raw_data());
}

// Byte addresses of the rows of t's last axis, in row-major order over the leading axes (any
// strides); at most gemv::kMaxRows rows (the caller checked).
void row_addresses(const Tensor& t, const void* (&out)[gemv::kMaxRows]) {
  const auto* base = static_cast<const char*>(t.raw_data());
  const auto elem = static_cast<std::int64_t>(dtype_size(t.dtype()));
  const std::int64_t rows = row_count(t);
  for (std::int64_t row = 0; row < rows; ++row) {
    std::int64_t rest = row, offset = 0;
    for (std::int64_t d = t.dim() - 2; d >= 0; --d) {
      offset += (rest % t.size(d)) * t.stride(d);
      rest /= t.size(d);
    }
    out[row] = base + offset * elem;
  }
}

// The GEMV params of the product x [..., M, K] @ w^T into out (the prologue fields are the
// caller's).
gemv::Params product_params(const Tensor& x, const Tensor& w, Tensor& out, bool w_constant) {
  gemv::Params p;
  p.w = w.raw_data();
  p.n = w.size(0);
  p.k = w.size(1);
  p.w_row_stride = p.n > 1 ? w.stride(0) : 0;
  p.rows = static_cast<int>(row_count(x));
  p.in_dtype = w.dtype();
  p.out_dtype = out.dtype();
  p.y_col_stride = out.stride(-1);
  p.w_constant = w_constant;
  const void* x_rows[gemv::kMaxRows] = {};
  const void* y_rows[gemv::kMaxRows] = {};
  row_addresses(x, x_rows);
  row_addresses(out, y_rows);
  for (int r = 0; r < p.rows; ++r) {
    p.x[r] = x_rows[r];
    p.y[r] = const_cast<void*>(y_rows[r]);
  }
  return p;
}

// p's prologue: rms_norm of x's rows by `weight` [K] with eps.
void set_rms_norm(gemv::Params& p, const Tensor& weight, float eps) {
  p.prologue = gemv::Prologue::rms_norm;
  p.norm_weight = weight.raw_data();
  p.norm_weight_stride = weight.stride(0);
  p.norm_weight_dtype = weight.dtype();
  p.eps = eps;
}

// prologue_gemv_applies without the routing rule: 16-bit or f32 operands of one dtype, a unit
// stride along K, 1-8 rows, K <= kPrologueGemvMaxK and the prologue's rows in shared memory.
bool prologue_gemv_fits(const Tensor& x, const Tensor& w) {
  if (x.dim() < 2 || w.dim() != 2 || x.dtype() != w.dtype() || x.size(-1) != w.size(1))
    return false;
  if (w.size(1) > 1 && w.stride(1) != 1) return false;
  const std::int64_t rows = row_count(x), n = w.size(0), k = w.size(1);
  return rows >= 1 && rows <= gemv::kMaxRows && n >= 1 && k >= 1 && k <= kPrologueGemvMaxK &&
         w.stride(0) >= 0 && gemv::prologue_fits(rows, k, x.dtype());
}

}  // namespace

void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  constexpr const char* kOp = "rms_norm";
  check_cuda_tensor(x, kOp, "x");
  check_cuda_tensor(weight, kOp, "weight");
  check_cuda_tensor(out, kOp, "out");
  layer_op_checks::check_rms_norm(x, weight, eps, out, kOp);
  const std::int64_t hidden = x.size(-1);
  RmsNormParams p;
  p.x = x.raw_data();
  p.out = out.raw_data();
  p.weight = weight.raw_data();
  p.weight_dtype = static_cast<int>(weight.dtype());
  p.weight_stride = weight.stride(0);
  p.x_rows = rows_of(x, kOp, "x");
  p.out_rows = rows_of(out, kOp, "out");
  p.rows = row_count(x);
  p.hidden = hidden;
  p.eps = eps;
  if (p.rows == 0 || hidden == 0) return;
  dispatch_float(x.dtype(), "layer_ops", [&](auto x_tag) {
    using TX = decltype(x_tag);
    dispatch_float(out.dtype(), "layer_ops", [&](auto out_tag) {
      using TO = decltype(out_tag);
      // Enough threads for one vector (or element) each, in whole warps, at most 1024.
      const long long per_thread = hidden % VectorOf<TX>::kWidth == 0 ? VectorOf<TX>::kWidth : 1;
      const long long lanes = (hidden / per_thread + kWarp - 1) / kWarp * kWarp;
      const int threads = static_cast<int>(std::clamp<long long>(lanes, kWarp, kMaxRowThreads));
      const auto blocks = static_cast<unsigned>(std::min<long long>(p.rows, kMaxBlocks));
      detail::launch_kernel(rms_norm_kernel<TX, TO>, dim3(blocks), dim3(threads), current_stream(),
                            p);
    });
  });
}

void silu_mul(const Tensor& a, const Tensor& b, Tensor& out) {
  constexpr const char* kOp = "silu_mul";
  check_cuda_tensor(a, kOp, "a");
  check_cuda_tensor(b, kOp, "b");
  check_cuda_tensor(out, kOp, "out");
  layer_op_checks::check_silu_mul(a, b, out, kOp);
  SiluMulParams p;
  p.a = a.raw_data();
  p.b = b.raw_data();
  p.out = out.raw_data();
  p.a_rows = rows_of(a, kOp, "a");
  p.b_rows = rows_of(b, kOp, "b");
  p.out_rows = rows_of(out, kOp, "out");
  p.rows = row_count(a);
  p.n = a.size(-1);
  if (a.numel() == 0) return;
  dispatch_float(a.dtype(), "layer_ops", [&](auto tag) {
    using T = decltype(tag);
    constexpr int kW = VectorOf<T>::kWidth;
    // Vectorized when every row of every operand starts on a 16-byte boundary.
    auto rows_aligned = [&](const Tensor& t, const RowLayout& l) {
      if (reinterpret_cast<std::uintptr_t>(t.raw_data()) % kVectorBytes != 0) return false;
      for (int d = 0; d < l.lead; ++d)
        if ((l.stride[d] * static_cast<long long>(sizeof(T))) % kVectorBytes != 0) return false;
      return true;
    };
    p.vectorized = p.n % kW == 0 && rows_aligned(a, p.a_rows) && rows_aligned(b, p.b_rows) &&
                   rows_aligned(out, p.out_rows);
    const long long work = p.rows * (p.vectorized ? p.n / kW : p.n);
    detail::launch_kernel(silu_mul_kernel<T>, dim3(grid_for(work, kElementwiseThreads)),
                          dim3(kElementwiseThreads), current_stream(), p);
  });
}

void rope(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& position,
          Tensor& out) {
  constexpr const char* kOp = "rope";
  check_cuda_tensor(x, kOp, "x");
  check_cuda_tensor(cos, kOp, "cos");
  check_cuda_tensor(sin, kOp, "sin");
  check_cuda_tensor(position, kOp, "position");
  check_cuda_tensor(out, kOp, "out");
  layer_op_checks::check_rope(x, cos, sin, position, out, kOp);
  const std::int64_t dim = x.size(-1);
  RopeParams p;
  p.x = x.raw_data();
  p.out = out.raw_data();
  p.cos = cos.raw_data();
  p.sin = sin.raw_data();
  p.table_dtype = static_cast<int>(cos.dtype());
  p.table_rows = cos.size(0);
  p.table_stride0 = cos.stride(0);
  p.table_stride1 = cos.stride(1);
  p.position = typed<int>(position);
  p.x_rows = rows_of(x, kOp, "x");
  p.out_rows = rows_of(out, kOp, "out");
  p.rows = row_count(x);
  p.dim = dim;
  if (x.numel() == 0) return;
  dispatch_float(x.dtype(), "layer_ops", [&](auto tag) {
    using T = decltype(tag);
    detail::launch_kernel(rope_kernel<T>, dim3(grid_for(p.rows * (dim / 2), kElementwiseThreads)),
                          dim3(kElementwiseThreads), current_stream(), p);
  });
}

bool prologue_gemv_applies(const Tensor& x, const Tensor& w) {
  return prologue_gemv_fits(x, w) && gemv::preferred(row_count(x), w.size(0), w.size(1));
}

void rms_norm_matmul(const Tensor& x, const Tensor& weight, float eps, const Tensor& w, Tensor& out,
                     bool w_constant) {
  constexpr const char* kOp = "rms_norm_matmul";
  for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&x, "x"},
                                {&weight, "weight"},
                                {&w, "w"},
                                {&out, "out"}})
    check_cuda_tensor(*t, kOp, name);
  layer_op_checks::check_rms_norm_matmul(x, weight, eps, w, out, kOp);
  if (out.numel() == 0) return;
  if (prologue_gemv_applies(x, w)) {
    gemv::Params p = product_params(x, w, out, w_constant);
    set_rms_norm(p, weight, eps);
    // One launch up to kRmsNormPrologueMaxRows rows; past them only on norm_rows_kernel.
    if (p.rows <= kRmsNormPrologueMaxRows || gemv::norm_rows_supported(p))
      return gemv::launch(p, current_stream());
  }
  // The two-kernel chain: the RmsNorm node's output (w's dtype), then the product.
  Tensor normalized = detail::scratch(x.shape(), w.dtype(), x.device());  // [..., M, K]
  rms_norm(x, weight, eps, normalized);
  MatmulOptions options;
  options.b_constant = w_constant;
  matmul(normalized, w, out, /*transpose_b=*/true, options);
}

void rms_norm_matmul_swiglu(const Tensor& x, const Tensor& weight, float eps, const Tensor& w,
                            Tensor& out, bool w_constant) {
  constexpr const char* kOp = "rms_norm_matmul_swiglu";
  check_cuda_tensor(x, kOp, "x");
  check_cuda_tensor(weight, kOp, "weight");
  check_cuda_tensor(w, kOp, "w");
  check_cuda_tensor(out, kOp, "out");
  const std::int64_t inter = layer_op_checks::check_swiglu(x, weight, eps, w, out, kOp);
  if (out.numel() == 0) return;
  const std::int64_t rows = row_count(x);
  if (rows <= gemv::kSwigluMaxRows && x.dtype() == w.dtype() && out.dtype() == w.dtype() &&
      prologue_gemv_fits(x, w)) {
    // One launch: the gate|up GEMV with the SwiGLU epilogue, when its layout rules hold (at one
    // row it then equals the chain below bit for bit; at 2-8 rows within the op's tolerance).
    gemv::SwigluParams p;
    p.product = product_params(x, w, out, w_constant);
    set_rms_norm(p.product, weight, eps);
    p.out = p.product.y[0];
    p.inter = inter;
    // The routing rule weighs one GEMV against cuBLASLt; this launch replaces three (rms_norm,
    // the product, silu_mul), so it also takes the 2-8 row products past the rule that
    // norm_rows_kernel streams in one resident wave (SmolLM2's 3072 x 576 at 5-8 rows: the
    // chain took 14.5 us of a batch-8 layer's ~51, perf-decode-step.md §19).
    const bool routed =
        gemv::preferred(rows, w.size(0), w.size(1)) || gemv::norm_rows_supported(p.product);
    if (routed && gemv::swiglu_supported(p.product))
      return gemv::launch_swiglu(p, current_stream());
  }
  // The two-kernel chain: the RmsNormMatMul node's gate|up row in out's dtype, then the SiluMul
  // node over its halves.
  Dims y_shape = x.shape();
  y_shape.back() = 2 * inter;
  Tensor y = detail::scratch(y_shape, out.dtype(), x.device());  // [..., M, 2I]
  rms_norm_matmul(x, weight, eps, w, y, w_constant);
  const std::int64_t last = y.dim() - 1;
  silu_mul(y.slice(last, 0, inter), y.slice(last, inter, 2 * inter), out);
}

void silu_mul_matmul_add(const Tensor& a, const Tensor& b, const Tensor& w, const Tensor& c,
                         Tensor& out, bool w_constant) {
  constexpr const char* kOp = "silu_mul_matmul_add";
  for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&a, "a"},
                                {&b, "b"},
                                {&w, "w"},
                                {&c, "c"},
                                {&out, "out"}})
    check_cuda_tensor(*t, kOp, name);
  layer_op_checks::check_silu_mul_matmul_add(a, b, w, c, out, kOp);
  if (out.numel() == 0) return;
  if (!prologue_gemv_applies(a, w)) {
    // The two-kernel chain: the SiluMul node's output, then the product with the residual.
    Tensor act = detail::scratch(a.shape(), a.dtype(), a.device());  // [..., M, K]
    silu_mul(a, b, act);
    MatmulOptions options;
    options.b_constant = w_constant;
    options.residual = &c;
    return matmul(act, w, out, /*transpose_b=*/true, options);
  }
  gemv::Params p = product_params(a, w, out, w_constant);
  p.prologue = gemv::Prologue::silu_mul;
  const void* b_rows[gemv::kMaxRows] = {};
  const void* c_rows[gemv::kMaxRows] = {};
  row_addresses(b, b_rows);
  row_addresses(c, c_rows);
  for (int r = 0; r < p.rows; ++r) {
    p.b[r] = b_rows[r];
    p.c[r] = c_rows[r];
  }
  p.has_c = true;
  p.c_dtype = c.dtype();
  p.c_col_stride = c.stride(-1);
  gemv::launch(p, current_stream());
}

}  // namespace splice::cuda
