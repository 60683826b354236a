// DecodeFlashSpec, the gate, the Branch splice and arm selection (spec decode_attention.md §2-§4,
// §6): offers and declines (graph byte-identical), malformed specs, verification that
// disqualifies a wrong arm, timing where a slow arm loses and ties keep arm 0, the tuning cache,
// per-bucket dispatch in a plan-once session, the shadow check, and plan-once vs per-step graphs.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "splice/core/error.h"
#include "splice/exec/session.h"
#include "splice/model/demo.h"
#include "splice/ops/decode_attention.h"
#include "splice/tune/optimize.h"
#include "support/test_util.h"

namespace splice {
namespace {

AttentionContract full_contract() {
  AttentionContract c = cpu_flash_decode_contract();
  return c;
}

DemoAttentionOptions small(bool alibi = false, std::optional<float> softcap = {},
                           std::optional<std::size_t> window = {}) {
  DemoAttentionOptions o;
  o.num_layers = 2;
  o.num_qo_heads = 4;
  o.num_kv_heads = 2;
  o.head_dim = 64;
  o.capacity = 64;
  o.alibi = alibi;
  o.softcap = softcap;
  o.window_left = window;
  return o;
}

TEST(DemoGraph, BadOptionsAreValueErrorsNamingTheField) {
  struct Case {
    const char* field;
    void (*edit)(DemoAttentionOptions&);
  };
  const Case cases[] = {
      {"num_layers", [](DemoAttentionOptions& o) { o.num_layers = -1; }},
      {"batch", [](DemoAttentionOptions& o) { o.batch = 0; }},
      {"num_qo_heads", [](DemoAttentionOptions& o) { o.num_qo_heads = 0; }},
      {"num_kv_heads", [](DemoAttentionOptions& o) { o.num_kv_heads = 0; }},
      {"num_kv_heads", [](DemoAttentionOptions& o) { o.num_kv_heads = 3; }},
      {"head_dim", [](DemoAttentionOptions& o) { o.head_dim = 0; }},
      {"capacity", [](DemoAttentionOptions& o) { o.capacity = 0; }},
      {"dtype", [](DemoAttentionOptions& o) { o.dtype = DType::i32; }},
      {"softcap", [](DemoAttentionOptions& o) { o.softcap = -1.0f; }},
      {"concrete_k_len", [](DemoAttentionOptions& o) { o.concrete_k_len = 65; }},
      {"concrete_k_len", [](DemoAttentionOptions& o) { o.concrete_k_len = 0; }},
  };
  for (const Case& c : cases) {
    DemoAttentionOptions o = small();
    c.edit(o);
    try {
      build_demo_attention_graph(o);
      ADD_FAILURE() << c.field << ": no error";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(c.field), std::string::npos) << e.what();
    }
  }
  DemoAttentionOptions none = small();
  none.num_layers = 0;  // a graph of no layers is valid: y = x
  EXPECT_NO_THROW(build_demo_attention_graph(none));
}

TEST(Offer, SplicesABranchPerLayer) {
  DemoAttentionGraph demo = build_demo_attention_graph(small());
  DecisionLog log;
  for (const auto& spec : demo.specs) {
    OfferResult r = offer_decode_flash_arm(demo.graph, spec, full_contract(), &log);
    EXPECT_TRUE(r.offered) << r.reason;
    EXPECT_EQ(demo.graph.node(r.branch).op, Op::Branch);
    EXPECT_EQ(demo.graph.node(spec.reconverge).inputs[0], r.branch);
  }
  verify_graph(demo.graph);
  EXPECT_EQ(log.entries().size(), 2u);
  EXPECT_NE(log.str().find("OFFERED"), std::string::npos);
}

TEST(Offer, SeedContractDeclinesUnsupportedFeaturesAndLeavesGraphIdentical) {
  struct Case {
    DemoAttentionOptions options;
    const char* feature;
  };
  const Case cases[] = {{small(true), "alibi"},
                        {small(false, 30.0f), "softcap"},
                        {small(false, {}, 16), "window_left"}};
  for (const auto& c : cases) {
    DemoAttentionGraph demo = build_demo_attention_graph(c.options);
    const std::string before = print_graph(demo.graph);
    const std::size_t nodes = demo.graph.size();
    DecisionLog log;
    OfferResult r =
        offer_decode_flash_arm(demo.graph, demo.specs[0], seed_capacity_k_contract(), &log);
    EXPECT_FALSE(r.offered);
    EXPECT_NE(r.reason.find(c.feature), std::string::npos) << r.reason;
    EXPECT_EQ(print_graph(demo.graph), before);
    EXPECT_EQ(demo.graph.size(), nodes);
    ASSERT_EQ(log.entries().size(), 1u);
    EXPECT_FALSE(log.entries()[0].offered);
    EXPECT_NE(log.str().find("DECLINED"), std::string::npos);
    // splice's own contract handles the feature: offered.
    EXPECT_TRUE(offer_decode_flash_arm(demo.graph, demo.specs[0], full_contract()).offered);
  }
  // The seed kernel accepts a plain causal Sq == 1 spec.
  DemoAttentionGraph plain = build_demo_attention_graph(small());
  EXPECT_TRUE(
      offer_decode_flash_arm(plain.graph, plain.specs[0], seed_capacity_k_contract()).offered);
  // A contract without the dtype or head dim declines with the reason.
  AttentionContract narrow = full_contract();
  narrow.head_dims = {128};
  DemoAttentionGraph d2 = build_demo_attention_graph(small());
  OfferResult r = offer_decode_flash_arm(d2.graph, d2.specs[0], narrow);
  EXPECT_FALSE(r.offered);
  EXPECT_NE(r.reason.find("head_dim"), std::string::npos);
}

TEST(Offer, MalformedSpecsAreErrorsNotDeclines) {
  auto fresh = [] { return build_demo_attention_graph(small()); };
  {
    auto d = fresh();
    DecodeFlashSpec s = d.specs[0];
    s.q = NodeId{100000};
    EXPECT_THROW(offer_decode_flash_arm(d.graph, s, full_contract()), GraphError);
  }
  {
    auto d = fresh();
    DecodeFlashSpec s = d.specs[0];
    s.decomposed_out = NodeId{static_cast<std::uint32_t>(d.graph.size() + 5)};
    EXPECT_THROW(offer_decode_flash_arm(d.graph, s, full_contract()), GraphError);
  }
  {  // reconverge not the sole consumer of decomposed_out
    auto d = fresh();
    DecodeFlashSpec s = d.specs[0];
    d.graph.unary(Op::Neg, d.graph.cast(s.decomposed_out, DType::f32));
    EXPECT_THROW(offer_decode_flash_arm(d.graph, s, full_contract()), GraphError);
  }
  {  // reconverge is not a consumer at all
    auto d = fresh();
    DecodeFlashSpec s = d.specs[0];
    s.reconverge = s.q;
    EXPECT_THROW(offer_decode_flash_arm(d.graph, s, full_contract()), GraphError);
  }
  {  // shape mismatch between q and decomposed_out
    auto d = fresh();
    DecodeFlashSpec s = d.specs[0];
    s.q = d.graph.input("q2", {SymExpr(1), SymExpr(4), SymExpr(2), SymExpr(64)}, DType::f32);
    EXPECT_THROW(offer_decode_flash_arm(d.graph, s, full_contract()), GraphError);
  }
  {  // dtype mismatch
    auto d = fresh();
    DecodeFlashSpec s = d.specs[0];
    s.q = d.graph.input("q2", {SymExpr(1), SymExpr(4), SymExpr(1), SymExpr(64)}, DType::bf16);
    EXPECT_THROW(offer_decode_flash_arm(d.graph, s, full_contract()), GraphError);
  }
  {  // bad scale
    auto d = fresh();
    DecodeFlashSpec s = d.specs[0];
    s.softmax_scale = -1.0f;
    EXPECT_THROW(offer_decode_flash_arm(d.graph, s, full_contract()), GraphError);
  }
}

// A two-arm branch over one input with a chosen fused arm (generic kind: N(0,1) inputs).
struct TestBranch {
  Graph g;
  NodeId branch;
  explicit TestBranch(int variant) {
    const NodeId x = g.input("x", {SymExpr(64), SymExpr(64)}, DType::f32);
    const NodeId w =
        g.param("w", testing::random_tensor(*std::make_unique<Rng>(5), {64, 64}, DType::f32));
    const NodeId oracle = g.matmul(g.unary(Op::Tanh, x), w);
    const NodeId merge = g.unary(Op::Neg, oracle);
    g.mark_output("y", merge);
    NodeId fused = g.matmul(g.unary(Op::Tanh, x), w);
    if (variant == 1) fused = g.binary(Op::Mul, fused, g.scalar(1.01, DType::f32));  // wrong
    if (variant == 2)  // slow: 40 extra round trips through a matmul that leave the value unchanged
      for (int i = 0; i < 40; ++i)
        fused = g.binary(Op::Add, fused,
                         g.binary(Op::Mul, g.matmul(fused, w), g.scalar(0.0, DType::f32)));
    ArmRecipe recipe;
    recipe.kind = "test";
    recipe.roles = {{"x", x}};
    recipe.contract_revision = "t1";
    BranchBuilder b(g, x);
    b.add_arm(oracle, "oracle").add_arm(fused, "fused");
    branch = b.finalize(merge, recipe);
  }
};

TEST(Select, WrongArmIsDisqualifiedWithItsError) {
  TestBranch t(1);
  DecisionLog log;
  select_arms(t.g, log, TuneOptions{});
  ASSERT_EQ(log.entries().size(), 1u);
  const auto& bucket = log.entries()[0].buckets.at(0);
  EXPECT_FALSE(bucket.verified[1]);
  EXPECT_EQ(bucket.winner, 0);
  EXPECT_GT(bucket.max_abs_error[1], 1e-3);
  EXPECT_NE(bucket.failure[1].find("worst at"), std::string::npos) << bucket.failure[1];
  EXPECT_EQ(log.entries()[0].collapsed_to, 0);
}

TEST(Select, SlowArmLoses) {
  TestBranch t(2);
  DecisionLog log;
  TuneOptions opt;
  opt.repeats = 5;
  select_arms(t.g, log, opt);
  const auto& bucket = log.entries()[0].buckets.at(0);
  EXPECT_TRUE(bucket.verified[1]) << bucket.failure[1];
  EXPECT_GT(bucket.median_us[1], bucket.median_us[0]);
  EXPECT_EQ(bucket.winner, 0);
}

TEST(Select, TiesKeepArmZeroAndFasterWins) {
  {
    TestBranch t(0);
    DecisionLog log;
    TuneOptions opt;
    opt.time_override = [](NodeId, int, std::int64_t) { return 10.0; };
    select_arms(t.g, log, opt);
    EXPECT_EQ(log.entries()[0].buckets[0].winner, 0);
    EXPECT_NE(log.entries()[0].buckets[0].reason.find("tie"), std::string::npos);
  }
  {
    TestBranch t(0);
    DecisionLog log;
    TuneOptions opt;
    opt.time_override = [](NodeId, int arm, std::int64_t) { return arm == 1 ? 5.0 : 10.0; };
    select_arms(t.g, log, opt);
    EXPECT_EQ(log.entries()[0].buckets[0].winner, 1);
    EXPECT_EQ(log.entries()[0].collapsed_to, 1);
  }
}

TEST(Select, TuningCacheReusesDecisionsWithoutTiming) {
  const std::string path = testing::process_temp_path("splice_tuning_cache_test.json");
  std::filesystem::remove(path);
  int timed = 0;
  auto run = [&](std::vector<int>& winners) {
    DemoAttentionGraph demo = build_demo_attention_graph(small());
    OptimizeOptions opt;
    opt.tune.cache_path = path;
    opt.tune.time_override = [&](NodeId, int arm, std::int64_t k) {
      ++timed;
      return arm == 1 ? (k > 16 ? 1.0 : 3.0) : 2.0;  // flash wins above 16
    };
    DecisionLog log = optimize_graph(demo.graph, demo.specs, opt);
    for (const auto& d : log.entries())
      for (const auto& b : d.buckets) winners.push_back(b.winner);
    return log;
  };
  std::vector<int> first, second;
  DecisionLog log1 = run(first);
  const int timed_first = timed;
  EXPECT_GT(timed_first, 0);
  EXPECT_TRUE(std::filesystem::exists(path));
  DecisionLog log2 = run(second);
  EXPECT_EQ(timed, timed_first);  // no timing the second time
  EXPECT_EQ(first, second);       // the same choices
  for (const auto& d : log2.entries())
    for (const auto& b : d.buckets) EXPECT_TRUE(b.from_cache);
  EXPECT_NE(log2.str().find("tuning cache"), std::string::npos);
  std::filesystem::remove(path);
}

TEST(Select, RealFlashArmVerifiesAndDispatchesPerBucket) {
  DemoAttentionGraph demo = build_demo_attention_graph(small(true, 20.0f, 24));
  const Graph original = demo.graph;
  OptimizeOptions opt;
  opt.tune.time_override = [](NodeId, int arm, std::int64_t k) {
    return arm == 1 ? (k >= 16 ? 1.0 : 3.0) : 2.0;
  };
  DecisionLog log = optimize_graph(demo.graph, demo.specs, opt);
  for (const auto& d : log.entries()) {
    ASSERT_TRUE(d.offered) << d.reason;
    for (const auto& b : d.buckets) {
      EXPECT_TRUE(b.verified[1]) << b.failure[1];
      EXPECT_LT(b.max_abs_error[1], 1e-4);
      EXPECT_EQ(b.winner, b.hi >= 16 ? 1 : 0);  // time_override reads the bucket top
    }
  }
  // The session dispatches per bucket and matches the unoptimized graph at every step.
  Session fast(demo.graph);
  Session oracle(original);
  Rng rng(11);
  for (std::int64_t step = 1; step <= 40; ++step) {
    const Tensor x = testing::random_tensor(rng, {1, 1, 256}, DType::f32);
    fast.step({{"k_len", step}}, {{"x", x}});
    oracle.step({{"k_len", step}}, {{"x", x}});
    ASSERT_TRUE(testing::close(fast.output("y"), oracle.output("y"), {1e-4, 1e-4}))
        << "step " << step;
    // Buckets [9, 16] and above time the flash arm faster.
    for (int arm : fast.last_choices()) EXPECT_EQ(arm, step >= 9 ? 1 : 0) << "step " << step;
  }
}

TEST(Select, ShadowCheckDemotesADriftingArm) {
  TestBranch t(1);  // wrong arm, forced in by hand
  t.g.mutable_node(t.branch).attrs.branch->dispatch = {{0, 0, 1}};
  SessionOptions so;
  so.shadow_every = 2;
  Session s(t.g, so);
  Rng rng(3);
  const Tensor x = testing::random_tensor(rng, {64, 64}, DType::f32);
  s.step({}, {{"x", x}});
  EXPECT_EQ(s.last_choices()[0], 1);
  EXPECT_TRUE(s.shadow_events().empty());
  s.step({}, {{"x", x}});
  ASSERT_EQ(s.shadow_events().size(), 1u);
  EXPECT_TRUE(s.shadow_events()[0].demoted);
  s.step({}, {{"x", x}});
  EXPECT_EQ(s.last_choices()[0], 0);  // demoted for good
}

TEST(Select, PlanOnceMatchesPerStepGraphsOver100Tokens) {
  DemoAttentionOptions o = small();
  o.capacity = 128;
  DemoAttentionGraph persistent = build_demo_attention_graph(o);
  OptimizeOptions opt;
  opt.tune.time_override = [](NodeId, int arm, std::int64_t) { return arm == 1 ? 1.0 : 2.0; };
  optimize_graph(persistent.graph, persistent.specs, opt);
  Session planned(persistent.graph);
  Rng rng(21);
  std::map<std::string, Tensor> caches;  // carried between the per-step sessions
  for (std::int64_t step = 1; step <= 100; ++step) {
    const Tensor x = testing::random_tensor(rng, {1, 1, 256}, DType::f32);
    planned.step({{"k_len", step}}, {{"x", x}});
    DemoAttentionOptions po = o;
    po.concrete_k_len = step;
    DemoAttentionGraph per_step = build_demo_attention_graph(po);
    for (const auto& spec : per_step.specs) {  // alternate fused and decomposed arms
      OfferResult r = offer_decode_flash_arm(per_step.graph, spec, full_contract());
      collapse(per_step.graph, r.branch, static_cast<int>(step % 2));
    }
    eliminate_dead_code(per_step.graph);
    Session once(per_step.graph);
    for (const auto& [name, t] : caches) once.state(name).copy_from(t);
    once.step({}, {{"x", x}});
    for (int l = 0; l < 2; ++l)
      for (const char* kind : {".k_cache", ".v_cache"}) {
        const std::string name = "layer" + std::to_string(l) + kind;
        caches[name] = once.state(name).clone();
      }
    ASSERT_TRUE(testing::close(planned.output("y"), once.output("y"), {1e-4, 1e-4}))
        << "step " << step;
  }
}

}  // namespace
}  // namespace splice
