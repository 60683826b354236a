// IR: builder shape inference and its errors, Op::Branch construction and each rejection of
// spec §3, collapse + dead-code elimination, the verifier, and the printers.
#include <gtest/gtest.h>

#include "splice/core/error.h"
#include "splice/ir/graph.h"

namespace splice {
namespace {

TEST(Builder, InfersSymbolicShapes) {
  Graph g;
  const SymId k = g.declare_symbol("k_len", 1, 512);
  const NodeId cache =
      g.state("k_cache", {SymExpr(1), SymExpr(4), SymExpr(512), SymExpr(64)}, DType::bf16);
  const NodeId live = g.slice(cache, 2, DynScalar::Concrete(0), DynScalar::Sym(k));
  EXPECT_TRUE(same_shape(g.node(live).shape, {SymExpr(1), SymExpr(4), SymExpr(k), SymExpr(64)}));
  const NodeId q = g.input("q", {SymExpr(1), SymExpr(4), SymExpr(2), SymExpr(64)}, DType::bf16);
  const NodeId s = g.matmul(q, live, true);
  EXPECT_TRUE(same_shape(g.node(s).shape, {SymExpr(1), SymExpr(4), SymExpr(2), SymExpr(k)}));
  const NodeId r = g.reduce(Op::ReduceMax, s, -1, true);
  EXPECT_TRUE(same_shape(g.node(r).shape, {SymExpr(1), SymExpr(4), SymExpr(2), SymExpr(1)}));
  const NodeId b = g.binary(Op::Sub, s, r);  // broadcasting
  EXPECT_TRUE(same_shape(g.node(b).shape, g.node(s).shape));
  const NodeId cmp = g.binary(Op::Less, s, r);
  EXPECT_EQ(g.node(cmp).dtype, DType::boolean);
  const NodeId p = g.permute(q, {0, 2, 1, 3});
  EXPECT_TRUE(same_shape(g.node(p).shape, {SymExpr(1), SymExpr(2), SymExpr(4), SymExpr(64)}));
  const NodeId c = g.concat({q, q}, 2);
  EXPECT_TRUE(same_shape(g.node(c).shape, {SymExpr(1), SymExpr(4), SymExpr(4), SymExpr(64)}));
  const NodeId table = g.param("embed", Tensor::zeros({10, 8}, DType::f32));
  const NodeId ids = g.input("ids", {SymExpr(3)}, DType::i32);
  EXPECT_TRUE(same_shape(g.node(g.gather(table, ids)).shape, {SymExpr(3), SymExpr(8)}));
  verify_graph(g);
}

TEST(Builder, RejectsMalformedOps) {
  Graph g;
  const SymId k = g.declare_symbol("k_len", 1, 512);
  const NodeId a = g.input("a", {SymExpr(2), SymExpr(3)}, DType::f32);
  const NodeId b = g.input("b", {SymExpr(4), SymExpr(5)}, DType::f32);
  const NodeId h = g.input("h", {SymExpr(2), SymExpr(3)}, DType::bf16);
  EXPECT_THROW(g.matmul(a, b), GraphError);           // inner dims
  EXPECT_THROW(g.binary(Op::Add, a, b), GraphError);  // broadcast
  EXPECT_THROW(g.binary(Op::Add, a, h), GraphError);  // dtypes
  EXPECT_THROW(g.reduce(Op::ReduceSum, a, 2, false), GraphError);
  EXPECT_THROW(g.permute(a, {0, 0}), GraphError);
  EXPECT_THROW(g.reshape(a, {SymExpr(5)}), GraphError);
  EXPECT_THROW(g.slice(a, 1, DynScalar::Concrete(0), DynScalar::Sym(k)),
               GraphError);                                               // k may exceed 3
  EXPECT_THROW(g.where(a, a, a), GraphError);                             // cond not bool
  EXPECT_THROW(g.write_at(a, a, 0, DynScalar::Concrete(0)), GraphError);  // not a state
  EXPECT_THROW(g.unary(Op::Add, a), GraphError);
  EXPECT_THROW(g.input("a", {SymExpr(1)}, DType::f32), GraphError);  // duplicate name
  Node bad;
  bad.op = Op::Exp;
  bad.inputs = {NodeId{99}};
  EXPECT_THROW(g.append(bad), GraphError);
}

// q -> (arm 0: exp(q) * 2) and (arm 1: exp(q) via another path) -> merge.
struct TwoArms {
  Graph g;
  NodeId q, arm0_mid, arm0, arm1, merge, other;
  TwoArms() {
    q = g.input("q", {SymExpr(4)}, DType::f32);
    other = g.input("o", {SymExpr(4)}, DType::f32);
    arm0_mid = g.unary(Op::Exp, q);
    arm0 = g.binary(Op::Mul, arm0_mid, g.scalar(2.0, DType::f32));
    merge = g.binary(Op::Add, arm0, other);
    arm1 = g.binary(Op::Add, g.unary(Op::Exp, q), g.unary(Op::Exp, q));
    g.mark_output("y", merge);
  }
};

TEST(Branch, BuildsAndCollapses) {
  TwoArms t;
  const std::size_t before = t.g.live_nodes().size();
  BranchBuilder builder(t.g, t.q);
  builder.add_arm(t.arm0, "oracle").add_arm(t.arm1, "alt");
  const NodeId br = builder.finalize(t.merge);
  verify_graph(t.g);
  EXPECT_EQ(t.g.node(br).op, Op::Branch);
  EXPECT_EQ(t.g.node(t.merge).inputs[0], br);  // merge now reads the branch
  const auto interior0 = arm_interior(t.g, t.q, t.arm0);
  EXPECT_EQ(interior0.size(),
            2u);  // exp, mul (the scalar constant is outside: not downstream of q)
  collapse(t.g, br, 1);
  EXPECT_EQ(t.g.node(t.merge).inputs[0], t.arm1);
  EXPECT_FALSE(t.g.is_live(t.arm0));
  EXPECT_FALSE(t.g.is_live(t.arm0_mid));
  EXPECT_GT(eliminate_dead_code(t.g), 0u);  // the loser's constant
  verify_graph(t.g);
  EXPECT_LT(t.g.live_nodes().size(), before + 1);
}

TEST(Branch, RejectsEachMalformation) {
  {  // no arm
    TwoArms t;
    BranchBuilder b(t.g, t.q);
    EXPECT_THROW(b.finalize(t.merge), GraphError);
  }
  {  // merge not downstream of the diverge point
    TwoArms t;
    BranchBuilder b(t.g, t.q);
    b.add_arm(t.arm0, "a");
    EXPECT_THROW(b.finalize(t.other), GraphError);
    BranchBuilder b2(t.g, t.q);
    b2.add_arm(t.arm0, "a");
    EXPECT_THROW(b2.finalize(t.q), GraphError);
  }
  {  // overlapping interiors: arm 1 reuses arm 0's exp
    TwoArms t;
    const NodeId overlapping = t.g.unary(Op::Neg, t.arm0_mid);
    BranchBuilder b(t.g, t.q);
    b.add_arm(t.arm0, "a").add_arm(overlapping, "b");
    EXPECT_THROW(b.finalize(t.merge), GraphError);
  }
  {  // interior read from outside the branch
    TwoArms t;
    t.g.mark_output("leak", t.g.unary(Op::Neg, t.arm0_mid));
    BranchBuilder b(t.g, t.q);
    b.add_arm(t.arm0, "a").add_arm(t.arm1, "b");
    EXPECT_THROW(b.finalize(t.merge), GraphError);
  }
  {  // exits differ in shape
    TwoArms t;
    const NodeId wide = t.g.concat({t.g.unary(Op::Abs, t.q), t.g.unary(Op::Abs, t.q)}, 0);
    BranchBuilder b(t.g, t.q);
    b.add_arm(t.arm0, "a").add_arm(wide, "b");
    EXPECT_THROW(b.finalize(t.merge), GraphError);
  }
  {  // exits differ in dtype
    TwoArms t;
    const NodeId half = t.g.cast(t.g.unary(Op::Abs, t.q), DType::bf16);
    BranchBuilder b(t.g, t.q);
    b.add_arm(t.arm0, "a").add_arm(half, "b");
    EXPECT_THROW(b.finalize(t.merge), GraphError);
  }
  {  // merge does not read arm 0's exit
    TwoArms t;
    const NodeId merge2 = t.g.unary(Op::Neg, t.arm1);
    BranchBuilder b(t.g, t.q);
    b.add_arm(t.arm0, "a").add_arm(t.arm1, "b");
    EXPECT_THROW(b.finalize(merge2), GraphError);
  }
  {  // arm exit not downstream of the diverge point
    TwoArms t;
    BranchBuilder b(t.g, t.q);
    b.add_arm(t.arm0, "a").add_arm(t.other, "b");
    EXPECT_THROW(b.finalize(t.merge), GraphError);
  }
}

TEST(Verifier, CatchesBrokenGraphs) {
  {
    TwoArms t;
    t.g.erase(t.arm0_mid);  // a live node reads an erased one
    EXPECT_THROW(verify_graph(t.g), GraphError);
  }
  {
    TwoArms t;
    t.g.mutable_node(t.arm0).dtype = DType::bf16;  // stored dtype drifted from the rule
    EXPECT_THROW(verify_graph(t.g), GraphError);
  }
  {
    TwoArms t;
    t.g.mutable_node(t.arm0_mid).inputs[0] = t.merge;  // cycle
    EXPECT_THROW(verify_graph(t.g), GraphError);
  }
  {
    TwoArms t;
    BranchBuilder b(t.g, t.q);
    b.add_arm(t.arm0, "a").add_arm(t.arm1, "b");
    const NodeId br = b.finalize(t.merge);
    t.g.mutable_node(t.merge).inputs[0] = t.arm0;  // merge no longer reads the branch
    EXPECT_THROW(verify_graph(t.g), GraphError);
    t.g.mutable_node(t.merge).inputs[0] = br;
    t.g.mutable_node(br).attrs.branch->dispatch.push_back({1, 0, 0});  // lo > hi
    EXPECT_THROW(verify_graph(t.g), GraphError);
  }
  {
    Graph g;
    const NodeId st = g.state("s", {SymExpr(4)}, DType::f32);
    const NodeId v = g.input("v", {SymExpr(1)}, DType::f32);
    g.write_at(st, v, 0, DynScalar::Concrete(0));
    g.write_at(st, v, 0, DynScalar::Concrete(1));  // the same version written twice
    EXPECT_THROW(verify_graph(g), GraphError);
  }
}

TEST(Printer, TextAndDot) {
  TwoArms t;
  BranchBuilder b(t.g, t.q);
  b.add_arm(t.arm0, "oracle").add_arm(t.arm1, "alt");
  b.finalize(t.merge);
  const std::string text = print_graph(t.g);
  EXPECT_NE(text.find("branch(arm0="), std::string::npos);
  EXPECT_NE(text.find("output y"), std::string::npos);
  const std::string dot = graph_to_dot(t.g);
  EXPECT_NE(dot.find("subgraph cluster_0"), std::string::npos);
  EXPECT_NE(dot.find("subgraph cluster_1"), std::string::npos);
  EXPECT_NE(dot.find("shape=diamond"), std::string::npos);
}

}  // namespace
}  // namespace splice
