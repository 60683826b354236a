// The rms_norm_matmul_rope_kv_append region of the Llama builder (stacked projections): per
// layer an outer LayerOpSpec whose region spans the q|k|v product's rms_norm_matmul region and
// the rope_kv_append region (diverging at h, decomposed_out the rope_kv_append merge), so both
// inner branches stay inside its arm 0, the oracle; its fused arm is one
// Op::RmsNormMatMulRopeKvAppend writing both caches in place.
//
//  1. Specs: one outer spec per layer after its two inner ones, inputs {h, norm_weight, w, cos,
//     sin, position, k_cache, v_cache} taken from them.
//  2. Offer (CPU row): the outer branch's arm 0 holds both inner branches (nested branches); the
//     spec validation rejects malformed specs (GraphError); a contract without the op, or the
//     CUDA row on an f32 model, declines the outer spec with a reason and keeps both inner arms.
//  3. Select: the inner branches are verified and collapsed first, then the outer one is verified
//     against the collapsed inner path (output and both caches) and, timed faster, chosen: one
//     fused node per layer, no RopeKvAppend left; the plan runs it before attention reads the
//     caches.
//     On a CUDA session the fused node gets constant_b and stable_position, and attention keeps
//     its stable-prefix promise (the fused node appends at k_len - 1).
//  4. Sessions over 6 steps, logits and caches bit for bit: every fused arm chosen with the
//     combined arm vs without it (the inner fused arms instead); only the combined arm chosen vs
//     the unoptimized model; offered and not selected (nested branches kept) vs the unoptimized
//     model.
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
constexpr const char* kKind = "rms_norm_matmul_rope_kv_append";

DecodeModel tiny_llama(DType dtype = DType::bf16) {
  return testing::rope_kv_append_llama(testing::process_temp_path("qkv_rope_llama"), dtype);
}

using testing::arm0_branches;
using testing::branches_of;
using testing::Fused;
using testing::nodes_of;
using testing::offer_only;
using testing::select_fused;

TEST(QkvRopeGraph, OneOuterSpecPerLayerAfterItsInnerSpecs) {
  const DecodeModel m = tiny_llama();
  int outer = 0;
  for (std::size_t i = 0; i < m.layer_specs.size(); ++i) {
    const LayerOpSpec& s = m.layer_specs[i];
    if (s.kind != LayerOpKind::rms_norm_matmul_rope_kv_append) continue;
    ++outer;
    ASSERT_GE(i, 2u);
    const LayerOpSpec& rope = m.layer_specs[i - 1];
    const LayerOpSpec& product = m.layer_specs[i - 2];
    ASSERT_EQ(rope.kind, LayerOpKind::rope_kv_append);
    ASSERT_EQ(product.kind, LayerOpKind::rms_norm_matmul);
    ASSERT_EQ(s.inputs.size(), 8u);
    EXPECT_EQ(s.inputs[0], product.inputs[0]);  // h
    EXPECT_EQ(s.inputs[1], product.inputs[1]);  // norm weight
    EXPECT_EQ(s.inputs[2], product.inputs[2]);  // stacked q|k|v weight
    for (int j = 1; j < 6; ++j) EXPECT_EQ(s.inputs[2 + j], rope.inputs[j]);
    EXPECT_EQ(s.decomposed_out, rope.reconverge);
    EXPECT_EQ(s.eps, product.eps);
  }
  EXPECT_EQ(outer, kLayers);
}

TEST(QkvRopeGraph, OfferedWithBothInnerBranchesInItsArmZero) {
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
    int inner_rope = 0, inner_product = 0;
    for (NodeId n : arm0_branches(m.graph, b)) {
      const std::string& kind = m.graph.node(n).attrs.branch->recipe.kind;
      inner_rope += kind == "rope_kv_append";
      inner_product += kind == "rms_norm_matmul";
      EXPECT_LT(n.index, b.index) << "inner branches are selected first (node order)";
    }
    EXPECT_EQ(inner_rope, 1);
    EXPECT_EQ(inner_product, 1);
    const Node& fused = m.graph.node(branch.inputs[1]);
    EXPECT_EQ(fused.op, Op::RmsNormMatMulRopeKvAppend);
  }
  EXPECT_EQ(nodes_of(m.graph, Op::RmsNormMatMulRopeKvAppend).size(),
            static_cast<std::size_t>(kLayers));
}

TEST(QkvRopeGraph, MalformedSpecsAreGraphErrors) {
  DecodeModel m = tiny_llama();
  LayerOpSpec spec;
  for (const LayerOpSpec& s : m.layer_specs)
    if (s.kind == LayerOpKind::rms_norm_matmul_rope_kv_append) spec = s;
  const LayerOpContract& row = cpu_layer_ops_contract();
  {
    LayerOpSpec bad = spec;
    bad.inputs.pop_back();
    EXPECT_THROW(offer_layer_op_arm(m.graph, bad, row), GraphError);
  }
  {
    LayerOpSpec bad = spec;
    bad.inputs[6] = bad.inputs[0];  // k_cache not a state buffer
    EXPECT_THROW(offer_layer_op_arm(m.graph, bad, row), GraphError);
  }
  {
    LayerOpSpec bad = spec;
    std::swap(bad.inputs[3], bad.inputs[5]);  // position where cos goes
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

// Offers the specs in order on `row`; returns the outer specs' decisions.
std::vector<Decision> offer_all(DecodeModel& m, const LayerOpContract& row) {
  DecisionLog log;
  for (const LayerOpSpec& s : m.layer_specs) offer_layer_op_arm(m.graph, s, row, &log);
  verify_graph(m.graph);
  std::vector<Decision> out;
  for (const Decision& d : log.entries())
    if (d.kind == kKind) out.push_back(d);
  return out;
}

TEST(QkvRopeGraph, DeclinedWithAReasonKeepingTheInnerArms) {
  {
    SCOPED_TRACE("a row without the op");
    DecodeModel m = tiny_llama();
    LayerOpContract row = cpu_layer_ops_contract();
    std::erase(row.ops, LayerOpKind::rms_norm_matmul_rope_kv_append);
    const auto decisions = offer_all(m, row);
    ASSERT_EQ(decisions.size(), static_cast<std::size_t>(kLayers));
    for (const Decision& d : decisions) {
      EXPECT_FALSE(d.offered);
      EXPECT_NE(d.reason.find("does not implement rms_norm_matmul_rope_kv_append"),
                std::string::npos)
          << d.reason;
    }
    EXPECT_TRUE(branches_of(m.graph, kKind).empty());
    EXPECT_EQ(branches_of(m.graph, "rope_kv_append").size(), static_cast<std::size_t>(kLayers));
    EXPECT_GE(branches_of(m.graph, "rms_norm_matmul").size(), static_cast<std::size_t>(kLayers));
  }
  {
    SCOPED_TRACE("the CUDA row's limits on an f32 model");
    DecodeModel m = tiny_llama(DType::f32);
    const auto decisions = offer_all(m, cuda_layer_ops_contract());
    ASSERT_EQ(decisions.size(), static_cast<std::size_t>(kLayers));
    for (const Decision& d : decisions) {
      EXPECT_FALSE(d.offered);
      EXPECT_NE(d.reason.find("takes no `x` of dtype f32"), std::string::npos) << d.reason;
    }
    EXPECT_EQ(branches_of(m.graph, "rope_kv_append").size(), static_cast<std::size_t>(kLayers));
  }
  {
    SCOPED_TRACE("a row whose K limit the model exceeds");
    DecodeModel m = tiny_llama();
    LayerOpContract row = cuda_layer_ops_contract();
    row.qkv_rope_max_k = 64;  // the model's hidden size is 128
    for (const Decision& d : offer_all(m, row)) {
      EXPECT_FALSE(d.offered);
      EXPECT_NE(d.reason.find("takes K <= 64, got 128"), std::string::npos) << d.reason;
    }
  }
  {
    SCOPED_TRACE("the CUDA row on the bf16 model: offered");
    DecodeModel m = tiny_llama();
    for (const Decision& d : offer_all(m, cuda_layer_ops_contract()))
      EXPECT_TRUE(d.offered) << d.reason;
  }
}

TEST(QkvRopeGraph, VerifiedAgainstTheCollapsedInnerArmsAndChosen) {
  DecodeModel m = tiny_llama();
  const DecisionLog log =
      optimize_graph(m.graph, m.attention_specs, select_fused(&m.graph, Fused::all, kKind),
                     m.kda_specs, m.layer_specs);
  int chosen = 0, inner_chosen = 0;
  for (const Decision& d : log.entries()) {
    if (d.kind == "rope_kv_append") inner_chosen += d.collapsed_to == 1;
    if (d.kind != kKind) continue;
    ASSERT_EQ(d.buckets.size(), 1u) << d.site;
    ASSERT_EQ(d.buckets[0].verified.size(), 2u);
    EXPECT_TRUE(d.buckets[0].verified[1]) << d.site << ": " << d.buckets[0].failure[1];
    // On the CPU both arms are the same compositions: bit for bit.
    EXPECT_EQ(d.buckets[0].max_abs_error[1], 0.0) << d.site;
    chosen += d.collapsed_to == 1;
  }
  EXPECT_EQ(chosen, kLayers);
  EXPECT_EQ(inner_chosen, kLayers);  // selected (and collapsed) before the outer branch
  EXPECT_EQ(nodes_of(m.graph, Op::RmsNormMatMulRopeKvAppend).size(),
            static_cast<std::size_t>(kLayers));
  EXPECT_TRUE(nodes_of(m.graph, Op::RopeKvAppend).empty());
  EXPECT_TRUE(nodes_of(m.graph, Op::Branch).empty());
  // The fused node runs before every reader of its caches (the flash arm's k and v inputs).
  const Plan plan = make_plan(m.graph);
  int readers = 0;
  for (NodeId w : nodes_of(m.graph, Op::RmsNormMatMulRopeKvAppend))
    for (NodeId r : nodes_of(m.graph, Op::FlashDecode))
      for (int input : {1, 2}) {
        const NodeId cache = plan.storage_root[m.graph.node(r).inputs[input].index];
        if (cache != m.graph.node(w).inputs[5 + input]) continue;
        ++readers;
        EXPECT_LT(plan.position[w.index], plan.position[r.index]);
      }
  EXPECT_EQ(readers, 2 * kLayers);
}

Graph optimized(Fused fused) {
  DecodeModel m = tiny_llama();
  optimize_graph(m.graph, m.attention_specs, select_fused(&m.graph, fused, kKind), m.kda_specs,
                 m.layer_specs);
  const bool outer = fused != Fused::all_but_outer;
  EXPECT_EQ(nodes_of(m.graph, Op::RmsNormMatMulRopeKvAppend).size(),
            outer ? static_cast<std::size_t>(kLayers) : 0u);
  EXPECT_EQ(nodes_of(m.graph, Op::RopeKvAppend).size(),
            outer ? 0u : static_cast<std::size_t>(kLayers));
  return std::move(m.graph);
}

Tensor step_tokens(std::int64_t step) {
  Tensor tokens = Tensor::empty({1}, DType::i32);
  tokens.data<std::int32_t>()[0] = static_cast<std::int32_t>(step * 7 % 61);
  return tokens;
}

const char* const kCaches[] = {"model.layers.0.k_cache", "model.layers.0.v_cache",
                               "model.layers.1.k_cache", "model.layers.1.v_cache"};

// Every fused arm chosen, with the combined arm and without it (the two inner fused arms in its
// place): bit for bit, logits and caches.
TEST(QkvRopeGraph, CombinedArmSessionIsBitwiseTheInnerFusedArms) {
  Session combined(optimized(Fused::all)), inner(optimized(Fused::all_but_outer));
  for (std::int64_t step = 1; step <= 6; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    combined.step({{"k_len", step}}, {{"tokens", step_tokens(step)}});
    inner.step({{"k_len", step}}, {{"tokens", step_tokens(step)}});
    EXPECT_TRUE(testing::bit_equal(combined.output("logits"), inner.output("logits")));
    for (const char* name : kCaches)
      EXPECT_TRUE(testing::bit_equal(combined.state(name), inner.state(name))) << name;
  }
}

// Only the combined arm chosen (its inner branches and every other branch collapsed to arm 0):
// bit for bit the unoptimized model (the CPU op is the composition of the two ops, which are
// bitwise their regions), logits and caches.
TEST(QkvRopeGraph, OptimizedModelWithTheCombinedArmIsBitwiseTheUnoptimizedOne) {
  Session combined(optimized(Fused::only_outer)), plain(tiny_llama().graph);
  for (std::int64_t step = 1; step <= 6; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    combined.step({{"k_len", step}}, {{"tokens", step_tokens(step)}});
    plain.step({{"k_len", step}}, {{"tokens", step_tokens(step)}});
    EXPECT_TRUE(testing::bit_equal(combined.output("logits"), plain.output("logits")));
    for (const char* name : kCaches)
      EXPECT_TRUE(testing::bit_equal(combined.state(name), plain.state(name))) << name;
  }
}

// The plan-time promises (exec/node_kernels.h) with the combined arm and attention's flash arm
// chosen: on a CUDA session the fused node streams its weight before the wait (constant_b: a
// Param), reads its position and tables there (stable_position: a SymValue, Param tables) and
// triggers the attention first (trigger_dependents_first), and each attention keeps its
// stable-prefix promise (the fused node appends at k_len - 1 like RopeKvAppend); on the CPU no
// position promise and no trigger.
TEST(QkvRopeGraph, PlanTimePromisesOfTheCombinedArm) {
  DecodeModel m = tiny_llama();
  optimize_graph(m.graph, m.attention_specs, offer_only(), m.kda_specs, m.layer_specs);
  for (NodeId id : m.graph.live_nodes()) {  // node order: inner branches first
    const Node& n = m.graph.node(id);
    if (n.op != Op::Branch || n.erased) continue;
    const std::string& kind = n.attrs.branch->recipe.kind;
    collapse(m.graph, id, kind == kKind || kind == "flash_decode" ? 1 : 0);
  }
  eliminate_dead_code(m.graph);
  verify_graph(m.graph);
  const Graph& g = m.graph;
  const std::vector<NodeId> fused = nodes_of(g, Op::RmsNormMatMulRopeKvAppend);
  ASSERT_EQ(fused.size(), static_cast<std::size_t>(kLayers));
  for (NodeId id : fused) {
    EXPECT_TRUE(node_hints(g, id, Device::cuda()).constant_b);
    EXPECT_TRUE(node_hints(g, id, Device::cuda()).stable_position);
    EXPECT_FALSE(node_hints(g, id, Device::cpu()).stable_position);
    // Its q feeds an attention that works before its wait (like RopeKvAppend's).
    EXPECT_TRUE(node_hints(g, id, Device::cuda()).trigger_dependents_first);
    EXPECT_FALSE(node_hints(g, id, Device::cpu()).trigger_dependents_first);
  }
  const std::vector<NodeId> flash = nodes_of(g, Op::FlashDecode);
  ASSERT_EQ(flash.size(), static_cast<std::size_t>(kLayers));
  for (NodeId id : flash) EXPECT_TRUE(node_hints(g, id, Device::cuda()).stable_kv_prefix);
}

// Offered and not selected (every branch kept, the outer ones holding the inner ones): a step
// runs arm 0 everywhere, bit for bit the unoptimized model.
TEST(QkvRopeGraph, UnselectedNestedBranchesRunArmZero) {
  DecodeModel m = tiny_llama();
  optimize_graph(m.graph, m.attention_specs, offer_only(), m.kda_specs, m.layer_specs);
  ASSERT_EQ(branches_of(m.graph, kKind).size(), static_cast<std::size_t>(kLayers));
  Session offered(std::move(m.graph)), plain(tiny_llama().graph);
  for (std::int64_t step = 1; step <= 4; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    offered.step({{"k_len", step}}, {{"tokens", step_tokens(step)}});
    plain.step({{"k_len", step}}, {{"tokens", step_tokens(step)}});
    EXPECT_TRUE(testing::bit_equal(offered.output("logits"), plain.output("logits")));
    for (const char* name : kCaches)
      EXPECT_TRUE(testing::bit_equal(offered.state(name), plain.state(name))) << name;
  }
}

}  // namespace
}  // namespace splice
