// The rms_norm_matmul_swiglu region of the Llama builder (stacked projections): per layer an
// outer LayerOpSpec whose region spans the gate|up product's rms_norm_matmul region, its two
// views and Silu -> Mul (diverging at h, decomposed_out the Mul), so the inner branch stays
// inside its arm 0, the oracle; its fused arm is one Op::RmsNormMatMulSwiglu. down_proj and the
// residual follow as a matmul_add region (no silu_mul_matmul_add spec any more).
//
//  1. Specs: per layer the gate|up rms_norm_matmul spec, the outer spec (inputs {h, norm_weight,
//     w} taken from it) and the down_proj matmul_add spec, in that order.
//  2. Offer (CPU row): the outer branch's arm 0 holds the inner branch (nested branches); the
//     spec validation rejects malformed specs (GraphError); a contract without the op declines
//     the outer spec with a reason and keeps the inner arm.
//  3. Select: the inner branch is verified and collapsed first, then the outer one is verified
//     against the collapsed inner path (bit for bit on the CPU) and, timed faster, chosen: one
//     fused node per layer; on a CUDA session it gets constant_b (its weight is a Param).
//  4. Sessions over 6 steps, logits bit for bit: every fused arm chosen with the combined arm vs
//     without it; only the combined arm chosen vs the unoptimized model; offered and not selected
//     (nested branches kept) vs the unoptimized model.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "exec/node_kernels.h"
#include "splice/core/error.h"
#include "splice/exec/session.h"
#include "splice/model/model.h"
#include "splice/ops/layer_ops.h"
#include "splice/passes/layer_ops.h"
#include "splice/tune/optimize.h"
#include "support/graph_test_util.h"
#include "support/test_util.h"
#include "support/tiny_llama.h"

namespace splice {
namespace {

constexpr int kLayers = 2;
constexpr const char* kKind = "rms_norm_matmul_swiglu";

DecodeModel tiny_llama(DType dtype = DType::bf16) {
  return testing::rope_kv_append_llama(testing::process_temp_path("swiglu_llama"), dtype);
}

using testing::arm0_branches;
using testing::branches_of;
using testing::Fused;
using testing::nodes_of;
using testing::offer_only;
using testing::select_fused;

TEST(SwigluGraph, OneOuterSpecPerLayerBetweenTheProductAndTheDownProjection) {
  const DecodeModel m = tiny_llama();
  int outer = 0;
  for (std::size_t i = 0; i < m.layer_specs.size(); ++i) {
    const LayerOpSpec& s = m.layer_specs[i];
    EXPECT_NE(s.kind, LayerOpKind::silu_mul_matmul_add) << s.site;
    EXPECT_NE(s.kind, LayerOpKind::silu_mul) << s.site;
    if (s.kind != LayerOpKind::rms_norm_matmul_swiglu) continue;
    ++outer;
    ASSERT_GE(i, 1u);
    ASSERT_LT(i + 1, m.layer_specs.size());
    const LayerOpSpec& product = m.layer_specs[i - 1];
    const LayerOpSpec& down = m.layer_specs[i + 1];
    ASSERT_EQ(product.kind, LayerOpKind::rms_norm_matmul);
    ASSERT_EQ(down.kind, LayerOpKind::matmul_add);
    ASSERT_EQ(s.inputs.size(), 3u);
    for (int j = 0; j < 3; ++j) EXPECT_EQ(s.inputs[j], product.inputs[j]);  // h, norm, gate|up
    EXPECT_EQ(s.eps, product.eps);
    EXPECT_EQ(m.graph.node(s.decomposed_out).op, Op::Mul);
    EXPECT_EQ(down.inputs[0], s.reconverge);  // down_proj reads the activation's merge
    EXPECT_EQ(m.graph.node(s.decomposed_out).shape.back().constant(),
              m.graph.node(s.inputs[2]).shape[0].constant() / 2);
  }
  EXPECT_EQ(outer, kLayers);
}

TEST(SwigluGraph, OfferedWithTheProductBranchInItsArmZero) {
  DecodeModel m = tiny_llama();
  const DecisionLog log =
      optimize_graph(m.graph, m.attention_specs, offer_only(), m.kda_specs, m.layer_specs);
  int offered = 0;
  for (const Decision& d : log.entries())
    if (d.kind == kKind) offered += d.offered;
  EXPECT_EQ(offered, kLayers);
  const auto outer = branches_of(m.graph, kKind);
  ASSERT_EQ(outer.size(), static_cast<std::size_t>(kLayers));
  for (NodeId b : outer) {
    const Node& branch = m.graph.node(b);
    int inner_product = 0, others = 0;
    for (NodeId n : arm0_branches(m.graph, b)) {
      const std::string& kind = m.graph.node(n).attrs.branch->recipe.kind;
      (kind == "rms_norm_matmul" ? inner_product : others) += 1;
      EXPECT_LT(n.index, b.index) << "the inner branch is selected first (node order)";
    }
    EXPECT_EQ(inner_product, 1);
    EXPECT_EQ(others, 0);
    EXPECT_EQ(m.graph.node(branch.inputs[1]).op, Op::RmsNormMatMulSwiglu);
  }
  verify_graph(m.graph);
}

TEST(SwigluGraph, MalformedSpecsAreGraphErrors) {
  DecodeModel m = tiny_llama();
  LayerOpSpec spec;
  for (const LayerOpSpec& s : m.layer_specs)
    if (s.kind == LayerOpKind::rms_norm_matmul_swiglu) spec = s;
  const LayerOpContract& row = cpu_layer_ops_contract();
  {
    LayerOpSpec bad = spec;
    bad.inputs.pop_back();
    EXPECT_THROW(offer_layer_op_arm(m.graph, bad, row), GraphError);
  }
  {
    LayerOpSpec bad = spec;
    std::swap(bad.inputs[1], bad.inputs[2]);  // the weights swapped
    EXPECT_THROW(offer_layer_op_arm(m.graph, bad, row), GraphError);
  }
  {
    LayerOpSpec bad = spec;
    bad.decomposed_out = bad.inputs[0];  // h: not [..., I]
    EXPECT_THROW(offer_layer_op_arm(m.graph, bad, row), GraphError);
  }
  {
    LayerOpSpec bad = spec;
    bad.reconverge = bad.decomposed_out;  // not its consumer
    EXPECT_THROW(offer_layer_op_arm(m.graph, bad, row), GraphError);
  }
  {
    LayerOpSpec bad = spec;
    bad.eps = -1.0f;
    EXPECT_THROW(offer_layer_op_arm(m.graph, bad, row), GraphError);
  }
}

TEST(SwigluGraph, DeclinedWithAReasonKeepingTheInnerArm) {
  {
    SCOPED_TRACE("a row without the op");
    DecodeModel m = tiny_llama();
    LayerOpContract row = cpu_layer_ops_contract();
    std::erase(row.ops, LayerOpKind::rms_norm_matmul_swiglu);
    DecisionLog log;
    for (const LayerOpSpec& s : m.layer_specs) offer_layer_op_arm(m.graph, s, row, &log);
    verify_graph(m.graph);
    int declined = 0;
    for (const Decision& d : log.entries()) {
      if (d.kind != kKind) continue;
      ++declined;
      EXPECT_FALSE(d.offered);
      EXPECT_NE(d.reason.find("does not implement rms_norm_matmul_swiglu"), std::string::npos)
          << d.reason;
    }
    EXPECT_EQ(declined, kLayers);
    EXPECT_TRUE(branches_of(m.graph, kKind).empty());
    // Per layer the q|k|v and gate|up products, plus the final norm's lm_head.
    EXPECT_EQ(branches_of(m.graph, "rms_norm_matmul").size(),
              static_cast<std::size_t>(2 * kLayers + 1));
  }
  for (const LayerOpContract* row : {&cpu_layer_ops_contract(), &cuda_layer_ops_contract()}) {
    SCOPED_TRACE(row->backend + " row: offered on the bf16 and f32 models");
    for (DType dtype : {DType::bf16, DType::f32}) {
      DecodeModel m = tiny_llama(dtype);
      DecisionLog log;
      for (const LayerOpSpec& s : m.layer_specs) offer_layer_op_arm(m.graph, s, *row, &log);
      for (const Decision& d : log.entries()) {
        if (d.kind == kKind) {
          EXPECT_TRUE(d.offered) << d.reason;
        }
      }
    }
  }
}

TEST(SwigluGraph, VerifiedAgainstTheCollapsedInnerArmAndChosen) {
  DecodeModel m = tiny_llama();
  const DecisionLog log =
      optimize_graph(m.graph, m.attention_specs, select_fused(&m.graph, Fused::all, kKind),
                     m.kda_specs, m.layer_specs);
  int chosen = 0;
  for (const Decision& d : log.entries()) {
    if (d.kind != kKind) continue;
    ASSERT_EQ(d.buckets.size(), 1u) << d.site;
    ASSERT_EQ(d.buckets[0].verified.size(), 2u);
    EXPECT_TRUE(d.buckets[0].verified[1]) << d.site << ": " << d.buckets[0].failure[1];
    // On the CPU both arms are the same compositions: bit for bit.
    EXPECT_EQ(d.buckets[0].max_abs_error[1], 0.0) << d.site;
    chosen += d.collapsed_to == 1;
  }
  EXPECT_EQ(chosen, kLayers);
  const std::vector<NodeId> fused = nodes_of(m.graph, Op::RmsNormMatMulSwiglu);
  EXPECT_EQ(fused.size(), static_cast<std::size_t>(kLayers));
  EXPECT_TRUE(nodes_of(m.graph, Op::SiluMulMatMulAdd).empty());
  EXPECT_TRUE(nodes_of(m.graph, Op::Silu).empty());
  EXPECT_TRUE(nodes_of(m.graph, Op::Branch).empty());
  for (NodeId id : fused) {
    EXPECT_TRUE(node_hints(m.graph, id, Device::cuda()).constant_b);
    EXPECT_EQ(weight_input(Op::RmsNormMatMulSwiglu), 2);
  }
}

Graph optimized(Fused fused) {
  DecodeModel m = tiny_llama();
  optimize_graph(m.graph, m.attention_specs, select_fused(&m.graph, fused, kKind), m.kda_specs,
                 m.layer_specs);
  const bool outer = fused != Fused::all_but_outer;
  EXPECT_EQ(nodes_of(m.graph, Op::RmsNormMatMulSwiglu).size(),
            outer ? static_cast<std::size_t>(kLayers) : 0u);
  return std::move(m.graph);
}

Tensor step_tokens(std::int64_t step) {
  Tensor tokens = Tensor::empty({1}, DType::i32);
  tokens.data<std::int32_t>()[0] = static_cast<std::int32_t>(step * 7 % 61);
  return tokens;
}

// Every fused arm chosen, with the combined arm and without it (the gate|up product's fused arm
// and the primitive Silu -> Mul in its place): bit for bit.
TEST(SwigluGraph, CombinedArmSessionIsBitwiseTheInnerFusedArm) {
  Session combined(optimized(Fused::all)), inner(optimized(Fused::all_but_outer));
  for (std::int64_t step = 1; step <= 6; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    combined.step({{"k_len", step}}, {{"tokens", step_tokens(step)}});
    inner.step({{"k_len", step}}, {{"tokens", step_tokens(step)}});
    EXPECT_TRUE(testing::bit_equal(combined.output("logits"), inner.output("logits")));
  }
}

// Only the combined arm chosen (every other branch collapsed to arm 0): bit for bit the
// unoptimized model (the CPU op is the composition of two ops bitwise their regions).
TEST(SwigluGraph, OptimizedModelWithTheCombinedArmIsBitwiseTheUnoptimizedOne) {
  Session combined(optimized(Fused::only_outer)), plain(tiny_llama().graph);
  for (std::int64_t step = 1; step <= 6; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    combined.step({{"k_len", step}}, {{"tokens", step_tokens(step)}});
    plain.step({{"k_len", step}}, {{"tokens", step_tokens(step)}});
    EXPECT_TRUE(testing::bit_equal(combined.output("logits"), plain.output("logits")));
  }
}

// Offered and not selected (the outer branches holding the inner ones): arm 0 everywhere, bit for
// bit the unoptimized model.
TEST(SwigluGraph, UnselectedNestedBranchesRunArmZero) {
  DecodeModel m = tiny_llama();
  optimize_graph(m.graph, m.attention_specs, offer_only(), m.kda_specs, m.layer_specs);
  ASSERT_EQ(branches_of(m.graph, kKind).size(), static_cast<std::size_t>(kLayers));
  Session offered(std::move(m.graph)), plain(tiny_llama().graph);
  for (std::int64_t step = 1; step <= 4; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    offered.step({{"k_len", step}}, {{"tokens", step_tokens(step)}});
    plain.step({{"k_len", step}}, {{"tokens", step_tokens(step)}});
    EXPECT_TRUE(testing::bit_equal(offered.output("logits"), plain.output("logits")));
  }
}

}  // namespace
}  // namespace splice
