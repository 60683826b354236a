// DecodeFlashSpec, the gate, the Branch splice and arm selection (spec decode_attention.md §2-§4,
// §6): offers and declines (graph byte-identical), malformed specs, verification that
// disqualifies a wrong arm, timing where a slow arm loses and ties keep arm 0, the tuning cache,
// per-bucket dispatch in a plan-once session, the shadow check, and plan-once vs per-step graphs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <string>

#include "splice/core/error.h"
#include "splice/exec/session.h"
#include "splice/model/blocks.h"
#include "splice/model/demo.h"
#include "splice/ops/decode_attention.h"
#include "splice/tune/optimize.h"
#include "splice/tune/select.h"
#include "support/reference_attention.h"
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
    // The branch records where the arms split and where they meet again (spec §3), and the
    // recipe carries the contract row's verification bound (§4.1).
    const BranchAttrs& attrs = *demo.graph.node(r.branch).attrs.branch;
    EXPECT_EQ(attrs.diverge, spec.q);
    EXPECT_EQ(attrs.merge, spec.reconverge);
    ASSERT_TRUE(attrs.recipe.output_tolerance.has_value());
    const Tolerance row = full_contract().tolerance(DType::f32);
    EXPECT_EQ(attrs.recipe.output_tolerance->atol, row.atol);
    EXPECT_EQ(attrs.recipe.output_tolerance->rtol, row.rtol);
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
  // A contract row without the dtype, the head dim, the GQA group or a feature declines, naming
  // what it lacks, and leaves the graph as it was.
  struct Narrow {
    const char* missing;  // what the reason must name
    void (*narrow)(AttentionContract&);
    void (*widen_spec)(DecodeFlashSpec&);
  };
  const Narrow narrow_cases[] = {
      {"head_dim", [](AttentionContract& c) { c.head_dims = {128}; }, nullptr},
      {"dtype f32", [](AttentionContract& c) { c.dtypes = {DType::bf16}; }, nullptr},
      {"GQA group 2", [](AttentionContract& c) { c.max_group = 1; }, nullptr},
      {"window_right",
       [](AttentionContract& c) {
         c.features.erase(
             std::remove(c.features.begin(), c.features.end(), AttentionFeature::window_right),
             c.features.end());
       },
       [](DecodeFlashSpec& s) { s.window_size_right = 4; }},
  };
  for (const Narrow& n : narrow_cases) {
    SCOPED_TRACE(n.missing);
    AttentionContract narrow = full_contract();
    n.narrow(narrow);
    DemoAttentionGraph d2 = build_demo_attention_graph(small());
    DecodeFlashSpec spec = d2.specs[0];
    if (n.widen_spec) n.widen_spec(spec);
    const std::string before = print_graph(d2.graph);
    OfferResult r = offer_decode_flash_arm(d2.graph, spec, narrow);
    EXPECT_FALSE(r.offered);
    EXPECT_NE(r.reason.find(n.missing), std::string::npos) << r.reason;
    EXPECT_EQ(print_graph(d2.graph), before);
    EXPECT_TRUE(offer_decode_flash_arm(d2.graph, spec, full_contract()).offered);
  }
}

// The gate on a multi-token query (Sq = 2, causal): a row whose max_sq is 1 or that lacks
// causal masking declines it, naming which; causal is no requirement at Sq = 1 (the seed case).
TEST(Offer, GateChecksTheQueryLengthAndCausalMaskingOfMultiTokenQueries) {
  Graph g;
  const NodeId q = g.input("q", {SymExpr(1), SymExpr(4), SymExpr(2), SymExpr(64)}, DType::f32);
  const NodeId k = g.input("k", {SymExpr(1), SymExpr(2), SymExpr(64), SymExpr(64)}, DType::f32);
  const NodeId v = g.input("v", {SymExpr(1), SymExpr(2), SymExpr(64), SymExpr(64)}, DType::f32);
  DecodeFlashSpec spec;
  spec.q = q;
  spec.k = k;
  spec.v = v;
  spec.softmax_scale = 0.125f;
  spec.causal = true;
  spec.k_len = DynScalar::Concrete(8);
  AttentionContract row = full_contract();
  row.max_sq = 8;
  EXPECT_EQ(decode_flash_gate(g, spec, row), "");
  AttentionContract one_token = row;
  one_token.max_sq = 1;
  EXPECT_NE(decode_flash_gate(g, spec, one_token).find("max_sq 1"), std::string::npos);
  AttentionContract no_causal = row;
  no_causal.features.erase(
      std::remove(no_causal.features.begin(), no_causal.features.end(), AttentionFeature::causal),
      no_causal.features.end());
  EXPECT_NE(decode_flash_gate(g, spec, no_causal).find("causal"), std::string::npos);
  spec.causal = false;
  EXPECT_EQ(decode_flash_gate(g, spec, no_causal), "");
}

// Offers `s` and expects a GraphError whose message contains `needle`, the graph unchanged.
void expect_malformed(DemoAttentionGraph& d, const DecodeFlashSpec& s, const std::string& needle) {
  SCOPED_TRACE(needle);
  const std::string before = print_graph(d.graph);
  try {
    offer_decode_flash_arm(d.graph, s, full_contract());
    ADD_FAILURE() << "no error";
  } catch (const GraphError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  EXPECT_EQ(print_graph(d.graph), before);
}

TEST(Offer, MalformedSpecsAreErrorsNotDeclines) {
  auto fresh = [] { return build_demo_attention_graph(small()); };
  {  // every id out of range is named
    auto d = fresh();
    const NodeId far{static_cast<std::uint32_t>(d.graph.size() + 5)};
    const std::pair<const char*, NodeId DecodeFlashSpec::*> ids[] = {
        {"`q`", &DecodeFlashSpec::q},
        {"`k`", &DecodeFlashSpec::k},
        {"`v`", &DecodeFlashSpec::v},
        {"`decomposed_out`", &DecodeFlashSpec::decomposed_out},
        {"`reconverge`", &DecodeFlashSpec::reconverge}};
    for (const auto& [name, field] : ids) {
      DecodeFlashSpec s = d.specs[0];
      s.*field = NodeId{100000};
      expect_malformed(d, s, std::string(name) + " = %100000 is not a live node");
    }
    DecodeFlashSpec s = d.specs[0];
    s.alibi = far;
    expect_malformed(d, s, "`alibi` = %" + std::to_string(far.index) + " is not a live node");
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
    expect_malformed(d, s, "`decomposed_out` is f32[1, 4, 1, 64]");
  }
  {  // dtype mismatch between q and decomposed_out (q, k and v agree: bf16)
    DemoAttentionOptions o = small();
    o.dtype = DType::bf16;
    auto d = build_demo_attention_graph(o);
    DecodeFlashSpec s = d.specs[0];
    s.decomposed_out = d.graph.cast(s.decomposed_out, DType::f32);
    expect_malformed(d, s, "`decomposed_out` is f32");
  }
  {  // q, k and v of different dtypes
    auto d = fresh();
    DecodeFlashSpec s = d.specs[0];
    s.q = d.graph.input("q2", {SymExpr(1), SymExpr(4), SymExpr(1), SymExpr(64)}, DType::bf16);
    expect_malformed(d, s, "q, k, v dtypes differ");
  }
  {  // bad scale
    auto d = fresh();
    DecodeFlashSpec s = d.specs[0];
    s.softmax_scale = -1.0f;
    EXPECT_THROW(offer_decode_flash_arm(d.graph, s, full_contract()), GraphError);
  }
}

// The oracle itself (arm 0, emit_decomposed_attention) against the float64 reference of spec §5
// where the demo graphs do not reach: bf16, two sequences, Sq = 4 (k_len below, at and above
// Sq), windows on both sides with and without causal masking, softcap and ALiBi; K/V NaN at and
// beyond k_len, which the region's live slice must never read.
TEST(Oracle, DecomposedRegionMatchesTheFloat64Reference) {
  constexpr std::int64_t kBatch = 2, kHq = 4, kHkv = 2, kSq = 4, kD = 32, kCapacity = 40;
  struct Variant {
    const char* name;
    bool causal;
    std::optional<std::size_t> left, right;
    std::optional<float> softcap;
    bool alibi;
  };
  const Variant variants[] = {{"causal, left 5, softcap, alibi", true, 5, {}, 20.0f, true},
                              {"full, left 3, right 2", false, 3, 2, {}, false},
                              {"causal, right 1", true, {}, 1, {}, false}};
  for (const Variant& variant : variants) {
    SCOPED_TRACE(variant.name);
    Graph g;
    const SymId k_len = g.declare_symbol("k_len", 1, kCapacity);
    const NodeId q = g.input("q", sym_shape_of({kBatch, kHq, kSq, kD}), DType::bf16);
    const NodeId k = g.input("k", sym_shape_of({kBatch, kHkv, kCapacity, kD}), DType::bf16);
    const NodeId v = g.input("v", sym_shape_of({kBatch, kHkv, kCapacity, kD}), DType::bf16);
    Tensor slopes = Tensor::empty({kHq}, DType::f32);  // [Hq]: the geometric ALiBi slopes
    for (std::int64_t h = 0; h < kHq; ++h)
      slopes.set({h}, std::exp2(-8.0 * static_cast<double>(h + 1) / kHq));
    AttentionRegionArgs args;
    args.q = q;
    args.k_cache = k;
    args.v_cache = v;
    if (variant.alibi) args.alibi = g.param("alibi", slopes);
    args.causal = variant.causal;
    args.window_left = variant.left;
    args.window_right = variant.right;
    args.softcap = variant.softcap;
    args.k_len = DynScalar::Sym(k_len);
    args.site = "oracle";
    const AttentionRegion region = emit_decomposed_attention(g, args);
    g.mark_output("y", region.output);  // [B, Sq, Hq, D]
    Session session(g);
    DecodeAttentionOptions options;
    options.causal = variant.causal;
    if (variant.left) options.window_left = static_cast<std::int64_t>(*variant.left);
    if (variant.right) options.window_right = static_cast<std::int64_t>(*variant.right);
    options.softcap = variant.softcap;
    Rng rng(77);
    for (const std::int64_t live :
         {std::int64_t{1}, std::int64_t{3}, std::int64_t{4}, std::int64_t{17}, kCapacity}) {
      SCOPED_TRACE("k_len " + std::to_string(live));
      const Tensor qt = testing::random_tensor(rng, {kBatch, kHq, kSq, kD}, DType::bf16);
      Tensor kt = testing::random_tensor(rng, {kBatch, kHkv, kCapacity, kD}, DType::bf16);
      Tensor vt = testing::random_tensor(rng, {kBatch, kHkv, kCapacity, kD}, DType::bf16);
      if (live < kCapacity) {
        Tensor k_tail = kt.slice(2, live, kCapacity), v_tail = vt.slice(2, live, kCapacity);
        poison_nan(k_tail);
        poison_nan(v_tail);
      }
      session.step({{"k_len", live}}, {{"q", qt}, {"k", kt}, {"v", vt}});
      Tensor k_lens = Tensor::empty({1}, DType::i32);
      k_lens.set({0}, static_cast<double>(live));
      const Tensor expected = testing::reference_decode_attention(
          qt, kt, vt, k_lens, variant.alibi ? &slopes : nullptr, options);  // [B, Hq, Sq, D]
      const Tensor got = session.output("y").permute({0, 2, 1, 3});         // [B, Hq, Sq, D]
      EXPECT_EQ(got.dtype(), DType::bf16);
      EXPECT_TRUE(testing::close(got, expected, default_tolerance(DType::bf16)));
    }
  }
}

// A two-arm branch over one input with a chosen fused arm (generic kind: N(0,1) inputs).
struct TestBranch {
  Graph g;
  NodeId branch;
  explicit TestBranch(int variant, const std::string& kind = "test") {
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
    recipe.kind = kind;
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

// An error raised while a bucket is measured (here by the arm-input generator, before any arm
// runs) keeps its type and is prefixed with the branch and the bucket, so a kernel or a copy that
// refuses its input during tuning says where (session 55: a bare "device copies need contiguous
// tensors" was all `splice bench` printed).
class RefusingGenerator : public ArmInputGenerator {
 public:
  void fill(const Graph&, const ArmRecipe&, Session&, std::int64_t, Rng&, SymBindings&,
            TensorMap&) const override {
    fail<LayoutError>("the generator refuses this region");
  }
};

TEST(Select, AnErrorWhileMeasuringNamesTheBranchAndBucketAndKeepsItsType) {
  register_arm_generator("test_refusing", std::make_shared<RefusingGenerator>());
  TestBranch t(0, "test_refusing");
  DecisionLog log;
  try {
    select_arms(t.g, log, TuneOptions{});
    FAIL() << "select_arms returned";
  } catch (const LayoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("arm selection of branch %" + std::to_string(t.branch.index) +
                        " (test_refusing), bucket ["),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("the generator refuses this region"), std::string::npos) << what;
  }
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

// A tuning cache that is not what select_arms writes is an IoError naming the file (and the entry,
// where one is at fault), raised before any branch is touched: the graph prints as before and the
// file is left as it was. Before session 51 a cached winner out of range indexed past the arms
// and a winner the entry did not record as verified was dispatched.
TEST(Select, ADamagedTuningCacheIsAClearErrorAndTouchesNothing) {
  const std::string path = testing::process_temp_path("splice_tuning_cache_damaged_test.json");
  std::filesystem::remove(path);
  const auto optimize = [&] {
    DemoAttentionGraph demo = build_demo_attention_graph(small());
    OptimizeOptions opt;
    opt.tune.cache_path = path;
    opt.tune.time_override = [](NodeId, int arm, std::int64_t) { return arm == 1 ? 1.0 : 2.0; };
    return optimize_graph(demo.graph, demo.specs, opt);
  };
  optimize();  // writes a good cache
  std::ifstream in(path);
  const nlohmann::json good = nlohmann::json::parse(in);
  in.close();
  ASSERT_FALSE(good["entries"].empty());
  const std::string key = good["entries"].begin().key();
  struct Damage {
    std::function<void(nlohmann::json&)> apply;
    std::string needle;
  };
  const std::vector<Damage> damages = {
      {[](nlohmann::json& j) { j = nlohmann::json::array(); }, "is not a splice tuning cache"},
      {[](nlohmann::json& j) { j["format"] = 1; }, "is not a splice tuning cache"},
      {[](nlohmann::json& j) { j["entries"] = nlohmann::json::array(); }, "`entries`"},
      {[&](nlohmann::json& j) { j["entries"][key] = 3; }, "is not an object"},
      {[&](nlohmann::json& j) { j["entries"][key]["winner"] = 7; }, "`winner`"},
      {[&](nlohmann::json& j) { j["entries"][key]["winner"] = -1; }, "`winner`"},
      {[&](nlohmann::json& j) { j["entries"][key]["winner"] = "1"; }, "`winner`"},
      {[&](nlohmann::json& j) {
         j["entries"][key]["winner"] = 1;
         j["entries"][key]["verified"][1] = false;
       },
       "not record as verified"},
      {[&](nlohmann::json& j) { j["entries"][key]["verified"][0] = "yes"; }, "`verified`"},
      {[&](nlohmann::json& j) { j["entries"][key]["verified"] = nlohmann::json::array(); },
       "`verified`"},
      {[&](nlohmann::json& j) { j["entries"][key]["median_us"].erase(0); }, "`median_us`"},
      {[&](nlohmann::json& j) { j["entries"][key]["failure"][0] = 0; }, "`failure`"},
      {[&](nlohmann::json& j) { j["entries"][key].erase("reason"); }, "`reason`"},
  };
  for (const Damage& damage : damages) {
    SCOPED_TRACE(damage.needle);
    nlohmann::json bad = good;
    damage.apply(bad);
    const std::string text = bad.dump(2);
    std::ofstream(path) << text;
    DemoAttentionGraph demo = build_demo_attention_graph(small());
    const std::string before = print_graph(demo.graph);
    OptimizeOptions opt;
    opt.tune.cache_path = path;
    opt.tune.time_override = [](NodeId, int, std::int64_t) { return 1.0; };
    try {
      optimize_graph(demo.graph, demo.specs, opt);
      ADD_FAILURE() << "no error";
    } catch (const IoError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(path), std::string::npos) << what;
      EXPECT_NE(what.find(damage.needle), std::string::npos) << what;
      EXPECT_NE(what.find("re-tune"), std::string::npos) << what;
    }
    std::ifstream back(path);
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(back), {}), text);
  }
  std::ofstream(path) << "{ not json";
  EXPECT_THROW(optimize(), IoError);
  std::filesystem::remove(path);
}

// Selects every branch of `graph` with the fused arm timed faster (1 us against 2 for arm 0), so
// a verified fused arm wins its bucket; returns `branch`'s decision.
const Decision& select_fused_faster(Graph& graph, DecisionLog& log, NodeId branch) {
  TuneOptions t;
  t.time_override = [](NodeId, int arm, std::int64_t) { return arm == 1 ? 1.0 : 2.0; };
  select_arms(graph, log, t);
  const Decision* d = log.find_branch(branch);
  if (d == nullptr) throw std::logic_error("select_fused_faster: no decision for the branch");
  return *d;
}

// The cache key (spec §4.4): device, kernel revision, dtype, shapes, fused attributes and the
// verification bound. A run that changes any of them measures again; the same run again measures
// nothing. The default device key is the tuning device's own ("cpu" here), never another's.
TEST(Select, TuningCacheKeysOnDeviceRevisionDtypeAndShapes) {
  const std::string path = testing::process_temp_path("splice_tuning_cache_keys_test.json");
  std::filesystem::remove(path);
  int timed = 0;
  // Tunes a fresh demo graph through `row` and returns how many arm timings it took.
  auto tune = [&](const DemoAttentionOptions& o, const std::string& device_name,
                  const std::string& revision, std::optional<Tolerance> bound = {}) {
    DemoAttentionGraph demo = build_demo_attention_graph(o);
    AttentionContract row = full_contract();
    row.revision = revision;
    row.verify_tolerance = bound;
    DecisionLog log;
    for (const auto& spec : demo.specs) offer_decode_flash_arm(demo.graph, spec, row, &log);
    TuneOptions t;
    t.cache_path = path;
    t.device_name = device_name;
    t.time_override = [&](NodeId, int arm, std::int64_t) {
      ++timed;
      return arm == 1 ? 1.0 : 2.0;
    };
    const int before = timed;
    select_arms(demo.graph, log, t);
    return timed - before;
  };
  DemoAttentionOptions bf16 = small();
  bf16.dtype = DType::bf16;
  DemoAttentionOptions smaller = small();
  smaller.capacity = 32;
  EXPECT_GT(tune(small(), "", "r1"), 0);
  EXPECT_EQ(tune(small(), "", "r1"), 0);
  EXPECT_EQ(tune(small(), "cpu", "r1"), 0);  // the default key is the device's
  EXPECT_GT(tune(small(), "another-device", "r1"), 0);
  EXPECT_GT(tune(small(), "", "r2"), 0);
  EXPECT_GT(tune(small(), "", "r1", Tolerance{1e-3, 1e-3}), 0);  // another verification bound
  EXPECT_EQ(tune(small(), "", "r1", Tolerance{1e-3, 1e-3}), 0);
  EXPECT_GT(tune(bf16, "", "r1"), 0);
  EXPECT_GT(tune(smaller, "", "r1"), 0);
  EXPECT_GT(tune(small(false, 30.0f), "", "r1"), 0);
  EXPECT_EQ(tune(small(false, 30.0f), "", "r1"), 0);
  EXPECT_EQ(tuning_device_key(Device::cpu()), "cpu");
  std::ifstream in(path);
  const nlohmann::json cache = nlohmann::json::parse(in);
  std::set<std::string> devices;
  for (const auto& [key, entry] : cache["entries"].items())
    devices.insert(key.substr(0, key.find('|')));
  EXPECT_EQ(devices, (std::set<std::string>{"cpu", "another-device"}));
  std::filesystem::remove(path);
}

// Verification points (spec §4.1): every bucket's points lie inside it, and over the buckets they
// include k_len = 1, the capacity, and in every bucket wider than two a length off every tile
// (odd) strictly inside it.
TEST(Select, VerificationPointsCoverOneAMisalignedLengthAndTheCapacity) {
  const auto generator = arm_generator("flash_decode");
  const std::int64_t capacity = 4096;
  std::set<std::int64_t> all;
  for (const auto& [lo, hi] : selector_buckets(1, capacity, 12)) {
    SCOPED_TRACE("bucket [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    const std::vector<std::int64_t> points = generator->verification_points(lo, hi);
    bool misaligned_inside = false;
    for (std::int64_t p : points) {
      EXPECT_GE(p, lo);
      EXPECT_LE(p, hi);
      misaligned_inside |= p > lo && p < hi && p % 2 == 1;
      all.insert(p);
    }
    EXPECT_EQ(points.front(), lo);
    EXPECT_EQ(points.back(), hi);
    if (hi - lo >= 2) {
      EXPECT_TRUE(misaligned_inside);
    }
  }
  EXPECT_EQ(all.count(1), 1u);
  EXPECT_EQ(all.count(capacity), 1u);
}

// A fused arm wrong only above some length is disqualified in those buckets alone (spec §4.1 "for
// that bucket"): its flash node masks keys left of an 8-key window the oracle does not have, so
// the arms agree while k_len <= 9 (every key is inside the window) and differ beyond. The
// explanation names the rejection, its error, the timings and each bucket's winner (§4.5).
TEST(Select, DisqualifiesTheFusedArmOnlyInTheBucketsWhereItIsWrong) {
  DemoAttentionGraph demo = build_demo_attention_graph(small());  // capacity 64, no window
  DecodeFlashSpec spec = demo.specs[0];
  spec.window_size_left = 8;
  DecisionLog log;
  const OfferResult offer = offer_decode_flash_arm(demo.graph, spec, full_contract(), &log);
  ASSERT_TRUE(offer.offered) << offer.reason;
  const Decision& d = select_fused_faster(demo.graph, log, offer.branch);
  ASSERT_EQ(d.buckets.size(), 7u);  // [1,1] [2,2] [3,4] [5,8] [9,16] [17,32] [33,64]
  for (const auto& b : d.buckets) {
    SCOPED_TRACE("bucket [" + std::to_string(b.lo) + ", " + std::to_string(b.hi) + "]");
    const bool agrees = b.hi <= 9;
    EXPECT_EQ(static_cast<bool>(b.verified[1]), agrees) << b.failure[1];
    EXPECT_EQ(b.winner, agrees ? 1 : 0);
    if (!agrees) {
      EXPECT_NE(b.failure[1].find("output at selector"), std::string::npos) << b.failure[1];
      EXPECT_GT(b.max_abs_error[1], 1e-3);
    }
  }
  EXPECT_EQ(d.collapsed_to, -1);  // both arms stay, dispatched per bucket
  const std::string text = log.str();
  EXPECT_NE(text.find("REJECTED"), std::string::npos) << text;
  EXPECT_NE(text.find("max_abs_err="), std::string::npos) << text;
  EXPECT_NE(text.find("-> arm 1 (fastest verified)"), std::string::npos) << text;
  EXPECT_NE(text.find("-> arm 0 (arm 0 (oracle): no verified fused arm)"), std::string::npos)
      << text;
  EXPECT_NE(text.find(" 2 us"), std::string::npos) << text;
}

// A fused arm that reads the key at k_len (its flash node attends k_len + 1 keys) meets the NaN
// poisoned there and is rejected in every bucket (spec §4.1: rows at and beyond k_len must not
// leak).
TEST(Select, AFusedArmThatReadsPastKLenIsRejected) {
  DemoAttentionGraph demo = build_demo_attention_graph(small());
  DecisionLog log;
  const OfferResult offer =
      offer_decode_flash_arm(demo.graph, demo.specs[0], full_contract(), &log);
  ASSERT_TRUE(offer.offered) << offer.reason;
  const NodeId fused = demo.graph.node(offer.branch).inputs.at(1);
  ASSERT_EQ(demo.graph.node(fused).op, Op::FlashDecode);
  auto attrs = std::make_shared<FlashDecodeAttrs>(*demo.graph.node(fused).attrs.flash);
  attrs->k_len = DynScalar::Expr(SymExpr(demo.k_len) + SymExpr(1));
  demo.graph.mutable_node(fused).attrs.flash = attrs;
  const Decision& d = select_fused_faster(demo.graph, log, offer.branch);
  ASSERT_FALSE(d.buckets.empty());
  for (const auto& b : d.buckets) {
    SCOPED_TRACE("bucket [" + std::to_string(b.lo) + ", " + std::to_string(b.hi) + "]");
    EXPECT_FALSE(b.verified[1]);
    EXPECT_EQ(b.winner, 0);
    EXPECT_NE(b.failure[1].find("selector " + std::to_string(b.lo)), std::string::npos)
        << b.failure[1];
  }
  EXPECT_EQ(d.collapsed_to, 0);
}

// The contract row's bound is the verifier's (spec §4.1): a row that allows no error at all
// rejects the real flash arm, whose fp32 sums are ordered otherwise than the oracle's, where the
// policy default verifies it (RealFlashArmVerifiesAndDispatchesPerBucket).
TEST(Select, VerificationUsesTheContractRowsTolerance) {
  DemoAttentionGraph demo = build_demo_attention_graph(small(true, 20.0f, 24));
  AttentionContract exact = full_contract();
  exact.verify_tolerance = Tolerance{0.0, 0.0};
  DecisionLog log;
  const OfferResult offer = offer_decode_flash_arm(demo.graph, demo.specs[0], exact, &log);
  ASSERT_TRUE(offer.offered) << offer.reason;
  const Decision& d = select_fused_faster(demo.graph, log, offer.branch);
  int rejected = 0;
  for (const auto& b : d.buckets) {
    if (b.verified[1]) continue;
    ++rejected;
    EXPECT_NE(b.failure[1].find("output at selector"), std::string::npos) << b.failure[1];
    EXPECT_LT(b.max_abs_error[1], 1e-4);  // rounding, not a wrong arm
  }
  EXPECT_GT(rejected, 0);
}

TEST(Select, MissingTimingKeepsArmZero) {
  TestBranch t(0);
  DecisionLog log;
  TuneOptions opt;
  opt.time_override = [](NodeId, int arm, std::int64_t) { return arm == 1 ? NAN : 10.0; };
  select_arms(t.g, log, opt);
  const auto& bucket = log.entries()[0].buckets.at(0);
  EXPECT_TRUE(bucket.verified[1]);
  EXPECT_EQ(bucket.winner, 0);
  EXPECT_NE(bucket.reason.find("missing timing"), std::string::npos) << bucket.reason;
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
