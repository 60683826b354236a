// The fused layer ops end to end on the CPU: a tiny random Llama and the embedded default KDA
// hybrid (both in bf16) decode 12 greedy tokens twice through the Generator, once with every
// LayerOpSpec offered, verified and chosen (RMSNorm, RMSNorm + the stacked projection it feeds
// (rms_norm_matmul), RoPE, the gate|up product with SwiGLU's activation (rms_norm_matmul_swiglu)
// fused) and once without them (the primitive regions); everything else
// (attention, KDA arms) is the same. The greedy tokens must be identical and the logits equal
// within the bf16 tolerance (the CPU fused kernels reproduce their primitive regions bit for bit,
// so they are in fact identical). The residual products (MatMulAdd: o_proj and down_proj plus
// their residuals) round once where their
// regions round the product first, so they are not bitwise: they run in tests of their own,
// where the greedy tokens must be identical and the logits close within
// kMatMulAddLogitTolerance.
// Also: the builders' stacked projections (one matmul for q|k|v, gate|up and the KDA mixer's
// inputs, the projections views of its output; one RoPE over the q and k heads) give bitwise
// (bf16) the logits of one matmul per Hugging Face linear and one RoPE each for q and k, for a
// Qwen2-style Llama with q/k/v biases at batch 1 and 2 (batch 2 makes the views strided) and for
// the KDA hybrid.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "splice/exec/session.h"
#include "splice/model/default_model.h"
#include "splice/model/generate.h"
#include "support/test_util.h"
#include "support/tiny_llama.h"

namespace splice {
namespace {

constexpr int kSteps = 12;
// Logits with the MatMulAdd arms against without: each fused residual add rounds h once where
// the region rounds twice, so h differs by about one bf16 ulp (2^-8 relative) in some elements
// per layer, and the logits leave a bf16 lm_head, whose rounding is an ulp at their own scale.
// Measured on the CPU: the tiny Llama's logits (max |logit| 30-39) differ by at most 0.42 (about
// one ulp at 32), the KDA hybrid's (max 3-4) by at most 0.047; both about 1% of the step's
// largest logit. Bound: |difference| <= 0.03 max |logit| + 0.03 |logit|.
constexpr double kMatMulAddLogitScaleTolerance = 0.03;

// The tiny Llama of these tests (support/tiny_llama.h; gate_proj drawn wider so SiLU sees both
// signs), or its Qwen2 twin with q/k/v biases.
testing::TinyLlamaSpec tiny_llama(bool qwen2 = false) {
  testing::TinyLlamaSpec spec;
  spec.gate_stddev = 0.3;
  if (qwen2) spec.architecture = "Qwen2ForCausalLM";
  return spec;
}

struct Decode {
  std::vector<std::int32_t> tokens;
  std::vector<Tensor> logits;
  int fused_layer_ops = 0;  // layer-op branches collapsed to the fused arm
};

// `layer_ops`: offer the RMSNorm, RMSNorm + projection, RoPE and SwiGLU specs; `matmul_add`: the
// residual MatMulAdd (and SiluMulMatMulAdd, which the stacked builders no longer emit) specs as
// well. `forced`: feed these tokens instead of the run's
// own greedy choices (teacher forcing: step s gets forced[s - 1]); the greedy choices are still
// recorded.
Decode greedy(DecodeModel model, bool layer_ops, bool matmul_add = false,
              const std::vector<std::int32_t>* forced = nullptr) {
  if (!layer_ops) model.layer_specs.clear();
  if (!matmul_add)
    std::erase_if(model.layer_specs, [](const LayerOpSpec& s) {
      return s.kind == LayerOpKind::matmul_add || s.kind == LayerOpKind::silu_mul_matmul_add;
    });
  GeneratorOptions go;
  go.optimize.tune.warmup = 0;
  go.optimize.tune.repeats = 1;
  go.optimize.tune.time_override = [](NodeId, int arm, std::int64_t) {
    return arm == 1 ? 1.0 : 2.0;
  };
  Generator gen(std::move(model), go);
  Decode d;
  for (const Decision& decision : gen.decisions().entries()) {
    const bool layer_op = decision.kind == "rms_norm" || decision.kind == "silu_mul" ||
                          decision.kind == "rope" || decision.kind == "rope_kv_append" ||
                          decision.kind == "matmul_add" || decision.kind == "rms_norm_matmul" ||
                          decision.kind == "silu_mul_matmul_add" ||
                          decision.kind == "rms_norm_matmul_rope_kv_append" ||
                          decision.kind == "rms_norm_matmul_swiglu";
    if (layer_op) {
      EXPECT_TRUE(decision.offered) << decision.site << ": " << decision.reason;
      d.fused_layer_ops += decision.collapsed_to == 1;
    }
  }
  std::int32_t token = 1;
  for (int step = 0; step < kSteps; ++step) {
    const Tensor logits = gen.step(token);
    d.logits.push_back(logits.clone());
    std::int64_t best = 0;
    for (std::int64_t v = 1; v < logits.numel(); ++v)
      if (logits.at_linear(v) > logits.at_linear(best)) best = v;
    token = static_cast<std::int32_t>(best);
    d.tokens.push_back(token);
    if (forced) token = (*forced)[static_cast<std::size_t>(step)];
  }
  return d;
}

void expect_same_decode(const Decode& fused, const Decode& plain) {
  EXPECT_EQ(fused.tokens, plain.tokens);
  for (int step = 0; step < kSteps; ++step)
    EXPECT_TRUE(
        testing::close(fused.logits[step], plain.logits[step], default_tolerance(DType::bf16)))
        << "step " << step;
}

TEST(LayerOpsE2e, LlamaGreedyTokensAndLogitsMatchWithAndWithoutFusedLayerOps) {
  const ModelConfig config =
      testing::tiny_llama_config(testing::process_temp_path("layer_ops_llama"), tiny_llama());
  const Weights weights = testing::tiny_llama_weights(tiny_llama());
  BuildOptions build;
  build.max_seq_len = 32;
  build.dtype = DType::bf16;
  DecodeModel model = build_decode_model(config, weights, build);
  // Per layer: 2 norms fused with the q|k|v and gate|up projections (rms_norm_matmul), 1
  // rope_kv_append (q and k heads in one RoPE, both cache appends), the region around the q|k|v
  // product and rope_kv_append (rms_norm_matmul_rope_kv_append), the o_proj residual
  // (matmul_add), the region around the gate|up product and SwiGLU's activation
  // (rms_norm_matmul_swiglu), down_proj with its residual (matmul_add); the final norm with
  // lm_head (rms_norm_matmul).
  EXPECT_EQ(model.layer_specs.size(), 2u * 7u + 1u);
  int norm_products = 0, swiglu_products = 0, residual_products = 0;
  for (const LayerOpSpec& s : model.layer_specs) {
    norm_products += s.kind == LayerOpKind::rms_norm_matmul;
    swiglu_products += s.kind == LayerOpKind::rms_norm_matmul_swiglu;
    residual_products += s.kind == LayerOpKind::matmul_add;
    EXPECT_NE(s.kind, LayerOpKind::silu_mul) << s.site;  // inside rms_norm_matmul_swiglu
    EXPECT_NE(s.kind, LayerOpKind::silu_mul_matmul_add) << s.site;
  }
  EXPECT_EQ(norm_products, 5);  // + the final norm with lm_head
  EXPECT_EQ(swiglu_products, 2);
  EXPECT_EQ(residual_products, 4);
  const Decode fused = greedy(build_decode_model(config, weights, build), true);
  const Decode plain = greedy(std::move(model), false);
  // 2 x (2 rms_norm_matmul + rope_kv_append + the regions around them) + the final norm
  EXPECT_EQ(fused.fused_layer_ops, 11);
  EXPECT_EQ(plain.fused_layer_ops, 0);
  expect_same_decode(fused, plain);
}

TEST(LayerOpsE2e, DefaultKdaModelGreedyTokensAndLogitsMatchWithAndWithoutFusedLayerOps) {
  const ModelConfig config = default_model_config();
  const Weights weights = Weights::from_tensors(make_kda_weights(config, 7));
  BuildOptions build;
  build.max_seq_len = 32;
  build.dtype = DType::bf16;
  DecodeModel model = build_decode_model(config, weights, build);
  // 4 layers x (the mixer's norm fused with its stacked input projection and the MLP norm with
  // gate|up (rms_norm_matmul), the mixer's o_proj residual (matmul_add), the region around the
  // gate|up product and SwiGLU's activation (rms_norm_matmul_swiglu), down_proj with its residual
  // (matmul_add)), the attention layer's rope, the final norm with lm_head (rms_norm_matmul),
  // and each KDA layer's output gate, its g_proj.1 product with its bias (matmul_add).
  EXPECT_EQ(model.layer_specs.size(), 4u * 5u + 1u + 1u + 3u);
  int norm_products = 0;
  for (const LayerOpSpec& s : model.layer_specs) {
    norm_products += s.kind == LayerOpKind::rms_norm_matmul;
    EXPECT_NE(s.kind, LayerOpKind::rms_norm) << s.site;  // every norm feeds a product
  }
  EXPECT_EQ(norm_products, 4 * 2 + 1);
  const Decode fused = greedy(build_decode_model(config, weights, build), true);
  const Decode plain = greedy(std::move(model), false);
  // 4 x (2 rms_norm_matmul + rms_norm_matmul_swiglu) + rope + the final norm
  EXPECT_EQ(fused.fused_layer_ops, 14);
  expect_same_decode(fused, plain);
}

// `same_tokens`: the greedy tokens must agree too (otherwise the fused run was teacher-forced with
// the plain run's tokens and only its logits are compared).
void expect_close_decode(const Decode& fused, const Decode& plain, bool same_tokens = true) {
  if (same_tokens) {
    EXPECT_EQ(fused.tokens, plain.tokens);
  }
  for (int step = 0; step < kSteps; ++step) {
    double scale = 0;  // max |logit| of this step
    for (std::int64_t i = 0; i < plain.logits[step].numel(); ++i)
      scale = std::max(scale, std::fabs(plain.logits[step].at_linear(i)));
    const Tolerance tol{kMatMulAddLogitScaleTolerance * scale, kMatMulAddLogitScaleTolerance};
    EXPECT_TRUE(testing::close(fused.logits[step], plain.logits[step], tol))
        << "step " << step << ", max |logit| " << scale;
  }
}

TEST(LayerOpsE2e, LlamaGreedyTokensMatchWithAndWithoutMatMulAdd) {
  const ModelConfig config =
      testing::tiny_llama_config(testing::process_temp_path("matmul_add_llama"), tiny_llama());
  const Weights weights = testing::tiny_llama_weights(tiny_llama());
  BuildOptions build;
  build.max_seq_len = 32;
  build.dtype = DType::bf16;
  const Decode fused = greedy(build_decode_model(config, weights, build), true, true);
  const Decode plain = greedy(build_decode_model(config, weights, build), true, false);
  // + the o_proj and down_proj residuals of 2 layers
  EXPECT_EQ(fused.fused_layer_ops, 11 + 4);
  EXPECT_EQ(plain.fused_layer_ops, 11);
  expect_close_decode(fused, plain);
}

TEST(LayerOpsE2e, DefaultKdaModelTeacherForcedLogitsMatchWithAndWithoutMatMulAdd) {
  const ModelConfig config = default_model_config();
  const Weights weights = Weights::from_tensors(make_kda_weights(config, 7));
  BuildOptions build;
  build.max_seq_len = 32;
  build.dtype = DType::bf16;
  // The random hybrid's recurrent KDA states carry each layer's rounding differences into later
  // tokens, and its logits (max |logit| 3-4) have near-ties, so a one-rounding difference per
  // residual can flip a greedy token (then the two runs decode different texts): the fused run is
  // teacher-forced with the plain run's tokens and the logits are compared step by step.
  const Decode plain = greedy(build_decode_model(config, weights, build), true, false);
  const Decode fused =
      greedy(build_decode_model(config, weights, build), true, true, &plain.tokens);
  // + the mixer and down_proj residuals of 4 layers, the 3 KDA layers' output-gate biases
  EXPECT_EQ(fused.fused_layer_ops, 14 + 8 + 3);
  expect_close_decode(fused, plain, /*same_tokens=*/false);
}

// Logits of `steps` tokens fed to a planned session of the model (batch rows get different tokens).
std::vector<Tensor> session_logits(const ModelConfig& config, const Weights& weights,
                                   BuildOptions build, int steps) {
  DecodeModel model = build_decode_model(config, weights, build);
  Session session(std::move(model.graph));
  std::vector<Tensor> out;
  for (int step = 0; step < steps; ++step) {
    Tensor tokens = Tensor::empty({build.batch}, DType::i32);
    for (std::int64_t b = 0; b < build.batch; ++b)
      tokens.data<std::int32_t>()[b] = static_cast<std::int32_t>((step * 7 + b * 13) % 97);
    session.step({{"k_len", step + 1}}, {{"tokens", tokens}});
    out.push_back(session.output("logits").clone());
  }
  return out;
}

TEST(StackedProjections, SameLogitsAsOneMatmulPerLinear) {
  const ModelConfig config =
      testing::tiny_llama_config(testing::process_temp_path("layer_ops_qwen2"), tiny_llama(true));
  ASSERT_TRUE(config.attention_bias);
  const Weights weights = testing::tiny_llama_weights(tiny_llama(true));
  // (f32 at batch 1 only: its batch-2 matmuls go through multithreaded BLAS, slow on loaded CI.)
  for (DType dtype : {DType::bf16, DType::f32})
    for (std::int64_t batch : {1, 2}) {
      if (dtype == DType::f32 && batch > 1) continue;
      BuildOptions build;
      build.max_seq_len = 16;
      build.dtype = dtype;
      build.batch = batch;
      build.stack_projections = true;
      const auto stacked = session_logits(config, weights, build, 6);
      build.stack_projections = false;
      const auto separate = session_logits(config, weights, build, 6);
      // bf16: bitwise (the direct decode matmul loop sums each output the same way whatever N).
      // f32 goes through BLAS sgemv, whose kernel choice depends on N: ulp-level differences.
      for (std::size_t i = 0; i < stacked.size(); ++i)
        EXPECT_TRUE(dtype == DType::bf16
                        ? testing::bit_equal(stacked[i], separate[i])
                        : testing::close(stacked[i], separate[i], default_tolerance(DType::f32)))
            << dtype_name(dtype) << " batch " << batch << " step " << i;
    }
}

// The same for the KDA hybrid (the KDA mixer stacks q, k, v, f_proj.0, b_proj and g_proj.0; the
// attention layer q|k|v; every MLP gate|up), bf16 at batch 1 and 2.
TEST(StackedProjections, KdaHybridSameLogitsAsOneMatmulPerLinear) {
  const ModelConfig config = default_model_config();
  const Weights weights = Weights::from_tensors(make_kda_weights(config, 5));
  for (std::int64_t batch : {1, 2}) {
    BuildOptions build;
    build.max_seq_len = 16;
    build.batch = batch;
    build.stack_projections = true;
    const auto stacked = session_logits(config, weights, build, 4);
    build.stack_projections = false;
    const auto separate = session_logits(config, weights, build, 4);
    for (std::size_t i = 0; i < stacked.size(); ++i)
      EXPECT_TRUE(testing::bit_equal(stacked[i], separate[i]))
          << "batch " << batch << " step " << i;
  }
}

}  // namespace
}  // namespace splice
