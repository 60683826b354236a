// The CUDA matmul's GEMV route (src/backend/cuda/gemv.cu, dispatched from primitives_gemm.cc for
// products with at most 8 rows of a and one row-major weight when gemv::preferred says so) and the
// GEMV kernel itself (gemv::launch, whatever the routing rule says) against the CPU backend, the
// oracle.
//
//  1. Grid: rows M in {1, 2, 3, 8} x N in {1, 17, 192, 576, 1536, 4097} x K in {1, 7, 64, 576,
//     1536, 4095} x {f32, f16, bf16}, out in the input dtype, w [N, K] read transposed, twice:
//     contiguous (K = 7 or 4095 rows are not 16-byte aligned: the scalar path) and with a padded
//     row stride (16-byte aligned rows: the vector path with a K % 8 tail); each case through
//     cuda::matmul (routed to the GEMV or cuBLASLt) and through gemv::launch directly.
//  1b. The persistent loop: gemv::launch with the grid capped at 1, 2 or 3 CTAs (Params::max_ctas;
//     also with 1, 2 and 4 columns per warp forced, and a warp per group: Params::cols and
//     one_warp_per_group, the bench's tuning overrides),
//     so each warp streams many column groups back to back (the next group's first batch in
//     flight during the previous group's reduction), over M in {1, 2, 3, 5, 8} (every row bucket
//     and partly used ones), N with odd column-group tails (N % 4 in {1, 3}) and K covering the
//     scalar path, several batches per group and vector + tail; and lm_head-sized N = 100003 with
//     the launcher's own grid (a full resident wave, several groups per warp).
//  1c. The routing rule's thresholds (gemv::preferred): launch_rules_host_test.cc.
//  2. Every operand is a view into a NaN-poisoned buffer (padding between rows and slack after the
//     last row), outputs start as NaN: a read past the view or a missed store shows as NaN.
//  3. Layout and dtype cases: batched a [B, 1, K] and a with non-uniform (padded) batch strides,
//     padded and transposed outputs, b with leading unit dims, b [K, N] as a transposed view with
//     transpose_b false, f32 out from 16-bit inputs and 16-bit out from f32, misaligned w and x.
//  4. Nine rows (a [9, K] and a [3, 3, K]) go through cuBLASLt and must match as well.
//  5. A captured CUDA graph replays the GEMV with new x and w contents.
//  6. Programmatic dependent launch (launch.cuh) and the constant-weight prefetch
//     (Params::w_constant, MatmulOptions::b_constant): a long dependent chain of GEMVs and
//     primitive kernels, cycling through
//       0: x = rms_norm(h, g)            (layer-op kernel; the GEMV below reads x right after it)
//       1: u = x . W1^T      [1, I]      (GEMV)
//       2: v = u . W2^T      [1, H]      (GEMV fed by the GEMV before it)
//       3: u[:, :H] = v                  (overwrites the input of the GEMV right before it)
//       4: x = u[:, :H] * half           (overwrites the first GEMV's x)
//       5: h' = x + h                    (h and h' swap each cycle)
//     gives the reference's bits (eager, PDL off, legacy stream, no prefetch promise) eagerly with
//     PDL on and the promise, and in captured graphs (PDL on and off, with and without the
//     promise) replayed several times from restored buffers; and agrees with the CPU. The launch
//     counters show each routed GEMV was launched with the attribute and the prefetch path
//     exactly when promised.
//  8. The residual epilogue (MatmulOptions::residual, out = a . b^T + c with one rounding): GEMV
//     rows (M = 1, 3) and cuBLASLt rows (M = 9) in bf16 and f32, a residual of another dtype, a
//     strided residual, and c = out itself (h += linear(x)), against the CPU's f32 product plus c;
//     which cuBLASLt cases take its own epilogue (beta = 1), also over batch dims.
//  9. fused_matmul_add (the MatMulAdd layer op) on CUDA against cpu::matmul_add, and with a bias
//     c [N] broadcast over the rows (the biased linear's region) against the CPU op.
//  7. A Session marks a MatMul whose weight is a Param as constant (the prefetch path) and one
//     whose b is an Input not, and both agree with the CPU.
//  10. The rms_norm / silu_mul prologue products, and the in-place residual epilogue and the
//     rms_norm prologue on 2 CTAs (many column groups per warp), against the CPU; and the
//     decode-row kernel (one row, one wave) against the general kernel bit for bit, over every
//     prologue, the residual, columns per warp and dtype; the 2-8 row rms_norm kernel against the
//     CPU and the general kernel (within tolerance: another fp32 summation order).
// Inputs have mean 0.5 so the dot products stay away from cancellation, where the fp32
// reassociation error of two valid summation orders could exceed the f32 atol; results agree
// within default_tolerance(out dtype) (design.md §2).
#include "../../src/backend/cuda/gemv.h"  // internal: the kernel is also tested directly

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../../src/backend/cuda/primitives_internal.h"  // internal: the residual route counter
#include "splice/backend/cpu/layer_ops.h"
#include "splice/backend/cpu/primitives.h"
#include "splice/backend/cuda/layer_ops.h"
#include "splice/backend/cuda/primitives.h"
#include "splice/backend/cuda/runtime.h"
#include "splice/core/random.h"
#include "splice/exec/session.h"
#include "splice/ir/graph.h"
#include "splice/ops/layer_ops.h"
#include "support/cuda_test_util.h"
#include "support/test_util.h"

namespace splice {
namespace {

constexpr DType kFloatTypes[] = {DType::f32, DType::f16, DType::bf16};
constexpr std::int64_t kRowsGrid[] = {1, 2, 3, 8};
constexpr std::int64_t kNGrid[] = {1, 17, 192, 576, 1536, 4097};
constexpr std::int64_t kKGrid[] = {1, 7, 64, 576, 1536, 4095};
constexpr std::int64_t kSlack = 64;     // poisoned elements after a matrix's last row
constexpr std::int64_t kRowAlign = 8;   // elements: 16 bytes of 16-bit, 32 of f32
constexpr std::int64_t kPadStride = 8;  // extra elements per padded weight row
constexpr double kMean = 0.5;

std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

using testing::download;
using testing::upload;

// A random CPU view of `shape` with `strides` at element `offset` of a NaN-poisoned buffer that
// ends kSlack elements after the view's last element.
Tensor poisoned(Rng& rng, const Dims& shape, const Dims& strides, std::int64_t offset,
                DType dtype) {
  std::int64_t last = offset;
  for (std::size_t d = 0; d < shape.size(); ++d) last += (shape[d] - 1) * strides[d];
  Tensor base = Tensor::empty({last + 1 + kSlack}, dtype);
  poison_nan(base);
  Tensor view = Tensor::view_of(base.storage(), offset, shape, strides, dtype);
  rng.normal(view, kMean, 1.0);
  return view;
}

Tensor contiguous_poisoned(Rng& rng, const Dims& shape, DType dtype, std::int64_t offset = 0) {
  return poisoned(rng, shape, Tensor::contiguous_strides(shape), offset, dtype);
}

// An all-NaN output of `shape` (contiguous) on the CPU, to be uploaded.
Tensor nan_output(const Dims& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  poison_nan(t);
  return t;
}

// cuda::matmul(da, db) into a device copy of `out_host` (its layout and its NaNs) against
// cpu::matmul(a, b) into a contiguous tensor of out_host's dtype.
::testing::AssertionResult agree(const Tensor& a, const Tensor& b, const Tensor& da,
                                 const Tensor& db, bool transpose_b, const Tensor& out_host) {
  Tensor expected = Tensor::empty(out_host.shape(), out_host.dtype());
  cpu::matmul(a, b, expected, transpose_b);
  Tensor device_out = upload(out_host);
  cuda::matmul(da, db, device_out, transpose_b);
  return testing::close(download(device_out), expected, default_tolerance(out_host.dtype()));
}

::testing::AssertionResult agree(const Tensor& a, const Tensor& b, bool transpose_b,
                                 const Tensor& out_host) {
  return agree(a, b, upload(a), upload(b), transpose_b, out_host);
}

// cpu::matmul(x, w^T) into a contiguous [m, n] of `out_dtype`: the oracle for gemv::launch.
Tensor expected_of(const Tensor& x, const Tensor& w, DType out_dtype) {
  Tensor expected = Tensor::empty({x.size(0), w.size(0)}, out_dtype);  // [m, n]
  cpu::matmul(x, w, expected, true);
  return expected;
}

// gemv::launch on device views dx [m, k] and dw [n, k] (row-strided, unit inner stride) into a
// NaN-filled device y [m, n] of expected's dtype, at most `max_ctas` CTAs (0: the launcher's
// grid), `cols` columns per warp (0: the launcher's), a warp per group if `one_warp_per_group`,
// against `expected` (expected_of on the host copies).
// The GEMV params of dx [m, k] (row-strided) . dw [n, k]^T: the weight, the shape, the x rows and
// the dtypes (y rows, prologue and launch knobs are the caller's).
cuda::gemv::Params direct_params(const Tensor& dx, const Tensor& dw, DType out_dtype) {
  cuda::gemv::Params p;
  p.w = dw.raw_data();
  p.w_row_stride = dw.stride(0);
  p.n = dw.size(0);
  p.k = dx.size(1);
  p.rows = static_cast<int>(dx.size(0));
  p.in_dtype = dx.dtype();
  p.out_dtype = out_dtype;
  const std::int64_t in_size = static_cast<std::int64_t>(dtype_size(dx.dtype()));
  for (int r = 0; r < p.rows; ++r)
    p.x[r] = static_cast<const char*>(dx.raw_data()) + r * dx.stride(0) * in_size;
  return p;
}

::testing::AssertionResult agree_direct(const Tensor& expected, const Tensor& dx, const Tensor& dw,
                                        int max_ctas = 0, int cols = 0,
                                        bool one_warp_per_group = false) {
  const std::int64_t m = dx.size(0), n = dw.size(0);
  const DType out_dtype = expected.dtype();
  Tensor dy = upload(nan_output({m, n}, out_dtype));  // [m, n]
  cuda::gemv::Params p = direct_params(dx, dw, out_dtype);
  p.max_ctas = max_ctas;
  p.cols = cols;
  p.one_warp_per_group = one_warp_per_group;
  const std::int64_t out_size = static_cast<std::int64_t>(dtype_size(out_dtype));
  for (std::int64_t r = 0; r < m; ++r)
    p.y[r] = static_cast<char*>(dy.raw_data()) + r * n * out_size;
  cuda::gemv::launch(p, cuda::current_stream());
  return testing::close(download(dy), expected, default_tolerance(out_dtype));
}

std::string label(DType dtype, std::int64_t m, std::int64_t n, std::int64_t k, const char* layout) {
  return std::string(dtype_name(dtype)) + " M " + std::to_string(m) + " N " + std::to_string(n) +
         " K " + std::to_string(k) + " " + layout;
}

TEST(CudaGemv, GridAgainstCpu) {
  SKIP_WITHOUT_GPU();
  Rng rng(11);
  for (DType dtype : kFloatTypes)
    for (std::int64_t k : kKGrid)
      for (std::int64_t n : kNGrid)
        for (const bool padded : {false, true}) {
          const std::int64_t row_stride = padded ? round_up(k, kRowAlign) + kPadStride : k;
          const Tensor w = poisoned(rng, {n, k}, {row_stride, 1}, 0, dtype);  // [n, k]
          const Tensor dw = upload(w);
          for (std::int64_t m : kRowsGrid) {
            const Tensor x = contiguous_poisoned(rng, {m, k}, dtype);  // [m, k]
            const Tensor dx = upload(x);
            EXPECT_TRUE(agree(x, w, dx, dw, true, nan_output({m, n}, dtype)))
                << label(dtype, m, n, k, padded ? "padded w" : "contiguous w");
            EXPECT_TRUE(agree_direct(expected_of(x, w, dtype), dx, dw))
                << label(dtype, m, n, k, padded ? "padded w, direct" : "contiguous w, direct");
          }
        }
}

TEST(CudaGemv, PersistentLoopOverManyColumnGroups) {
  SKIP_WITHOUT_GPU();
  Rng rng(16);
  // (k, padded row stride): the scalar path, one batch, several batches per group, vector + tail.
  const std::pair<std::int64_t, bool> k_cases[] = {
      {7, false}, {64, true}, {576, false}, {583, true}, {4096, false}};
  for (DType dtype : kFloatTypes)
    for (const auto& [k, padded] : k_cases)
      // On 132 SMs: 1, 1 and 4 columns a group (n = 4099: a last group of 3 columns).
      for (std::int64_t n : {5, 577, 4099}) {
        const std::int64_t row_stride = padded ? round_up(k, kRowAlign) + kPadStride : k;
        const Tensor w = poisoned(rng, {n, k}, {row_stride, 1}, 0, dtype);  // [n, k]
        const Tensor dw = upload(w);
        for (std::int64_t m : {1, 2, 3, 5, 8}) {
          const Tensor x = contiguous_poisoned(rng, {m, k}, dtype);  // [m, k]
          const Tensor dx = upload(x);
          const Tensor expected = expected_of(x, w, dtype);  // [m, n]
          const std::string name = label(dtype, m, n, k, padded ? "padded w" : "contiguous w");
          for (int max_ctas : {1, 2, 3})
            EXPECT_TRUE(agree_direct(expected, dx, dw, max_ctas))
                << name << " max_ctas " << max_ctas;
          // The bench's tuning overrides: forced columns per warp, a warp per group.
          for (int cols : {1, 2, 4})
            EXPECT_TRUE(agree_direct(expected, dx, dw, 2, cols)) << name << " cols " << cols;
          EXPECT_TRUE(agree_direct(expected, dx, dw, 0, 0, true)) << name << " warp per group";
        }
      }
}

TEST(CudaGemv, LmHeadSizedFullWave) {
  SKIP_WITHOUT_GPU();
  Rng rng(17);
  constexpr std::int64_t kN = 100003, kK = 576;  // 25001 column groups: several per warp
  for (DType dtype : {DType::bf16, DType::f32}) {
    const Tensor w = contiguous_poisoned(rng, {kN, kK}, dtype);  // [n, k]
    const Tensor dw = upload(w);
    for (std::int64_t m : {1, 4, 8}) {
      const Tensor x = contiguous_poisoned(rng, {m, kK}, dtype);  // [m, k]
      const Tensor dx = upload(x);
      EXPECT_TRUE(agree_direct(expected_of(x, w, dtype), dx, dw))
          << label(dtype, m, kN, kK, "direct");
      EXPECT_TRUE(agree(x, w, dx, dw, true, nan_output({m, kN}, dtype)))
          << label(dtype, m, kN, kK, "routed");
    }
  }
}

TEST(CudaGemv, BatchedRowsStridesAndOutputLayouts) {
  SKIP_WITHOUT_GPU();
  Rng rng(12);
  for (DType dtype : kFloatTypes)
    for (std::int64_t k : {7, 576, 4095})
      for (std::int64_t n : {17, 576}) {
        const Tensor w = contiguous_poisoned(rng, {n, k}, dtype);  // [n, k]
        const Tensor dw = upload(w);
        // a [B, 1, K], the decode batch layout.
        const Tensor a_batched = contiguous_poisoned(rng, {4, 1, k}, dtype);  // [4, 1, k]
        EXPECT_TRUE(agree(a_batched, w, upload(a_batched), dw, true, nan_output({4, 1, n}, dtype)))
            << label(dtype, 4, n, k, "a [4, 1, K]");
        // a [2, 3, 1, K] with padded (non-uniform) batch strides; out padded the same way.
        const Dims a_shape = {2, 3, 1, k};
        const Tensor a_padded = poisoned(rng, a_shape, {5 * (k + 3), k + 3, k + 1, 1}, 0, dtype);
        Tensor out_padded = testing::padded_tensor({2, 3, 1, n}, dtype, 3);
        EXPECT_TRUE(agree(a_padded, w, upload(a_padded), dw, true, out_padded))
            << label(dtype, 6, n, k, "a [2, 3, 1, K] padded, out padded");
        // out [M, N] as a transposed view (column stride M).
        const Tensor x = contiguous_poisoned(rng, {3, k}, dtype);  // [3, k]
        Tensor out_t_base = nan_output({n, 3}, dtype);
        EXPECT_TRUE(agree(x, w, upload(x), dw, true, out_t_base.permute({1, 0})))
            << label(dtype, 3, n, k, "out transposed");
        // b [1, N, K]: leading unit dims.
        EXPECT_TRUE(agree(x, w.unsqueeze(0), upload(x), dw.unsqueeze(0), true,
                          nan_output({1, 3, n}, dtype)))
            << label(dtype, 3, n, k, "b [1, N, K]");
      }
}

TEST(CudaGemv, UntransposedViewMixedOutputsAndMisalignment) {
  SKIP_WITHOUT_GPU();
  Rng rng(13);
  for (DType dtype : kFloatTypes)
    for (std::int64_t k : {7, 64, 576, 4095})
      for (std::int64_t n : {17, 576}) {
        const Tensor w = contiguous_poisoned(rng, {n, k}, dtype);  // [n, k]
        const Tensor x = contiguous_poisoned(rng, {2, k}, dtype);  // [2, k]
        // b [K, N] with stride(-2) == 1, read with transpose_b false.
        EXPECT_TRUE(agree(x, w.permute({1, 0}), false, nan_output({2, n}, dtype)))
            << label(dtype, 2, n, k, "b [K, N] transposed view");
        // The output in another float dtype.
        for (DType out_dtype : kFloatTypes) {
          if (out_dtype == dtype) continue;
          EXPECT_TRUE(agree(x, w, true, nan_output({2, n}, out_dtype)))
              << label(dtype, 2, n, k, "out ") << dtype_name(out_dtype);
        }
        // w and x one element off a 16-byte boundary (rows 16-byte strided): the scalar path.
        const std::int64_t stride = round_up(k, kRowAlign);
        const Tensor w_off = poisoned(rng, {n, k}, {stride, 1}, 1, dtype);
        const Tensor x_off = poisoned(rng, {2, k}, {stride, 1}, 1, dtype);
        EXPECT_TRUE(agree(x_off, w_off, true, nan_output({2, n}, dtype)))
            << label(dtype, 2, n, k, "misaligned w and x");
        const Tensor x_one_off = poisoned(rng, {2, k}, {stride, 1}, 1, dtype);
        const Tensor w_aligned = poisoned(rng, {n, k}, {stride, 1}, 0, dtype);
        EXPECT_TRUE(agree(x_one_off, w_aligned, true, nan_output({2, n}, dtype)))
            << label(dtype, 2, n, k, "misaligned x only");
      }
}

TEST(CudaGemv, NineRowsGoThroughCublasLt) {
  SKIP_WITHOUT_GPU();
  Rng rng(14);
  for (DType dtype : kFloatTypes)
    for (std::int64_t k : {64, 576})
      for (std::int64_t n : {17, 576}) {
        const Tensor w = contiguous_poisoned(rng, {n, k}, dtype);  // [n, k]
        const Tensor x = contiguous_poisoned(rng, {9, k}, dtype);  // [9, k]
        EXPECT_TRUE(agree(x, w, true, nan_output({9, n}, dtype))) << label(dtype, 9, n, k, "");
        const Tensor x3 = contiguous_poisoned(rng, {3, 3, k}, dtype);  // [3, 3, k]
        EXPECT_TRUE(agree(x3, w, true, nan_output({3, 3, n}, dtype)))
            << label(dtype, 9, n, k, "a [3, 3, K]");
      }
}

TEST(CudaGemv, CapturedGraphReplaysWithNewInputs) {
  SKIP_WITHOUT_GPU();
  Rng rng(15);
  constexpr std::int64_t kN = 576, kK = 1536, kM = 1;
  const DType dtype = DType::bf16;
  const cuda::Stream stream = cuda::create_stream();
  {
    cuda::StreamGuard guard(stream);
    Tensor w = contiguous_poisoned(rng, {kN, kK}, dtype);  // [n, k]
    Tensor x = contiguous_poisoned(rng, {kM, kK}, dtype);  // [m, k]
    const Tensor dw = upload(w), dx = upload(x);
    Tensor dout = upload(nan_output({kM, kN}, dtype));
    cuda::matmul(dx, dw, dout, true);  // warm-up outside capture
    cuda::stream_synchronize(stream);
    cuda::begin_capture(stream);
    cuda::matmul(dx, dw, dout, true);
    const cuda::GraphExec graph = cuda::end_capture(stream);
    constexpr int kReplays = 3;
    for (int replay = 0; replay < kReplays; ++replay) {
      rng.normal(w, kMean, 1.0);
      rng.normal(x, kMean, 1.0);
      device_copy(dw.raw_data(), dw.device(), w.raw_data(), Device::cpu(), w.nbytes());
      device_copy(dx.raw_data(), dx.device(), x.raw_data(), Device::cpu(), x.nbytes());
      cuda::launch_graph(graph, stream);
      cuda::stream_synchronize(stream);
      Tensor expected = Tensor::empty({kM, kN}, dtype);
      cpu::matmul(x, w, expected, true);
      EXPECT_TRUE(testing::close(download(dout), expected, default_tolerance(dtype)))
          << "replay " << replay;
    }
    cuda::destroy_graph(graph);
  }
  cuda::destroy_stream(stream);
}

// ---- 6. the PDL chain ------------------------------------------------------------------------

constexpr std::int64_t kChainHidden = 576;         // SmolLM2-135M's hidden size (H)
constexpr std::int64_t kChainIntermediate = 1536;  // its MLP width (I)
constexpr int kChainCycles = 40;                   // 6 kernels each: 240 dependent launches
constexpr int kChainGemvsPerCycle = 2;
constexpr float kChainEps = 1e-5f;
constexpr int kChainReplays = 3;

// The chain's buffers on one device. [1, H] etc.: one decode row.
struct GemvChain {
  Tensor h0, h1;  // [1, H] bf16: the running state (h1 = x + h0 on even cycles, h0 on odd)
  Tensor g;       // [H] bf16: the rms_norm weight
  Tensor w1;      // [I, H] bf16: never written
  Tensor w2;      // [H, I] bf16: never written
  Tensor x;       // [1, H] bf16
  Tensor u;       // [1, I] bf16
  Tensor v;       // [1, H] bf16
  Tensor half;    // [1] f32: 0.5
  std::vector<Tensor*> all() { return {&h0, &h1, &g, &w1, &w2, &x, &u, &v, &half}; }
};

GemvChain make_host_gemv_chain(Rng& rng) {
  const double w_scale1 = 1.0 / std::sqrt(static_cast<double>(kChainHidden));
  const double w_scale2 = 1.0 / std::sqrt(static_cast<double>(kChainIntermediate));
  GemvChain t;
  t.h0 = testing::random_tensor(rng, {1, kChainHidden}, DType::bf16);
  t.h1 = testing::random_tensor(rng, {1, kChainHidden}, DType::bf16);
  t.g = testing::random_tensor(rng, {kChainHidden}, DType::bf16, 0.1, 1.0);
  t.w1 = testing::random_tensor(rng, {kChainIntermediate, kChainHidden}, DType::bf16, w_scale1);
  t.w2 = testing::random_tensor(rng, {kChainHidden, kChainIntermediate}, DType::bf16, w_scale2);
  t.x = testing::random_tensor(rng, {1, kChainHidden}, DType::bf16);
  t.u = testing::random_tensor(rng, {1, kChainIntermediate}, DType::bf16);
  t.v = testing::random_tensor(rng, {1, kChainHidden}, DType::bf16);
  t.half = Tensor::empty({1}, DType::f32);
  t.half.set_linear(0, 0.5);
  return t;
}

GemvChain copy_gemv_chain(GemvChain& from, Device device) {
  GemvChain to;
  const std::vector<Tensor*> src = from.all(), dst = to.all();
  for (std::size_t i = 0; i < src.size(); ++i) *dst[i] = src[i]->to_device(device);
  return to;
}

void restore_gemv_chain(GemvChain& to, GemvChain& from, cuda::Stream stream) {
  const std::vector<Tensor*> dst = to.all(), src = from.all();
  for (std::size_t i = 0; i < dst.size(); ++i)
    cuda::copy_async(dst[i]->raw_data(), src[i]->raw_data(), src[i]->nbytes(), stream);
  cuda::stream_synchronize(stream);
}

// The chain on the CPU (cpu = true) or the current CUDA stream (eager or capturing).
void run_gemv_chain(GemvChain& t, bool cpu, bool b_constant) {
  Tensor u_head = t.u.slice(1, 0, kChainHidden);  // [1, H] view of u
  cuda::MatmulOptions options;
  options.b_constant = b_constant;
  for (int cycle = 0; cycle < kChainCycles; ++cycle) {
    Tensor& h = cycle % 2 == 0 ? t.h0 : t.h1;
    Tensor& h_next = cycle % 2 == 0 ? t.h1 : t.h0;
    if (cpu) {
      cpu::rms_norm(h, t.g, kChainEps, t.x);
      cpu::matmul(t.x, t.w1, t.u, true);
      cpu::matmul(t.u, t.w2, t.v, true);
      cpu::cast(t.v, u_head);
      cpu::binary(cpu::BinaryKind::mul, u_head, t.half, t.x);
      cpu::binary(cpu::BinaryKind::add, t.x, h, h_next);
    } else {
      cuda::rms_norm(h, t.g, kChainEps, t.x);
      cuda::matmul(t.x, t.w1, t.u, true, options);
      cuda::matmul(t.u, t.w2, t.v, true, options);
      cuda::cast(t.v, u_head);
      cuda::binary(cuda::BinaryKind::mul, u_head, t.half, t.x);
      cuda::binary(cuda::BinaryKind::add, t.x, h, h_next);
    }
  }
}

::testing::AssertionResult same_chain_bits(GemvChain& actual, GemvChain& expected) {
  cuda::synchronize();
  const std::vector<Tensor*> got = actual.all(), want = expected.all();
  for (std::size_t i = 0; i < got.size(); ++i) {
    ::testing::AssertionResult r =
        testing::bit_equal(got[i]->to_device(Device::cpu()), want[i]->to_device(Device::cpu()));
    if (!r) return r << " (buffer " << i << ")";
  }
  return ::testing::AssertionSuccess();
}

using testing::PdlScope;

TEST(CudaGemv, PdlChainWithPrefetchIsBitIdenticalEagerAndInGraphs) {
  SKIP_WITHOUT_GPU();
  PdlScope scope;
  Rng rng(23);
  GemvChain host = make_host_gemv_chain(rng);
  // Both products of the chain take the GEMV (one row).
  ASSERT_TRUE(cuda::gemv::preferred(1, kChainIntermediate, kChainHidden));
  ASSERT_TRUE(cuda::gemv::preferred(1, kChainHidden, kChainIntermediate));
  GemvChain initial = copy_gemv_chain(host, Device::cuda());  // pristine, never written
  const cuda::Stream stream = cuda::create_stream();
  constexpr std::uint64_t kGemvs = kChainCycles * kChainGemvsPerCycle;

  // Reference: PDL off, legacy default stream, eager, no promise.
  cuda::set_pdl_enabled(false);
  GemvChain reference = copy_gemv_chain(host, Device::cuda());
  auto before = cuda::gemv::launch_stats();
  run_gemv_chain(reference, /*cpu=*/false, /*b_constant=*/false);
  auto after = cuda::gemv::launch_stats();
  EXPECT_EQ(after.launches - before.launches, kGemvs);
  EXPECT_EQ(after.pdl - before.pdl, 0u);
  EXPECT_EQ(after.prefetch - before.prefetch, 0u);

  // CPU oracle (a sanity check: the bit-identity below is the race detector): every step rounds
  // through bf16 and each cycle renormalizes, but h accumulates 40 increments, each of which may
  // round differently on the two backends (a bf16 ulp of h, 2^-8 relative, per flip), so the
  // bound is a few percent: rtol 5e-2 plus atol 1e-1 for the entries near zero. A flip early in
  // the chain can still carry one entry further (H200, 05:58: 1 of 576 entries of h0 off by 0.5
  // at |h| ~ 1), so up to 1% of the entries may exceed the bound, none by more than 1.0; a wrong
  // GEMV or a race moves every entry by O(1).
  GemvChain cpu_chain = copy_gemv_chain(host, Device::cpu());
  run_gemv_chain(cpu_chain, /*cpu=*/true, false);
  constexpr Tolerance tol{1e-1, 5e-2};
  for (const auto& [name, got, want] :
       {std::tuple<const char*, Tensor, Tensor>{"h0", reference.h0, cpu_chain.h0},
        std::tuple<const char*, Tensor, Tensor>{"u", reference.u, cpu_chain.u}}) {
    const CompareReport r = compare_tensors(got.to_device(Device::cpu()), want, tol);
    EXPECT_LE(r.mismatches * 100, r.count) << name << ": " << r.str();
    EXPECT_LE(r.max_abs_error, 1.0) << name << ": " << r.str();
  }

  GemvChain dev = copy_gemv_chain(host, Device::cuda());
  cuda::set_pdl_enabled(true);
  {  // PDL on, created stream, eager, weights promised constant.
    cuda::StreamGuard guard(stream);
    restore_gemv_chain(dev, initial, stream);
    before = cuda::gemv::launch_stats();
    run_gemv_chain(dev, false, true);
    after = cuda::gemv::launch_stats();
    EXPECT_EQ(after.launches - before.launches, kGemvs);
    EXPECT_EQ(after.pdl - before.pdl, kGemvs) << "every GEMV carries the PDL attribute";
    EXPECT_EQ(after.prefetch - before.prefetch, kGemvs) << "every GEMV prefetches its weight";
    EXPECT_TRUE(same_chain_bits(dev, reference)) << "eager, PDL on, prefetch";
  }
  for (const bool pdl : {true, false})
    for (const bool b_constant : {true, false}) {  // captured graphs, replayed from restored inputs
      SCOPED_TRACE(std::string("graph, PDL ") + (pdl ? "on" : "off") + ", prefetch " +
                   (b_constant ? "on" : "off"));
      cuda::set_pdl_enabled(pdl);
      cuda::StreamGuard guard(stream);
      restore_gemv_chain(dev, initial, stream);
      before = cuda::gemv::launch_stats();
      cuda::begin_capture(stream);
      run_gemv_chain(dev, false, b_constant);
      const cuda::GraphExec exec = cuda::end_capture(stream);
      after = cuda::gemv::launch_stats();
      EXPECT_EQ(after.pdl - before.pdl, pdl ? kGemvs : 0u);
      EXPECT_EQ(after.prefetch - before.prefetch, b_constant ? kGemvs : 0u);
      for (int r = 0; r < kChainReplays; ++r) {
        restore_gemv_chain(dev, initial, stream);
        cuda::launch_graph(exec, stream);
        cuda::stream_synchronize(stream);
        EXPECT_TRUE(same_chain_bits(dev, reference)) << "replay " << r;
      }
      cuda::destroy_graph(exec);
    }
  {  // PDL on, legacy default stream: the attribute is skipped there (the prefetch still runs).
    cuda::set_pdl_enabled(true);
    restore_gemv_chain(dev, initial, nullptr);
    before = cuda::gemv::launch_stats();
    run_gemv_chain(dev, false, true);
    after = cuda::gemv::launch_stats();
    EXPECT_EQ(after.pdl - before.pdl, 0u);
    EXPECT_TRUE(same_chain_bits(dev, reference)) << "eager legacy stream, PDL on";
  }
  cuda::destroy_stream(stream);
}

// ---- 7. the session's hint -------------------------------------------------------------------

TEST(CudaGemv, SessionPromisesParamWeightsConstant) {
  SKIP_WITHOUT_GPU();
  PdlScope scope;
  cuda::set_pdl_enabled(true);
  Rng rng(29);
  constexpr std::int64_t kN = 960, kK = 576;  // SmolLM2's q|k|v projection
  const DType dtype = DType::bf16;
  const Tensor w = testing::random_tensor(rng, {kN, kK}, dtype, 0.05);  // [n, k]
  const Tensor v = testing::random_tensor(rng, {kN, kK}, dtype, 0.05);  // [n, k]
  const Tensor x = testing::random_tensor(rng, {1, kK}, dtype);         // [1, k]
  Graph g;
  const NodeId xi = g.input("x", sym_shape_of({1, kK}), dtype);
  const NodeId vi = g.input("v", sym_shape_of({kN, kK}), dtype);
  g.mark_output("from_param", g.matmul(xi, g.param("w", w), /*transpose_b=*/true));
  g.mark_output("from_input", g.matmul(xi, vi, /*transpose_b=*/true));
  // The MatMulAdd layer op with a Param weight is promised constant too.
  const NodeId ci = g.input("c", sym_shape_of({1, kN}), dtype);
  g.mark_output("fused", g.matmul_add(xi, g.param("w2", w), ci, dtype));
  SessionOptions options;
  options.device = Device::cuda();
  options.cuda_graph = false;  // eager: every step launches (and counts) both GEMVs
  Session session(g, options);
  const Device d = Device::cuda();
  const auto before = cuda::gemv::launch_stats();
  const Tensor c = testing::random_tensor(rng, {1, kN}, dtype);  // [1, n]
  session.step({}, {{"x", x.to_device(d)}, {"v", v.to_device(d)}, {"c", c.to_device(d)}});
  cuda::synchronize();
  const auto after = cuda::gemv::launch_stats();
  EXPECT_EQ(after.launches - before.launches, 3u);
  EXPECT_EQ(after.prefetch - before.prefetch, 2u) << "only the Param weights are promised constant";
  Tensor expected_fused = Tensor::empty({1, kN}, dtype);
  cpu::matmul_add(x, w, c, expected_fused);
  EXPECT_TRUE(testing::close(session.output("fused").to_device(Device::cpu()), expected_fused,
                             default_tolerance(dtype)));
  Tensor expected_param = Tensor::empty({1, kN}, dtype),
         expected_input = Tensor::empty({1, kN}, dtype);
  cpu::matmul(x, w, expected_param, true);
  cpu::matmul(x, v, expected_input, true);
  EXPECT_TRUE(testing::close(session.output("from_param").to_device(Device::cpu()), expected_param,
                             default_tolerance(dtype)));
  EXPECT_TRUE(testing::close(session.output("from_input").to_device(Device::cpu()), expected_input,
                             default_tolerance(dtype)));
}

// ---- 9. the MatMulAdd layer op on CUDA ------------------------------------------------------

TEST(CudaGemv, FusedMatMulAddLayerOpAgainstTheCpuKernel) {
  SKIP_WITHOUT_GPU();
  Rng rng(37);
  constexpr std::int64_t kN = 576, kK = 1536;  // SmolLM2's down_proj
  for (std::int64_t m : {1, 9}) {              // the GEMV epilogue; cuBLASLt + one add
    const DType dtype = DType::bf16;
    const Tensor a = testing::random_tensor(rng, {1, m, kK}, dtype);          // [1, m, k]
    const Tensor b = testing::random_tensor(rng, {kN, kK}, dtype, 1.0 / 32);  // [n, k]
    const Tensor c = testing::random_tensor(rng, {1, m, kN}, dtype);          // [1, m, n]
    Tensor want = Tensor::empty({1, m, kN}, dtype);
    cpu::matmul_add(a, b, c, want);
    const Device d = Device::cuda();
    Tensor got = Tensor::empty({1, m, kN}, dtype, d);
    fused_matmul_add(a.to_device(d), b.to_device(d), c.to_device(d), got, /*b_constant=*/true);
    EXPECT_TRUE(testing::close(got.to_device(Device::cpu()), want, default_tolerance(dtype)))
        << "m " << m;
  }
}

// The MatMulAdd layer op with a bias c [n] (the biased linear's region): broadcast over the rows
// through a stride-0 view, on the GEMV (1, 3 rows: its per-row c pointers) and cuBLASLt (9 rows:
// the scratch product and a broadcasting add, not cuBLASLt's epilogue, whose C has out's
// strides), against the CPU op.
TEST(CudaGemv, FusedMatMulAddBroadcastsABias) {
  SKIP_WITHOUT_GPU();
  Rng rng(41);
  constexpr std::int64_t kN = 256, kK = 128;  // the default model's g_proj.1
  for (std::int64_t m : {1, 3, 9}) {
    const DType dtype = DType::bf16;
    const Tensor a = testing::random_tensor(rng, {m, kK}, dtype);             // [m, k]
    const Tensor b = testing::random_tensor(rng, {kN, kK}, dtype, 1.0 / 16);  // [n, k]
    const Tensor bias = testing::random_tensor(rng, {kN}, dtype);             // [n]
    Tensor want = Tensor::empty({m, kN}, dtype);                              // [m, n]
    fused_matmul_add(a, b, bias, want);
    const Device d = Device::cuda();
    Tensor got = Tensor::empty({m, kN}, dtype, d);
    const std::uint64_t epilogues = cuda::detail::lt_residual_epilogues();
    fused_matmul_add(a.to_device(d), b.to_device(d), bias.to_device(d), got, /*b_constant=*/true);
    EXPECT_EQ(cuda::detail::lt_residual_epilogues(), epilogues) << "m " << m;
    EXPECT_TRUE(testing::close(got.to_device(Device::cpu()), want, default_tolerance(dtype)))
        << "m " << m;
  }
}

// ---- 8b. the residual epilogue through cuda::matmul ---------------------------------------

TEST(CudaGemv, ResidualEpilogueAgainstCpu) {
  SKIP_WITHOUT_GPU();
  Rng rng(31);
  constexpr std::int64_t kN = 577, kK = 576;
  for (DType dtype : {DType::bf16, DType::f32})
    for (DType c_dtype : {dtype, DType::f32})
      for (std::int64_t m : {1, 3, 9})
        for (int layout = 0; layout < 3; ++layout) {  // 0: contiguous c, 1: strided c, 2: c = out
          SCOPED_TRACE(label(dtype, m, kN, kK,
                             layout == 0   ? "c"
                             : layout == 1 ? "strided c"
                                           : "c = out") +
                       " c " + dtype_name(c_dtype));
          if (layout == 2 && c_dtype != dtype) continue;
          const Tensor x = contiguous_poisoned(rng, {m, kK}, dtype);   // [m, k]
          const Tensor w = contiguous_poisoned(rng, {kN, kK}, dtype);  // [n, k]
          const std::int64_t c_stride = layout == 1 ? kN + kPadStride : kN;
          const Tensor c = poisoned(rng, {m, kN}, {c_stride, 1}, 0, c_dtype);  // [m, n]
          // Oracle: the f32 product plus c in fp32, one rounding into dtype.
          Tensor product = Tensor::empty({m, kN}, DType::f32);
          cpu::matmul(x, w, product, true);
          Tensor expected = Tensor::empty({m, kN}, dtype);
          cpu::binary(cpu::BinaryKind::add, product, c, expected);

          const Tensor dx = upload(x), dw = upload(w);
          Tensor dc = upload(c);
          Tensor dout = layout == 2 ? dc : upload(nan_output({m, kN}, dtype));
          cuda::MatmulOptions options;
          options.residual = &dc;
          options.b_constant = true;
          const std::uint64_t epilogues = cuda::detail::lt_residual_epilogues();
          cuda::matmul(dx, dw, dout, true, options);
          EXPECT_TRUE(testing::close(download(dout), expected, default_tolerance(dtype)));
          // Nine rows go to cuBLASLt: its own epilogue adds a residual of out's dtype and
          // strides (c = out among them); the others take the f32 product and an add.
          const bool lt_epilogue = m == 9 && c_dtype == dtype && layout != 1;
          EXPECT_EQ(cuda::detail::lt_residual_epilogues() - epilogues, lt_epilogue ? 1u : 0u);
        }
}

// The residual in cuBLASLt's epilogue over batch dims: a [2, 9, k] against one weight (the batch
// folded into one GEMM's rows) and against a batch of weights (a strided-batched GEMM), c
// contiguous and c = out, against the CPU's f32 product plus c.
TEST(CudaGemv, ResidualEpilogueOverBatchDims) {
  SKIP_WITHOUT_GPU();
  Rng rng(37);
  constexpr std::int64_t kB = 2, kM = 9, kN = 96, kK = 64;
  for (DType dtype : {DType::bf16, DType::f32})
    for (bool batched_w : {false, true})
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + (batched_w ? " batched w" : " one w") +
                     (in_place ? " c = out" : " c"));
        const Tensor x = contiguous_poisoned(rng, {kB, kM, kK}, dtype);             // [B, M, K]
        const Tensor w = batched_w ? contiguous_poisoned(rng, {kB, kN, kK}, dtype)  // [B, N, K]
                                   : contiguous_poisoned(rng, {kN, kK}, dtype);     // [N, K]
        const Tensor c = contiguous_poisoned(rng, {kB, kM, kN}, dtype);             // [B, M, N]
        Tensor product = Tensor::empty({kB, kM, kN}, DType::f32);                   // [B, M, N]
        cpu::matmul(x, w, product, true);
        Tensor expected = Tensor::empty({kB, kM, kN}, dtype);  // [B, M, N]
        cpu::binary(cpu::BinaryKind::add, product, c, expected);
        const Tensor dx = upload(x), dw = upload(w);
        Tensor dc = upload(c);
        Tensor dout = in_place ? dc : upload(nan_output({kB, kM, kN}, dtype));
        cuda::MatmulOptions options;
        options.residual = &dc;
        const std::uint64_t epilogues = cuda::detail::lt_residual_epilogues();
        cuda::matmul(dx, dw, dout, true, options);
        EXPECT_EQ(cuda::detail::lt_residual_epilogues() - epilogues, 1u);
        EXPECT_TRUE(testing::close(download(dout), expected, default_tolerance(dtype)));
      }
}

// ---- 10. The prologue products, and the decode-row kernel against the general kernel --------

// The prologue layer ops against the CPU compositions, on shapes where rms_norm's prologue runs in
// registers (bf16 / f32, aligned, k = 64, 576 and 1536 in one batch; one row of these takes the
// decode-row kernel) and where it falls back to shared memory (a stride-2 norm weight: the
// per-element path; 4 columns per warp at k = 1536: two batches; 3 rows). Tolerance: the
// prologue ops' (default, atol x4 in 16-bit: the prologue row is rounded to the activation dtype).
TEST(CudaGemv, PrologueProductsAgreeWithTheCpu) {
  SKIP_WITHOUT_GPU();
  Rng rng(47);
  constexpr float kEpsNorm = 1e-5f;
  for (DType dtype : {DType::bf16, DType::f32})
    for (std::int64_t k : {64, 576, 1536})
      for (std::int64_t n : {192, 576, 1537})
        for (std::int64_t m : {1, 3}) {
          if (!cuda::gemv::preferred(m, n, k)) continue;
          const bool strided_norm = n == 1537;  // (m = 1: 3 rows of n > 1024 go to cuBLASLt)
          SCOPED_TRACE(label(dtype, m, n, k, strided_norm ? "strided norm" : "contiguous"));
          Tolerance tol = default_tolerance(dtype);
          if (dtype != DType::f32) tol.atol *= 4;
          const Tensor x = contiguous_poisoned(rng, {m, k}, dtype);  // [m, k]
          const Tensor b = contiguous_poisoned(rng, {m, k}, dtype);  // [m, k]
          const Tensor w =
              testing::random_tensor(rng, {n, k}, dtype, 1.0 / std::sqrt(static_cast<double>(k)));
          Tensor norm = testing::random_tensor(rng, {k}, dtype, 0.3, 1.0);  // [k]
          if (strided_norm) {
            const Tensor spread = testing::random_tensor(rng, {k, 2}, dtype, 0.3, 1.0);
            norm = Tensor::view_of(spread.storage(), spread.offset(), {k}, {2}, dtype);
          }
          const Tensor c = contiguous_poisoned(rng, {m, n}, dtype);  // [m, n]
          const Tensor dx = upload(x), db = upload(b), dw = upload(w), dnorm = upload(norm),
                       dc = upload(c);

          Tensor expected = Tensor::empty({m, n}, dtype);  // [m, n]
          cpu::rms_norm_matmul(x, norm, kEpsNorm, w, expected);
          Tensor expected_silu = Tensor::empty({m, n}, dtype);  // [m, n]
          cpu::silu_mul_matmul_add(x, b, w, c, expected_silu);
          Tensor product = Tensor::empty({m, n}, DType::f32);  // [m, n]
          cpu::matmul(x, w, product, true);
          Tensor expected_add = Tensor::empty({m, n}, dtype);  // [m, n]
          cpu::binary(cpu::BinaryKind::add, product, c, expected_add);

          Tensor dout = upload(nan_output({m, n}, dtype));
          cuda::rms_norm_matmul(dx, dnorm, kEpsNorm, dw, dout, /*w_constant=*/m == 1);
          EXPECT_TRUE(testing::close(download(dout), expected, tol)) << "rms_norm_matmul";

          Tensor dout_silu = upload(nan_output({m, n}, dtype));
          cuda::silu_mul_matmul_add(dx, db, dw, dc, dout_silu, /*w_constant=*/m == 3);
          EXPECT_TRUE(testing::close(download(dout_silu), expected_silu, tol))
              << "silu_mul_matmul_add";

          // The residual epilogue in place (c = y, the h += linear(x) of a decoder layer) on at
          // most 2 CTAs, so each warp streams many groups and reads the next group's c before
          // storing this group's y (the early residual's order).
          Tensor dy = upload(c);  // [m, n]: c and y
          cuda::gemv::Params p;
          p.w = dw.raw_data();
          p.w_row_stride = dw.stride(0);
          p.n = n;
          p.k = k;
          p.rows = static_cast<int>(m);
          p.in_dtype = dtype;
          p.out_dtype = dtype;
          p.max_ctas = 2;
          p.has_c = true;
          p.c_dtype = dtype;
          const std::int64_t size = static_cast<std::int64_t>(dtype_size(dtype));
          for (std::int64_t r = 0; r < m; ++r) {
            p.x[r] = static_cast<const char*>(dx.raw_data()) + r * dx.stride(0) * size;
            p.y[r] = static_cast<char*>(dy.raw_data()) + r * dy.stride(0) * size;
            p.c[r] = p.y[r];
          }
          cuda::gemv::launch(p, cuda::current_stream());
          EXPECT_TRUE(testing::close(download(dy), expected_add, default_tolerance(dtype)))
              << "in-place residual";

          // The rms_norm prologue on 2 CTAs: each warp keeps its prologue row (in registers in a
          // one-batch shape) across many column groups.
          Tensor dy_norm = upload(nan_output({m, n}, dtype));  // [m, n]
          cuda::gemv::Params q = p;
          q.has_c = false;
          q.prologue = cuda::gemv::Prologue::rms_norm;
          q.norm_weight = dnorm.raw_data();
          q.norm_weight_stride = dnorm.stride(0);
          q.norm_weight_dtype = dtype;
          q.eps = kEpsNorm;
          q.w_constant = true;
          for (std::int64_t r = 0; r < m; ++r) {
            q.y[r] = static_cast<char*>(dy_norm.raw_data()) + r * dy_norm.stride(0) * size;
            q.c[r] = nullptr;
          }
          cuda::gemv::launch(q, cuda::current_stream());
          EXPECT_TRUE(testing::close(download(dy_norm), expected, tol)) << "rms_norm on 2 CTAs";
        }
}

// The decode-row kernel (gemv_kernel.cuh's row_kernel: one row in a one-batch shape, the launcher's
// grid, one resident wave) is gemv_kernel's product bit for bit: every prologue (none, rms_norm in
// registers, silu_mul), with and without the residual, 1, 2 and 4 columns per warp, in every
// dtype, at k = 64, 576, 1536 and 1544 (over the one-batch limit: both launches take gemv_kernel)
// and n from 1 to 3072 (odd column-group tails), launched once with the launcher's grid and once
// with max_ctas set (which always takes gemv_kernel). The SmolLM2 decode shapes must take the row
// kernel (LaunchStats::row).
TEST(CudaGemv, DecodeRowKernelIsBitwiseTheGeneralKernel) {
  SKIP_WITHOUT_GPU();
  using cuda::gemv::Prologue;
  Rng rng(53);
  for (DType dtype : kFloatTypes)
    for (std::int64_t k : {64, 576, 1536, 1544})
      for (std::int64_t n : {1, 17, 192, 576, 1537, 3072}) {
        const Tensor x = contiguous_poisoned(rng, {1, k}, dtype);  // [1, k]: a (silu_mul) or x
        const Tensor b = contiguous_poisoned(rng, {1, k}, dtype);  // [1, k]: silu_mul's b
        const Tensor w =
            testing::random_tensor(rng, {n, k}, dtype, 1.0 / std::sqrt(static_cast<double>(k)));
        const Tensor norm = testing::random_tensor(rng, {k}, dtype, 0.3, 1.0);  // [k]
        const Tensor c = contiguous_poisoned(rng, {1, n}, dtype);               // [1, n]
        const Tensor dx = upload(x), db = upload(b), dw = upload(w), dnorm = upload(norm),
                     dc = upload(c);
        for (int cols : {1, 2, 4})
          for (Prologue prologue : {Prologue::none, Prologue::rms_norm, Prologue::silu_mul})
            for (bool has_c : {false, true}) {
              SCOPED_TRACE(label(dtype, 1, n, k, "row") + " cols " + std::to_string(cols) +
                           " prologue " + std::to_string(static_cast<int>(prologue)) +
                           (has_c ? " residual" : ""));
              cuda::gemv::Params p;
              p.w = dw.raw_data();
              p.w_row_stride = dw.stride(0);
              p.n = n;
              p.k = k;
              p.rows = 1;
              p.in_dtype = dtype;
              p.out_dtype = dtype;
              p.cols = cols;
              p.w_constant = true;
              p.x[0] = dx.raw_data();
              p.b[0] = db.raw_data();
              p.prologue = prologue;
              p.norm_weight = dnorm.raw_data();
              p.norm_weight_dtype = dtype;
              p.eps = 1e-5f;
              p.has_c = has_c;
              p.c[0] = dc.raw_data();
              p.c_dtype = dtype;
              Tensor row_out = upload(nan_output({1, n}, dtype));      // [1, n]
              Tensor general_out = upload(nan_output({1, n}, dtype));  // [1, n]
              p.y[0] = row_out.raw_data();
              const std::uint64_t rows_before = cuda::gemv::launch_stats().row;
              cuda::gemv::launch(p, cuda::current_stream());
              const bool took_row = cuda::gemv::launch_stats().row > rows_before;
              p.y[0] = general_out.raw_data();
              p.max_ctas = 1 << 20;
              cuda::gemv::launch(p, cuda::current_stream());
              EXPECT_EQ(cuda::gemv::launch_stats().row, rows_before + (took_row ? 1 : 0))
                  << "max_ctas takes gemv_kernel";
              const Tensor got_row = download(row_out), got_general = download(general_out);
              EXPECT_TRUE(testing::bit_equal(got_row, got_general)) << "row vs general";
              // The decode products of SmolLM2-135M in bf16 must take the row kernel: o_proj
              // (576 x 576), gate|up (3072 x 576) and down (576 x 1536, at most 2 columns).
              const bool decode_shape =
                  dtype == DType::bf16 &&
                  ((k == 576 && (n == 576 || n == 3072)) || (k == 1536 && n == 576 && cols <= 2));
              if (decode_shape) {
                EXPECT_TRUE(took_row) << "a decode shape took gemv_kernel";
              }
              if (k == 1544) {
                EXPECT_FALSE(took_row) << "k = 1544 is over the one-batch limit";
              }
            }
      }
}

// The multi-row decode kernel (gemv_kernel.cuh's norm_rows_kernel: 2-8 rows of a 16-bit product of
// k <= 768 with the register rms_norm, or at 2-4 rows with no prologue and an f32 residual or none,
// y in x's dtype, one resident wave; rms_norm with a residual stays on gemv_kernel) against the CPU
// composition and against gemv_kernel (the same launch with max_ctas set): both prologues (about
// half the cases each), bf16 and f16, 2, 3, 4, 5 and 8 rows, k = 64, 256 (one slot a lane), 576,
// 768 (the largest) and 776 (gemv_kernel), n = 1, 17, 1030 and 3072 (column groups ending after 1,
// 1, 2 and 4 columns), w_constant on and off, y rows at a column stride of 2 in a NaN-poisoned
// buffer (gaps and row ends must stay NaN). Not bitwise gemv_kernel (it orders the fp32 sums
// otherwise): both within the prologue ops' tolerance of the CPU. The launch counters
// (LaunchStats::norm_rows, plain_rows) say which kernel ran.
TEST(CudaGemv, NormRowsKernelAgreesWithTheCpuAndTheGeneralKernel) {
  SKIP_WITHOUT_GPU();
  Rng rng(59);
  constexpr float kEpsNorm = 1e-5f;
  int on_norm_rows = 0;
  for (DType dtype : {DType::bf16, DType::f16})
    for (std::int64_t k : {64, 256, 576, 768, 776})
      for (std::int64_t n : {1, 17, 1030, 3072})
        for (std::int64_t m : {2, 3, 4, 5, 8}) {
          SCOPED_TRACE(label(dtype, m, n, k, "norm rows"));
          // The prologue: none (plain) or rms_norm; the residual epilogue on most plain cases and
          // at k = 64 with rms_norm (which norm_rows_kernel leaves to gemv_kernel). One batch of
          // loads: up to 3 slots; a plain product at 2-4 rows only.
          const bool plain = (k + n + m) % 2 == 1, has_c = n != 1030 && (plain || k == 64);
          const bool fits = k <= 768 && !(plain && m > 4) && (plain || !has_c);
          Tolerance tol = default_tolerance(dtype);
          tol.atol *= 4;
          const Tensor x = contiguous_poisoned(rng, {m, k}, dtype);  // [m, k]
          const Tensor w =
              testing::random_tensor(rng, {n, k}, dtype, 1.0 / std::sqrt(static_cast<double>(k)));
          const Tensor norm = testing::random_tensor(rng, {k}, dtype, 0.3, 1.0);  // [k]
          const Tensor c = contiguous_poisoned(rng, {m, n}, DType::f32);          // [m, n] residual
          // The product in fp32 where the residual is added (one rounding), else in dtype.
          Tensor product = Tensor::empty({m, n}, has_c ? DType::f32 : dtype);  // [m, n]
          if (plain) {
            cpu::matmul(x, w, product, true);
          } else {
            cpu::rms_norm_matmul(x, norm, kEpsNorm, w, product);
          }
          Tensor expected = product;  // [m, n] in dtype
          if (has_c) {
            expected = Tensor::empty({m, n}, dtype);
            cpu::binary(cpu::BinaryKind::add, product, c, expected);
          }
          const Tensor dx = upload(x), dw = upload(w), dnorm = upload(norm), dc = upload(c);
          const std::int64_t row_stride = 2 * n + 3;  // y [m, n] at strides (2 n + 3, 2)
          const std::int64_t size = static_cast<std::int64_t>(dtype_size(dtype));
          for (bool general : {false, true}) {
            Tensor dy = upload(nan_output({m, row_stride}, dtype));  // [m, 2 n + 3] buffer
            cuda::gemv::Params p = direct_params(dx, dw, dtype);
            p.y_col_stride = 2;
            p.w_constant = n != 17;
            p.max_ctas = general ? 1 << 20 : 0;
            p.prologue = plain ? cuda::gemv::Prologue::none : cuda::gemv::Prologue::rms_norm;
            p.norm_weight = dnorm.raw_data();
            p.norm_weight_dtype = dtype;
            p.eps = kEpsNorm;
            p.has_c = has_c;
            p.c_dtype = DType::f32;
            for (std::int64_t r = 0; r < m; ++r) {
              p.y[r] = static_cast<char*>(dy.raw_data()) + r * row_stride * size;
              p.c[r] = static_cast<const float*>(dc.raw_data()) + r * n;
            }
            const auto routed = [plain] {
              const cuda::gemv::LaunchStats st = cuda::gemv::launch_stats();
              return plain ? st.plain_rows : st.norm_rows;
            };
            const std::uint64_t before = routed();
            cuda::gemv::launch(p, cuda::current_stream());
            const bool took = routed() > before;
            EXPECT_EQ(took, !general && fits) << (general ? "max_ctas" : "launcher's grid");
            on_norm_rows += took;
            const Tensor buffer = download(dy);
            const Tensor got =
                Tensor::view_of(buffer.storage(), 0, {m, n}, {row_stride, 2}, dtype);  // [m, n]
            EXPECT_TRUE(testing::close(got, expected, tol)) << (took ? "norm_rows" : "general");
            EXPECT_EQ(testing::touched_padding(got), 0) << "a store outside y's elements";
          }
        }
  EXPECT_EQ(on_norm_rows,
            114);  // of 200: rms_norm (no residual) at 2-8 rows, plain at 2-4, within k
}

}  // namespace
}  // namespace splice
