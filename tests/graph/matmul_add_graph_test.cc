// The MatMulAdd layer op on the graph side: layers::linear_residual emits residual + x @ W^T with
// a matmul_add LayerOpSpec (none with a bias or a broadcasting residual), layers::linear with a
// bias x @ W^T + bias with one whose c is the bias (broadcast by the fused op); the offer splices
// Op::MatMulAdd as arm 1 and both arms agree within the matmul_add tolerance on the CPU (the
// fused arm rounds once where the region rounds the product first); optimize_graph verifies and
// chooses it; declines leave the graph byte-identical; malformed specs and ill-typed nodes are
// GraphErrors.
#include <gtest/gtest.h>

#include <cmath>

#include "splice/core/error.h"
#include "splice/exec/session.h"
#include "splice/model/model.h"
#include "splice/ops/layer_ops.h"
#include "splice/tune/optimize.h"
#include "support/graph_test_util.h"
#include "support/test_util.h"

namespace splice {
namespace {

constexpr std::int64_t kIn = 96, kOut = 80;

struct Region {
  Graph graph;
  std::vector<LayerOpSpec> specs;
};

// y = h + x_l @ W_l^T over x_l [2, 1, kIn], h [2, 1, kOut], for l < layers.
Region residual_region(DType dtype, int layers = 1, bool bias = false, bool broadcast = false) {
  Region r;
  Graph& g = r.graph;
  Rng rng(9);
  NodeId h = broadcast ? g.input("h", {SymExpr(kOut)}, dtype)
                       : g.input("h", {SymExpr(2), SymExpr(1), SymExpr(kOut)}, dtype);
  for (int l = 0; l < layers; ++l) {
    const std::string site = "layer" + std::to_string(l) + ".o_proj";
    const NodeId w =
        g.param("w" + std::to_string(l), testing::random_tensor(rng, {kOut, kIn}, dtype, 0.1));
    std::optional<NodeId> b;
    if (bias) b = g.param("b" + std::to_string(l), testing::random_tensor(rng, {kOut}, dtype));
    const NodeId x =
        g.input("x" + std::to_string(l), {SymExpr(2), SymExpr(1), SymExpr(kIn)}, dtype);
    h = layers::linear_residual(g, h, x, w, b, &r.specs, site, site + ".residual");
  }
  g.mark_output("y", h);
  return r;
}

TensorMap inputs_for(const Graph& g, std::uint64_t seed) { return testing::random_inputs(g, seed); }

using testing::count_op;

// One rounding instead of two (the fused arm rounds the product plus c once): the matmul_add
// tolerance, default atol x4 in 16-bit.
Tolerance matmul_add_tolerance(DType dtype) {
  Tolerance tol = default_tolerance(dtype);
  if (dtype != DType::f32) tol.atol *= 4;
  return tol;
}

// Optimizer options under which every fused arm times faster than its region (one repeat).
OptimizeOptions fused_arm_timed_faster() {
  OptimizeOptions opt;
  opt.tune.warmup = 0;
  opt.tune.repeats = 1;
  opt.tune.time_override = [](NodeId, int arm, std::int64_t) { return arm == 1 ? 1.0 : 2.0; };
  return opt;
}

Tensor run_arm(Region r, int arm) {
  for (const LayerOpSpec& s : r.specs) {
    const OfferResult o = offer_layer_op_arm(r.graph, s, cpu_layer_ops_contract());
    EXPECT_TRUE(o.offered) << o.reason;
    collapse(r.graph, o.branch, arm);
  }
  eliminate_dead_code(r.graph);
  verify_graph(r.graph);
  Session session(r.graph);
  session.step({}, inputs_for(r.graph, 3));
  return session.output("y").clone();
}

TEST(MatMulAddBranch, FusedArmAgreesWithTheRegionOnTheCpu) {
  for (DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    SCOPED_TRACE(dtype_name(dtype));
    Region probe = residual_region(dtype, 2);
    ASSERT_EQ(probe.specs.size(), 2u);
    for (const LayerOpSpec& s : probe.specs) {
      EXPECT_EQ(s.kind, LayerOpKind::matmul_add);
      const OfferResult o = offer_layer_op_arm(probe.graph, s, cpu_layer_ops_contract());
      ASSERT_TRUE(o.offered) << o.reason;
      collapse(probe.graph, o.branch, 1);
    }
    eliminate_dead_code(probe.graph);
    EXPECT_EQ(count_op(probe.graph, Op::MatMulAdd), 2);
    EXPECT_EQ(count_op(probe.graph, Op::MatMul), 0);
    EXPECT_EQ(count_op(probe.graph, Op::Add), 0);
    const Tensor want = run_arm(residual_region(dtype, 2), 0);
    const Tensor got = run_arm(residual_region(dtype, 2), 1);
    const Tolerance tol = matmul_add_tolerance(dtype);
    EXPECT_TRUE(testing::close(got, want, tol));
  }
}

TEST(MatMulAddBranch, OptimizeVerifiesChoosesAndCollapses) {
  Region r = residual_region(DType::bf16, 2);
  const OptimizeOptions opt = fused_arm_timed_faster();
  const DecisionLog log = optimize_graph(r.graph, {}, opt, {}, r.specs);
  ASSERT_EQ(log.entries().size(), 2u);
  for (const Decision& d : log.entries()) {
    EXPECT_EQ(d.kind, "matmul_add");
    EXPECT_TRUE(d.offered) << d.reason;
    ASSERT_EQ(d.buckets.size(), 1u);
    EXPECT_TRUE(d.buckets[0].verified[1]) << d.site << ": " << d.buckets[0].failure[1];
    EXPECT_EQ(d.collapsed_to, 1) << d.site;
  }
  EXPECT_EQ(count_op(r.graph, Op::Branch), 0);
  EXPECT_EQ(count_op(r.graph, Op::MatMulAdd), 2);
  Session s(r.graph);
  s.step({}, inputs_for(r.graph, 7));
  for (std::int64_t i = 0; i < s.output("y").numel(); ++i)
    EXPECT_TRUE(std::isfinite(s.output("y").at_linear(i)));
}

TEST(MatMulAddBranch, NoSpecWithABiasOrABroadcastResidual) {
  EXPECT_TRUE(residual_region(DType::bf16, 1, /*bias=*/true).specs.empty());
  EXPECT_TRUE(residual_region(DType::bf16, 1, false, /*broadcast=*/true).specs.empty());
}

// A biased linear with specs (layers::linear): x @ W^T + bias is a matmul_add region whose c is
// the bias [kOut], broadcast over the rows by the fused op; both arms agree on the CPU, and the
// optimizer verifies and chooses the fused arm.
TEST(MatMulAddBranch, BiasedLinearIsARegionWithABroadcastBias) {
  for (DType dtype : {DType::bf16, DType::f32}) {
    SCOPED_TRACE(dtype_name(dtype));
    const auto build = [&] {
      Region r;
      Rng rng(11);
      const NodeId w = r.graph.param("w", testing::random_tensor(rng, {kOut, kIn}, dtype, 0.1));
      const NodeId b = r.graph.param("b", testing::random_tensor(rng, {kOut}, dtype));
      const NodeId x = r.graph.input("x", {SymExpr(3), SymExpr(kIn)}, dtype);  // [3, kIn]
      r.graph.mark_output("y", layers::linear(r.graph, x, w, b, &r.specs, "gate"));
      return r;
    };
    Region probe = build();
    ASSERT_EQ(probe.specs.size(), 1u);
    EXPECT_EQ(probe.specs[0].kind, LayerOpKind::matmul_add);
    EXPECT_EQ(probe.graph.node(probe.specs[0].inputs[2]).shape.size(), 1u);  // c: the bias
    const Tolerance tol = matmul_add_tolerance(dtype);
    EXPECT_TRUE(testing::close(run_arm(build(), 1), run_arm(build(), 0), tol));
    Region r = build();
    const OptimizeOptions opt = fused_arm_timed_faster();
    const DecisionLog log = optimize_graph(r.graph, {}, opt, {}, r.specs);
    ASSERT_EQ(log.entries().size(), 1u);
    EXPECT_EQ(log.entries()[0].collapsed_to, 1) << log.entries()[0].reason;
    EXPECT_EQ(count_op(r.graph, Op::MatMulAdd), 1);
    EXPECT_EQ(count_op(r.graph, Op::Add), 0);
  }
}

TEST(MatMulAddBranch, DeclinesLeaveTheGraphUntouchedAndSayWhy) {
  Region r = residual_region(DType::bf16);
  const std::string before = print_graph(r.graph);
  LayerOpContract without = cpu_layer_ops_contract();
  without.ops = {LayerOpKind::rms_norm, LayerOpKind::silu_mul, LayerOpKind::rope};
  OfferResult o = offer_layer_op_arm(r.graph, r.specs[0], without);
  EXPECT_FALSE(o.offered);
  EXPECT_NE(o.reason.find("does not implement matmul_add"), std::string::npos) << o.reason;
  LayerOpContract f32_only = cpu_layer_ops_contract();
  f32_only.dtypes = {DType::f32};
  o = offer_layer_op_arm(r.graph, r.specs[0], f32_only);
  EXPECT_FALSE(o.offered);
  EXPECT_NE(o.reason.find("does not take dtype bf16"), std::string::npos) << o.reason;
  EXPECT_EQ(print_graph(r.graph), before);
}

TEST(MatMulAddBranch, MalformedSpecsAndNodesAreGraphErrors) {
  Region r = residual_region(DType::bf16);
  const LayerOpSpec good = r.specs[0];
  const LayerOpContract& row = cpu_layer_ops_contract();
  LayerOpSpec bad = good;
  bad.inputs.pop_back();
  EXPECT_THROW(offer_layer_op_arm(r.graph, bad, row), GraphError);
  bad = good;
  bad.inputs[2] = bad.inputs[0];  // c [2, 1, kIn] is not the product's [2, 1, kOut]
  EXPECT_THROW(offer_layer_op_arm(r.graph, bad, row), GraphError);
  bad = good;
  bad.inputs[1] = bad.inputs[0];  // b must be [N, K]
  EXPECT_THROW(offer_layer_op_arm(r.graph, bad, row), GraphError);
  EXPECT_TRUE(offer_layer_op_arm(r.graph, good, row).offered);

  Graph g;
  const NodeId a = g.input("a", {SymExpr(3), SymExpr(8)}, DType::bf16);
  const NodeId b = g.input("b", {SymExpr(5), SymExpr(8)}, DType::bf16);
  const NodeId c = g.input("c", {SymExpr(3), SymExpr(5)}, DType::f32);
  const NodeId y = g.matmul_add(a, b, c, DType::bf16);
  EXPECT_EQ(g.node(y).dtype, DType::bf16);
  EXPECT_EQ(g.node(y).shape.size(), 2u);
  EXPECT_NE(print_graph(g).find("matmul_add"), std::string::npos);
  EXPECT_THROW(g.matmul_add(a, a, c, DType::bf16), GraphError);  // b [3, 8]: product [3, 3]
  // c broadcasts to the product: a bias [5] or [1, 5]; not [2, 5] nor [1, 3, 5].
  EXPECT_EQ(g.node(g.matmul_add(a, b, g.input("bias", {SymExpr(5)}, DType::f32), DType::bf16))
                .shape.size(),
            2u);
  (void)g.matmul_add(a, b, g.input("bias_row", {SymExpr(1), SymExpr(5)}, DType::f32), DType::bf16);
  EXPECT_THROW(g.matmul_add(a, b, g.input("c2", {SymExpr(2), SymExpr(5)}, DType::f32), DType::bf16),
               GraphError);
  EXPECT_THROW(g.matmul_add(a, b, g.input("c3", {SymExpr(1), SymExpr(3), SymExpr(5)}, DType::f32),
                            DType::bf16),
               GraphError);
  const NodeId b32 = g.input("b32", {SymExpr(5), SymExpr(8)}, DType::f32);
  EXPECT_THROW(g.matmul_add(a, b32, c, DType::bf16), GraphError);  // a and b differ in dtype
  verify_graph(g);
}

}  // namespace
}  // namespace splice
