// CUDA kernel of Op::RopeKvAppend (see splice/backend/cuda/rope_kv_append.h): the attention
// prologue of one decode token in one launch.
//
//   1. Host: validate devices, dtypes, shapes and unit last strides with the CPU kernel's typed
//      errors; fill one POD params struct (raw pointers, element strides); launch on
//      cuda::current_stream() through detail::launch_kernel (PDL when enabled).
//   2. Kernel: one thread per (batch b, head h of the q|k|v row, i < D/2) pair (a grid-stride
//      loop; the item -> offsets map is rope_kv_append_index::item of the header, which
//      tests/kernels runs on the host against the CPU kernel). The first item's offsets (at cache
//      row 0: the row adds p times the target's row stride) are computed before pdl_prologue()
//      (wait for the producers, then trigger: launch.cuh). p = position[0] is read from device
//      memory, so a replayed CUDA graph sees each token's position:
//        - by default after the wait, together with the item's x pair, so the dependent round
//          trips after the wait are two: [x, p] -> [cos, sin at row p] -> stores;
//        - under the caller's `position_stable` promise (no kernel the stream may still be
//          running writes position, cos or sin: a session's step scalar, written by the host
//          copy before the step's first kernel, and constant tables), p and the first item's
//          table rows before the wait: after it only [x] -> stores.
//      With
//      x = qkv[b, 0, h D : (h + 1) D], c = cos[p], s = sin[p]:
//        y_i = x_i c_i + (-x_{i+D/2}) s_i,   y_{i+D/2} = x_{i+D/2} c_{i+D/2} + x_i s_{i+D/2}
//      each product rounded to fp32 before the sum (__fmul_rn / __fadd_rn: cpu::rope's exact
//      operations), stored in qkv's dtype: q heads (h < Hq) into out[b, h], k heads into
//      k_cache[b, h - Hq, p]; v heads are copied into v_cache[b, h - Hq - Hkv, p] unchanged.
//      A p outside [0, min(max_seq_len, capacity)) writes zeros to out and leaves the caches.
//      With `trigger_dependents_first` every CTA triggers its dependents as its first
//      instruction (launch.cuh's one exception to triggering after the wait).
//   3. rms_norm_matmul_rope_kv_append (host only): the same checks for x, norm_weight and w
//      (layer_op_checks::check_qkv_rope, then the kernel's limits: B <= 8, one 16-bit dtype, K,
//      alignment), then one launch of gemv.h's launch_rope (B = 1: gemv_kernel.cuh's
//      rope_pairs_kernel; B = 2-8: its norm_rows_kernel): the q|k|v GEMV with the register
//      rms_norm prologue whose epilogue is step 2's RoPE and appends. At B = 2-8 a product the
//      multi-row kernel does not take (K > 768, rows not 16-byte aligned, more pairs than one
//      resident wave) runs the chain it fuses: rms_norm_matmul into a [B, 1, N] scratch, then
//      rope_kv_append.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <utility>

#include "backend/cuda/float_convert.cuh"
#include "backend/cuda/gemv.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/primitives_internal.h"
#include "backend/layer_op_checks.h"
#include "splice/backend/cuda/layer_ops.h"
#include "splice/backend/cuda/rope_kv_append.h"
#include "splice/backend/cuda/runtime.h"
#include "splice/core/error.h"

namespace splice::cuda {
namespace {

constexpr int kThreads = 256;              // block size
constexpr long long kMaxBlocks = 1 << 16;  // the grid-stride loop covers the rest

struct RopeKvAppendParams {
  rope_kv_append_index::Geometry g;  // shapes and element strides (the header's index math)
  const void* qkv = nullptr;         // [B, 1, (Hq + 2 Hkv) D], unit-stride row
  void* out = nullptr;               // [B, Hq, 1, D]
  void* k_cache = nullptr;           // [B, Hkv, capacity, D]
  void* v_cache = nullptr;
  const void* cos = nullptr;  // [max_seq_len, D] each
  const void* sin = nullptr;
  int table_dtype = 0;
  long long table_rows = 0, table_stride0 = 0, table_stride1 = 0;
  long long capacity = 0;
  const int* position = nullptr;  // [1]: the step's p, read on the device
  bool position_stable = false;   // the launcher's promise: read p and the tables before the wait
  bool trigger_first = false;     // trigger the dependents before the wait (scheduling only)
};

std::atomic<std::uint64_t> g_launches{0}, g_early_position_launches{0}, g_early_trigger_launches{0};
std::atomic<std::uint64_t> g_qkv_launches{0}, g_qkv_early_position_launches{0},
    g_qkv_early_weight_launches{0}, g_qkv_early_trigger_launches{0};
constexpr int kVectorBytes = 16;  // gemv_kernel.cuh's vector loads: 16-byte aligned rows
static_assert(kQkvRopeMaxK <= static_cast<std::int64_t>(gemv::kRopeMaxSlots) * 32 * 8 &&
                  kQkvRopeKMultiple * 2 == kVectorBytes && kQkvRopeMaxBatch == gemv::kMaxRows,
              "kQkvRopeMaxK / kQkvRopeKMultiple must match gemv.h's RoPE epilogue");

using detail::dispatch_float;  // float_convert.cuh
using detail::from_float;
using detail::load_any;       // float_convert.cuh
using detail::load_in_order;  // launch.cuh
using detail::to_float;

// The cache-row stride of an item's target: Item::dst at row p is item(g, t, 0).dst + p * this
// (item() adds row * k_stride[2] / v_stride[2] to the k / v targets' offsets and nothing to q's).
__device__ __forceinline__ long long row_stride_of(const rope_kv_append_index::Geometry& g,
                                                   rope_kv_append_index::Target target) {
  using rope_kv_append_index::Target;
  return target == Target::k ? g.k_stride[2] : target == Target::v ? g.v_stride[2] : 0;
}

// Post-wait path per item (SASS checked, default mode: the qkv pair's loads and the position's go
// out back to back right after ACQBULK): [x_i, x_{i+D/2}, p] -> [cos, sin at row p] -> stores; with
// position_stable, [x_i, x_{i+D/2}] -> stores for the first item. The item's offsets (three 64-bit
// divisions) are computed before the wait from the launch parameters alone.
template <typename T>
__global__ void rope_kv_append_kernel(RopeKvAppendParams p) {
  using rope_kv_append_index::Target;
  const long long half = p.g.dim / 2, total = rope_kv_append_index::items(p.g);
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  long long t = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  // The first item's offsets at row 0, before the wait (parameters only).
  rope_kv_append_index::Item it =
      t < total ? rope_kv_append_index::item(p.g, t, 0) : rope_kv_append_index::Item{};
  const T* const qkv = static_cast<const T*>(p.qkv);
  if (p.trigger_first) detail::allow_dependents();  // the next kernel may launch now

  // The position, and the current item's table rows (c_i, c_{i+D/2}, s_i, s_{i+D/2} at row p;
  // none for a v item or an invalid p).
  bool valid = false;
  long long row = 0;
  float cs[4] = {};
  const auto read_position = [&] {
    const long long pos = load_in_order(p.position);
    valid = pos >= 0 && pos < p.table_rows && pos < p.capacity;
    row = valid ? pos : 0;
  };
  const auto read_tables = [&] {
    if (!valid || t >= total || it.target == Target::v) return;
    const long long base = row * p.table_stride0;
    cs[0] = load_any(p.cos, p.table_dtype, base + it.i * p.table_stride1);
    cs[1] = load_any(p.cos, p.table_dtype, base + (it.i + half) * p.table_stride1);
    cs[2] = load_any(p.sin, p.table_dtype, base + it.i * p.table_stride1);
    cs[3] = load_any(p.sin, p.table_dtype, base + (it.i + half) * p.table_stride1);
  };
  if (p.position_stable) {  // the promise: nothing in flight writes them
    read_position();
    read_tables();
  }
  detail::pdl_prologue();  // before the qkv loads (launch.cuh)
  // The item's x pair (read whether or not the position is valid), then (default) the position.
  T x_lo{}, x_hi{};
  if (t < total) {
    x_lo = load_in_order(qkv + it.src + it.i);
    x_hi = load_in_order(qkv + it.src + it.i + half);
  }
  if (!p.position_stable) {
    read_position();
    read_tables();
  }
  while (t < total) {
    const long long i = it.i;
    const Target target = it.target;
    const long long dst = it.dst + row * row_stride_of(p.g, target);
    if (target == Target::v) {  // an exact copy into row p
      if (valid) {
        T* y = static_cast<T*>(p.v_cache) + dst;
        y[i] = x_lo;
        y[i + half] = x_hi;
      }
    } else {
      T* y = static_cast<T*>(target == Target::q ? p.out : p.k_cache) + dst;
      if (valid) {
        const float x1 = to_float(x_lo), x2 = to_float(x_hi);
        y[i] = from_float<T>(__fadd_rn(__fmul_rn(x1, cs[0]), __fmul_rn(-x2, cs[2])));
        y[i + half] = from_float<T>(__fadd_rn(__fmul_rn(x2, cs[1]), __fmul_rn(x1, cs[3])));
      } else if (target == Target::q) {
        y[i] = from_float<T>(0.0f);
        y[i + half] = from_float<T>(0.0f);
      }
    }
    t += step;  // the grid-stride loop's next item (decode grids cover every item at once)
    if (t < total) {
      it = rope_kv_append_index::item(p.g, t, 0);
      x_lo = qkv[it.src + it.i];
      x_hi = qkv[it.src + it.i + half];
      read_tables();
    }
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

}  // namespace

void rope_kv_append(const Tensor& qkv, const Tensor& cos, const Tensor& sin, const Tensor& position,
                    Tensor& k_cache, Tensor& v_cache, Tensor& out, bool position_stable,
                    bool trigger_dependents_first) {
  constexpr const char* kOp = "rope_kv_append";
  check_cuda_tensor(qkv, kOp, "qkv");
  check_cuda_tensor(cos, kOp, "cos");
  check_cuda_tensor(sin, kOp, "sin");
  check_cuda_tensor(position, kOp, "position");
  check_cuda_tensor(k_cache, kOp, "k_cache");
  check_cuda_tensor(v_cache, kOp, "v_cache");
  check_cuda_tensor(out, kOp, "out");
  layer_op_checks::check_rope_kv_append(qkv, cos, sin, position, k_cache, v_cache, out, kOp);
  const std::int64_t batch = qkv.size(0);
  RopeKvAppendParams p;
  p.g = rope_kv_append_index::geometry_of(qkv, k_cache, v_cache, out);
  p.qkv = qkv.raw_data();
  p.out = out.raw_data();
  p.k_cache = k_cache.raw_data();
  p.v_cache = v_cache.raw_data();
  p.cos = cos.raw_data();
  p.sin = sin.raw_data();
  p.table_dtype = static_cast<int>(cos.dtype());
  p.table_rows = cos.size(0);
  p.table_stride0 = cos.stride(0);
  p.table_stride1 = cos.stride(1);
  p.capacity = k_cache.size(2);
  p.position = static_cast<const int*>(position.raw_data());
  p.position_stable = position_stable;
  p.trigger_first = trigger_dependents_first;
  if (batch == 0) return;
  g_launches.fetch_add(1, std::memory_order_relaxed);
  if (position_stable) g_early_position_launches.fetch_add(1, std::memory_order_relaxed);
  if (trigger_dependents_first) g_early_trigger_launches.fetch_add(1, std::memory_order_relaxed);
  dispatch_float(qkv.dtype(), "rope_kv_append", [&](auto tag) {
    using T = decltype(tag);
    detail::launch_kernel(rope_kv_append_kernel<T>,
                          dim3(grid_for(rope_kv_append_index::items(p.g))), dim3(kThreads),
                          current_stream(), p);
  });
}

void rms_norm_matmul_rope_kv_append(const Tensor& x, const Tensor& norm_weight, float eps,
                                    const Tensor& w, const Tensor& cos, const Tensor& sin,
                                    const Tensor& position, Tensor& k_cache, Tensor& v_cache,
                                    Tensor& out, bool w_constant, bool position_stable,
                                    bool trigger_dependents_first) {
  constexpr const char* kOp = "rms_norm_matmul_rope_kv_append";
  const std::pair<const Tensor*, const char*> operands[] = {{&x, "x"},
                                                            {&norm_weight, "norm_weight"},
                                                            {&w, "w"},
                                                            {&cos, "cos"},
                                                            {&sin, "sin"},
                                                            {&position, "position"},
                                                            {&k_cache, "k_cache"},
                                                            {&v_cache, "v_cache"},
                                                            {&out, "out"}};
  for (const auto& [t, name] : operands) check_cuda_tensor(*t, kOp, name);
  const layer_op_checks::RopeGeometry geo = layer_op_checks::check_qkv_rope(
      x, norm_weight, eps, w, cos, sin, position, k_cache, v_cache, out, kOp);
  // The kernel's own limits (the CUDA layer-op contract row's qkv_rope_* fields).
  const DType dtype = x.dtype();
  if (dtype != DType::bf16 && dtype != DType::f16)
    fail<UnsupportedError>(kOp, ": `x` must be bf16 or f16 on CUDA, got ", dtype_name(dtype));
  for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&norm_weight, "norm_weight"},
                                {&w, "w"},
                                {&k_cache, "k_cache"}})
    if (t->dtype() != dtype)
      fail<DTypeError>(kOp, ": `", name, "` must have x's dtype ", dtype_name(dtype),
                       " on CUDA, got ", dtype_name(t->dtype()));
  const std::int64_t k = x.size(2), batch = x.size(0);
  if (batch > kQkvRopeMaxBatch)
    fail<UnsupportedError>(kOp, ": CUDA takes batch 1 to ", kQkvRopeMaxBatch,
                           " (x [B, 1, K]), got x ", dims_str(x.shape()));
  if (k % kQkvRopeKMultiple != 0 || k > kQkvRopeMaxK)
    fail<UnsupportedError>(kOp, ": CUDA takes K a multiple of ", kQkvRopeKMultiple, " and at most ",
                           kQkvRopeMaxK, ", got K = ", k);
  if (k > 1 && norm_weight.stride(0) != 1)
    fail<LayoutError>(kOp, ": `norm_weight` must have a unit stride on CUDA, got ",
                      norm_weight.describe());
  for (const auto& [t, name] :
       {std::pair<const Tensor*, const char*>{&x, "x"}, {&norm_weight, "norm_weight"}, {&w, "w"}})
    if (reinterpret_cast<std::uintptr_t>(t->raw_data()) % kVectorBytes != 0)
      fail<LayoutError>(kOp, ": `", name, "` must start on a ", kVectorBytes,
                        "-byte boundary on CUDA, got ", t->describe());
  if ((w.stride(0) * static_cast<std::int64_t>(dtype_size(dtype))) % kVectorBytes != 0 &&
      w.size(0) > 1)
    fail<LayoutError>(kOp, ": every row of `w` must start on a ", kVectorBytes,
                      "-byte boundary on CUDA, got ", w.describe());

  gemv::RopeParams p;
  gemv::Params& q = p.product;
  q.w = w.raw_data();
  q.n = w.size(0);
  q.k = k;
  q.w_row_stride = w.stride(0);
  // Row r of x at x[r]; y is unused by the epilogue (launch()'s params keep every row non-null).
  for (std::int64_t r = 0; r < batch; ++r) {
    q.x[r] = static_cast<const char*>(x.raw_data()) +
             r * x.stride(0) * static_cast<std::int64_t>(dtype_size(dtype));
    q.y[r] = out.raw_data();
  }
  q.rows = static_cast<int>(batch);
  q.in_dtype = dtype;
  q.out_dtype = dtype;
  q.w_constant = w_constant;
  q.prologue = gemv::Prologue::rms_norm;
  q.norm_weight = norm_weight.raw_data();
  q.norm_weight_stride = 1;
  q.norm_weight_dtype = dtype;
  q.eps = eps;
  if (!gemv::rope_supported(q)) {
    if (batch == 1)
      fail<UnsupportedError>(kOp, ": the fused kernel does not take x ", x.describe(), ", w ",
                             w.describe(), " (gemv::rope_supported)");
    // 2-8 rows the multi-row kernel does not take: the chain (every check above has passed).
    Tensor qkv = detail::scratch({batch, 1, w.size(0)}, dtype, x.device());  // [B, 1, N]
    rms_norm_matmul(x, norm_weight, eps, w, qkv, w_constant);
    return rope_kv_append(qkv, cos, sin, position, k_cache, v_cache, out, position_stable,
                          trigger_dependents_first);
  }
  p.heads = static_cast<int>(geo.heads);
  p.kv_heads = static_cast<int>(geo.kv_heads);
  p.dim = static_cast<int>(geo.dim);
  p.out = out.raw_data();
  p.out_row_stride = out.stride(0);
  p.out_head_stride = out.stride(1);
  p.k_cache = k_cache.raw_data();
  p.v_cache = v_cache.raw_data();
  p.k_batch_stride = k_cache.stride(0);
  p.v_batch_stride = v_cache.stride(0);
  p.k_head_stride = k_cache.stride(1);
  p.k_row_stride = k_cache.stride(2);
  p.v_head_stride = v_cache.stride(1);
  p.v_row_stride = v_cache.stride(2);
  p.capacity = k_cache.size(2);
  p.cos = cos.raw_data();
  p.sin = sin.raw_data();
  p.table_dtype = cos.dtype();
  p.table_rows = cos.size(0);
  p.table_stride0 = cos.stride(0);
  p.table_stride1 = cos.stride(1);
  p.position = static_cast<const int*>(position.raw_data());
  p.position_stable = position_stable;
  p.trigger_first = trigger_dependents_first;
  g_qkv_launches.fetch_add(1, std::memory_order_relaxed);
  if (position_stable) g_qkv_early_position_launches.fetch_add(1, std::memory_order_relaxed);
  if (w_constant) g_qkv_early_weight_launches.fetch_add(1, std::memory_order_relaxed);
  if (trigger_dependents_first)
    g_qkv_early_trigger_launches.fetch_add(1, std::memory_order_relaxed);
  gemv::launch_rope(p, current_stream());
}

QkvRopeLaunches rms_norm_matmul_rope_kv_append_launches() {
  return {g_qkv_launches.load(std::memory_order_relaxed),
          g_qkv_early_position_launches.load(std::memory_order_relaxed),
          g_qkv_early_weight_launches.load(std::memory_order_relaxed),
          g_qkv_early_trigger_launches.load(std::memory_order_relaxed)};
}

RopeKvAppendLaunches rope_kv_append_launches() {
  return {g_launches.load(std::memory_order_relaxed),
          g_early_position_launches.load(std::memory_order_relaxed),
          g_early_trigger_launches.load(std::memory_order_relaxed)};
}

}  // namespace splice::cuda
