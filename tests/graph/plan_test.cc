// make_plan and nodes_to_run on a branch nested inside another branch's arms (the shape of an
// uncollapsed graph: `splice run --no-optimize`, OptimizeOptions::select = false). The inner
// branch has a state write in each arm (like KDA's write_at arm beside the in-place fused op);
// the outer branch (like the o_proj matmul_add region after the mixer) needs the whole inner
// region through both of its arms. Checks:
//   1. the plan orders the state reads and writes (the two inner arms' writes never run in one
//      step, so no edge joins them);
//   2. a step runs only the chosen inner arm whatever the outer arm is;
//   3. a session over the uncollapsed graph writes the state once per step (arm 0's write).
#include "splice/plan/plan.h"

#include <gtest/gtest.h>

#include "splice/exec/session.h"

namespace splice {
namespace {

constexpr std::int64_t kWidth = 4;  // row length
constexpr std::int64_t kSlots = 2;  // state rows

struct Nested {
  Graph g;
  NodeId write0, write1, add0, add1, outer_exit0, outer_exit1;
};

// y = |x|; inner arm a: v = y + s[0], s[0] = v; inner arm b: v = s[0] + y, s[0] = v (each arm's
// exit sequenced after its write); m = reshape(inner); outer arms 2m and m + m; out = reshape.
Nested build_nested() {
  Nested n;
  Graph& g = n.g;
  const SymShape row{SymExpr(1), SymExpr(kWidth)};
  const NodeId x = g.input("x", row, DType::f32);                                 // [1, W]
  const NodeId s = g.state("s", {SymExpr(kSlots), SymExpr(kWidth)}, DType::f32);  // [slots, W]
  const NodeId y = g.unary(Op::Abs, x);                                           // inner diverge
  auto arm = [&](bool state_first, NodeId& add, NodeId& write) {
    const NodeId old_row = g.slice(s, 0, DynScalar::Concrete(0), DynScalar::Concrete(1));
    add = state_first ? g.binary(Op::Add, old_row, y) : g.binary(Op::Add, y, old_row);
    write = g.write_at(s, add, 0, DynScalar::Concrete(0));
    return g.sequence(add, {write});
  };
  const NodeId exit0 = arm(false, n.add0, n.write0);
  const NodeId exit1 = arm(true, n.add1, n.write1);
  const NodeId m = g.reshape(exit0, row);
  BranchBuilder(g, y).add_arm(exit0, "a").add_arm(exit1, "b").finalize(m);
  n.outer_exit0 = g.binary(Op::Mul, m, g.scalar(2.0, DType::f32));
  n.outer_exit1 = g.binary(Op::Add, m, m);
  const NodeId out = g.reshape(n.outer_exit0, row);
  BranchBuilder(g, m).add_arm(n.outer_exit0, "twice").add_arm(n.outer_exit1, "sum").finalize(out);
  g.mark_output("out", out);
  verify_graph(g);
  return n;
}

TEST(Plan, NestedBranchWithStateWritesInBothInnerArmsIsOrdered) {
  const Nested n = build_nested();
  const Plan plan = make_plan(n.g);  // threw "state reads and writes cannot be ordered" before
  ASSERT_EQ(plan.branches.size(), 2u);
  EXPECT_EQ(plan.schedule.size(), n.g.live_nodes().size());
  // Each write follows the read it consumes (a data edge) ...
  EXPECT_LT(plan.position[n.add0.index], plan.position[n.write0.index]);
  EXPECT_LT(plan.position[n.add1.index], plan.position[n.write1.index]);
  // ... and both inner arms are inside both outer arms (the nesting under test).
  const BranchRegion& outer = plan.branches[1];
  for (const auto& nodes : outer.arm_nodes) {
    EXPECT_TRUE(nodes[n.write0.index]);
    EXPECT_TRUE(nodes[n.write1.index]);
  }
  EXPECT_TRUE(outer.arms_have_effects);
}

TEST(Plan, NodesToRunFollowEveryChosenArm) {
  const Nested n = build_nested();
  const Plan plan = make_plan(n.g);
  for (int inner = 0; inner < 2; ++inner)
    for (int outer = 0; outer < 2; ++outer) {
      // plan.branches is in node order: the inner branch first.
      const std::vector<bool> run = nodes_to_run(n.g, plan, {inner, 0, outer, 0});
      SCOPED_TRACE("inner arm " + std::to_string(inner) + ", outer arm " + std::to_string(outer));
      EXPECT_EQ(run[n.write0.index], inner == 0);
      EXPECT_EQ(run[n.add0.index], inner == 0);
      EXPECT_EQ(run[n.write1.index], inner == 1);
      EXPECT_EQ(run[n.add1.index], inner == 1);
      EXPECT_EQ(run[n.outer_exit0.index], outer == 0);
      EXPECT_EQ(run[n.outer_exit1.index], outer == 1);
    }
  // A shadow check of the outer branch adds its arm 0.
  const std::vector<bool> shadow = nodes_to_run(n.g, plan, {0, 0, 1, 1});
  EXPECT_TRUE(shadow[n.outer_exit0.index]);
  EXPECT_TRUE(shadow[n.outer_exit1.index]);
  EXPECT_FALSE(shadow[n.write1.index]);
}

TEST(Plan, SessionOverTheNestedBranchWritesTheStateOncePerStep) {
  Nested n = build_nested();
  Session session(std::move(n.g));
  Tensor x = Tensor::empty({1, kWidth}, DType::f32);  // [1, W]
  for (std::int64_t i = 0; i < kWidth; ++i) x.set({0, i}, -0.5 - static_cast<double>(i));
  for (int step = 1; step <= 3; ++step) {
    session.step({}, {{"x", x}});
    const Tensor out = session.output("out");
    const Tensor s = session.state("s");
    for (std::int64_t i = 0; i < kWidth; ++i) {
      const double y = 0.5 + static_cast<double>(i);
      EXPECT_EQ(s.at({0, i}), step * y) << "step " << step << ", column " << i;
      EXPECT_EQ(s.at({1, i}), 0.0);
      EXPECT_EQ(out.at({0, i}), 2 * step * y);
    }
  }
}

}  // namespace
}  // namespace splice
