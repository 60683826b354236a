// The fused layer ops on the graph side: the regions layers::rms_norm, layers::swiglu (its
// activation) and layers::rope emit with their LayerOpSpecs; the offer (branch spliced, both arms
// agree bit for bit on the CPU), verification and choice through optimize_graph, declines that
// leave the graph byte-identical, malformed specs as GraphErrors, and the tuning-cache key (one
// measurement for identical layers, a new one when eps differs).
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

constexpr std::int64_t kHidden = 97, kInter = 48, kHeads = 3, kHeadDim = 64, kMaxSeq = 16;
constexpr float kEps = 1e-5f;

struct Region {
  Graph graph;
  std::vector<LayerOpSpec> specs;
};

// y = rms_norm(x) over x [2, 1, H] (one region per eps given).
Region norm_region(DType dtype, std::vector<float> eps_list = {kEps}) {
  Region r;
  Graph& g = r.graph;
  Rng rng(1);
  NodeId x = g.input("x", {SymExpr(2), SymExpr(1), SymExpr(kHidden)}, dtype);
  for (std::size_t i = 0; i < eps_list.size(); ++i) {
    const NodeId w =
        g.param("w" + std::to_string(i), testing::random_tensor(rng, {kHidden}, dtype, 0.1, 1.0));
    x = layers::rms_norm(g, x, w, eps_list[i], dtype, &r.specs, "n" + std::to_string(i));
  }
  g.mark_output("y", x);
  return r;
}

// y = swiglu(x) over x [1, 1, 32]: the spec covers silu(gate) * up.
Region swiglu_region(DType dtype) {
  Region r;
  Graph& g = r.graph;
  Rng rng(2);
  const SymExpr one(1);
  const NodeId x = g.input("x", {one, one, SymExpr(32)}, dtype);
  const NodeId gate = g.param("gate", testing::random_tensor(rng, {kInter, 32}, dtype, 0.5));
  const NodeId up = g.param("up", testing::random_tensor(rng, {kInter, 32}, dtype, 0.5));
  const NodeId down = g.param("down", testing::random_tensor(rng, {32, kInter}, dtype, 0.2));
  g.mark_output("y", layers::swiglu(g, x, gate, up, down, &r.specs, "mlp"));
  return r;
}

// y = rope(x) over heads viewed [1, H, 1, D] at position k_len - 1 (a SymValue node).
Region rope_region(DType dtype) {
  Region r;
  Graph& g = r.graph;
  Rng rng(3);
  const SymId k_len = g.declare_symbol("k_len", 1, kMaxSeq);
  const NodeId position =
      g.sym_value(DynScalar::Expr(DynScalar::Sym(k_len).expr() - 1), DType::i32);
  const NodeId cos = g.param("cos", testing::random_tensor(rng, {kMaxSeq, kHeadDim}, DType::f32));
  const NodeId sin = g.param("sin", testing::random_tensor(rng, {kMaxSeq, kHeadDim}, DType::f32));
  const NodeId x =
      g.input("x", {SymExpr(1), SymExpr(1), SymExpr(kHeads), SymExpr(kHeadDim)}, dtype);
  const NodeId heads = g.permute(x, {0, 2, 1, 3});
  g.mark_output("y", layers::rope(g, heads, cos, sin, position, &r.specs, "attn.q"));
  return r;
}

TensorMap inputs_for(const Graph& g, std::uint64_t seed) {
  return testing::random_inputs(g, seed, 2.0);
}

using testing::count_op;

// Offers every spec, collapses every branch to `arm`, runs `steps` positions.
std::vector<Tensor> run_arm(Region r, int arm, const std::vector<std::int64_t>& positions) {
  std::vector<NodeId> branches;
  for (const LayerOpSpec& s : r.specs) {
    const OfferResult o = offer_layer_op_arm(r.graph, s, cpu_layer_ops_contract());
    EXPECT_TRUE(o.offered) << o.reason;
    branches.push_back(o.branch);
  }
  verify_graph(r.graph);
  for (NodeId b : branches) collapse(r.graph, b, arm);
  eliminate_dead_code(r.graph);
  verify_graph(r.graph);
  Session session(r.graph);
  std::vector<Tensor> outs;
  for (std::int64_t p : positions) {
    SymBindings symbols;
    if (r.graph.symbols().size() > 0) symbols["k_len"] = p + 1;
    session.step(symbols, inputs_for(r.graph, 40 + static_cast<std::uint64_t>(p)));
    outs.push_back(session.output("y").clone());
  }
  return outs;
}

class LayerOpArms : public ::testing::TestWithParam<DType> {};

TEST_P(LayerOpArms, FusedArmsAreBitwiseTheDecomposedArmsOnTheCpu) {
  const DType dtype = GetParam();
  const std::vector<std::int64_t> positions{0, 5, kMaxSeq - 1};
  const struct {
    const char* name;
    Region (*make)(DType);
    Op op;
  } cases[] = {{"rms_norm x3",
                [](DType d) {
                  return norm_region(d, {kEps, kEps, 1e-6f});
                },
                Op::RmsNorm},
               {"swiglu", swiglu_region, Op::SiluMul},
               {"rope", rope_region, Op::Rope}};
  for (const auto& c : cases) {
    Region fused = c.make(dtype);
    // Every fused node is in the collapsed graph, and no primitive of the region is left.
    {
      Region probe = c.make(dtype);
      for (const LayerOpSpec& s : probe.specs) {
        const OfferResult o = offer_layer_op_arm(probe.graph, s, cpu_layer_ops_contract());
        collapse(probe.graph, o.branch, 1);
      }
      eliminate_dead_code(probe.graph);
      EXPECT_EQ(count_op(probe.graph, c.op), static_cast<int>(probe.specs.size())) << c.name;
      EXPECT_EQ(count_op(probe.graph, Op::Rsqrt) + count_op(probe.graph, Op::Silu) +
                    count_op(probe.graph, Op::Neg),
                0)
          << c.name;
    }
    const auto want = run_arm(c.make(dtype), 0, positions);
    const auto got = run_arm(std::move(fused), 1, positions);
    for (std::size_t i = 0; i < want.size(); ++i)
      EXPECT_TRUE(testing::bit_equal(got[i], want[i])) << c.name << " step " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LayerOpArms,
                         ::testing::Values(DType::bf16, DType::f16, DType::f32));

TEST(LayerOpBranch, OptimizeVerifiesChoosesAndCollapses) {
  for (auto make :
       {+[] { return norm_region(DType::bf16); }, +[] { return swiglu_region(DType::bf16); },
        +[] { return rope_region(DType::bf16); }}) {
    Region r = make();
    OptimizeOptions opt;
    opt.tune.warmup = 0;
    opt.tune.repeats = 1;
    opt.tune.time_override = [](NodeId, int arm, std::int64_t) { return arm == 1 ? 1.0 : 2.0; };
    const DecisionLog log = optimize_graph(r.graph, {}, opt, {}, r.specs);
    ASSERT_EQ(log.entries().size(), r.specs.size());
    for (const Decision& d : log.entries()) {
      EXPECT_TRUE(d.offered) << d.reason;
      ASSERT_EQ(d.buckets.size(), 1u);
      EXPECT_TRUE(d.buckets[0].verified[1]) << d.site << ": " << d.buckets[0].failure[1];
      EXPECT_EQ(d.buckets[0].max_abs_error[1], 0.0) << d.site;  // bitwise on the CPU
      EXPECT_EQ(d.collapsed_to, 1) << d.site;
      EXPECT_NE(log.str().find(d.kind), std::string::npos);
    }
    EXPECT_EQ(count_op(r.graph, Op::Branch), 0);
    Session s(r.graph);
    SymBindings symbols;
    if (r.graph.symbols().size() > 0) symbols["k_len"] = 3;
    s.step(symbols, inputs_for(r.graph, 7));
    for (std::int64_t i = 0; i < s.output("y").numel(); ++i)
      EXPECT_TRUE(std::isfinite(s.output("y").at_linear(i)));
  }
}

TEST(LayerOpBranch, SlowerFusedArmKeepsTheOracle) {
  Region r = norm_region(DType::f32);
  OptimizeOptions opt;
  opt.tune.warmup = 0;
  opt.tune.repeats = 1;
  opt.tune.time_override = [](NodeId, int arm, std::int64_t) { return arm == 1 ? 2.0 : 1.0; };
  const DecisionLog log = optimize_graph(r.graph, {}, opt, {}, r.specs);
  ASSERT_EQ(log.entries().size(), 1u);
  EXPECT_EQ(log.entries()[0].collapsed_to, 0);
  EXPECT_EQ(count_op(r.graph, Op::RmsNorm), 0);
  EXPECT_EQ(count_op(r.graph, Op::Rsqrt), 1);
}

TEST(LayerOpBranch, IdenticalLayersTuneOnceAndEpsIsPartOfTheKey) {
  Region r = norm_region(DType::bf16, {kEps, kEps, 1e-6f});
  OptimizeOptions opt;
  opt.tune.warmup = 0;
  opt.tune.repeats = 1;
  const DecisionLog log = optimize_graph(r.graph, {}, opt, {}, r.specs);
  ASSERT_EQ(log.entries().size(), 3u);
  EXPECT_FALSE(log.entries()[0].buckets.at(0).from_cache);
  EXPECT_TRUE(log.entries()[1].buckets.at(0).from_cache);   // same shapes, same eps
  EXPECT_FALSE(log.entries()[2].buckets.at(0).from_cache);  // eps 1e-6 is measured anew
}

TEST(LayerOpBranch, DeclinesLeaveTheGraphUntouchedAndSayWhy) {
  Region r = rope_region(DType::bf16);
  const std::string before = print_graph(r.graph);
  LayerOpContract no_rope = cpu_layer_ops_contract();
  no_rope.ops = {LayerOpKind::rms_norm, LayerOpKind::silu_mul};
  DecisionLog log;
  OfferResult o = offer_layer_op_arm(r.graph, r.specs[0], no_rope, &log);
  EXPECT_FALSE(o.offered);
  EXPECT_NE(o.reason.find("does not implement rope"), std::string::npos) << o.reason;
  ASSERT_EQ(log.entries().size(), 1u);
  EXPECT_FALSE(log.entries()[0].offered);
  LayerOpContract f32_only = cpu_layer_ops_contract();
  f32_only.dtypes = {DType::f32};
  o = offer_layer_op_arm(r.graph, r.specs[0], f32_only);
  EXPECT_FALSE(o.offered);
  EXPECT_NE(o.reason.find("does not take dtype bf16"), std::string::npos) << o.reason;
  LayerOpContract short_rows = cpu_layer_ops_contract();
  short_rows.max_row = 32;
  o = offer_layer_op_arm(r.graph, r.specs[0], short_rows);
  EXPECT_FALSE(o.offered);
  EXPECT_NE(o.reason.find("max_row 32"), std::string::npos) << o.reason;
  EXPECT_EQ(print_graph(r.graph), before);
}

TEST(LayerOpBranch, MalformedSpecsAreGraphErrors) {
  Region r = norm_region(DType::bf16);
  const LayerOpSpec good = r.specs[0];
  const LayerOpContract& row = cpu_layer_ops_contract();
  LayerOpSpec bad = good;
  bad.reconverge = bad.inputs[0];
  EXPECT_THROW(offer_layer_op_arm(r.graph, bad, row), GraphError);
  bad = good;
  bad.inputs.pop_back();
  EXPECT_THROW(offer_layer_op_arm(r.graph, bad, row), GraphError);
  bad = good;
  bad.eps = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(offer_layer_op_arm(r.graph, bad, row), GraphError);
  bad = good;
  bad.inputs[1] = bad.inputs[0];  // weight [2, 1, H] is not [H]
  EXPECT_THROW(offer_layer_op_arm(r.graph, bad, row), GraphError);
  bad = good;
  bad.inputs[0] = NodeId{9999};
  EXPECT_THROW(offer_layer_op_arm(r.graph, bad, row), GraphError);
  bad = good;
  bad.kind = LayerOpKind::silu_mul;  // x and weight differ in shape
  EXPECT_THROW(offer_layer_op_arm(r.graph, bad, row), GraphError);
  Region q = rope_region(DType::bf16);
  LayerOpSpec rope_bad = q.specs[0];
  rope_bad.inputs[3] = rope_bad.inputs[1];  // position must be i32 [1]
  EXPECT_THROW(offer_layer_op_arm(q.graph, rope_bad, row), GraphError);
  // The well-formed spec is still offered afterwards.
  EXPECT_TRUE(offer_layer_op_arm(r.graph, good, row).offered);
}

TEST(LayerOpIr, BuildersTypeCheckAndPrint) {
  Graph g;
  const NodeId x = g.input("x", {SymExpr(2), SymExpr(8)}, DType::bf16);
  const NodeId w = g.input("w", {SymExpr(8)}, DType::f32);
  const NodeId y = g.rms_norm(x, w, 1e-6f, DType::f32);
  EXPECT_EQ(g.node(y).dtype, DType::f32);
  EXPECT_NE(print_graph(g).find("rms_norm"), std::string::npos);
  EXPECT_THROW(g.rms_norm(x, x, 1e-6f, DType::bf16), GraphError);
  EXPECT_THROW(g.silu_mul(x, w), GraphError);
  EXPECT_EQ(g.node(g.silu_mul(x, x)).dtype, DType::bf16);
  const NodeId tables = g.input("cos", {SymExpr(4), SymExpr(8)}, DType::f32);
  const NodeId pos = g.input("pos", {SymExpr(1)}, DType::i32);
  EXPECT_EQ(g.node(g.rope(x, tables, tables, pos)).dtype, DType::bf16);
  EXPECT_THROW(g.rope(x, tables, tables, w), GraphError);
  const NodeId odd = g.input("odd", {SymExpr(2), SymExpr(7)}, DType::bf16);
  EXPECT_THROW(g.rope(odd, tables, tables, pos), GraphError);
  verify_graph(g);
}

}  // namespace
}  // namespace splice
