// Plan-once Session on the CPU backend: the toy persistent decode loop of issue 2 (one attention
// layer from primitives over a KV capacity cache, 50 steps, k_len a symbol bound each step)
// against a naive float64 recompute at every step; NaN-poisoned cache rows beyond k_len never
// reach the output; every step error path leaves the caches untouched; the plan reuses memory.
#include "splice/exec/session.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>

#include "splice/core/error.h"
#include "splice/core/random.h"
#include "splice/model/demo.h"
#include "splice/ops/decode_attention.h"
#include "splice/passes/decode_flash.h"
#include "support/test_util.h"

namespace splice {
namespace {

using testing::close;

// Naive recompute of one layer at step t over the inputs x_0..x_t (float64).
Tensor naive_step(const Graph& g, const std::vector<Tensor>& xs, const DemoAttentionOptions& o) {
  auto weight = [&](const std::string& name) {
    for (NodeId id : g.live_nodes())
      if (g.node(id).op == Op::Param && g.node(id).attrs.name == name)
        return g.node(id).attrs.tensor;
    throw std::runtime_error("no weight " + name);
  };
  const Tensor wq = weight("layer0.wq"), wk = weight("layer0.wk"), wv = weight("layer0.wv"),
               wo = weight("layer0.wo");
  const std::int64_t dim = o.num_qo_heads * o.head_dim, D = o.head_dim;
  const std::int64_t group = o.num_qo_heads / o.num_kv_heads;
  const std::int64_t t = static_cast<std::int64_t>(xs.size()) - 1;
  auto project = [&](const Tensor& x, const Tensor& w, std::int64_t col) {
    double acc = 0;
    for (std::int64_t i = 0; i < dim; ++i) acc += x.at({0, 0, i}) * w.at({i, col});
    return acc;
  };
  std::vector<double> attn(dim);
  for (std::int64_t h = 0; h < o.num_qo_heads; ++h) {
    const std::int64_t kvh = h / group;
    std::vector<double> q(D), scores(t + 1);
    for (std::int64_t d = 0; d < D; ++d) q[d] = project(xs[t], wq, h * D + d);
    double mx = -INFINITY;
    for (std::int64_t j = 0; j <= t; ++j) {
      double s = 0;
      for (std::int64_t d = 0; d < D; ++d) s += q[d] * project(xs[j], wk, kvh * D + d);
      scores[j] = s / std::sqrt(static_cast<double>(D));
      mx = std::max(mx, scores[j]);
    }
    double sum = 0;
    for (auto& s : scores) sum += (s = std::exp(s - mx));
    for (std::int64_t d = 0; d < D; ++d) {
      double acc = 0;
      for (std::int64_t j = 0; j <= t; ++j)
        acc += scores[j] / sum * project(xs[j], wv, kvh * D + d);
      attn[h * D + d] = acc;
    }
  }
  Tensor y = Tensor::empty({1, 1, dim}, DType::f32);
  for (std::int64_t c = 0; c < dim; ++c) {
    double acc = xs[t].at({0, 0, c});
    for (std::int64_t i = 0; i < dim; ++i) acc += attn[i] * wo.at({i, c});
    y.set({0, 0, c}, acc);
  }
  return y;
}

TEST(Session, ToyDecodeLoopMatchesNaiveRecompute) {
  DemoAttentionOptions o;
  o.num_layers = 1;
  o.num_qo_heads = 4;
  o.num_kv_heads = 2;
  o.head_dim = 16;
  o.capacity = 64;
  DemoAttentionGraph demo = build_demo_attention_graph(o);
  const Graph reference_graph = demo.graph;
  Session session(std::move(demo.graph));
  // NaN everywhere in the caches: rows at and beyond k_len must never reach the output.
  Tensor kc = session.state("layer0.k_cache"), vc = session.state("layer0.v_cache");
  poison_nan(kc);
  poison_nan(vc);
  Rng rng(7);
  std::vector<Tensor> xs;
  for (std::int64_t step = 1; step <= 50; ++step) {
    xs.push_back(testing::random_tensor(rng, {1, 1, 64}, DType::f32));
    session.step({{"k_len", step}}, {{"x", xs.back()}});
    const Tensor y = session.output("y");
    const Tensor expected = naive_step(reference_graph, xs, o);
    ASSERT_TRUE(close(y, expected, {1e-4, 1e-4})) << "step " << step;
  }
  EXPECT_EQ(session.steps(), 50);
}

// set_profile_nodes: a profiled step times each compute node it runs once, in schedule order
// (never an input, parameter, constant, state or branch: they launch nothing), within the step's
// wall time, every matmul among them, and computes what an unprofiled step computes; off again,
// a step records nothing.
TEST(Session, ProfiledStepTimesEachComputeNodeOnce) {
  DemoAttentionOptions o;
  o.num_layers = 2;
  o.head_dim = 16;
  o.capacity = 32;
  DemoAttentionGraph demo = build_demo_attention_graph(o);
  Session plain(demo.graph), profiled(std::move(demo.graph));
  profiled.set_profile_nodes(true);
  Rng rng(3);
  for (std::int64_t step = 1; step <= 3; ++step) {
    const Tensor x = testing::random_tensor(rng, {1, 1, 64}, DType::f32);
    plain.step({{"k_len", step}}, {{"x", x}});
    profiled.step({{"k_len", step}}, {{"x", x}});
    ASSERT_TRUE(close(profiled.output("y"), plain.output("y"), {0.0, 0.0})) << "step " << step;
    const std::vector<NodeTime>& times = profiled.last_node_times();
    ASSERT_FALSE(times.empty());
    const Plan& plan = profiled.plan();
    double sum = 0;
    std::int64_t matmuls = 0;
    for (std::size_t i = 0; i < times.size(); ++i) {
      const Node& n = profiled.graph().node(times[i].node);
      EXPECT_TRUE(n.op != Op::Input && n.op != Op::Param && n.op != Op::Constant &&
                  n.op != Op::State && n.op != Op::Branch)
          << op_name(n.op);
      if (i > 0) {
        EXPECT_LT(plan.position[times[i - 1].node.index], plan.position[times[i].node.index]);
      }
      EXPECT_GE(times[i].us, 0.0);
      sum += times[i].us;
      matmuls += n.op == Op::MatMul;
    }
    std::int64_t scheduled_matmuls = 0;
    for (NodeId id : plan.schedule) scheduled_matmuls += profiled.graph().node(id).op == Op::MatMul;
    EXPECT_EQ(matmuls, scheduled_matmuls);
    EXPECT_LE(sum, profiled.last_timing().total_us);
  }
  profiled.set_profile_nodes(false);
  profiled.step({{"k_len", 4}}, {{"x", testing::random_tensor(rng, {1, 1, 64}, DType::f32)}});
  EXPECT_TRUE(profiled.last_node_times().empty());
}

// A reshape of a strided tensor is a view when the new shape only splits or merges dims that are
// contiguous with each other (a batch's column slice of a stacked projection split into heads),
// and a copy otherwise (merging rows that a slice left apart): both compute the same values,
// and only the copy is a compute node (the profile times no view).
TEST(Session, ReshapeOfAStridedSliceIsAViewWhereStridesAllow) {
  Graph g;
  const NodeId x = g.input("x", {4, 10}, DType::f32);
  const NodeId y = g.unary(Op::Neg, x);  // [4, 10] in the arena
  const NodeId cols =
      g.slice(y, 1, DynScalar::Concrete(2), DynScalar::Concrete(8));  // [4, 6], row stride 10
  g.mark_output("split", g.reshape(cols, {4, 1, 2, 3}));  // a view: strides [10, 6, 3, 1]
  g.mark_output("merged", g.reshape(cols, {24}));         // rows apart: a copy
  Session session(std::move(g));
  session.set_profile_nodes(true);
  Rng rng(5);
  const Tensor in = testing::random_tensor(rng, {4, 10}, DType::f32);
  session.step({}, {{"x", in}});
  const Tensor split = session.output("split"), merged = session.output("merged");
  EXPECT_EQ(split.strides(), (Dims{10, 6, 3, 1}));
  for (std::int64_t r = 0; r < 4; ++r)
    for (std::int64_t c = 0; c < 6; ++c) {
      const double want = -in.at({r, 2 + c});
      EXPECT_EQ(split.at({r, 0, c / 3, c % 3}), want) << r << ", " << c;
      EXPECT_EQ(merged.at({6 * r + c}), want) << r << ", " << c;
    }
  int reshapes = 0;
  for (const NodeTime& t : session.last_node_times())
    reshapes += session.graph().node(t.node).op == Op::Reshape;
  EXPECT_EQ(reshapes, 1);  // the merge's copy
}

TEST(Session, PlansOnceAndReusesMemory) {
  DemoAttentionOptions o;
  o.num_layers = 3;
  DemoAttentionGraph demo = build_demo_attention_graph(o);
  Session session(std::move(demo.graph));
  const Plan& plan = session.plan();
  EXPECT_GT(plan.arena_bytes, 0);
  EXPECT_LT(plan.arena_bytes, plan.unshared_bytes);  // buffers share space
  // Every buffer holds its node's shape at each symbol's declared upper bound (spec §6), so one
  // plan serves every k_len up to the capacity; the k_len-shaped nodes (live K/V slices, scores,
  // probabilities) are among them.
  const Graph& graph = session.graph();
  int symbolic = 0;
  for (NodeId id : plan.schedule) {
    if (plan.buffer_offset[id.index] < 0 || plan.storage_root[id.index] != id) continue;
    const Node& n = graph.node(id);
    std::int64_t bytes = static_cast<std::int64_t>(dtype_size(n.dtype));
    for (std::int64_t d : upper_bound_shape(n.shape, graph.symbols())) bytes *= d;
    EXPECT_GE(plan.buffer_bytes[id.index], bytes) << "node %" << id.index;
    bool reads_symbol = false;
    for (const SymExpr& d : n.shape) reads_symbol |= !d.is_constant();
    symbolic += reads_symbol;
  }
  EXPECT_GT(symbolic, 0);
  for (std::int64_t i = 0; i + 1 < static_cast<std::int64_t>(plan.schedule.size()); ++i)
    EXPECT_GE(plan.position[plan.schedule[i].index], 0);
  // Each state write comes after every reader of the version it overwrites.
  for (NodeId id : plan.schedule) {
    const Node& n = session.graph().node(id);
    if (n.op != Op::WriteAt) continue;
    for (NodeId other : plan.schedule)
      for (NodeId in : session.graph().node(other).inputs)
        if (in == n.inputs[0] && other != id) {
          EXPECT_LT(plan.position[other.index], plan.position[id.index]);
        }
  }
}

// SPLICE_DEBUG (core/debug.h): a named session prints its plan summary on stderr from level 1,
// an unnamed one (the tuner's per-arm regions) from level 2, and level 0 prints nothing; the
// summary's counts are the plan's own.
TEST(Session, DebugLevelsPrintThePlanSummary) {
  const char* saved = std::getenv("SPLICE_DEBUG");
  const std::string restore = saved ? saved : "";
  DemoAttentionOptions o;
  o.num_layers = 2;
  auto printed_by = [&](const char* level, const std::string& name) {
    EXPECT_EQ(setenv("SPLICE_DEBUG", level, 1), 0);
    SessionOptions so;
    so.name = name;
    ::testing::internal::CaptureStderr();
    Session session(build_demo_attention_graph(o).graph, so);
    const std::string printed = ::testing::internal::GetCapturedStderr();
    return std::make_pair(printed, session.plan().summary(session.graph()));
  };
  const std::string quiet = printed_by("0", "decode step").first;
  const auto [named, named_summary] = printed_by("1", "decode step");
  const std::string unnamed_1 = printed_by("1", "").first;
  const auto [unnamed_2, unnamed_summary_2] = printed_by("2", "");
  saved ? setenv("SPLICE_DEBUG", restore.c_str(), 1) : unsetenv("SPLICE_DEBUG");
  EXPECT_EQ(quiet, "");
  EXPECT_EQ(named, "[splice] decode step " + named_summary + "\n");
  EXPECT_EQ(unnamed_1, "");
  EXPECT_EQ(unnamed_2, "[splice] session " + unnamed_summary_2 + "\n");

  Session session(build_demo_attention_graph(o).graph);
  const Plan& plan = session.plan();
  std::size_t buffers = 0;
  for (auto offset : plan.buffer_offset) buffers += offset >= 0;
  const std::string summary = plan.summary(session.graph());
  EXPECT_EQ(summary, named_summary);
  EXPECT_NE(
      summary.find(std::to_string(plan.schedule.size()) + " nodes scheduled, " +
                   std::to_string(buffers) + " buffers in a " + std::to_string(plan.arena_bytes) +
                   "-byte arena (" + std::to_string(plan.unshared_bytes) + " without reuse)"),
      std::string::npos)
      << summary;
  EXPECT_NE(summary.find(std::to_string(plan.branches.size()) + " branches"), std::string::npos)
      << summary;
}

TEST(Session, BadStepsThrowAndLeaveCachesUntouched) {
  DemoAttentionOptions o;
  o.num_layers = 1;
  o.capacity = 16;
  DemoAttentionGraph demo = build_demo_attention_graph(o);
  Session session(std::move(demo.graph));
  Rng rng(3);
  const Tensor x = testing::random_tensor(rng, {1, 1, 256}, DType::f32);
  session.step({{"k_len", 1}}, {{"x", x}});
  const Tensor before = session.state("layer0.k_cache").clone();
  EXPECT_THROW(session.step({}, {{"x", x}}), UnboundSymbolError);
  EXPECT_THROW(session.step({{"k_len", 17}}, {{"x", x}}), SymbolBindingError);
  EXPECT_THROW(session.step({{"k_len", 0}}, {{"x", x}}), SymbolBindingError);
  EXPECT_THROW(session.step({{"nope", 2}}, {{"x", x}}), ValueError);
  EXPECT_THROW(session.step({{"k_len", 2}}, {}), ValueError);
  EXPECT_THROW(session.step({{"k_len", 2}}, {{"x", x.to(DType::bf16)}}), DTypeError);
  EXPECT_THROW(
      session.step({{"k_len", 2}}, {{"x", testing::random_tensor(rng, {1, 2, 256}, DType::f32)}}),
      ShapeError);
  EXPECT_THROW(session.step({{"k_len", 2}}, {{"x", x}, {"extra", x}}), ValueError);
  EXPECT_TRUE(testing::bit_equal(session.state("layer0.k_cache"), before));
  EXPECT_THROW(session.output("missing"), ValueError);
  EXPECT_THROW(session.state("missing"), ValueError);
  session.step({{"k_len", 2}}, {{"x", x}});  // still usable
  EXPECT_EQ(session.steps(), 2);
}

TEST(Session, OutputBeforeFirstStepIsAnError) {
  DemoAttentionGraph demo = build_demo_attention_graph({});
  Session session(std::move(demo.graph));
  EXPECT_THROW(session.output("y"), ValueError);
}

}  // namespace
}  // namespace splice

namespace splice {
namespace {

// The capture check is host logic: it runs in CPU CI too. A graph still holding the decomposed
// attention arm (a symbolic live-prefix slice) is refused, naming the node and the symbol; the same
// graph collapsed to the fused arm is capturable.
TEST(CudaGraphCapture, RefusalNamesTheNodeAndTheSymbolOnTheHost) {
  auto build = [](int collapse_to) {
    DemoAttentionOptions o;
    o.num_layers = 1;
    DemoAttentionGraph demo = build_demo_attention_graph(o);
    const OfferResult r =
        offer_decode_flash_arm(demo.graph, demo.specs[0], cpu_flash_decode_contract());
    if (collapse_to >= 0) collapse(demo.graph, r.branch, collapse_to);
    eliminate_dead_code(demo.graph);
    return std::move(demo.graph);
  };
  const Graph decomposed = build(0);
  const std::string reason = cuda_graph_refusal(decomposed, make_plan(decomposed));
  EXPECT_NE(reason.find("node %"), std::string::npos) << reason;
  EXPECT_NE(reason.find("`k_len`"), std::string::npos) << reason;
  const Graph fused = build(1);
  EXPECT_EQ(cuda_graph_refusal(fused, make_plan(fused)), "");
}

}  // namespace
}  // namespace splice
