// The rope_kv_append region of the Llama builder (stacked projections) in the graph: one
// LayerOpSpec per layer whose arm 0 is the RoPE region plus two write_at sequenced before the
// rotated q, and whose fused arm is Op::RopeKvAppend writing both caches in place; attention reads
// the caches through StateAfter views of the region's merge.
//
//  1. Offer: one rope_kv_append branch per layer, offered by the CPU contract row; the flash spec's
//     k and v are StateAfter nodes.
//  2. Plan order (uncollapsed and collapsed to either arm): every reader of a layer's caches (the
//     FlashDecode node, the decomposed attention's live-prefix slices) runs after that layer's
//     appends (arm 0's write_at, or RopeKvAppend): attention reads the cache written this step.
//  3. Verify and choose: select_arms verifies the fused arm (output and both caches bit for bit)
//     and, timed faster, collapses every region to it.
//  4. Sessions of the graph collapsed to arm 0 and to arm 1 give bitwise the same logits and
//     caches over 6 steps, with the decomposed attention and with the flash arm (what the GPU
//     test replays).
//  5. The region alone (region_graph), either arm, positions out of order: bit for bit.
#include <gtest/gtest.h>

#include "splice/exec/session.h"
#include "splice/model/model.h"
#include "splice/ops/layer_ops.h"
#include "splice/passes/layer_ops.h"
#include "splice/tune/optimize.h"
#include "support/graph_test_util.h"
#include "support/rope_kv_append_region.h"
#include "support/test_util.h"
#include "support/tiny_llama.h"

namespace splice {
namespace {

constexpr int kLayers = 2;
constexpr std::int64_t kMaxSeqLen = 16;

DecodeModel tiny_llama() {
  return testing::rope_kv_append_llama(testing::process_temp_path("rope_kv_append_llama"));
}

// The live nodes of `op`, in node order.
using testing::nodes_of;

// The State node a node's storage ends in.
NodeId state_root(const Plan& plan, NodeId id) { return plan.storage_root[id.index]; }

// Every reader of a cache version written this step (through views) runs after every writer of
// that cache (WriteAt or RopeKvAppend) that runs.
void expect_appends_before_attention(const Graph& g) {
  const Plan plan = make_plan(g);
  const std::vector<bool> run = nodes_to_run(g, plan, std::vector<int>(plan.branches.size() * 2));
  int readers = 0;
  for (NodeId reader : g.live_nodes()) {
    const Node& n = g.node(reader);
    const bool attention_read =
        n.op == Op::FlashDecode ||
        (n.op == Op::Slice && n.inputs.size() && g.node(n.inputs[0]).op == Op::StateAfter);
    if (!attention_read || !run[reader.index]) continue;
    const NodeId cache = state_root(plan, n.op == Op::FlashDecode ? n.inputs[1] : n.inputs[0]);
    for (NodeId writer : g.live_nodes()) {
      const Node& w = g.node(writer);
      if (!run[writer.index]) continue;
      const bool writes =
          (w.op == Op::WriteAt && state_root(plan, w.inputs[0]) == cache) ||
          (w.op == Op::RopeKvAppend && (w.inputs[4] == cache || w.inputs[5] == cache)) ||
          (w.op == Op::RmsNormMatMulRopeKvAppend && (w.inputs[6] == cache || w.inputs[7] == cache));
      if (writes) {
        ++readers;
        EXPECT_LT(plan.position[writer.index], plan.position[reader.index])
            << op_name(w.op) << " %" << writer.index << " after " << op_name(n.op) << " %"
            << reader.index;
      }
    }
  }
  EXPECT_GT(readers, 0);
}

// Arm 1 faster, except for the rms_norm_matmul_rope_kv_append branch around each region (its
// own test is qkv_rope_graph_test.cc), which keeps arm 0 and so the region's branch.
OptimizeOptions options(bool select, const Graph* graph = nullptr) {
  OptimizeOptions o;
  o.select = select;
  o.tune.warmup = 0;
  o.tune.repeats = 1;
  o.tune.time_override = [graph](NodeId branch, int arm, std::int64_t) {
    const bool outer = graph != nullptr && graph->node(branch).attrs.branch->recipe.kind ==
                                               "rms_norm_matmul_rope_kv_append";
    return (arm == 1) != outer ? 1.0 : 2.0;
  };
  return o;
}

TEST(RopeKvAppendGraph, OfferedPerLayerAndAttentionReadsTheAppendedCaches) {
  DecodeModel m = tiny_llama();
  int specs = 0;
  for (const LayerOpSpec& s : m.layer_specs) specs += s.kind == LayerOpKind::rope_kv_append;
  EXPECT_EQ(specs, kLayers);
  for (const DecodeFlashSpec& s : m.attention_specs) {
    EXPECT_EQ(m.graph.node(s.k).op, Op::StateAfter);
    EXPECT_EQ(m.graph.node(s.v).op, Op::StateAfter);
  }
  const DecisionLog log =
      optimize_graph(m.graph, m.attention_specs, options(false), m.kda_specs, m.layer_specs);
  int offered = 0;
  for (const Decision& d : log.entries())
    if (d.kind == "rope_kv_append") offered += d.offered;
  EXPECT_EQ(offered, kLayers);
  EXPECT_EQ(nodes_of(m.graph, Op::RopeKvAppend).size(), static_cast<std::size_t>(kLayers));
  // Uncollapsed, every arm 0 run: attention after the write_at appends.
  expect_appends_before_attention(m.graph);
}

TEST(RopeKvAppendGraph, VerifiedChosenAndPlannedBeforeTheFlashArm) {
  DecodeModel m = tiny_llama();
  const DecisionLog log = optimize_graph(m.graph, m.attention_specs, options(true, &m.graph),
                                         m.kda_specs, m.layer_specs);
  int chosen = 0;
  for (const Decision& d : log.entries()) {
    if (d.kind != "rope_kv_append") continue;
    ASSERT_FALSE(d.buckets.empty()) << d.site;
    for (const BucketDecision& b : d.buckets) {
      ASSERT_EQ(b.verified.size(), 2u);
      EXPECT_TRUE(b.verified[1]) << d.site << ": " << b.failure[1];
    }
    chosen += d.collapsed_to == 1;
  }
  EXPECT_EQ(chosen, kLayers);
  EXPECT_EQ(nodes_of(m.graph, Op::RopeKvAppend).size(), static_cast<std::size_t>(kLayers));
  EXPECT_FALSE(nodes_of(m.graph, Op::FlashDecode).empty());
  expect_appends_before_attention(m.graph);
}

// Collapses every rope_kv_append branch to `arm`, every flash_decode branch to `attention_arm`
// and every other branch to arm 0.
Graph collapsed(int arm, int attention_arm) {
  DecodeModel m = tiny_llama();
  optimize_graph(m.graph, m.attention_specs, options(false), m.kda_specs, m.layer_specs);
  for (NodeId id : nodes_of(m.graph, Op::Branch)) {
    const std::string& kind = m.graph.node(id).attrs.branch->recipe.kind;
    collapse(m.graph, id,
             kind == "rope_kv_append" ? arm
             : kind == "flash_decode" ? attention_arm
                                      : 0);
  }
  eliminate_dead_code(m.graph);
  verify_graph(m.graph);
  return std::move(m.graph);
}

// Over 6 steps (positions 0-5, every cache row written before being read by later steps), with
// the decomposed attention and with the flash arm reading the StateAfter views.
TEST(RopeKvAppendGraph, FusedArmSessionIsBitwiseTheDecomposedOne) {
  for (int attention_arm : {0, 1}) {
    SCOPED_TRACE("attention arm " + std::to_string(attention_arm));
    Graph plain = collapsed(0, attention_arm), fused = collapsed(1, attention_arm);
    EXPECT_TRUE(nodes_of(plain, Op::RopeKvAppend).empty());
    EXPECT_EQ(nodes_of(fused, Op::RopeKvAppend).size(), static_cast<std::size_t>(kLayers));
    EXPECT_EQ(nodes_of(fused, Op::FlashDecode).size(),
              attention_arm == 1 ? static_cast<std::size_t>(kLayers) : 0u);
    expect_appends_before_attention(plain);
    expect_appends_before_attention(fused);
    Session a(std::move(plain)), b(std::move(fused));
    for (std::int64_t step = 1; step <= 6; ++step) {
      Tensor tokens = Tensor::empty({1}, DType::i32);
      tokens.data<std::int32_t>()[0] = static_cast<std::int32_t>(step * 7 % 61);
      a.step({{"k_len", step}}, {{"tokens", tokens}});
      b.step({{"k_len", step}}, {{"tokens", tokens}});
      EXPECT_TRUE(testing::bit_equal(b.output("logits"), a.output("logits"))) << "step " << step;
      for (int l = 0; l < kLayers; ++l)
        for (const char* cache : {"k_cache", "v_cache"}) {
          const std::string name = "model.layers." + std::to_string(l) + "." + cache;
          EXPECT_TRUE(testing::bit_equal(b.state(name), a.state(name))) << name << " step " << step;
        }
    }
  }
}

// The region alone (qkv an input, position k_len - 1; outputs q and f32 copies of both caches
// read through their StateAfter views), collapsed to either arm: bit for bit over every cache row
// visited out of order (one row twice), the row just written holding this step's v. The GPU test
// replays the same graph against this CPU session.
using testing::kRegionDim;
using testing::kRegionHeads;
using testing::kRegionKvHeads;
using testing::kRegionRow;

Graph region_graph(int arm) {
  return testing::rope_kv_append_region_graph(arm, kMaxSeqLen, cpu_layer_ops_contract());
}

TEST(RopeKvAppendGraph, RegionAloneArmsBitwiseAtPositionsOutOfOrder) {
  Session fused(region_graph(1)), plain(region_graph(0));
  Rng rng(7);
  const std::int64_t k_lens[] = {1, 2, 3, 7, 4, 16, 5, 6, 10, 8, 9, 2, 12};
  for (std::int64_t k_len : k_lens) {
    SCOPED_TRACE("k_len " + std::to_string(k_len));
    const Tensor qkv = testing::random_tensor(rng, {1, 1, kRegionRow}, DType::bf16);  // [1, 1, row]
    fused.step({{"k_len", k_len}}, {{"qkv", qkv}});
    plain.step({{"k_len", k_len}}, {{"qkv", qkv}});
    for (const char* name : {"q", "k_seen", "v_seen"})
      EXPECT_TRUE(testing::bit_equal(fused.output(name), plain.output(name))) << name;
    // v head 0 of this step's qkv (after the q and k heads) is row k_len - 1 of v_seen.
    const Tensor v_row = fused.output("v_seen").slice(2, k_len - 1, k_len).slice(1, 0, 1);
    const std::int64_t v0 = (kRegionHeads + kRegionKvHeads) * kRegionDim;
    const Tensor v_in = qkv.slice(2, v0, v0 + kRegionDim);
    for (std::int64_t j = 0; j < kRegionDim; ++j)
      EXPECT_EQ(v_row.at({0, 0, 0, j}), v_in.at({0, 0, j})) << j;
  }
}

}  // namespace
}  // namespace splice
