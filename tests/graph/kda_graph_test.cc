// KDA on the graph side: the decomposed arm (primitives) against the fused arm over a 64-step
// persistent loop of a small KDA layer, both gate modes, fp32 and bf16 state; the offer, its
// verification (outputs, conv_state bit for bit, state within tolerance) and its decisions.
#include <gtest/gtest.h>

#include "splice/core/error.h"
#include "splice/exec/session.h"
#include "splice/model/blocks.h"
#include "splice/ops/kda_decode.h"
#include "splice/tune/optimize.h"
#include "support/test_util.h"

namespace splice {
namespace {

struct KdaLayer {
  Graph graph;
  KdaDecodeSpec spec;
};

constexpr std::int64_t kRows = 2, kHeads = 2, kDim = 128, kSlots = 4;
constexpr std::int64_t kChannels = kHeads * kDim;

KdaLayer build_layer(std::optional<float> lower_bound, DType state_dtype, std::uint64_t seed) {
  KdaLayer layer;
  Graph& g = layer.graph;
  Rng rng(seed);
  const SymExpr R(kRows), H(kHeads), D(kDim), one(1);
  KdaRegionArgs a;
  a.x = g.input("x", {R, SymExpr(3 * kChannels)}, DType::bf16);
  a.raw_gate = g.input("raw_gate", {one, R, H, D}, DType::bf16);
  a.raw_beta = g.input("raw_beta", {one, R, H}, DType::bf16);
  a.output_gate = g.input("output_gate", {R, H, D}, DType::bf16);
  a.weight =
      g.param("conv_weight", testing::random_tensor(rng, {3, 4, kChannels}, DType::f32, 0.1));
  a.A_log = g.param("A_log", testing::random_tensor(rng, {kHeads}, DType::f32, 0.5));
  a.dt_bias = g.param("dt_bias", testing::random_tensor(rng, {kChannels}, DType::f32, 0.1));
  a.norm_weight = g.param("norm_weight", testing::random_tensor(rng, {kDim}, DType::f32));
  a.conv_state =
      g.state("conv_state", {SymExpr(kSlots), SymExpr(3), SymExpr(3 * kChannels)}, DType::bf16);
  a.state = g.state("state", {SymExpr(kSlots), H, D, D}, state_dtype);
  a.lower_bound = lower_bound;
  a.site = "kda0";
  KdaRegion region = emit_decomposed_kda(g, a);
  g.mark_output("y", region.output);
  layer.spec = region.spec;
  return layer;
}

TensorMap step_inputs(Rng& rng) {
  return {{"x", testing::random_tensor(rng, {kRows, 3 * kChannels}, DType::bf16)},
          {"raw_gate", testing::random_tensor(rng, {1, kRows, kHeads, kDim}, DType::bf16)},
          {"raw_beta", testing::random_tensor(rng, {1, kRows, kHeads}, DType::bf16)},
          {"output_gate", testing::random_tensor(rng, {kRows, kHeads, kDim}, DType::bf16)}};
}

void fill_states(Session& s, std::uint64_t seed) {
  Rng rng(seed);
  Tensor conv = s.state("conv_state"), st = s.state("state");
  rng.normal(conv, 0.0, 0.1);
  rng.normal(st, 0.0, 0.01);
}

class KdaArms : public ::testing::TestWithParam<std::tuple<bool, DType>> {};

TEST_P(KdaArms, FusedMatchesDecomposedOver64Steps) {
  const auto [gated, state_dtype] = GetParam();
  const std::optional<float> lower_bound = gated ? std::optional<float>(-5.0f) : std::nullopt;
  KdaLayer a = build_layer(lower_bound, state_dtype, 5),
           b = build_layer(lower_bound, state_dtype, 5);
  const OfferResult ra = offer_kda_arm(a.graph, a.spec, cpu_kda_contract());
  const OfferResult rb = offer_kda_arm(b.graph, b.spec, cpu_kda_contract());
  ASSERT_TRUE(ra.offered && rb.offered) << ra.reason;
  collapse(a.graph, ra.branch, 0);
  collapse(b.graph, rb.branch, 1);
  eliminate_dead_code(a.graph);
  eliminate_dead_code(b.graph);
  Session decomposed(a.graph), fused(b.graph);
  fill_states(decomposed, 9);
  fill_states(fused, 9);
  const Tensor slot0 = decomposed.state("state").select(0, 0).clone();
  Rng rng(17);
  for (int step = 0; step < 64; ++step) {
    const TensorMap inputs = step_inputs(rng);
    decomposed.step({}, inputs);
    fused.step({}, inputs);
    ASSERT_TRUE(
        testing::close(fused.output("y"), decomposed.output("y"), default_tolerance(DType::bf16)))
        << "step " << step;
  }
  // The conv history is a bit copy of the inputs either way.
  EXPECT_TRUE(testing::bit_equal(fused.state("conv_state"), decomposed.state("conv_state")));
  const Tolerance state_tol =
      state_dtype == DType::f32 ? Tolerance{1e-4, 1e-3} : default_tolerance(DType::bf16);
  EXPECT_TRUE(testing::close(fused.state("state"), decomposed.state("state"), state_tol));
  // Slot 0 is reserved and never written.
  EXPECT_TRUE(testing::bit_equal(fused.state("state").select(0, 0), slot0));
  EXPECT_TRUE(testing::bit_equal(decomposed.state("state").select(0, 0), slot0));
}

INSTANTIATE_TEST_SUITE_P(GateAndState, KdaArms,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(DType::f32, DType::bf16)));

TEST(KdaBranch, OfferVerifyAndChoose) {
  KdaLayer layer = build_layer(-5.0f, DType::f32, 3);
  OptimizeOptions opt;
  DecisionLog log = optimize_graph(layer.graph, {}, opt, {layer.spec});
  ASSERT_EQ(log.entries().size(), 1u);
  const Decision& d = log.entries()[0];
  EXPECT_TRUE(d.offered) << d.reason;
  ASSERT_EQ(d.buckets.size(), 1u);
  EXPECT_TRUE(d.buckets[0].verified[1]) << d.buckets[0].failure[1];
  EXPECT_LT(d.buckets[0].max_abs_error[1], 2e-2);
  EXPECT_NE(log.str().find("kda_decode"), std::string::npos);
  Session s(layer.graph);
  Rng rng(2);
  s.step({}, step_inputs(rng));
  EXPECT_EQ(s.output("y").shape(), (Dims{kRows, kChannels}));
}

TEST(KdaBranch, DeclinedForAnUnsupportedStateDtypeAndMalformedSpecsThrow) {
  KdaLayer layer = build_layer(-5.0f, DType::f32, 3);
  KdaContract narrow = cpu_kda_contract();
  narrow.state_dtypes = {DType::bf16};
  const std::string before = print_graph(layer.graph);
  const OfferResult r = offer_kda_arm(layer.graph, layer.spec, narrow);
  EXPECT_FALSE(r.offered);
  EXPECT_NE(r.reason.find("state dtype"), std::string::npos);
  EXPECT_EQ(print_graph(layer.graph), before);
  KdaDecodeSpec bad = layer.spec;
  bad.reconverge = bad.x;
  EXPECT_THROW(offer_kda_arm(layer.graph, bad, cpu_kda_contract()), GraphError);
  bad = layer.spec;
  bad.state = bad.x;
  EXPECT_THROW(offer_kda_arm(layer.graph, bad, cpu_kda_contract()), GraphError);
}

}  // namespace
}  // namespace splice
