// The two prologue products on CUDA (cuda::rms_norm_matmul, cuda::silu_mul_matmul_add: the GEMV
// with its rms_norm / silu_mul prologue, gemv.h, or the two-kernel fallback) against the CPU
// kernels (the oracle). Skips itself without a CUDA device.
//
//  1. Grid (the GEMV route): K in {64, 97 (odd: scalar tails), 576, 1536, 2048 (the route's
//     largest K, kPrologueGemvMaxK)} x
//     N in {17, 96, 577, 960} (odd and even; 577 leaves a partial column group) x M = 1 .. 8 rows
//     x bf16 / f16 / f32 x x layouts contiguous, padded (NaN gaps between rows: a stray read
//     shows up as NaN) and
//     offset (rows start one element past a 16-byte boundary: the prologue's scalar path). Every
//     case first asserts which route it takes (prologue_gemv_applies and the GEMV's prologue
//     launch counter), so a routing change cannot silently turn the test into a fallback test;
//     at 2-4 rows both of the GEMV's stage 0s run (registers and shared memory: the register
//     counter), the register one on both its kernels (norm_rows_kernel for a 16-bit out,
//     gemv_kernel); at 5-8 rows rms_norm_matmul takes one launch only on norm_rows_kernel, else
//     the chain (kRmsNormPrologueMaxRows), and both run.
//     Outputs start as NaN in a padded buffer: a missed store or a write outside the view fails.
//     Tolerance: the contract's default for out's dtype with the atol widened 4x in 16-bit (the
//     tuner's tolerance for these ops): the fused normalization sums x^2 in another order than
//     the CPU, and silu uses expf, so an element of the rounded prologue row may sit one ulp
//     apart, and the product differs by the fp32 summation order.
//  2. silu_mul_matmul_add with a, b the two halves of one [M, 2K] gate|up buffer (views, as the
//     builders produce them), c in the operands' dtype or f32, c = out (in place, h += ...).
//  3. The fallback route: M = 9 and 16 rows (beyond the GEMV's rows) and a K beyond the
//     prologue's shared memory (gemv::prologue_fits false) agree with the CPU too, and launch no
//     prologue GEMV.
//  4. gemv::launch refuses a prologue that does not fit (UnsupportedError) and prologue_fits
//     states the documented limit.
//  5. A PDL chain: 24 layers of gate|up = rms_norm_matmul(h), h = silu_mul_matmul_add(gate, up,
//     W_down, h) (every prologue reads what the kernel right before it wrote; h is updated in
//     place) gives the same bits eagerly with PDL off on the legacy stream (the reference), with
//     PDL on and the constant-weight promise on a created stream, and in captured graphs (PDL on
//     and off, promise on and off) replayed from restored buffers; it agrees with the CPU chain
//     within a sanity bound; the counters show every launch was a prologue GEMV with the PDL
//     attribute and the prefetch exactly when promised.
//  6. A session over a two-layer MLP graph optimized on the device: both fused arms are offered,
//     verified against arm 0 on the GPU and chosen (time override), and the captured session's
//     output agrees with the CPU session's over several steps.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "../../src/backend/cuda/gemv.h"  // internal: launch counters and the shared-memory limit
#include "splice/backend/cpu/layer_ops.h"
#include "splice/backend/cuda/layer_ops.h"
#include "splice/backend/cuda/runtime.h"
#include "splice/core/error.h"
#include "splice/core/random.h"
#include "splice/exec/session.h"
#include "splice/model/model.h"
#include "splice/ops/layer_ops.h"
#include "splice/tune/optimize.h"
#include "support/cuda_test_util.h"
#include "support/test_util.h"

namespace splice {
namespace {

using testing::download_view;
using testing::PdlScope;
using testing::upload;

constexpr float kEps = 1e-5f;
const DType kDtypes[] = {DType::bf16, DType::f16, DType::f32};
const std::int64_t kKGrid[] = {64, 97, 576, 1536, cuda::kPrologueGemvMaxK};
const std::int64_t kNGrid[] = {17, 96, 577, 960};

using testing::host;  // support/cuda_test_util.h: NaN-poisoned layouts
using testing::kLayouts;
using testing::Layout;
using testing::layout_name;
using testing::normal;
using testing::touched_padding;

// The tuner's tolerance for these ops (generators.cc): default, atol x4 in 16-bit.
Tolerance product_tolerance(DType dtype) {
  Tolerance t = default_tolerance(dtype);
  if (dtype != DType::f32) t.atol *= 4;
  return t;
}

// Compares a device output (a padded view) with the CPU's, within product_tolerance of the
// coarser of out's dtype and the activation dtype `inputs` (an f32 output of 16-bit inputs still
// carries the 16-bit rounding of the prologue row: one element of it rounding one ulp apart on
// the two backends moves the f32 output by ~1e-4, beyond the f32 policy's atol).
::testing::AssertionResult agrees(const Tensor& device_out, const Tensor& expected, DType inputs) {
  const Tensor actual = download_view(device_out);
  if (const std::int64_t t = touched_padding(actual))
    return ::testing::AssertionFailure() << t << " padding elements were written";
  const DType coarser = expected.dtype() == DType::f32 ? inputs : expected.dtype();
  return testing::close(actual, expected, product_tolerance(coarser));
}

std::uint64_t prologue_launches() { return cuda::gemv::launch_stats().prologue; }

// ---- 1. rms_norm_matmul on the GEMV route ------------------------------------------------------

TEST(PrologueOpsCuda, RmsNormMatMulMatchesCpu) {
  SKIP_WITHOUT_GPU();
  Rng rng(31);
  int cases = 0;
  std::uint64_t multi_row_in_registers = 0;   // 2-4 row cases whose stage 0 ran in registers
  std::uint64_t on_norm_rows = 0;             // of which on norm_rows_kernel (16-bit out, k <= 768)
  int wide_on_norm_rows = 0, wide_chain = 0;  // 5-8 row cases: norm_rows_kernel, the chain
  for (DType dtype : kDtypes)
    for (std::int64_t k : kKGrid)
      for (std::int64_t n : kNGrid)
        for (std::int64_t m = 1; m <= cuda::gemv::kMaxRows; ++m) {
          // Rows 2 .. 8 take the GEMV only for small weights (gemv::preferred): those cases are
          // covered by the fallback test; here every case is a prologue GEMV.
          if (!cuda::gemv::preferred(m, n, k)) continue;
          const Layout layout = kLayouts[cases % 3];
          SCOPED_TRACE(std::string(dtype_name(dtype)) + " k " + std::to_string(k) + " n " +
                       std::to_string(n) + " m " + std::to_string(m) + " " + layout_name(layout));
          const Tensor x = normal(rng, {m, k}, dtype, layout);
          // The norm weight: usually x's dtype and contiguous (read as chunks of T), every 5th
          // case in f32 and every 7th a stride-2 view (both the per-element path, norm_direct
          // false in gemv.cu).
          const DType norm_dtype = cases % 5 == 4 ? DType::f32 : dtype;
          Tensor norm = testing::random_tensor(rng, {k}, norm_dtype, 0.3, 1.0);
          if (cases % 7 == 6) {
            const Tensor spread = testing::random_tensor(rng, {k, 2}, norm_dtype, 0.3, 1.0);
            norm = Tensor::view_of(spread.storage(), spread.offset(), {k}, {2}, norm_dtype);
          }
          const Tensor w =
              testing::random_tensor(rng, {n, k}, dtype, 1.0 / std::sqrt(static_cast<double>(k)));
          const DType out_dtype = cases % 4 == 3 ? DType::f32 : dtype;
          Tensor expected = Tensor::empty({m, n}, out_dtype);
          cpu::rms_norm_matmul(x, norm, kEps, w, expected);
          const Tensor dx = upload(x), dnorm = upload(norm), dw = upload(w);
          Tensor dout = upload(host({m, n}, out_dtype, Layout::padded));
          ASSERT_TRUE(cuda::prologue_gemv_applies(dx, dw));
          const std::uint64_t before = prologue_launches();
          const std::uint64_t registers_before = cuda::gemv::launch_stats().register_prologue;
          const std::uint64_t norm_rows_before = cuda::gemv::launch_stats().norm_rows;
          cuda::rms_norm_matmul(dx, dnorm, kEps, dw, dout, /*w_constant=*/cases % 2 == 0);
          const std::uint64_t norm_rows = cuda::gemv::launch_stats().norm_rows - norm_rows_before;
          // 1-4 rows: one prologue GEMV launch; 5-8 rows: one on norm_rows_kernel (16-bit out, k
          // <= 768 in aligned vectors), else rms_norm then the plain GEMV.
          const bool one_launch = m <= cuda::kRmsNormPrologueMaxRows || norm_rows == 1;
          EXPECT_EQ(prologue_launches() - before, one_launch ? 1u : 0u)
              << (one_launch ? "one prologue GEMV launch" : "the chain: no prologue GEMV");
          if (m > cuda::kRmsNormPrologueMaxRows) {
            (norm_rows == 1 ? wide_on_norm_rows : wide_chain) += 1;
          } else if (m > 1) {
            on_norm_rows += norm_rows;
            multi_row_in_registers +=
                cuda::gemv::launch_stats().register_prologue - registers_before;
          }
          EXPECT_TRUE(agrees(dout, expected, dtype))
              << "out " << dtype_name(out_dtype) << ", norm weight " << dtype_name(norm_dtype)
              << (cases % 7 == 6 ? " (stride 2)" : "");
          ++cases;
        }
  EXPECT_GT(cases, 150);
  // Both stage 0s at 2-4 rows: registers (k = 64 and 576 in whole aligned vectors) and shared
  // memory (k = 97, misaligned layouts, a strided or f32 norm weight, k = 1536).
  EXPECT_GT(multi_row_in_registers, 10u);
  EXPECT_LT(multi_row_in_registers, static_cast<std::uint64_t>(cases) / 2);
  // Both kernels of the register stage 0 at 2-4 rows: norm_rows_kernel (16-bit out) and
  // gemv_kernel (f32, or an f32 out).
  EXPECT_GT(on_norm_rows, 5u);
  EXPECT_LT(on_norm_rows, multi_row_in_registers);
  // Both routes at 5-8 rows: norm_rows_kernel (k = 64, 576) and the chain (k = 97, 1536, 2048,
  // f32, misaligned).
  EXPECT_GT(wide_on_norm_rows, 5);
  EXPECT_GT(wide_chain, 5);
}

// ---- 2. silu_mul_matmul_add on the GEMV route ---------------------------------------------------

TEST(PrologueOpsCuda, SiluMulMatMulAddMatchesCpu) {
  SKIP_WITHOUT_GPU();
  Rng rng(32);
  int cases = 0;
  for (DType dtype : kDtypes)
    for (std::int64_t k : kKGrid)
      for (std::int64_t n : kNGrid)
        for (std::int64_t m = 1; m <= cuda::gemv::kMaxRows; ++m) {
          if (!cuda::gemv::preferred(m, n, k)) continue;
          const Layout layout = kLayouts[cases % 3];
          SCOPED_TRACE(std::string(dtype_name(dtype)) + " k " + std::to_string(k) + " n " +
                       std::to_string(n) + " m " + std::to_string(m) + " " + layout_name(layout));
          // a, b: the gate and up halves of one [m, 2k] gate|up output (views).
          const Tensor gate_up = normal(rng, {m, 2 * k}, dtype, layout);
          const Tensor a = gate_up.slice(1, 0, k), b = gate_up.slice(1, k, 2 * k);
          const Tensor w =
              testing::random_tensor(rng, {n, k}, dtype, 1.0 / std::sqrt(static_cast<double>(k)));
          const DType c_dtype = cases % 4 == 1 ? DType::f32 : dtype;
          const Tensor c = normal(rng, {m, n}, c_dtype, Layout::padded);
          const bool in_place = c_dtype == dtype && cases % 2 == 0;  // out = c: h += ...
          Tensor expected = Tensor::empty({m, n}, dtype);
          cpu::silu_mul_matmul_add(a, b, w, c, expected);
          const Tensor dgu = upload(gate_up), dw = upload(w);
          const Tensor da = dgu.slice(1, 0, k), db = dgu.slice(1, k, 2 * k);
          Tensor dc = upload(c);
          Tensor dout = in_place ? dc : upload(host({m, n}, dtype, Layout::padded));
          ASSERT_TRUE(cuda::prologue_gemv_applies(da, dw));
          const std::uint64_t before = prologue_launches();
          cuda::silu_mul_matmul_add(da, db, dw, dc, dout, /*w_constant=*/cases % 3 == 0);
          EXPECT_EQ(prologue_launches() - before, 1u) << "one prologue GEMV launch";
          EXPECT_TRUE(agrees(dout, expected, dtype))
              << "c " << dtype_name(c_dtype) << (in_place ? ", in place" : "");
          ++cases;
        }
  EXPECT_GT(cases, 150);
}

// ---- 3. the fallback route ---------------------------------------------------------------------

TEST(PrologueOpsCuda, FallbackRouteMatchesCpu) {
  SKIP_WITHOUT_GPU();
  Rng rng(33);
  const DType dtype = DType::bf16;
  struct Case {
    std::int64_t m, n, k;
  };
  // 9 and 16 rows: beyond the GEMV; 8 rows of a 3072 x 576 weight and 4 rows of a 4096 x 576
  // one: gemv::preferred says cuBLASLt; one row of k = 4104: beyond kPrologueGemvMaxK; one row of
  // k = 32776: also beyond the prologue's shared memory (bf16: 32768 at one row).
  const Case cases[] = {{9, 96, 576},   {16, 577, 1536}, {8, 3072, 576},
                        {4, 4096, 576}, {1, 960, 4104},  {1, 17, 32776}};
  for (const Case& c : cases) {
    SCOPED_TRACE("m " + std::to_string(c.m) + " n " + std::to_string(c.n) + " k " +
                 std::to_string(c.k));
    const Tensor gate_up = normal(rng, {c.m, 2 * c.k}, dtype, Layout::padded);
    const Tensor x = gate_up.slice(1, 0, c.k), b = gate_up.slice(1, c.k, 2 * c.k);
    const Tensor norm = testing::random_tensor(rng, {c.k}, dtype, 0.3, 1.0);
    const Tensor w =
        testing::random_tensor(rng, {c.n, c.k}, dtype, 1.0 / std::sqrt(static_cast<double>(c.k)));
    const Tensor res = normal(rng, {c.m, c.n}, dtype, Layout::padded);
    Tensor want_norm = Tensor::empty({c.m, c.n}, dtype), want_silu = want_norm.clone();
    cpu::rms_norm_matmul(x, norm, kEps, w, want_norm);
    cpu::silu_mul_matmul_add(x, b, w, res, want_silu);
    const Tensor dgu = upload(gate_up), dnorm = upload(norm), dw = upload(w), dres = upload(res);
    const Tensor dx = dgu.slice(1, 0, c.k), db = dgu.slice(1, c.k, 2 * c.k);
    EXPECT_FALSE(cuda::prologue_gemv_applies(dx, dw));
    Tensor out_norm = upload(host({c.m, c.n}, dtype, Layout::padded));
    Tensor out_silu = upload(host({c.m, c.n}, dtype, Layout::padded));
    const std::uint64_t before = prologue_launches();
    cuda::rms_norm_matmul(dx, dnorm, kEps, dw, out_norm, true);
    cuda::silu_mul_matmul_add(dx, db, dw, dres, out_silu, true);
    EXPECT_EQ(prologue_launches(), before) << "no prologue GEMV on the fallback route";
    EXPECT_TRUE(agrees(out_norm, want_norm, dtype)) << "rms_norm_matmul";
    EXPECT_TRUE(agrees(out_silu, want_silu, dtype)) << "silu_mul_matmul_add";
  }
}

// ---- 4. the shared-memory limit ----------------------------------------------------------------

TEST(PrologueOpsCuda, PrologueLimitIsDocumentedAndEnforced) {
  SKIP_WITHOUT_GPU();
  // (rows * sizeof(T) + 4) * k_pad <= 192 KiB (gemv.h).
  EXPECT_TRUE(cuda::gemv::prologue_fits(1, 32768, DType::bf16));
  EXPECT_FALSE(cuda::gemv::prologue_fits(1, 32776, DType::bf16));
  EXPECT_TRUE(cuda::gemv::prologue_fits(4, 16384, DType::bf16));
  EXPECT_TRUE(cuda::gemv::prologue_fits(8, 9824, DType::bf16));
  EXPECT_FALSE(cuda::gemv::prologue_fits(8, 9832, DType::bf16));
  EXPECT_TRUE(cuda::gemv::prologue_fits(8, 5460, DType::f32));
  EXPECT_FALSE(cuda::gemv::prologue_fits(8, 5464, DType::f32));
  EXPECT_FALSE(cuda::gemv::prologue_fits(9, 64, DType::bf16));
  Rng rng(34);
  const Tensor x = upload(testing::random_tensor(rng, {8, 9832}, DType::bf16));
  const Tensor w = upload(testing::random_tensor(rng, {4, 9832}, DType::bf16));
  Tensor y = upload(Tensor::empty({8, 4}, DType::bf16));
  cuda::gemv::Params p;
  p.w = w.raw_data();
  p.w_row_stride = 9832;
  p.n = 4;
  p.k = 9832;
  p.rows = 8;
  p.in_dtype = p.out_dtype = DType::bf16;
  for (int r = 0; r < 8; ++r) {
    p.x[r] = static_cast<const char*>(x.raw_data()) + r * 9832 * 2;
    p.b[r] = p.x[r];
    p.y[r] = static_cast<char*>(y.raw_data()) + r * 4 * 2;
  }
  p.prologue = cuda::gemv::Prologue::silu_mul;
  EXPECT_THROW(cuda::gemv::launch(p, cuda::current_stream()), UnsupportedError);
}

// ---- 5. the PDL chain --------------------------------------------------------------------------

constexpr std::int64_t kChainHidden = 576, kChainInter = 1536;  // SmolLM2's MLP
constexpr int kChainLayers = 24, kChainReplays = 3;

struct MlpChain {
  Tensor h;                                     // [1, H]
  Tensor gate_up;                               // [1, 2I]
  std::vector<Tensor> norm, w_gate_up, w_down;  // [H], [2I, H], [H, I] per layer
  std::vector<Tensor*> buffers() { return {&h, &gate_up}; }
};

MlpChain make_chain(Rng& rng) {
  MlpChain c;
  c.h = testing::random_tensor(rng, {1, kChainHidden}, DType::bf16);
  c.gate_up = testing::random_tensor(rng, {1, 2 * kChainInter}, DType::bf16);
  for (int l = 0; l < kChainLayers; ++l) {
    c.norm.push_back(testing::random_tensor(rng, {kChainHidden}, DType::bf16, 0.1, 1.0));
    c.w_gate_up.push_back(testing::random_tensor(rng, {2 * kChainInter, kChainHidden}, DType::bf16,
                                                 1.0 / std::sqrt(576.0)));
    c.w_down.push_back(testing::random_tensor(rng, {kChainHidden, kChainInter}, DType::bf16,
                                              0.5 / std::sqrt(1536.0)));
  }
  return c;
}

MlpChain copy_chain(const MlpChain& from, Device device) {
  MlpChain to;
  to.h = from.h.to_device(device);
  to.gate_up = from.gate_up.to_device(device);
  for (int l = 0; l < kChainLayers; ++l) {
    to.norm.push_back(from.norm[l].to_device(device));
    to.w_gate_up.push_back(from.w_gate_up[l].to_device(device));
    to.w_down.push_back(from.w_down[l].to_device(device));
  }
  return to;
}

void restore(MlpChain& to, MlpChain& from, cuda::Stream stream) {
  const std::vector<Tensor*> dst = to.buffers(), src = from.buffers();
  for (std::size_t i = 0; i < dst.size(); ++i)
    cuda::copy_async(dst[i]->raw_data(), src[i]->raw_data(), src[i]->nbytes(), stream);
  cuda::stream_synchronize(stream);
}

void run_chain(MlpChain& c, bool cpu, bool w_constant) {
  Tensor gate = c.gate_up.slice(1, 0, kChainInter),
         up = c.gate_up.slice(1, kChainInter, 2 * kChainInter);
  for (int l = 0; l < kChainLayers; ++l) {
    if (cpu) {
      cpu::rms_norm_matmul(c.h, c.norm[l], kEps, c.w_gate_up[l], c.gate_up);
      cpu::silu_mul_matmul_add(gate, up, c.w_down[l], c.h, c.h);
    } else {
      cuda::rms_norm_matmul(c.h, c.norm[l], kEps, c.w_gate_up[l], c.gate_up, w_constant);
      cuda::silu_mul_matmul_add(gate, up, c.w_down[l], c.h, c.h, w_constant);
    }
  }
}

::testing::AssertionResult same_bits(MlpChain& actual, MlpChain& expected) {
  cuda::synchronize();
  const std::vector<Tensor*> got = actual.buffers(), want = expected.buffers();
  for (std::size_t i = 0; i < got.size(); ++i) {
    ::testing::AssertionResult r =
        testing::bit_equal(got[i]->to_device(Device::cpu()), want[i]->to_device(Device::cpu()));
    if (!r) return r << " (buffer " << i << ")";
  }
  return ::testing::AssertionSuccess();
}

TEST(PrologueOpsCuda, PdlChainIsBitIdenticalEagerAndInGraphs) {
  SKIP_WITHOUT_GPU();
  PdlScope scope;
  Rng rng(35);
  const MlpChain host_chain = make_chain(rng);
  // Both products of a layer take the prologue GEMV (one row).
  {
    const MlpChain probe = copy_chain(host_chain, Device::cuda());
    ASSERT_TRUE(cuda::prologue_gemv_applies(probe.h, probe.w_gate_up[0]));
    ASSERT_TRUE(
        cuda::prologue_gemv_applies(probe.gate_up.slice(1, 0, kChainInter), probe.w_down[0]));
  }
  MlpChain initial = copy_chain(host_chain, Device::cuda());  // never written
  const cuda::Stream stream = cuda::create_stream();
  constexpr std::uint64_t kLaunches = 2 * kChainLayers;

  // Reference: PDL off, legacy default stream, eager, no promise.
  cuda::set_pdl_enabled(false);
  MlpChain reference = copy_chain(host_chain, Device::cuda());
  auto before = cuda::gemv::launch_stats();
  run_chain(reference, false, false);
  auto after = cuda::gemv::launch_stats();
  EXPECT_EQ(after.launches - before.launches, kLaunches);
  EXPECT_EQ(after.prologue - before.prologue, kLaunches);
  EXPECT_EQ(after.pdl - before.pdl, 0u);
  EXPECT_EQ(after.prefetch - before.prefetch, 0u);

  // CPU sanity bound (the bit identity below is the race detector): h accumulates 24 residual
  // updates, each of which may round one bf16 ulp apart on the two backends, so up to 1% of the
  // entries may exceed rtol 5e-2 + atol 1e-1 and none by more than 1.0; a wrong prologue or a
  // race moves every entry by O(1).
  MlpChain cpu_chain = copy_chain(host_chain, Device::cpu());
  run_chain(cpu_chain, true, false);
  {
    const CompareReport r =
        compare_tensors(reference.h.to_device(Device::cpu()), cpu_chain.h, Tolerance{1e-1, 5e-2});
    EXPECT_LE(r.mismatches * 100, r.count) << r.str();
    EXPECT_LE(r.max_abs_error, 1.0) << r.str();
  }

  MlpChain dev = copy_chain(host_chain, Device::cuda());
  cuda::set_pdl_enabled(true);
  {  // PDL on, created stream, eager, weights promised constant.
    cuda::StreamGuard guard(stream);
    restore(dev, initial, stream);
    before = cuda::gemv::launch_stats();
    run_chain(dev, false, true);
    after = cuda::gemv::launch_stats();
    EXPECT_EQ(after.pdl - before.pdl, kLaunches) << "every launch carries the PDL attribute";
    EXPECT_EQ(after.prefetch - before.prefetch, kLaunches) << "every launch prefetches";
    EXPECT_TRUE(same_bits(dev, reference)) << "eager, PDL on, prefetch";
  }
  for (const bool pdl : {true, false})
    for (const bool w_constant : {true, false}) {
      SCOPED_TRACE(std::string("graph, PDL ") + (pdl ? "on" : "off") + ", prefetch " +
                   (w_constant ? "on" : "off"));
      cuda::set_pdl_enabled(pdl);
      cuda::StreamGuard guard(stream);
      restore(dev, initial, stream);
      before = cuda::gemv::launch_stats();
      cuda::begin_capture(stream);
      run_chain(dev, false, w_constant);
      const cuda::GraphExec exec = cuda::end_capture(stream);
      after = cuda::gemv::launch_stats();
      EXPECT_EQ(after.pdl - before.pdl, pdl ? kLaunches : 0u);
      EXPECT_EQ(after.prefetch - before.prefetch, w_constant ? kLaunches : 0u);
      for (int r = 0; r < kChainReplays; ++r) {
        restore(dev, initial, stream);
        cuda::launch_graph(exec, stream);
        cuda::stream_synchronize(stream);
        EXPECT_TRUE(same_bits(dev, reference)) << "replay " << r;
      }
      cuda::destroy_graph(exec);
    }
  cuda::destroy_stream(stream);
}

// ---- 6. a session optimized on the device
// --------------------------------------------------------

TEST(PrologueOpsCuda, OptimizedSessionChoosesTheFusedArmsAndMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  constexpr std::int64_t kHidden = 576, kInter = 1536;
  Rng rng(36);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (int l = 0; l < 2; ++l) {
    const std::string p = "l" + std::to_string(l) + ".";
    tensors.emplace_back(p + "gate.weight",
                         testing::random_tensor(rng, {kInter, kHidden}, DType::bf16, 0.04));
    tensors.emplace_back(p + "up.weight",
                         testing::random_tensor(rng, {kInter, kHidden}, DType::bf16, 0.04));
  }
  const Weights weights = Weights::from_tensors(std::move(tensors));
  auto build = [&](std::vector<LayerOpSpec>* specs) {
    Graph g;
    Rng wr(37);
    NodeId h = g.input("h", {SymExpr(1), SymExpr(1), SymExpr(kHidden)}, DType::bf16);
    for (int l = 0; l < 2; ++l) {
      const std::string p = "l" + std::to_string(l) + ".";
      const NodeId norm =
          g.param(p + "norm", testing::random_tensor(wr, {kHidden}, DType::bf16, 0.1, 1.0));
      const NodeId down =
          g.param(p + "down", testing::random_tensor(wr, {kHidden, kInter}, DType::bf16, 0.02));
      const std::vector<NodeId> gu = layers::norm_project(
          g, weights, DType::bf16, true, h, norm, kEps, kHidden, p + "gate_up.",
          {{p + "gate.", kInter}, {p + "up.", kInter}}, false, {}, specs, p + "norm");
      h = layers::swiglu_down_residual(g, h, gu[0], gu[1], down, specs, p + "mlp");
    }
    g.mark_output("y", h);
    return g;
  };
  std::vector<LayerOpSpec> specs;
  Graph gpu_graph = build(&specs);
  ASSERT_EQ(specs.size(), 4u);
  OptimizeOptions opt;
  opt.tune.device = Device::cuda();
  opt.tune.warmup = 1;
  opt.tune.repeats = 3;
  opt.tune.time_override = [](NodeId, int arm, std::int64_t) { return arm == 1 ? 1.0 : 2.0; };
  const DecisionLog log = optimize_graph(gpu_graph, {}, opt, {}, specs);
  ASSERT_EQ(log.entries().size(), 4u);
  for (const Decision& d : log.entries()) {
    EXPECT_TRUE(d.offered) << d.site << ": " << d.reason;
    ASSERT_EQ(d.buckets.size(), 1u);
    EXPECT_TRUE(d.buckets[0].verified[1]) << d.site << ": " << d.buckets[0].failure[1];
    EXPECT_EQ(d.collapsed_to, 1) << d.site;
  }
  SessionOptions gpu_options;
  gpu_options.device = Device::cuda();
  gpu_options.require_cuda_graph = true;  // steps 2.. replay one captured graph
  Session gpu(gpu_graph, gpu_options);
  Session cpu(build(nullptr));
  for (int step = 0; step < 4; ++step) {
    Tensor h = testing::random_tensor(rng, {1, 1, kHidden}, DType::bf16);
    const cuda::gemv::LaunchStats before = cuda::gemv::launch_stats();
    gpu.step({}, {{"h", h.to_device(Device::cuda())}});
    cpu.step({}, {{"h", h}});
    if (step == 0) {  // the eager first step: 2 layers x 2 prologue GEMVs, all with the session's
                      // constant-weight hint (NodeHints via node_kernels' weight_input)
      const cuda::gemv::LaunchStats after = cuda::gemv::launch_stats();
      EXPECT_EQ(after.prologue - before.prologue, 4u);
      EXPECT_EQ(after.prefetch - before.prefetch, 4u);
    }
    EXPECT_TRUE(testing::close(gpu.output("y").to_device(Device::cpu()), cpu.output("y"),
                               Tolerance{1e-1, 5e-2}))
        << "step " << step;
  }
}

}  // namespace
}  // namespace splice
