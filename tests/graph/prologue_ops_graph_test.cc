// The two prologue products on the graph side (Op::RmsNormMatMul, Op::SiluMulMatMulAdd):
//  1. layers::norm_project emits rms_norm(h) -> stacked matmul as ONE region with a
//     rms_norm_matmul LayerOpSpec (and no rms_norm spec of its own); layers::swiglu_down_residual
//     emits silu(gate) * up -> down_proj -> + h as one region with a silu_mul_matmul_add spec;
//     without stacking, a bias or a spec sink they fall back to the separate specs.
//  2. Offer + collapse: rms_norm_matmul's fused arm is bitwise its region on the CPU (the CPU
//     kernel is the region's two kernels); silu_mul_matmul_add rounds once where its region
//     rounds the product first (within the matmul_add tolerance); the collapsed graph holds one
//     fused node per spec and none of the regions' primitives.
//  3. optimize_graph verifies, chooses and collapses both (rms_norm_matmul with max error 0);
//     eps is part of the tuning key.
//  4. Declines (op not in the row, activation / residual / weight dtype not taken) say why and
//     leave the graph byte-identical; malformed specs and ill-typed nodes are GraphErrors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "splice/core/error.h"
#include "splice/exec/session.h"
#include "splice/model/model.h"
#include "splice/ops/layer_ops.h"
#include "splice/tune/optimize.h"
#include "support/graph_test_util.h"
#include "support/test_util.h"

namespace splice {
namespace {

constexpr std::int64_t kHidden = 96, kInter = 80;
constexpr float kEps = 1e-5f;

struct Region {
  Graph graph;
  std::vector<LayerOpSpec> specs;
};

// Weights of `layers` MLP blocks: l.norm [H], l.gate / l.up [I, H], l.down [H, I].
Weights mlp_weights(DType dtype, int layers) {
  Rng rng(21);
  std::vector<std::pair<std::string, Tensor>> t;
  for (int l = 0; l < layers; ++l) {
    const std::string p = "l" + std::to_string(l) + ".";
    t.emplace_back(p + "norm", testing::random_tensor(rng, {kHidden}, dtype, 0.3, 1.0));
    t.emplace_back(p + "gate.weight", testing::random_tensor(rng, {kInter, kHidden}, dtype, 0.2));
    t.emplace_back(p + "up.weight", testing::random_tensor(rng, {kInter, kHidden}, dtype, 0.2));
    t.emplace_back(p + "down", testing::random_tensor(rng, {kHidden, kInter}, dtype, 0.1));
  }
  return Weights::from_tensors(std::move(t));
}

// h [2, 1, H] through `layers` Llama MLP blocks: h += down(silu(gate) * up), gate|up =
// rms_norm(h) @ W_gate_up^T (stacked when `stack`); eps_list[l] per layer (default kEps).
Region mlp_region(DType dtype, int layers = 1, bool stack = true, bool sink = true,
                  std::vector<float> eps_list = {}) {
  Region r;
  Graph& g = r.graph;
  const Weights w = mlp_weights(dtype, layers);
  NodeId h = g.input("h", {SymExpr(2), SymExpr(1), SymExpr(kHidden)}, dtype);
  std::vector<LayerOpSpec>* specs = sink ? &r.specs : nullptr;
  for (int l = 0; l < layers; ++l) {
    const std::string p = "l" + std::to_string(l) + ".";
    const float eps = l < static_cast<int>(eps_list.size()) ? eps_list[l] : kEps;
    const NodeId norm = g.param(p + "norm", w.get(p + "norm", dtype));
    const std::vector<NodeId> gate_up = layers::norm_project(
        g, w, dtype, stack, h, norm, eps, kHidden, p + "gate_up.",
        {{p + "gate.", kInter}, {p + "up.", kInter}}, false, {}, specs, p + "norm");
    h = layers::swiglu_down_residual(g, h, gate_up[0], gate_up[1],
                                     g.param(p + "down", w.get(p + "down", dtype)), specs,
                                     p + "mlp", p + "down_proj", p + "residual");
  }
  g.mark_output("y", h);
  return r;
}

TensorMap inputs_for(const Graph& g, std::uint64_t seed) {
  return testing::random_inputs(g, seed, 2.0);
}

using testing::count_op;

// Offers every spec and collapses its branch to arm_of(kind) (0: the region), then runs once.
Tensor run_arms(Region r, int norm_arm, int silu_arm) {
  for (const LayerOpSpec& s : r.specs) {
    const OfferResult o = offer_layer_op_arm(r.graph, s, cpu_layer_ops_contract());
    EXPECT_TRUE(o.offered) << o.reason;
    collapse(r.graph, o.branch, s.kind == LayerOpKind::rms_norm_matmul ? norm_arm : silu_arm);
  }
  eliminate_dead_code(r.graph);
  verify_graph(r.graph);
  Session session(r.graph);
  session.step({}, inputs_for(r.graph, 5));
  return session.output("y").clone();
}

TEST(PrologueOpsGraph, BuildersEmitOneFusedSpecPerSite) {
  Region r = mlp_region(DType::bf16, 2);
  ASSERT_EQ(r.specs.size(), 4u);
  for (int l = 0; l < 2; ++l) {
    const LayerOpSpec& norm = r.specs[2 * l];
    const LayerOpSpec& silu = r.specs[2 * l + 1];
    EXPECT_EQ(norm.kind, LayerOpKind::rms_norm_matmul);
    EXPECT_EQ(norm.site, "l" + std::to_string(l) + ".norm");
    ASSERT_EQ(norm.inputs.size(), 3u);
    EXPECT_EQ(r.graph.node(norm.inputs[1]).op, Op::Param);  // the norm weight
    EXPECT_EQ(r.graph.node(norm.inputs[2]).op, Op::Param);  // the stacked gate|up weight
    EXPECT_EQ(norm.eps, kEps);
    EXPECT_EQ(r.graph.node(norm.decomposed_out).op, Op::MatMul);
    EXPECT_EQ(silu.kind, LayerOpKind::silu_mul_matmul_add);
    ASSERT_EQ(silu.inputs.size(), 4u);
    EXPECT_EQ(r.graph.node(silu.inputs[0]).op, Op::Slice);  // gate: a view of the merge
    EXPECT_EQ(r.graph.node(silu.inputs[1]).op, Op::Slice);  // up
    EXPECT_EQ(r.graph.node(silu.decomposed_out).op, Op::Add);
  }
  // Without stacking the norm keeps its own rms_norm spec (the product is one matmul per
  // linear); the SwiGLU tail does not depend on stacking.
  Region plain = mlp_region(DType::bf16, 1, /*stack=*/false);
  ASSERT_EQ(plain.specs.size(), 2u);
  EXPECT_EQ(plain.specs[0].kind, LayerOpKind::rms_norm);
  EXPECT_EQ(plain.specs[1].kind, LayerOpKind::silu_mul_matmul_add);
  // A residual of another shape than the product (broadcast): the separate silu_mul and no
  // residual spec, exactly like swiglu_activation + linear_residual.
  {
    Region r2;
    Graph& g = r2.graph;
    Rng rng(4);
    const NodeId gate = g.input("gate", {SymExpr(2), SymExpr(1), SymExpr(kInter)}, DType::bf16);
    const NodeId up = g.input("up", {SymExpr(2), SymExpr(1), SymExpr(kInter)}, DType::bf16);
    const NodeId h = g.input("h", {SymExpr(kHidden)}, DType::bf16);
    const NodeId down =
        g.param("down", testing::random_tensor(rng, {kHidden, kInter}, DType::bf16, 0.1));
    g.mark_output("y", layers::swiglu_down_residual(g, h, gate, up, down, &r2.specs, "mlp"));
    ASSERT_EQ(r2.specs.size(), 1u);
    EXPECT_EQ(r2.specs[0].kind, LayerOpKind::silu_mul);
  }
  EXPECT_TRUE(mlp_region(DType::bf16, 1, true, /*sink=*/false).specs.empty());
  // Both builds compute the same function (arm 0): the regions are the same primitives.
  EXPECT_TRUE(testing::bit_equal(run_arms(mlp_region(DType::bf16, 2), 0, 0),
                                 run_arms(mlp_region(DType::bf16, 2, false), 0, 0)));
}

class PrologueOpArms : public ::testing::TestWithParam<DType> {};

TEST_P(PrologueOpArms, FusedArmsAgreeWithTheRegionsOnTheCpu) {
  const DType dtype = GetParam();
  {
    Region probe = mlp_region(dtype, 2);
    for (const LayerOpSpec& s : probe.specs) {
      const OfferResult o = offer_layer_op_arm(probe.graph, s, cpu_layer_ops_contract());
      ASSERT_TRUE(o.offered) << o.reason;
      collapse(probe.graph, o.branch, 1);
    }
    eliminate_dead_code(probe.graph);
    EXPECT_EQ(count_op(probe.graph, Op::RmsNormMatMul), 2);
    EXPECT_EQ(count_op(probe.graph, Op::SiluMulMatMulAdd), 2);
    EXPECT_EQ(count_op(probe.graph, Op::Rsqrt) + count_op(probe.graph, Op::Silu) +
                  count_op(probe.graph, Op::MatMul) + count_op(probe.graph, Op::Add),
              0);
    EXPECT_NE(print_graph(probe.graph).find("rms_norm_matmul"), std::string::npos);
  }
  // rms_norm_matmul alone, two layers: bitwise (the CPU kernel is the region's RmsNorm and
  // MatMul kernels).
  EXPECT_TRUE(testing::bit_equal(run_arms(mlp_region(dtype, 2), 1, 0),
                                 run_arms(mlp_region(dtype, 2), 0, 0)));
  // Both, one layer: silu_mul_matmul_add rounds once where the region rounds the product, then
  // the sum (the matmul_add tolerance; over several layers the one-ulp differences of h would
  // propagate through the next norm, so one layer keeps the bound tight).
  Tolerance tol = default_tolerance(dtype);
  if (dtype != DType::f32) tol.atol *= 4;
  const Tensor want = run_arms(mlp_region(dtype, 1), 0, 0);
  const Tensor got = run_arms(mlp_region(dtype, 1), 1, 1);
  EXPECT_TRUE(testing::close(got, want, tol));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, PrologueOpArms,
                         ::testing::Values(DType::bf16, DType::f16, DType::f32));

TEST(PrologueOpsGraph, OptimizeVerifiesChoosesAndCollapses) {
  Region r = mlp_region(DType::bf16, 2);
  OptimizeOptions opt;
  opt.tune.warmup = 0;
  opt.tune.repeats = 1;
  opt.tune.time_override = [](NodeId, int arm, std::int64_t) { return arm == 1 ? 1.0 : 2.0; };
  const DecisionLog log = optimize_graph(r.graph, {}, opt, {}, r.specs);
  ASSERT_EQ(log.entries().size(), 4u);
  for (const Decision& d : log.entries()) {
    EXPECT_TRUE(d.kind == "rms_norm_matmul" || d.kind == "silu_mul_matmul_add") << d.kind;
    EXPECT_TRUE(d.offered) << d.reason;
    ASSERT_EQ(d.buckets.size(), 1u);
    EXPECT_TRUE(d.buckets[0].verified[1]) << d.site << ": " << d.buckets[0].failure[1];
    if (d.kind == "rms_norm_matmul") {
      EXPECT_EQ(d.buckets[0].max_abs_error[1], 0.0) << d.site;
    }
    EXPECT_EQ(d.collapsed_to, 1) << d.site;
  }
  EXPECT_EQ(count_op(r.graph, Op::Branch), 0);
  EXPECT_EQ(count_op(r.graph, Op::RmsNormMatMul), 2);
  EXPECT_EQ(count_op(r.graph, Op::SiluMulMatMulAdd), 2);
  Session s(r.graph);
  s.step({}, inputs_for(r.graph, 7));
  for (std::int64_t i = 0; i < s.output("y").numel(); ++i)
    EXPECT_TRUE(std::isfinite(s.output("y").at_linear(i)));
}

TEST(PrologueOpsGraph, EpsIsPartOfTheTuningKey) {
  Region r = mlp_region(DType::bf16, 3, true, true, {kEps, kEps, 1e-6f});
  OptimizeOptions opt;
  opt.tune.warmup = 0;
  opt.tune.repeats = 1;
  const DecisionLog log = optimize_graph(r.graph, {}, opt, {}, r.specs);
  std::vector<const Decision*> norms;
  for (const Decision& d : log.entries())
    if (d.kind == "rms_norm_matmul") norms.push_back(&d);
  ASSERT_EQ(norms.size(), 3u);
  EXPECT_FALSE(norms[0]->buckets.at(0).from_cache);
  EXPECT_TRUE(norms[1]->buckets.at(0).from_cache);   // same shapes, same eps
  EXPECT_FALSE(norms[2]->buckets.at(0).from_cache);  // eps 1e-6 is measured anew
}

TEST(PrologueOpsGraph, DeclinesLeaveTheGraphUntouchedAndSayWhy) {
  Region r = mlp_region(DType::bf16);
  const std::string before = print_graph(r.graph);
  LayerOpContract without = cpu_layer_ops_contract();
  without.ops = {LayerOpKind::rms_norm, LayerOpKind::silu_mul, LayerOpKind::matmul_add};
  DecisionLog log;
  for (const LayerOpSpec& s : r.specs) {
    const OfferResult o = offer_layer_op_arm(r.graph, s, without, &log);
    EXPECT_FALSE(o.offered);
    EXPECT_NE(o.reason.find(std::string("does not implement ") + layer_op_name(s.kind)),
              std::string::npos)
        << o.reason;
  }
  ASSERT_EQ(log.entries().size(), 2u);
  EXPECT_FALSE(log.entries()[0].offered);
  LayerOpContract f32_only = cpu_layer_ops_contract();
  f32_only.dtypes = {DType::f32};
  for (const LayerOpSpec& s : r.specs) {
    const OfferResult o = offer_layer_op_arm(r.graph, s, f32_only);
    EXPECT_FALSE(o.offered);
    EXPECT_NE(o.reason.find("does not take dtype bf16"), std::string::npos) << o.reason;
  }
  EXPECT_EQ(print_graph(r.graph), before);

  // A residual (silu_mul_matmul_add's c) and a projection weight (rms_norm_matmul's w) the row
  // does not take, named in the reason.
  Graph g;
  const SymExpr two(2), k(kHidden), n(kInter);
  const NodeId a = g.input("a", {two, k}, DType::bf16);
  const NodeId b = g.input("b", {two, k}, DType::bf16);
  const NodeId w = g.input("w", {n, k}, DType::bf16);
  const NodeId c = g.input("c", {two, n}, DType::f32);
  const NodeId act = g.binary(Op::Mul, g.unary(Op::Silu, a), b);
  const NodeId sum =
      g.binary(Op::Add, c, g.cast(g.matmul(act, w, /*transpose_b=*/true), DType::f32));
  const NodeId merge = g.reshape(sum, g.node(sum).shape);
  const NodeId x = g.input("x", {two, k}, DType::bf16);
  const NodeId nw = g.input("nw", {k}, DType::bf16);
  const NodeId w32 = g.input("w32", {n, k}, DType::f32);
  const NodeId normed = layers::rms_norm(g, x, nw, kEps, DType::f32);
  const NodeId prod = g.matmul(normed, w32, /*transpose_b=*/true);
  const NodeId merge2 = g.reshape(prod, g.node(prod).shape);
  g.mark_output("y", merge);
  g.mark_output("z", merge2);
  LayerOpContract bf16_only = cpu_layer_ops_contract();
  bf16_only.dtypes = {DType::bf16};
  LayerOpSpec silu{LayerOpKind::silu_mul_matmul_add, {a, b, w, c}, 0.0f, sum, merge, "s"};
  const std::string silu_reason = layer_op_gate(g, silu, bf16_only);
  EXPECT_NE(silu_reason.find("does not take a residual of dtype f32"), std::string::npos)
      << silu_reason;
  LayerOpSpec norm{LayerOpKind::rms_norm_matmul, {x, nw, w32}, kEps, prod, merge2, "n"};
  const std::string norm_reason = layer_op_gate(g, norm, bf16_only);
  EXPECT_NE(norm_reason.find("does not take a weight of dtype f32"), std::string::npos)
      << norm_reason;
  EXPECT_TRUE(offer_layer_op_arm(g, silu, cpu_layer_ops_contract()).offered);
  EXPECT_TRUE(offer_layer_op_arm(g, norm, cpu_layer_ops_contract()).offered);
}

TEST(PrologueOpsGraph, MalformedSpecsAndNodesAreGraphErrors) {
  Region r = mlp_region(DType::bf16);
  const LayerOpContract& row = cpu_layer_ops_contract();
  const LayerOpSpec norm = r.specs[0], silu = r.specs[1];
  LayerOpSpec bad = norm;
  bad.inputs.pop_back();
  EXPECT_THROW(offer_layer_op_arm(r.graph, bad, row), GraphError);
  bad = norm;
  bad.inputs[1] = bad.inputs[2];  // norm weight [2I, H] is not [H]
  EXPECT_THROW(offer_layer_op_arm(r.graph, bad, row), GraphError);
  bad = norm;
  bad.inputs[2] = bad.inputs[1];  // w [H] is not [N, K]
  EXPECT_THROW(offer_layer_op_arm(r.graph, bad, row), GraphError);
  bad = norm;
  bad.eps = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(offer_layer_op_arm(r.graph, bad, row), GraphError);
  bad = norm;
  bad.reconverge = bad.inputs[0];  // not the sole consumer of decomposed_out
  EXPECT_THROW(offer_layer_op_arm(r.graph, bad, row), GraphError);
  bad = silu;
  bad.inputs[3] = bad.inputs[0];  // c [2, 1, I] is not the product's [2, 1, H]
  EXPECT_THROW(offer_layer_op_arm(r.graph, bad, row), GraphError);
  bad = silu;
  bad.inputs[2] = norm.inputs[2];  // w [2I, H]: K = H is not a's I
  EXPECT_THROW(offer_layer_op_arm(r.graph, bad, row), GraphError);
  bad = silu;
  bad.kind = LayerOpKind::rms_norm_matmul;  // three inputs expected
  EXPECT_THROW(offer_layer_op_arm(r.graph, bad, row), GraphError);
  EXPECT_TRUE(offer_layer_op_arm(r.graph, norm, row).offered);
  EXPECT_TRUE(offer_layer_op_arm(r.graph, silu, row).offered);

  Graph g;
  const NodeId x = g.input("x", {SymExpr(3), SymExpr(8)}, DType::bf16);
  const NodeId nw = g.input("nw", {SymExpr(8)}, DType::f32);
  const NodeId w = g.input("w", {SymExpr(5), SymExpr(8)}, DType::bf16);
  const NodeId c = g.input("c", {SymExpr(3), SymExpr(5)}, DType::f32);
  const NodeId y = g.rms_norm_matmul(x, nw, w, 1e-6f, DType::bf16);
  EXPECT_EQ(g.node(y).dtype, DType::bf16);
  EXPECT_EQ(sym_shape_str(g.node(y).shape), sym_shape_str({SymExpr(3), SymExpr(5)}));
  EXPECT_NE(print_graph(g).find("rms_norm_matmul"), std::string::npos);
  EXPECT_NE(print_graph(g).find("eps="), std::string::npos);
  EXPECT_THROW(g.rms_norm_matmul(x, w, w, 1e-6f, DType::bf16), GraphError);    // weight not [K]
  EXPECT_THROW(g.rms_norm_matmul(nw, nw, w, 1e-6f, DType::bf16), GraphError);  // x rank 1
  const NodeId z = g.silu_mul_matmul_add(x, x, w, c, DType::bf16);
  EXPECT_EQ(sym_shape_str(g.node(z).shape), sym_shape_str({SymExpr(3), SymExpr(5)}));
  EXPECT_THROW(g.silu_mul_matmul_add(x, x, w, x, DType::bf16), GraphError);  // c not [3, 5]
  const NodeId w32 = g.input("w32", {SymExpr(5), SymExpr(8)}, DType::f32);
  EXPECT_THROW(g.silu_mul_matmul_add(x, x, w32, c, DType::bf16), GraphError);  // w dtype
  verify_graph(g);
}

}  // namespace
}  // namespace splice
