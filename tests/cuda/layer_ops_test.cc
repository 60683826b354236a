// CUDA kernels of the fused layer ops (RmsNorm, SiluMul, Rope) against the CPU kernels (the
// oracle), and the ops inside planned, captured sessions. Skips itself without a CUDA device.
//
//  1. Grids: row lengths 1, 17, 97, 576, 4095, 4096 (rope: the even neighbours) x rows 1, 3 x
//     bf16 / f16 / f32 x layouts contiguous, padded (NaN gaps between rows) and offset (rows start
//     one element past a 16-byte boundary: the scalar path). rms_norm also writes an output dtype
//     other than x's. Outputs compare with default_tolerance(out dtype); rope bit for bit (both
//     backends do the same fp32 operations without fused multiply-adds); padding must stay NaN.
//  2. Rope on a permuted head view, at positions 0, interior and last; an out-of-range position
//     writes zeros; a captured CUDA graph replays with a new position each time.
//  3. Sessions: small graphs with every layer op offered through optimize_graph on the device
//     (verified against arm 0 on the GPU, fused arms chosen) agree with the CPU session over
//     several steps, captured as one CUDA graph. Timed for real on the device (no override):
//     every arm verified and given a positive device span, the fused arms chosen, and the
//     tuning cache's keys marked "device-span".
//  4. Typed errors: a non-unit last stride, wrong shapes, a CPU tensor.
#include "splice/backend/cuda/layer_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "splice/backend/cpu/layer_ops.h"
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

constexpr float kEps = 1e-6f;
const DType kDtypes[] = {DType::bf16, DType::f16, DType::f32};
const std::int64_t kLengths[] = {1, 17, 97, 576, 4095, 4096};
const std::int64_t kRowCounts[] = {1, 3};

using testing::download_view;
using testing::host;  // support/cuda_test_util.h: NaN-poisoned layouts
using testing::kLayouts;
using testing::Layout;
using testing::layout_name;
using testing::normal;
using testing::touched_padding;
using testing::upload;

// Runs `gpu` into a device output of `layout` and `cpu_fn` into a CPU output; compares.
::testing::AssertionResult agree(const Dims& shape, DType out_dtype, Layout layout,
                                 const std::function<void(Tensor&)>& cpu_fn,
                                 const std::function<void(Tensor&)>& gpu_fn, bool exact) {
  Tensor expected = Tensor::empty(shape, out_dtype);
  cpu_fn(expected);
  Tensor device_out = upload(host(shape, out_dtype, layout));
  gpu_fn(device_out);
  const Tensor actual = download_view(device_out);
  if (const std::int64_t t = touched_padding(actual))
    return ::testing::AssertionFailure() << t << " padding elements were written";
  if (exact) return testing::bit_equal(actual, expected);
  return testing::close(actual, expected, default_tolerance(out_dtype));
}

TEST(LayerOpsCuda, RmsNormMatchesCpu) {
  SKIP_WITHOUT_GPU();
  Rng rng(11);
  int case_index = 0;
  for (DType dtype : kDtypes)
    for (std::int64_t h : kLengths)
      for (std::int64_t rows : kRowCounts)
        for (Layout layout : kLayouts) {
          const DType out_dtype = (case_index++ % 3 == 2) ? DType::f32 : dtype;
          const Dims shape{rows, 1, h};
          const Tensor x = normal(rng, shape, dtype, layout);
          const Tensor w = normal(rng, {h}, dtype, Layout::contiguous, 0.1, 1.0);
          const Tensor dx = upload(x), dw = upload(w);
          EXPECT_TRUE(agree(
              shape, out_dtype, layout, [&](Tensor& o) { cpu::rms_norm(x, w, kEps, o); },
              [&](Tensor& o) { cuda::rms_norm(dx, dw, kEps, o); }, false))
              << dtype_name(dtype) << "->" << dtype_name(out_dtype) << " rows " << rows << " H "
              << h << " " << layout_name(layout);
        }
}

TEST(LayerOpsCuda, SiluMulMatchesCpu) {
  SKIP_WITHOUT_GPU();
  Rng rng(12);
  for (DType dtype : kDtypes)
    for (std::int64_t n : kLengths)
      for (std::int64_t rows : kRowCounts)
        for (Layout layout : kLayouts) {
          const Dims shape{rows, 1, n};
          const Tensor a = normal(rng, shape, dtype, layout, 4.0);
          const Tensor b = normal(rng, shape, dtype, Layout::contiguous);
          const Tensor da = upload(a), db = upload(b);
          // expf vs std::exp may differ by an ulp and flip silu's intermediate rounding.
          EXPECT_TRUE(agree(
              shape, dtype, layout, [&](Tensor& o) { cpu::silu_mul(a, b, o); },
              [&](Tensor& o) { cuda::silu_mul(da, db, o); }, false))
              << dtype_name(dtype) << " rows " << rows << " n " << n << " " << layout_name(layout);
        }
}

Tensor position_tensor(std::int64_t p, Device device) {
  Tensor t = Tensor::empty({1}, DType::i32);
  t.data<std::int32_t>()[0] = static_cast<std::int32_t>(p);
  return device.is_cpu() ? t : t.to_device(device);
}

TEST(LayerOpsCuda, RopeMatchesCpuBitForBitOnPermutedHeads) {
  SKIP_WITHOUT_GPU();
  Rng rng(13);
  constexpr std::int64_t kMaxSeq = 41;
  for (DType dtype : kDtypes)
    for (std::int64_t len : kLengths)
      for (std::int64_t heads : kRowCounts)
        for (Layout layout : kLayouts) {
          const std::int64_t d = len + len % 2;
          const Tensor cos = normal(rng, {kMaxSeq, d}, DType::f32, Layout::contiguous);
          const Tensor sin = normal(rng, {kMaxSeq, d}, DType::f32, Layout::contiguous);
          const Tensor dcos = upload(cos), dsin = upload(sin);
          const Tensor buffer = normal(rng, {2, 1, heads, d}, dtype, layout);
          const Tensor x = buffer.permute({0, 2, 1, 3});  // [2, heads, 1, D]
          const Tensor dx = upload(buffer).permute({0, 2, 1, 3});
          for (std::int64_t p : {std::int64_t{0}, std::int64_t{23}, kMaxSeq - 1}) {
            const Tensor hp = position_tensor(p, Device::cpu());
            const Tensor dp = position_tensor(p, Device::cuda());
            EXPECT_TRUE(agree(
                {2, heads, 1, d}, dtype, layout, [&](Tensor& o) { cpu::rope(x, cos, sin, hp, o); },
                [&](Tensor& o) { cuda::rope(dx, dcos, dsin, dp, o); }, true))
                << dtype_name(dtype) << " heads " << heads << " D " << d << " p " << p << " "
                << layout_name(layout);
          }
        }
}

TEST(LayerOpsCuda, RopeOutOfRangePositionWritesZeros) {
  SKIP_WITHOUT_GPU();
  Rng rng(14);
  const Tensor cos = upload(normal(rng, {8, 64}, DType::f32, Layout::contiguous));
  const Tensor x = upload(normal(rng, {1, 4, 1, 64}, DType::bf16, Layout::contiguous));
  for (std::int64_t p : {std::int64_t{8}, std::int64_t{-1}}) {
    Tensor out = upload(normal(rng, {1, 4, 1, 64}, DType::bf16, Layout::contiguous));
    cuda::rope(x, cos, cos, position_tensor(p, Device::cuda()), out);
    EXPECT_TRUE(
        testing::bit_equal(download_view(out).clone(), Tensor::zeros({1, 4, 1, 64}, DType::bf16)))
        << "p " << p;
  }
}

TEST(LayerOpsCuda, CapturedRopeReplaysWithNewPositions) {
  SKIP_WITHOUT_GPU();
  Rng rng(15);
  const Tensor cos = normal(rng, {32, 128}, DType::f32, Layout::contiguous);
  const Tensor sin = normal(rng, {32, 128}, DType::f32, Layout::contiguous);
  const Tensor x = normal(rng, {1, 9, 1, 128}, DType::bf16, Layout::contiguous);
  const Tensor dcos = upload(cos), dsin = upload(sin), dx = upload(x);
  Tensor dpos = position_tensor(0, Device::cuda());
  Tensor dout = Tensor::empty({1, 9, 1, 128}, DType::bf16, Device::cuda());
  const cuda::Stream stream = cuda::create_stream();
  cuda::GraphExec graph = nullptr;
  {
    cuda::StreamGuard guard(stream);
    cuda::begin_capture(stream);
    cuda::rope(dx, dcos, dsin, dpos, dout);
    graph = cuda::end_capture(stream);
  }
  for (std::int64_t p : {3, 0, 31, 17}) {
    const Tensor hp = position_tensor(p, Device::cpu());
    cuda::copy_async(dpos.raw_data(), hp.raw_data(), sizeof(std::int32_t), stream);
    cuda::launch_graph(graph, stream);
    cuda::stream_synchronize(stream);
    Tensor want = Tensor::empty({1, 9, 1, 128}, DType::bf16);
    cpu::rope(x, cos, sin, hp, want);
    EXPECT_TRUE(testing::bit_equal(dout.to_device(Device::cpu()), want)) << "p " << p;
  }
  cuda::destroy_graph(graph);
  cuda::destroy_stream(stream);
}

// x [1, 1, 64] -> rms_norm -> swiglu (its activation fused) -> rope of a [1, 2, 1, 32] view.
Graph layer_graph(std::vector<LayerOpSpec>& specs) {
  Graph g;
  Rng rng(16);
  const SymExpr one(1);
  const SymId k_len = g.declare_symbol("k_len", 1, 24);
  const NodeId position =
      g.sym_value(DynScalar::Expr(DynScalar::Sym(k_len).expr() - 1), DType::i32);
  const NodeId x = g.input("x", {one, one, SymExpr(64)}, DType::bf16);
  auto param = [&](const std::string& name, const Dims& shape, double stddev, double mean = 0) {
    return g.param(name, testing::random_tensor(rng, shape, DType::bf16, stddev, mean));
  };
  const NodeId n =
      layers::rms_norm(g, x, param("norm", {64}, 0.1, 1.0), kEps, DType::bf16, &specs, "norm");
  const NodeId mlp = layers::swiglu(g, n, param("gate", {96, 64}, 0.3), param("up", {96, 64}, 0.2),
                                    param("down", {64, 96}, 0.2), &specs, "mlp");
  const NodeId heads = g.permute(g.reshape(mlp, {one, one, SymExpr(2), SymExpr(32)}), {0, 2, 1, 3});
  const NodeId cos = g.param("cos", testing::random_tensor(rng, {24, 32}, DType::f32));
  const NodeId sin = g.param("sin", testing::random_tensor(rng, {24, 32}, DType::f32));
  g.mark_output("y", layers::rope(g, heads, cos, sin, position, &specs, "rope"));
  return g;
}

TEST(LayerOpsCuda, OptimizedSessionMatchesTheCpuAndIsCaptured) {
  SKIP_WITHOUT_GPU();
  std::vector<LayerOpSpec> cpu_specs, gpu_specs;
  Graph cpu_graph = layer_graph(cpu_specs), gpu_graph = layer_graph(gpu_specs);
  OptimizeOptions opt;
  opt.tune.time_override = [](NodeId, int arm, std::int64_t) { return arm == 1 ? 1.0 : 2.0; };
  optimize_graph(cpu_graph, {}, opt, {}, cpu_specs);
  opt.tune.device = Device::cuda();
  opt.tune.device_name = "cuda";
  const DecisionLog log = optimize_graph(gpu_graph, {}, opt, {}, gpu_specs);
  ASSERT_EQ(log.entries().size(), 3u);
  for (const Decision& d : log.entries()) {
    EXPECT_TRUE(d.offered) << d.reason;
    EXPECT_TRUE(d.buckets.at(0).verified.at(1)) << d.site << ": " << d.buckets[0].failure[1];
    EXPECT_EQ(d.collapsed_to, 1) << d.site;
  }
  SessionOptions so;
  so.device = Device::cuda();
  so.require_cuda_graph = true;
  Session gpu(gpu_graph, so), cpu(cpu_graph);
  Rng rng(17);
  for (std::int64_t step = 1; step <= 6; ++step) {
    const Tensor x = testing::random_tensor(rng, {1, 1, 64}, DType::bf16);
    cpu.step({{"k_len", step * 3}}, {{"x", x}});
    gpu.step({{"k_len", step * 3}}, {{"x", x.to_device(Device::cuda())}});
    const Tensor got = gpu.output("y").to_device(Device::cpu());
    EXPECT_TRUE(testing::close(got, cpu.output("y"), default_tolerance(DType::bf16)))
        << "step " << step;
  }
  EXPECT_TRUE(gpu.last_step_replayed());
}

TEST(LayerOpsCuda, ArmsAreTimedByTheirDeviceSpan) {
  SKIP_WITHOUT_GPU();
  std::vector<LayerOpSpec> specs;
  Graph graph = layer_graph(specs);
  const std::string cache = testing::process_temp_path("device_span_tuning.json");
  std::remove(cache.c_str());
  OptimizeOptions opt;
  opt.tune.device = Device::cuda();
  opt.tune.cache_path = cache;
  const DecisionLog log = optimize_graph(graph, {}, opt, {}, specs);
  ASSERT_EQ(log.entries().size(), 3u);
  for (const Decision& d : log.entries()) {
    ASSERT_EQ(d.buckets.size(), 1u) << d.site;
    const BucketDecision& b = d.buckets[0];
    EXPECT_TRUE(b.verified.at(1)) << d.site << ": " << b.failure[1];
    for (double us : b.median_us) {
      EXPECT_GT(us, 0.0) << d.site;
      EXPECT_LT(us, 1000.0) << d.site;  // microseconds of small kernels, not a stalled hold
    }
    // One launch against a chain of 2-10 (rms_norm's decomposed arm: 9 kernels).
    EXPECT_EQ(d.collapsed_to, 1) << d.site << ": " << b.reason << " (" << b.median_us[0]
                                 << " against " << b.median_us[1] << " us)";
  }
  std::ifstream in(cache);
  const nlohmann::json j = nlohmann::json::parse(in);
  ASSERT_EQ(j.at("entries").size(), 3u);
  for (const auto& [key, entry] : j.at("entries").items())
    EXPECT_NE(key.find("|device-span|"), std::string::npos) << key;
  std::remove(cache.c_str());
}

TEST(LayerOpsCuda, ArgumentErrors) {
  SKIP_WITHOUT_GPU();
  Rng rng(18);
  const Tensor x = upload(normal(rng, {2, 8}, DType::bf16, Layout::contiguous));
  const Tensor w = upload(normal(rng, {8}, DType::bf16, Layout::contiguous));
  Tensor out = Tensor::empty({2, 8}, DType::bf16, Device::cuda());
  const Tensor strided =
      upload(normal(rng, {8, 2}, DType::bf16, Layout::contiguous)).permute({1, 0});
  EXPECT_THROW(cuda::rms_norm(strided, w, kEps, out), LayoutError);
  EXPECT_THROW(cuda::silu_mul(x, upload(normal(rng, {2, 4}, DType::bf16, Layout::contiguous)), out),
               ShapeError);
  const Tensor host_w = normal(rng, {8}, DType::bf16, Layout::contiguous);
  EXPECT_THROW(cuda::rms_norm(x, host_w, kEps, out), DeviceError);
  EXPECT_THROW(fused_rms_norm(x, host_w, kEps, out), DeviceError);
  const Tensor cos = upload(normal(rng, {4, 8}, DType::f32, Layout::contiguous));
  EXPECT_THROW(cuda::rope(x, cos, cos, upload(Tensor::zeros({1}, DType::i64)), out), DTypeError);
}

// The layer ops' aliasing rule (backend/layer_op_checks.h) on CUDA, as on the CPU: an expanded
// out, an out overlapping an input other than as the identical view of one read elementwise, an
// out over a table or a weight; refused before any launch. In place stays allowed.
TEST(LayerOpsCuda, OutputsThatShareMemoryAreRefused) {
  SKIP_WITHOUT_GPU();
  Rng rng(19);
  const Tensor host_buf = normal(rng, {6, 8}, DType::bf16, Layout::contiguous);
  Tensor buf = upload(host_buf);  // [6, 8]
  Tensor x = buf.slice(0, 0, 2), shifted = buf.slice(0, 1, 3), spare = buf.slice(0, 4, 6);
  const Tensor weight = upload(normal(rng, {8}, DType::bf16, Layout::contiguous));
  Tensor expanded = buf.slice(0, 5, 6).expand({2, 8});
  const auto refused = [](const std::function<void()>& call, const std::string& needle) {
    testing::expect_error_with<LayoutError>(call, needle);
  };
  refused([&] { cuda::rms_norm(x, weight, kEps, shifted); }, "only an identical view");
  refused([&] { cuda::rms_norm(x, weight, kEps, expanded); }, "share an address");
  refused([&] { cuda::silu_mul(x, spare, shifted); }, "overlaps `a`");
  const Tensor cos = upload(normal(rng, {4, 8}, DType::f32, Layout::contiguous));
  const Tensor position = upload(Tensor::zeros({1}, DType::i32));
  Tensor out_over_cos = Tensor::view_of(cos.storage(), 0, {2, 8}, {8, 1}, DType::bf16);
  refused([&] { cuda::rope(x, cos, cos, position, out_over_cos); }, "overlaps `cos`");
  const Tensor w = upload(normal(rng, {4, 8}, DType::bf16, Layout::contiguous));
  Tensor product_over_w = w.slice(0, 0, 2).slice(1, 0, 4);  // [2, 4] inside w
  refused([&] { cuda::rms_norm_matmul(x, weight, kEps, w, product_over_w); }, "overlaps `w`");
  cuda::synchronize();
  EXPECT_TRUE(testing::bit_equal(testing::download(buf), host_buf));
  // rms_norm in place on x's identical view equals the out-of-place result.
  Tensor expected = Tensor::empty({2, 8}, DType::bf16, Device::cuda());
  cuda::rms_norm(x, weight, kEps, expected);
  cuda::rms_norm(x, weight, kEps, x);
  EXPECT_TRUE(testing::bit_equal(testing::download(x), testing::download(expected)));
}

}  // namespace
}  // namespace splice
