// cuda::rms_norm_matmul_swiglu (Op::RmsNormMatMulSwiglu's CUDA launcher: the register-prologue
// gate|up GEMV with the SwiGLU epilogue, gemv_kernel.cuh's swiglu_pairs_kernel, or the two-kernel
// chain) against the two CUDA kernels it replaces (cuda::rms_norm_matmul into a [.., 2I] row, then
// cuda::silu_mul of its halves) and against the CPU op.
//
//  1. Kernel grid: (K, I) = SmolLM2's (576, 1536) and (64, 17), (64, 192), (576, 17), (576, 192),
//     (1536, 192), (1536, 1536), (768, 4096) x bf16 / f16 x w_constant off / on: out bit for bit
//     the two kernels, and the fused kernel launched exactly where gemv::swiglu_supported says
//     (SmolLM2's shape always); within the arm generator's tolerance (the bf16 / f16 policy with a
//     4x atol) of the CPU op.
//  2. The fallback (five rows of K = 832, past norm_rows_kernel's 768; f32; K not in whole
//     16-byte vectors): the two kernels, bitwise.
//  2b. 2-8 rows (norm_rows_kernel): the default model's (256, 512), SmolLM2's (576, 1536) (at 5-8
//     rows past the routing rule's 2^20 weight elements: the fused launch still takes it), odd I
//     and K = 768 at 2, 3, 4, 5 and 8 rows, x rows in a padded
//     buffer (strided rows), out rows NaN-poisoned first: one fused launch, every element
//     written, within the tolerance of the CPU op and of the two kernels (not bitwise: the
//     chain's GEMV sums with other columns per warp).
//  3. A captured CUDA graph of the fused launch, replayed with new x: bit for bit the eager
//     two-kernel chain each time.
//  4. Errors: typed, before any launch (odd weight rows, a host tensor, a wrong out shape).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "../../src/backend/cuda/gemv.h"  // internal: launch counters, swiglu_supported
#include "splice/backend/cpu/layer_ops.h"
#include "splice/backend/cuda/layer_ops.h"
#include "splice/backend/cuda/runtime.h"
#include "splice/core/error.h"
#include "splice/core/random.h"
#include "splice/ops/layer_ops.h"
#include "support/cuda_test_util.h"
#include "support/test_util.h"

namespace splice {
namespace {

constexpr float kEps = 1e-5f;

// The arm generator's policy for this op (generators.cc MatMulAddGenerator): 4x the default atol.
Tolerance swiglu_tolerance(DType dtype) {
  Tolerance t = default_tolerance(dtype);
  if (dtype == DType::bf16 || dtype == DType::f16) t.atol *= 4.0;
  return t;
}

struct Operands {
  Tensor x, norm_weight, w;  // host: x [M, 1, K], norm_weight [K], w [2I, K]
};

// x ~ N(0, 1), norm_weight ~ 1 + N(0, 0.1), w ~ N(0, 1 / K): gate and up sums of order 1.
Operands make_operands(std::int64_t rows, std::int64_t k, std::int64_t inter, DType dtype,
                       Rng& rng) {
  Operands o;
  o.x = testing::random_tensor(rng, {rows, 1, k}, dtype);
  o.norm_weight = testing::random_tensor(rng, {k}, dtype, 0.1, 1.0);
  o.w = testing::random_tensor(rng, {2 * inter, k}, dtype, 1.0 / std::sqrt(static_cast<double>(k)));
  return o;
}

// The two CUDA kernels: rms_norm_matmul into y [M, 1, 2I] of `dtype`, then silu_mul of its
// halves into out [M, 1, I].
void two_kernels(const Tensor& x, const Tensor& nw, const Tensor& w, Tensor& out, bool w_constant) {
  const std::int64_t inter = w.size(0) / 2;
  Tensor y = Tensor::empty({x.size(0), 1, 2 * inter}, out.dtype(), Device::cuda());
  cuda::rms_norm_matmul(x, nw, kEps, w, y, w_constant);
  cuda::silu_mul(y.slice(2, 0, inter), y.slice(2, inter, 2 * inter), out);
}

// Whether the launcher takes the fused kernel for these device operands (its own rule).
bool fused_applies(const Tensor& x, const Tensor& nw, const Tensor& w, DType out_dtype) {
  if (x.size(0) * x.size(1) != 1 || x.dtype() != w.dtype() || out_dtype != w.dtype() ||
      !cuda::prologue_gemv_applies(x, w))
    return false;
  cuda::gemv::Params q;
  q.w = w.raw_data();
  q.w_row_stride = w.stride(0);
  q.n = w.size(0);
  q.k = w.size(1);
  q.rows = 1;
  q.x[0] = x.raw_data();
  q.in_dtype = w.dtype();
  q.out_dtype = out_dtype;
  q.prologue = cuda::gemv::Prologue::rms_norm;
  q.norm_weight = nw.raw_data();
  q.norm_weight_stride = nw.stride(0);
  q.norm_weight_dtype = nw.dtype();
  return cuda::gemv::swiglu_supported(q);
}

void check_kernel(std::int64_t k, std::int64_t inter, DType dtype, bool w_constant, Rng& rng) {
  SCOPED_TRACE(std::string(dtype_name(dtype)) + " K " + std::to_string(k) + " I " +
               std::to_string(inter) + (w_constant ? " w_constant" : ""));
  const Operands o = make_operands(1, k, inter, dtype, rng);
  const Tensor x = testing::upload(o.x), nw = testing::upload(o.norm_weight),
               w = testing::upload(o.w);
  Tensor two = Tensor::empty({1, 1, inter}, dtype, Device::cuda());
  two_kernels(x, nw, w, two, w_constant);
  Tensor one = Tensor::empty({1, 1, inter}, dtype, Device::cuda());
  const bool fused = fused_applies(x, nw, w, dtype);
  if (k == 576 && inter == 1536) {
    EXPECT_TRUE(fused) << "SmolLM2's MLP takes the fused kernel";
  }
  const std::uint64_t launches_before = cuda::gemv::swiglu_launches();
  const cuda::gemv::LaunchStats stats_before = cuda::gemv::launch_stats();
  cuda::rms_norm_matmul_swiglu(x, nw, kEps, w, one, w_constant);
  const cuda::gemv::LaunchStats stats_after = cuda::gemv::launch_stats();
  EXPECT_EQ(cuda::gemv::swiglu_launches() - launches_before, fused ? 1u : 0u);
  if (fused) {  // counted as a decode-row GEMV with a prologue, as row_kernel counts itself
    EXPECT_EQ(stats_after.row - stats_before.row, 1u);
    EXPECT_EQ(stats_after.prologue - stats_before.prologue, 1u);
    EXPECT_EQ(stats_after.prefetch - stats_before.prefetch, w_constant ? 1u : 0u);
  }
  const Tensor got = testing::download(one), want = testing::download(two);
  EXPECT_TRUE(testing::bit_equal(got, want))
      << compare_tensors(got, want, Tolerance{0.0, 0.0}).str();
  // The CPU op: the CPU GEMV sums in another order.
  Tensor cpu_out = Tensor::empty({1, 1, inter}, dtype);
  cpu::rms_norm_matmul_swiglu(o.x, o.norm_weight, kEps, o.w, cpu_out);
  EXPECT_TRUE(testing::close(got, cpu_out, swiglu_tolerance(dtype)))
      << compare_tensors(got, cpu_out, swiglu_tolerance(dtype)).str();
}

TEST(SwigluCuda, FusedKernelMatchesTheTwoKernelsBitwise) {
  SKIP_WITHOUT_GPU();
  Rng rng(81);
  const std::pair<std::int64_t, std::int64_t> shapes[] = {{576, 1536},  {64, 17},   {64, 192},
                                                          {576, 17},    {576, 192}, {1536, 192},
                                                          {1536, 1536}, {768, 4096}};
  for (DType dtype : {DType::bf16, DType::f16})
    for (const auto& [k, inter] : shapes)
      for (bool w_constant : {false, true}) check_kernel(k, inter, dtype, w_constant, rng);
}

TEST(SwigluCuda, FallbackIsTheTwoKernels) {
  SKIP_WITHOUT_GPU();
  Rng rng(82);
  struct Case {
    std::int64_t rows, k, inter;
    DType dtype;
  };
  // Five rows of K = 832 (past norm_rows_kernel's 768); f32; K = 100 (not whole 16-byte vectors
  // of bf16).
  for (const Case& c : {Case{5, 832, 192, DType::bf16}, Case{1, 576, 192, DType::f32},
                        Case{1, 100, 96, DType::bf16}}) {
    SCOPED_TRACE(std::string(dtype_name(c.dtype)) + " rows " + std::to_string(c.rows) + " K " +
                 std::to_string(c.k));
    const Operands o = make_operands(c.rows, c.k, c.inter, c.dtype, rng);
    const Tensor x = testing::upload(o.x), nw = testing::upload(o.norm_weight),
                 w = testing::upload(o.w);
    EXPECT_FALSE(fused_applies(x, nw, w, c.dtype));
    Tensor two = Tensor::empty({c.rows, 1, c.inter}, c.dtype, Device::cuda());
    two_kernels(x, nw, w, two, false);
    Tensor one = Tensor::empty({c.rows, 1, c.inter}, c.dtype, Device::cuda());
    const std::uint64_t before = cuda::gemv::swiglu_launches();
    fused_rms_norm_matmul_swiglu(x, nw, kEps, w, one);
    EXPECT_EQ(cuda::gemv::swiglu_launches(), before);
    EXPECT_TRUE(testing::bit_equal(testing::download(one), testing::download(two)));
    Tensor cpu_out = Tensor::empty({c.rows, 1, c.inter}, c.dtype);
    cpu::rms_norm_matmul_swiglu(o.x, o.norm_weight, kEps, o.w, cpu_out);
    EXPECT_TRUE(testing::close(testing::download(one), cpu_out, swiglu_tolerance(c.dtype)));
  }
}

TEST(SwigluCuda, FusedKernelAtTwoToEightRows) {
  SKIP_WITHOUT_GPU();
  Rng rng(85);
  const std::pair<std::int64_t, std::int64_t> shapes[] = {
      {256, 512}, {576, 1536}, {64, 17}, {768, 192}};
  int fused_cases = 0;
  for (DType dtype : {DType::bf16, DType::f16})
    for (const auto& [k, inter] : shapes)
      for (const std::int64_t rows : {2, 3, 4, 5, 8}) {
        const bool w_constant = (fused_cases % 2) == 0;
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " K " + std::to_string(k) + " I " +
                     std::to_string(inter) + " rows " + std::to_string(rows));
        const Operands o = make_operands(rows, k, inter, dtype, rng);
        // x [rows, 1, K] with 16 bytes of NaN after every row: strided rows, each 16-byte aligned.
        Tensor xh = testing::padded_tensor({rows, 1, k}, dtype,
                                           16 / static_cast<std::int64_t>(dtype_size(dtype)));
        rng.normal(xh, 0.0, 1.0);
        const Tensor x = testing::upload(xh), nw = testing::upload(o.norm_weight),
                     w = testing::upload(o.w);
        Tensor want = Tensor::empty({rows, 1, inter}, dtype, Device::cuda());
        two_kernels(x, nw, w, want, false);
        Tensor got = testing::upload(testing::host({rows, 1, inter}, dtype,
                                                   testing::Layout::contiguous));  // NaN
        const std::uint64_t before = cuda::gemv::swiglu_launches();
        cuda::rms_norm_matmul_swiglu(x, nw, kEps, w, got, w_constant);
        EXPECT_EQ(cuda::gemv::swiglu_launches() - before, 1u) << "one fused launch";
        ++fused_cases;
        Tensor cpu_out = Tensor::empty({rows, 1, inter}, dtype);
        cpu::rms_norm_matmul_swiglu(xh.clone(), o.norm_weight, kEps, o.w, cpu_out);
        const Tensor host_got = testing::download(got);
        EXPECT_TRUE(testing::close(host_got, cpu_out, swiglu_tolerance(dtype)))
            << compare_tensors(host_got, cpu_out, swiglu_tolerance(dtype)).str();
        EXPECT_TRUE(testing::close(host_got, testing::download(want), swiglu_tolerance(dtype)))
            << "against the two kernels";
      }
  EXPECT_EQ(fused_cases, 40);  // dtypes x 4 shapes x 5 row counts
}

TEST(SwigluCuda, CapturedGraphReplaysBitwise) {
  SKIP_WITHOUT_GPU();
  constexpr std::int64_t kHidden = 576, kInter = 1536;  // SmolLM2-135M's MLP
  Rng rng(83);
  const Operands o = make_operands(1, kHidden, kInter, DType::bf16, rng);
  Tensor x = testing::upload(o.x);
  const Tensor nw = testing::upload(o.norm_weight), w = testing::upload(o.w);
  Tensor out = Tensor::empty({1, 1, kInter}, DType::bf16, Device::cuda());
  const cuda::Stream stream = cuda::create_stream();
  cuda::GraphExec graph = nullptr;
  {
    cuda::StreamGuard guard(stream);
    const std::uint64_t before = cuda::gemv::swiglu_launches();
    cuda::begin_capture(stream);
    cuda::rms_norm_matmul_swiglu(x, nw, kEps, w, out, /*w_constant=*/true);
    graph = cuda::end_capture(stream);
    EXPECT_EQ(cuda::gemv::swiglu_launches() - before, 1u);
  }
  for (int replay = 0; replay < 3; ++replay) {
    const Tensor hx = testing::random_tensor(rng, {1, 1, kHidden}, DType::bf16);
    cuda::copy_async(x.raw_data(), hx.raw_data(), hx.numel() * sizeof(std::uint16_t), stream);
    cuda::launch_graph(graph, stream);
    cuda::stream_synchronize(stream);
    Tensor want = Tensor::empty({1, 1, kInter}, DType::bf16, Device::cuda());
    two_kernels(x, nw, w, want, false);
    EXPECT_TRUE(testing::bit_equal(testing::download(out), testing::download(want)))
        << "replay " << replay;
  }
  cuda::destroy_graph(graph);
  cuda::destroy_stream(stream);
}

TEST(SwigluCuda, BadInputsRaiseTypedErrors) {
  SKIP_WITHOUT_GPU();
  Rng rng(84);
  const Operands o = make_operands(1, 64, 17, DType::bf16, rng);
  const Tensor x = testing::upload(o.x), nw = testing::upload(o.norm_weight),
               w = testing::upload(o.w);
  Tensor out = Tensor::empty({1, 1, 17}, DType::bf16, Device::cuda());
  EXPECT_THROW(cuda::rms_norm_matmul_swiglu(x, nw, kEps, w.slice(0, 0, 33), out), ShapeError);
  EXPECT_THROW(cuda::rms_norm_matmul_swiglu(o.x, nw, kEps, w, out), DeviceError);
  Tensor wide = Tensor::empty({1, 1, 34}, DType::bf16, Device::cuda());
  EXPECT_THROW(cuda::rms_norm_matmul_swiglu(x, nw, kEps, w, wide), ShapeError);
  EXPECT_THROW(cuda::rms_norm_matmul_swiglu(x, nw, -1.0f, w, out), ValueError);
}

}  // namespace
}  // namespace splice
