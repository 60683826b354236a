// cuda::rope_kv_append (Op::RopeKvAppend's one-launch CUDA kernel) against the CPU kernel, and a
// tiny Llama whose rope_kv_append regions run the fused arm inside a replayed CUDA graph.
//
//  1. Kernel grid: batch 1, 2 x (Hq, Hkv) (1, 1), (4, 2), (3, 1) x D 2, 64, 128 x bf16 / f16 / f32
//     x positions 0, interior, last x qkv contiguous or a batch-strided view; caches random in
//     every row: out and both caches bit for bit against cpu::rope_kv_append (the same fp32
//     operations, the appends are copies). A position outside the caches zeroes out and leaves
//     the caches untouched.
//  2. Session: the Llama graph with every rope_kv_append branch collapsed to the fused arm and
//     attention to the flash arm, stepped 6 times on the GPU (captured, then replayed with a new
//     position each step: the kernel reads it from device memory) against the same graph on the
//     CPU: logits and caches within the bf16 policy; the GPU steps after the second replay.
#include "splice/backend/cuda/rope_kv_append.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "splice/backend/cpu/layer_ops.h"
#include "splice/backend/cuda/runtime.h"
#include "splice/exec/session.h"
#include "splice/model/model.h"
#include "splice/tune/optimize.h"
#include "support/cuda_test_util.h"
#include "support/test_util.h"

namespace splice {
namespace {

// Every device tensor needs the CUDA backend registered (device copies included).
#define SKIP_WITHOUT_GPU()                                           \
  do {                                                               \
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device"; \
    cuda::ensure_registered();                                       \
  } while (0)

constexpr std::int64_t kCapacity = 11;

void check_kernel(std::int64_t batch, std::int64_t heads, std::int64_t kv_heads, std::int64_t dim,
                  DType dtype, std::int64_t position, bool strided, Rng& rng) {
  SCOPED_TRACE(std::string(dtype_name(dtype)) + " B " + std::to_string(batch) + " Hq " +
               std::to_string(heads) + " Hkv " + std::to_string(kv_heads) + " D " +
               std::to_string(dim) + " p " + std::to_string(position) +
               (strided ? " strided" : ""));
  const std::int64_t row = (heads + 2 * kv_heads) * dim;
  Tensor qkv = testing::random_tensor(rng, {batch, 1, row}, dtype);  // [B, 1, row]
  if (strided) qkv = testing::random_tensor(rng, {batch, 1, row + 8}, dtype).slice(2, 0, row);
  const Tensor cos = testing::random_tensor(rng, {kCapacity, dim}, DType::f32);
  const Tensor sin = testing::random_tensor(rng, {kCapacity, dim}, DType::f32);
  Tensor pos = Tensor::empty({1}, DType::i32);
  pos.data<std::int32_t>()[0] = static_cast<std::int32_t>(position);
  const Dims cache{batch, kv_heads, kCapacity, dim};  // [B, Hkv, capacity, D]
  Tensor k_cpu = testing::random_tensor(rng, cache, dtype);
  Tensor v_cpu = testing::random_tensor(rng, cache, dtype);
  Tensor k_gpu = testing::upload(k_cpu), v_gpu = testing::upload(v_cpu);
  Tensor out_cpu = Tensor::empty({batch, heads, 1, dim}, dtype);
  Tensor out_gpu = Tensor::empty({batch, heads, 1, dim}, dtype, Device::cuda());
  cpu::rope_kv_append(qkv, cos, sin, pos, k_cpu, v_cpu, out_cpu);
  cuda::rope_kv_append(testing::upload(qkv), testing::upload(cos), testing::upload(sin),
                       testing::upload(pos), k_gpu, v_gpu, out_gpu);
  EXPECT_TRUE(testing::bit_equal(testing::download(out_gpu), out_cpu));
  EXPECT_TRUE(testing::bit_equal(testing::download(k_gpu), k_cpu));
  EXPECT_TRUE(testing::bit_equal(testing::download(v_gpu), v_cpu));
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
        for (bool strided : {false, true})
          check_kernel(s.batch, s.heads, s.kv_heads, s.dim, dtype, p, strided, rng);
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
  Tensor out = testing::upload(testing::random_tensor(rng, {1, heads, 1, dim}, DType::bf16));
  cuda::rope_kv_append(qkv, cos, sin, testing::upload(pos), k_cache, v_cache, out);
  EXPECT_TRUE(
      testing::bit_equal(testing::download(out), Tensor::zeros({1, heads, 1, dim}, DType::bf16)));
  EXPECT_TRUE(testing::bit_equal(testing::download(k_cache), k_host));
  EXPECT_TRUE(testing::bit_equal(testing::download(v_cache), k_host));
}

// A tiny Llama (head_dim 64: the flash arm's smallest) collapsed to the fused rope_kv_append arms
// and the flash arms (every other branch to arm 0).
Graph fused_llama() {
  const std::string dir = ::testing::TempDir() + "/rope_kv_append_cuda_llama";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 61,
    "hidden_size": 128, "intermediate_size": 96, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "max_position_embeddings": 64, "tie_word_embeddings": true})";
  Rng rng(11);
  std::vector<std::pair<std::string, Tensor>> t;
  auto add = [&](const std::string& name, Dims shape, double stddev, double mean = 0.0) {
    t.emplace_back(name, testing::random_tensor(rng, shape, DType::f32, stddev, mean));
  };
  add("model.embed_tokens.weight", {61, 128}, 1.0);
  add("model.norm.weight", {128}, 0.1, 1.0);
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "self_attn.q_proj.weight", {128, 128}, 0.1);
    add(p + "self_attn.k_proj.weight", {64, 128}, 0.1);
    add(p + "self_attn.v_proj.weight", {64, 128}, 0.1);
    add(p + "self_attn.o_proj.weight", {128, 128}, 0.1);
    add(p + "mlp.gate_proj.weight", {96, 128}, 0.1);
    add(p + "mlp.up_proj.weight", {96, 128}, 0.1);
    add(p + "mlp.down_proj.weight", {128, 96}, 0.1);
    add(p + "input_layernorm.weight", {128}, 0.3, 1.0);
    add(p + "post_attention_layernorm.weight", {128}, 0.3, 1.0);
  }
  BuildOptions build;
  build.max_seq_len = 16;
  build.dtype = DType::bf16;
  DecodeModel m = build_decode_model(load_config(dir + "/config.json"),
                                     Weights::from_tensors(std::move(t)), build);
  OptimizeOptions o;
  o.select = false;
  o.tune.device = Device::cuda();
  optimize_graph(m.graph, m.attention_specs, o, m.kda_specs, m.layer_specs);
  for (NodeId id : m.graph.live_nodes()) {
    const Node& n = m.graph.node(id);
    if (n.op != Op::Branch || n.erased) continue;
    const std::string& kind = n.attrs.branch->recipe.kind;
    collapse(m.graph, id, kind == "rope_kv_append" || kind == "flash_decode" ? 1 : 0);
  }
  eliminate_dead_code(m.graph);
  verify_graph(m.graph);
  return std::move(m.graph);
}

TEST(RopeKvAppendCuda, ReplayedSessionStepMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const Graph graph = fused_llama();
  int fused = 0;
  for (NodeId id : graph.live_nodes()) fused += graph.node(id).op == Op::RopeKvAppend;
  ASSERT_EQ(fused, 2);
  SessionOptions gpu_options;
  gpu_options.device = Device::cuda();
  gpu_options.require_cuda_graph = true;
  Session gpu(graph, gpu_options), cpu(graph);
  const Tolerance tol = default_tolerance(DType::bf16);
  for (std::int64_t step = 1; step <= 6; ++step) {
    Tensor tokens = Tensor::empty({1}, DType::i32);
    tokens.data<std::int32_t>()[0] = static_cast<std::int32_t>(step * 7 % 61);
    cpu.step({{"k_len", step}}, {{"tokens", tokens}});
    gpu.step({{"k_len", step}}, {{"tokens", tokens.to_device(Device::cuda())}});
    if (step >= 3) {
      EXPECT_TRUE(gpu.last_step_replayed()) << gpu.cuda_graph_status();
    }
    EXPECT_TRUE(testing::close(testing::download(gpu.output("logits")), cpu.output("logits"), tol))
        << "step " << step;
    for (int l = 0; l < 2; ++l)
      for (const char* cache : {"k_cache", "v_cache"}) {
        const std::string name = "model.layers." + std::to_string(l) + "." + cache;
        EXPECT_TRUE(testing::close(testing::download(gpu.state(name)), cpu.state(name), tol))
            << name << " step " << step;
      }
  }
}

}  // namespace
}  // namespace splice
