// cuda::rope_kv_append (Op::RopeKvAppend's one-launch CUDA kernel) against the CPU kernel, the
// rope_kv_append region alone replayed on the GPU, and a tiny Llama whose rope_kv_append regions
// run the fused arm inside a replayed CUDA graph.
//
//  1. Kernel grid: batch 1, 2 x (Hq, Hkv) (1, 1), (4, 2), (3, 1) x D 2, 64, 128 x bf16 / f16 / f32
//     x positions 0, interior, last x three layouts (everything contiguous; qkv a batch-strided
//     view; qkv strided, k rows padded along D, v along the capacity and out's heads views of
//     wider buffers); caches random in every row: out and both caches bit for bit against
//     cpu::rope_kv_append (the same fp32 operations, the appends are copies). A position outside
//     the caches zeroes out and leaves the caches untouched.
//  2. Region: a graph holding only the rope_kv_append region (qkv an input, position k_len - 1)
//     whose outputs are q and f32 copies of both caches read through their StateAfter views,
//     collapsed to either arm, stepped over every cache row (out of order, one row twice) with
//     fresh qkv each step, PDL on and off, captured then replayed on the GPU: every output and both
//     caches bit for bit the CPU session of the same graph (a position frozen at capture, a write
//     to the wrong row or a cache read before the append all fail here, exactly).
//     Both kernel checks run in both position modes (read after the wait; before it under the
//     position_stable promise).
//  3. Llama: the graph with every rope_kv_append branch collapsed to the fused arm and attention
//     to the flash arm, its launches promising a stable position (the session's hint), replayed
//     on the GPU: bit for bit the same graph with the decomposed arm
//     (rope + two write_at) on the GPU (the two arms do the same fp32 operations and every other
//     kernel is the same), and within the two-layer bf16 policy of the CPU
//     (testing::bf16_logit_tolerance).
#include "splice/backend/cuda/rope_kv_append.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <string>
#include <vector>

#include "splice/backend/cpu/layer_ops.h"
#include "splice/backend/cuda/flash_decode.h"
#include "splice/backend/cuda/runtime.h"
#include "splice/core/error.h"
#include "splice/exec/session.h"
#include "splice/model/model.h"
#include "splice/ops/layer_ops.h"
#include "splice/passes/layer_ops.h"
#include "splice/tune/optimize.h"
#include "support/cuda_test_util.h"
#include "support/rope_kv_append_region.h"
#include "support/test_util.h"
#include "support/tiny_llama.h"

namespace splice {
namespace {

// Every device tensor needs the CUDA backend registered (device copies included).
constexpr std::int64_t kCapacity = 11;

// The kernel's operand layouts: contiguous; qkv a batch-strided view; additionally the caches'
// rows and out's heads views of wider buffers (strides the kernel must honour).
enum class Views { contiguous, strided_qkv, all_strided };

void check_kernel(std::int64_t batch, std::int64_t heads, std::int64_t kv_heads, std::int64_t dim,
                  DType dtype, std::int64_t position, Views views, Rng& rng) {
  SCOPED_TRACE(std::string(dtype_name(dtype)) + " B " + std::to_string(batch) + " Hq " +
               std::to_string(heads) + " Hkv " + std::to_string(kv_heads) + " D " +
               std::to_string(dim) + " p " + std::to_string(position) + " views " +
               std::to_string(static_cast<int>(views)));
  constexpr std::int64_t kPad = 3;  // extra rows / heads / row elements of the wider buffers
  const std::int64_t row = (heads + 2 * kv_heads) * dim;
  Tensor qkv = testing::random_tensor(rng, {batch, 1, row}, dtype);  // [B, 1, row]
  if (views != Views::contiguous)
    qkv = testing::random_tensor(rng, {batch, 1, row + kPad}, dtype).slice(2, 0, row);
  const Tensor cos = testing::random_tensor(rng, {kCapacity, dim}, DType::f32);
  const Tensor sin = testing::random_tensor(rng, {kCapacity, dim}, DType::f32);
  Tensor pos = Tensor::empty({1}, DType::i32);
  pos.data<std::int32_t>()[0] = static_cast<std::int32_t>(position);
  const bool wide = views == Views::all_strided;
  // [B, Hkv, capacity, D]; when wide, k a view of [B, Hkv, capacity, D + kPad] and v of
  // [B, Hkv, capacity + 2 kPad, D] (every stride of the two caches differs).
  const std::int64_t pad = wide ? kPad : 0;
  Tensor k_cpu =
      testing::random_tensor(rng, {batch, kv_heads, kCapacity, dim + pad}, dtype).slice(3, 0, dim);
  Tensor v_cpu = testing::random_tensor(rng, {batch, kv_heads, kCapacity + 2 * pad, dim}, dtype)
                     .slice(2, 0, kCapacity);
  // [B, Hq, 1, D] (heads of a [B, Hq + kPad, 1, D] buffer when wide)
  Tensor out_cpu =
      Tensor::empty({batch, heads + (wide ? kPad : 0), 1, dim}, dtype).slice(1, 0, heads);
  // The GPU runs on copies of the CPU's operands (taken before the CPU kernel writes them), once
  // per mode: the position read after the wait, and before it (the position_stable promise).
  const Tensor k_before = k_cpu, v_before = v_cpu, out_before = out_cpu;
  std::vector<Tensor> k_gpu, v_gpu, out_gpu;
  for (int mode = 0; mode < 2; ++mode) {
    k_gpu.push_back(testing::upload(k_before));
    v_gpu.push_back(testing::upload(v_before));
    out_gpu.push_back(testing::upload(out_before));
  }
  cpu::rope_kv_append(qkv, cos, sin, pos, k_cpu, v_cpu, out_cpu);
  for (int mode = 0; mode < 2; ++mode) {
    SCOPED_TRACE(mode == 1 ? "position_stable" : "position after the wait");
    cuda::rope_kv_append(testing::upload(qkv), testing::upload(cos), testing::upload(sin),
                         testing::upload(pos), k_gpu[mode], v_gpu[mode], out_gpu[mode],
                         /*position_stable=*/mode == 1);
    EXPECT_TRUE(testing::bit_equal(testing::download(out_gpu[mode]), out_cpu.clone()));
    EXPECT_TRUE(testing::bit_equal(testing::download(k_gpu[mode]), k_cpu.clone()));
    EXPECT_TRUE(testing::bit_equal(testing::download(v_gpu[mode]), v_cpu.clone()));
  }
}

TEST(RopeKvAppendCuda, KernelMatchesCpuBitwise) {
  SKIP_WITHOUT_GPU();
  Rng rng(23);
  struct Shape {
    std::int64_t batch, heads, kv_heads, dim;
  };
  const Shape shapes[] = {{1, 1, 1, 2}, {2, 4, 2, 64}, {1, 3, 1, 128}, {2, 3, 1, 64}};
  for (DType dtype : {DType::bf16, DType::f16, DType::f32})
    for (const Shape& s : shapes)
      for (std::int64_t p : {std::int64_t{0}, kCapacity / 2, kCapacity - 1})
        for (Views views : {Views::contiguous, Views::strided_qkv, Views::all_strided})
          check_kernel(s.batch, s.heads, s.kv_heads, s.dim, dtype, p, views, rng);
}

TEST(RopeKvAppendCuda, PositionOutsideTheCachesZeroesOutAndWritesNoCache) {
  SKIP_WITHOUT_GPU();
  Rng rng(5);
  const std::int64_t heads = 2, kv_heads = 1, dim = 64, row = (heads + 2 * kv_heads) * dim;
  const Tensor qkv = testing::upload(testing::random_tensor(rng, {1, 1, row}, DType::bf16));
  const Tensor cos = testing::upload(testing::random_tensor(rng, {kCapacity + 4, dim}, DType::f32));
  const Tensor sin = testing::upload(testing::random_tensor(rng, {kCapacity + 4, dim}, DType::f32));
  const Tensor k_host = testing::random_tensor(rng, {1, kv_heads, kCapacity, dim}, DType::bf16);
  Tensor k_cache = testing::upload(k_host), v_cache = testing::upload(k_host);
  Tensor pos = Tensor::empty({1}, DType::i32);
  pos.data<std::int32_t>()[0] =
      static_cast<std::int32_t>(kCapacity);  // in the tables, past the caches
  for (const bool position_stable : {false, true}) {
    SCOPED_TRACE(position_stable ? "position_stable" : "position after the wait");
    Tensor out = testing::upload(testing::random_tensor(rng, {1, heads, 1, dim}, DType::bf16));
    cuda::rope_kv_append(qkv, cos, sin, testing::upload(pos), k_cache, v_cache, out,
                         position_stable);
    EXPECT_TRUE(
        testing::bit_equal(testing::download(out), Tensor::zeros({1, heads, 1, dim}, DType::bf16)));
    EXPECT_TRUE(testing::bit_equal(testing::download(k_cache), k_host));
    EXPECT_TRUE(testing::bit_equal(testing::download(v_cache), k_host));
  }
}

// Outputs that share memory are refused before the launch, as on the CPU: one cache passed as
// both (it would end up holding v) and out inside a cache (the append would overwrite it); the
// caches keep their bytes.
TEST(RopeKvAppendCuda, OverlappingOutputsAreRefused) {
  SKIP_WITHOUT_GPU();
  Rng rng(6);
  const std::int64_t heads = 1, kv_heads = 1, dim = 64, row = (heads + 2 * kv_heads) * dim;
  const Tensor qkv = testing::upload(testing::random_tensor(rng, {1, 1, row}, DType::bf16));
  const Tensor cos = testing::upload(testing::random_tensor(rng, {kCapacity, dim}, DType::f32));
  const Tensor sin = testing::upload(testing::random_tensor(rng, {kCapacity, dim}, DType::f32));
  const Tensor k_host = testing::random_tensor(rng, {1, kv_heads, kCapacity, dim}, DType::bf16);
  Tensor k_cache = testing::upload(k_host), v_cache = testing::upload(k_host);
  Tensor pos = Tensor::empty({1}, DType::i32);
  pos.data<std::int32_t>()[0] = 3;
  const Tensor position = testing::upload(pos);
  Tensor out = Tensor::empty({1, heads, 1, dim}, DType::bf16, Device::cuda());
  const auto expect_refused = [&](Tensor& k, Tensor& v, Tensor& o, const std::string& needle) {
    try {
      cuda::rope_kv_append(qkv, cos, sin, position, k, v, o);
      ADD_FAILURE() << needle << ": accepted";
    } catch (const LayoutError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_refused(k_cache, k_cache, out, "`k_cache` and `v_cache` must not overlap");
  Tensor out_in_v = v_cache.slice(2, 5, 6);  // [1, Hkv = Hq, 1, D]: row 5 of v_cache
  expect_refused(k_cache, v_cache, out_in_v, "`v_cache` and `out` must not overlap");
  cuda::synchronize();
  EXPECT_TRUE(testing::bit_equal(testing::download(k_cache), k_host));
  EXPECT_TRUE(testing::bit_equal(testing::download(v_cache), k_host));
}

SessionOptions gpu_options() {
  SessionOptions options;
  options.device = Device::cuda();
  options.require_cuda_graph = true;
  return options;
}

// ---- the region alone ----

using testing::kRegionRow;

// The shared region graph (support/rope_kv_append_region.h), offered by the CUDA contract row.
Graph region_graph(int arm) {
  return testing::rope_kv_append_region_graph(arm, kCapacity, cuda_layer_ops_contract());
}

TEST(RopeKvAppendCuda, ReplayedRegionMatchesCpuBitwise) {
  SKIP_WITHOUT_GPU();
  testing::PdlScope pdl_scope;
  for (int arm : {1, 0})
    for (bool pdl : {true, false}) {
      SCOPED_TRACE("arm " + std::to_string(arm) + (pdl ? " PDL" : " no PDL"));
      cuda::set_pdl_enabled(pdl);  // read when a launch is captured
      const Graph graph = region_graph(arm);
      int fused = 0;
      for (NodeId id : graph.live_nodes()) fused += graph.node(id).op == Op::RopeKvAppend;
      ASSERT_EQ(fused, arm);
      Session gpu(graph, gpu_options()), cpu(graph);
      Rng rng(7);
      // Every cache row, out of order and one row twice (the position changes every replay).
      const std::int64_t k_lens[] = {1, 2, 3, 7, 4, 11, 5, 6, 10, 8, 9, 2};
      for (std::size_t step = 0; step < std::size(k_lens); ++step) {
        const std::int64_t k_len = k_lens[step];
        SCOPED_TRACE("k_len " + std::to_string(k_len));
        const Tensor qkv = testing::random_tensor(rng, {1, 1, kRegionRow}, DType::bf16);
        cpu.step({{"k_len", k_len}}, {{"qkv", qkv}});
        gpu.step({{"k_len", k_len}}, {{"qkv", qkv.to_device(Device::cuda())}});
        if (step >= 2) {
          EXPECT_TRUE(gpu.last_step_replayed()) << gpu.cuda_graph_status();
        }
        for (const char* name : {"q", "k_seen", "v_seen"})
          EXPECT_TRUE(testing::bit_equal(testing::download(gpu.output(name)), cpu.output(name)))
              << name;
        for (const char* name : {"k_cache", "v_cache"})
          EXPECT_TRUE(testing::bit_equal(testing::download(gpu.state(name)), cpu.state(name)))
              << name;
      }
    }
}

// ---- the Llama ----

// A tiny bf16 Llama (head_dim 64: the flash arm's smallest), its rope_kv_append branches
// collapsed to `rope_kv_append_arm`, attention to the flash arm, every other branch to arm 0.
Graph llama(int rope_kv_append_arm) {
  Graph g = testing::collapsed_rope_kv_append_llama(
      testing::process_temp_path("rope_kv_append_cuda_llama"), Device::cuda(),
      [&](const std::string& kind) {
        return kind == "rope_kv_append" ? rope_kv_append_arm : kind == "flash_decode" ? 1 : 0;
      });
  int fused = 0;
  for (NodeId id : g.live_nodes()) fused += g.node(id).op == Op::RopeKvAppend;
  EXPECT_EQ(fused, rope_kv_append_arm == 1 ? 2 : 0);
  return g;
}

constexpr int kLlamaSteps = 6;
const char* const kCaches[] = {"model.layers.0.k_cache", "model.layers.0.v_cache",
                               "model.layers.1.k_cache", "model.layers.1.v_cache"};

Tensor token(std::int64_t step) {
  Tensor tokens = Tensor::empty({1}, DType::i32);
  tokens.data<std::int32_t>()[0] = static_cast<std::int32_t>(step * 7 % 61);
  return tokens;
}

// The decisive check: the fused arm against the decomposed one on the same device, where both
// run the same kernels everywhere else (same shapes, same 256-byte-aligned arena buffers) and the
// two arms do the same fp32 operations: logits and caches bit for bit at every step.
TEST(RopeKvAppendCuda, ReplayedLlamaIsBitwiseTheDecomposedArm) {
  SKIP_WITHOUT_GPU();
  const Graph fused_graph = llama(1), plain_graph = llama(0);
  Session fused(fused_graph, gpu_options()), plain(plain_graph, gpu_options());
  for (std::int64_t step = 1; step <= kLlamaSteps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const Tensor tokens = token(step).to_device(Device::cuda());
    const cuda::RopeKvAppendLaunches before = cuda::rope_kv_append_launches();
    const cuda::FlashDecodeLaunches flash_before = cuda::flash_decode_launches();
    fused.step({{"k_len", step}}, {{"tokens", tokens}});
    const cuda::RopeKvAppendLaunches after = cuda::rope_kv_append_launches();
    const cuda::FlashDecodeLaunches flash_after = cuda::flash_decode_launches();
    // Attention reads its stable KV prefix before the wait (rope_kv_append appends at k_len - 1).
    EXPECT_EQ(flash_after.stable_prefix - flash_before.stable_prefix,
              flash_after.launches - flash_before.launches);
    // The session promises a stable position (a SymValue step scalar, Param tables): every
    // launch it issues (eager and captured steps; a replay issues none) reads p before the wait.
    EXPECT_EQ(after.early_position - before.early_position, after.launches - before.launches);
    EXPECT_EQ(after.early_trigger - before.early_trigger, after.launches - before.launches);
    if (step == 1) {
      EXPECT_EQ(after.launches - before.launches, 2u) << "one per layer";
    }
    plain.step({{"k_len", step}}, {{"tokens", tokens}});
    if (step >= 3) {
      EXPECT_TRUE(fused.last_step_replayed()) << fused.cuda_graph_status();
      EXPECT_TRUE(plain.last_step_replayed()) << plain.cuda_graph_status();
    }
    const Tensor want = testing::download(plain.output("logits"));
    const Tensor got = testing::download(fused.output("logits"));
    EXPECT_TRUE(testing::bit_equal(got, want))
        << "logits: " << compare_tensors(got, want, Tolerance{0.0, 0.0}).str();
    for (const char* name : kCaches)
      EXPECT_TRUE(testing::bit_equal(testing::download(fused.state(name)),
                                     testing::download(plain.state(name))))
          << name;
  }
}

// The CPU comparison's policy for the logits: testing::bf16_logit_tolerance (4 ulps of the
// largest logit plus 2%; |logit| up to ~60 here, where one bf16 ulp is 0.25: on the CPU alone,
// changing only the summation and rounding order, every layer op fused vs decomposed, moves them
// by up to 0.28 and puts 10-19 of the 61 outside the default bf16 policy at every step, exactly
// run 14's failure, which compared with that policy: 0.25, 6-18 of 61). Caches: the two-layer
// policy of session_graph_test.
constexpr Tolerance kBf16TwoLayers = {0.03, 0.06};

TEST(RopeKvAppendCuda, ReplayedSessionStepMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const Graph fused_graph = llama(1), plain_graph = llama(0);
  Session fused(fused_graph, gpu_options()), plain(plain_graph, gpu_options()), cpu(fused_graph);
  for (std::int64_t step = 1; step <= kLlamaSteps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    cpu.step({{"k_len", step}}, {{"tokens", token(step)}});
    fused.step({{"k_len", step}}, {{"tokens", token(step).to_device(Device::cuda())}});
    plain.step({{"k_len", step}}, {{"tokens", token(step).to_device(Device::cuda())}});
    const Tensor want = cpu.output("logits");
    const Tolerance tol = testing::bf16_logit_tolerance(want);
    const Tensor got = testing::download(fused.output("logits"));
    // Printed for the record: the decomposed arm's distance to the CPU is the noise floor.
    std::printf(
        "step %lld logits vs CPU: fused %s | decomposed %s\n", static_cast<long long>(step),
        compare_tensors(got, want, tol).str().c_str(),
        compare_tensors(testing::download(plain.output("logits")), want, tol).str().c_str());
    EXPECT_TRUE(testing::close(got, want, tol)) << "logits";
    for (const char* name : kCaches)
      EXPECT_TRUE(
          testing::close(testing::download(fused.state(name)), cpu.state(name), kBf16TwoLayers))
          << name;
  }
}

}  // namespace
}  // namespace splice
