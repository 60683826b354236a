// Skinny GEMM (GEMV) for decode: y [rows, n] = x [rows, k] . w [n, k]^T with rows <= 8, the
// weight-streaming kernel the CUDA matmul primitive (primitives_gemm.cc) routes small-m products
// with a row-major weight to (when `preferred` says it beats cuBLASLt). Device code, launcher and
// the routing rule in gemv.cu.
//
// Programmatic dependent launch (launch.cuh): the kernel waits for its producers before its first
// read of x (or write of y) and is launched with the PDL attribute when pdl_enabled() on a
// created stream. With `w_constant` it issues its first weight batch before that wait, so the
// weight's DRAM latency overlaps the predecessor's tail.
//
// The launcher picks everything from the POD params: 16-byte vector loads when the weight rows
// and every x row are 16-byte aligned (scalar loads otherwise), columns per warp, warps per CTA
// and a grid of at most one resident wave (each warp loops over column groups) from n, the SM
// count and the kernel's occupancy (no allocation, no synchronization: graph-capturable).
// One row of whole 16-byte vectors that one batch per lane covers (k <= 768 bf16 / f16 at any
// column count, k <= 1536 at 1 or 2 columns per warp), with no max_ctas and column groups that
// fit one resident wave, takes the decode-row kernel instead: the same product bit for bit in
// the least code (gemv_kernel.cuh's row_kernel; LaunchStats::row counts it). The batch-1 products
// of a decode step are such calls. Two fused siblings of it reuse its stages with their own column
// mapping and epilogue: launch_rope (q|k|v + RoPE + KV appends) and launch_swiglu (gate|up +
// SwiGLU's activation), below. An rms_norm product of 2-8 rows that norm_rows_supported takes
// runs on the multi-row decode kernel (gemv_kernel.cuh's norm_rows_kernel; within tolerance, not
// bitwise, of the general kernel; LaunchStats::norm_rows counts it).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "splice/core/dtype.h"

namespace splice::cuda::gemv {

inline constexpr int kMaxRows = 8;  // rows of x (the flattened m of the matmul) one launch takes

// Prologues (Params::prologue): instead of reading x rows as they are, each CTA first computes
// its rows' GEMV input into shared memory, then streams the weight unchanged:
//   rms_norm: xs[r, kk] = round_T((x[r, kk] * inv_r) * norm_weight[kk]),
//             inv_r = 1 / sqrt(sum_kk x[r, kk]^2 / k + eps)
//   silu_mul: xs[r, kk] = round_T(round_T(x[r, kk] / (1 + e^-x[r, kk])) * b[r, kk])
// (T = in_dtype: the rounding of the RmsNorm / SiluMul node that feeds the matmul in the
// decomposed region). The rows live in shared memory, rows * k_pad elements of T plus k_pad fp32
// norm weights (k_pad = k rounded up to whole 16-byte vectors), so a prologue launch takes at most
// kMaxPrologueBytes (192 KiB of the H200's 227 KiB per CTA): in bf16 / f16, k <= 32768 at one row,
// 16384 at four, 9824 at eight; in f32, 24576 at one row, 5460 at eight. prologue_fits() says
// whether a call fits; launch() refuses (UnsupportedError) one that does not.
enum class Prologue : std::uint8_t { none, rms_norm, silu_mul };
inline constexpr std::int64_t kMaxPrologueBytes = 192 * 1024;

struct Params {
  // [n, k]: element (j, kk) at w[j * w_row_stride + kk] (unit stride along k), dtype `in_dtype`.
  const void* w = nullptr;
  std::int64_t w_row_stride = 0;  // elements, >= 0 (any value when n == 1)
  // Row r of x: [k] at x[r] (unit stride), dtype `in_dtype`; entries r >= rows are ignored.
  const void* x[kMaxRows] = {};
  // Row r of y: [n], element j at y[r][j * y_col_stride], dtype `out_dtype`.
  void* y[kMaxRows] = {};
  std::int64_t y_col_stride = 1;
  // Optional residual epilogue (has_c): row r of c: [n], element j at c[r][j * c_col_stride],
  // dtype `c_dtype`; then y[r, j] = round_out(sum + c[r, j]), the fp32 sum plus c in fp32 with
  // one rounding. Read after the wait like x; c may be y itself (each element is read, then
  // written, by one thread).
  bool has_c = false;
  const void* c[kMaxRows] = {};
  std::int64_t c_col_stride = 1;
  DType c_dtype = DType::f32;
  std::int64_t n = 0, k = 0;     // n >= 1, k >= 1
  int rows = 0;                  // 1 .. kMaxRows
  DType in_dtype = DType::f32;   // x and w: f32, f16 or bf16
  DType out_dtype = DType::f32;  // y: f32, f16 or bf16 (one RNE rounding of the fp32 sum)
  // > 0: launch at most this many CTAs (tests use it to make each warp loop over many column
  // groups); 0: the launcher's grid (at most one resident wave).
  int max_ctas = 0;
  // Tuning overrides for the bench's sweeps: output columns per warp (1, 2 or 4; 0: the
  // launcher's choice), and a warp per column group instead of the one-wave persistent grid.
  int cols = 0;
  bool one_warp_per_group = false;
  // The caller's promise that no kernel that may still be running (the whole stream before this
  // launch, which under PDL may not have completed yet) ever writes w: a model weight (a session
  // Param). The kernel then issues its first weight batch BEFORE griddepcontrol.wait, so the
  // weight's DRAM latency overlaps the predecessor's tail; x and y are touched only after the
  // wait either way. A false promise is a silent race; false (the default) assumes nothing.
  bool w_constant = false;
  // Optional prologue (see Prologue above): x rows are its first operand (in_dtype), the rows
  // read once after the wait; silu_mul's second operand rows are b[r] (in_dtype, unit stride);
  // rms_norm's weight [k] is norm_weight (element kk at norm_weight[kk * norm_weight_stride],
  // dtype norm_weight_dtype) with `eps`. Combines with has_c (silu_mul + residual is the
  // SiluMulMatMulAdd product).
  Prologue prologue = Prologue::none;
  const void* b[kMaxRows] = {};
  const void* norm_weight = nullptr;
  std::int64_t norm_weight_stride = 1;
  DType norm_weight_dtype = DType::f32;
  float eps = 0.0f;
};

// Whether a prologue launch of `rows` rows of length k in `dtype` fits the shared-memory limit.
bool prologue_fits(std::int64_t rows, std::int64_t k, DType dtype);

// Whether launch(params) takes norm_rows_kernel: an rms_norm prologue (2-8 rows) or none (2-4
// rows, with the residual epilogue or without), no max_ctas, cols or one_warp_per_group; 16-bit
// x, w (and norm weight) and y of one dtype (unit strides; x rows, w rows and the norm weight
// 16-byte aligned), k a whole number of 16-byte vectors, at most 768 elements (one batch of loads
// covers the row); and its four-column groups in one resident wave. y needs no alignment.
bool norm_rows_supported(const Params& params);

// Launch counters (process-wide, relaxed atomics) for tests and SPLICE_DEBUG: launches issued,
// those with the PDL attribute, those that take the constant-weight prefetch path, those with a
// prologue, and those that took the decode-row kernel (below).
struct LaunchStats {
  std::uint64_t launches = 0, pdl = 0, prefetch = 0, prologue = 0, row = 0;
  std::uint64_t register_prologue = 0;  // rms_norm prologues computed in registers (no barrier)
  std::uint64_t norm_rows = 0;   // 2-8 row rms_norm products on norm_rows_kernel (gemv_kernel.cuh)
  std::uint64_t plain_rows = 0;  // 2-4 row products without a prologue on it
};
LaunchStats launch_stats();

// y[r, j] = round_out(sum_kk x[r, kk] * w[j, kk] (+ c[r, j])) for r < rows, j < n (fp32; x
// replaced by its prologue's rows when one is set), launched on `stream`; checks the launch.
// Invalid params are an internal error (the caller validates tensors); a prologue beyond
// prologue_fits is an UnsupportedError.
void launch(const Params& params, cudaStream_t stream);

// ---- the q|k|v GEMV with a RoPE and KV-append epilogue (cuda::rms_norm_matmul_rope_kv_append) --
//
// One row x [k] (16-bit; or 2-8 rows, norm_rows_kernel), the register rms_norm prologue, the
// stacked weight w [N, k] with N = (Hq + 2 Hkv) D, and the "rope pairs" column mapping: warp g =
// h D/2 + i computes output columns h D + i and h D + i + D/2 (both halves of one RoPE pair of
// head h; at 2-8 rows a warp takes two consecutive pairs, for every row), so after the reduction
// one warp holds the pair. Each element is rounded to T as launch() stores it, then q heads are
// rotated into out, k heads rotated into k_cache row p and v heads copied into v_cache row p, one
// p for every row (cuda::rope_kv_append's exact operations; gemv_kernel.cuh's rope_pairs_kernel
// and norm_rows_kernel have the algorithm). `product` carries the GEMV part: w, w_row_stride, n,
// k, x[0 .. rows-1], norm_weight (T, unit stride), eps, in_dtype (= T = out, caches),
// w_constant; rows = 1-8, prologue = rms_norm.
inline constexpr int kRopeMaxSlots = 8;  // 16-byte vectors per lane: k <= 8 * 32 * 8 = 2048
struct RopeParams {
  Params product;
  int heads = 0, kv_heads = 0, dim = 0;  // Hq, Hkv, D (even)
  // [rows, Hq, 1, D]: (r, h, e) at out[r * out_row_stride + h * out_head_stride + e]
  void* out = nullptr;
  std::int64_t out_row_stride = 0, out_head_stride = 0;
  // [rows, Hkv, capacity, D] each: (r, h, t, e) at [r * batch_stride + h * head_stride + t *
  // row_stride + e], each cache its own strides
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  std::int64_t k_batch_stride = 0, k_head_stride = 0, k_row_stride = 0;
  std::int64_t v_batch_stride = 0, v_head_stride = 0, v_row_stride = 0;
  std::int64_t capacity = 0;
  const void* cos = nullptr;  // [table_rows, D] each, element (t, e) at t * stride0 + e * stride1
  const void* sin = nullptr;
  DType table_dtype = DType::f32;
  std::int64_t table_rows = 0, table_stride0 = 0, table_stride1 = 0;
  const int* position = nullptr;  // [1]: p, read on the device
  // The caller's promise that no kernel in flight writes position, cos or sin (rope_kv_append's
  // position_stable): p and the table entries are then read before the wait.
  bool position_stable = false;
  // A scheduling hint (rope_kv_append's trigger_dependents_first): a single-wave grid triggers
  // its dependents as its first instruction instead of after its wait.
  bool trigger_first = false;
};

// Whether launch_rope takes `product` as given: 16-bit x, w and norm weight (unit stride), k a
// whole number of 16-byte vectors, every row 16-byte aligned, and one row of at most
// kRopeMaxSlots vectors per lane, or 2-8 rows of norm_rows_kernel's k (at most 768, one batch of
// loads) whose pairs of RoPE pairs fit one resident wave. The caller validates tensors first; this
// says whether the kernel's layout assumptions hold.
bool rope_supported(const Params& product);

// Launches the fused kernel on `stream` (PDL per launch.cuh); invalid params are an internal
// error. One row: per lane, the accumulation order is launch()'s for the columns per warp
// launch() would pick for this n on this device, and the reduction tree is the same for every
// column count, so the q|k|v elements are bitwise launch()'s with the register prologue in a
// one-batch shape (k <= 768 bf16 / f16 for any n; k <= 1536 where launch() takes at most 2
// columns per warp); elsewhere launch() sums x^2 in shared memory in another order. 2-8 rows:
// four columns per warp, so the fp32 sums may be ordered differently from launch()'s (the
// tolerance, not bits; the same as launch_swiglu at 2-8 rows).
void launch_rope(const RopeParams& params, cudaStream_t stream);
// Launches of launch_rope (process-wide, relaxed): tests count kernels per step with it.
std::uint64_t rope_launches();

// ---- the gate|up GEMV with a SwiGLU epilogue (cuda::rms_norm_matmul_swiglu) -----------------
//
// One row x [k] (16-bit; or 2-8 rows, norm_rows_kernel), the register rms_norm prologue, the
// stacked weight w [2I, k] (rows 0 .. I-1 the gate, I .. 2I-1 the up projection) and the "swiglu
// pairs" column mapping: warp g computes columns j, j + 1, I + j, I + j + 1 (j = 2 g) of every
// row, so after the reduction one warp holds the gate and up sums of two outputs a row. Each sum
// is rounded to T as launch() stores it, then out[j] = round_T(round_T(silu(gate)) * up)
// (layer_ops.cu's silu_mul operations; gemv_kernel.cuh's swiglu_pairs_kernel has the algorithm).
// `product` carries the GEMV part: w, w_row_stride, n = 2I, k, x[0 .. rows-1], norm_weight (T,
// unit stride), eps, in_dtype = out_dtype = T, w_constant; rows = 1-8 (kSwigluMaxRows), prologue =
// rms_norm; at 2-8 rows also y[0 .. rows-1] and y_col_stride (out's rows).
struct SwigluParams {
  Params product;          // at 2-8 rows out row r is product.y[r] (product.y_col_stride)
  void* out = nullptr;     // one row: [I], T, unit stride
  std::int64_t inter = 0;  // I
};

// The most rows of x launch_swiglu takes (norm_rows_kernel at 2-8 rows).
inline constexpr int kSwigluMaxRows = 8;

// Whether launch_swiglu takes `product` as given: 16-bit x, w, norm weight and y of one dtype
// (unit strides, every x row and w row 16-byte aligned), k a whole number of 16-byte vectors, and
//   one row: launch() would run this product (n = 2I) in a one-batch instance with the register
//     prologue (k <= 768 bf16 / f16 at 4 columns per warp, <= 1536 at 1 or 2: gemv.h's header),
//     the case in which the fused kernel is bitwise launch() then silu_mul;
//   2-8 rows: norm_rows_kernel's k (at most 768; one batch of loads).
bool swiglu_supported(const Params& product);

// Launches the fused kernel on `stream` (PDL and w_constant as launch(); one row counts in
// launch_stats() as a decode-row launch with a prologue, 2-8 rows as a prologue launch with its
// stage 0 in registers); invalid params are an internal error.
// One row: per lane, the accumulation order is launch()'s for the columns per warp launch() would
// pick at n = 2I on this device, and the reduction tree is the same for every column count, so
// out is bitwise launch() into a [2I] row of T followed by cuda::silu_mul of its halves. 2-8 rows:
// the same operations with four columns per warp, so the fp32 sums may be ordered differently
// from launch()'s (the CPU contract's tolerance, not bits).
void launch_swiglu(const SwigluParams& params, cudaStream_t stream);
// Launches of launch_swiglu (process-wide, relaxed): tests count kernels per step with it.
std::uint64_t swiglu_launches();

// The routing rule: true when this kernel is measured (or, where unmeasured, predicted) to be at
// least as fast as cuBLASLt for `rows` rows of x and a 16-bit or f32 weight [n, k]. The measured
// numbers behind the thresholds are in its comment in gemv.cu.
bool preferred(std::int64_t rows, std::int64_t n, std::int64_t k);

}  // namespace splice::cuda::gemv
