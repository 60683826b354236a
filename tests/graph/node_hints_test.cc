// The plan-time promises of exec/node_kernels.h (NodeHints), computed from the graph alone (no
// GPU needed): which kernels may read before their programmatic-dependent-launch wait.
//
//   1. A tiny Llama (stacked projections, the flash arm collapsed), with the rope_kv_append arm
//      fused or decomposed: on a CUDA session every FlashDecode node gets stable_kv_prefix (its
//      caches' only writers append at k_len - 1, through RopeKvAppend's SymValue position or
//      WriteAt's offset) and every RopeKvAppend gets stable_position and (its q feeds such an
//      attention) trigger_dependents_first; on the CPU none.
//   2. Any other writer of a cache takes the promise away from the attention that reads it (and
//      only from that one, and with it the early trigger of the RoPE kernel feeding it): a
//      WriteAt at row 0, a WriteAt at k_len - 2, a WriteAt on the wrong axis (the graph refuses
//      a WriteAt through a permuted view).
//   3. The default hybrid model's KdaDecode nodes get stable_kda_state on CUDA (constant slot
//      tables; the state written only by the node itself), with the branch collapsed to the
//      fused arm and with both arms left in (the oracle's WriteAt on the state sits in the other
//      arm); on the CPU none. A WriteAt on one layer's state outside the branch takes that
//      layer's promise away, and only that one's.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "exec/node_kernels.h"
#include "splice/ir/graph.h"
#include "splice/model/default_model.h"
#include "splice/model/model.h"
#include "splice/tune/optimize.h"
#include "support/graph_test_util.h"
#include "support/tiny_llama.h"

namespace splice {
namespace {

// The tiny Llama's graph with the flash arm chosen and rope_kv_append's arm `rope_arm`.
Graph llama(int rope_arm) {
  return testing::collapsed_rope_kv_append_llama(
      testing::process_temp_path("node_hints_llama"), Device::cpu(), [&](const std::string& kind) {
        return kind == "rope_kv_append" ? rope_arm : kind == "flash_decode" ? 1 : 0;
      });
}

using testing::nodes_of;

NodeId state_named(const Graph& g, const std::string& name) {
  for (NodeId id : g.live_nodes())
    if (g.node(id).op == Op::State && g.node(id).attrs.name == name) return id;
  ADD_FAILURE() << "no state " << name;
  return {};
}

// Whether each FlashDecode node (in node order) gets the stable-prefix promise on CUDA.
std::vector<bool> flash_promises(const Graph& g) {
  std::vector<bool> promises;
  for (NodeId id : nodes_of(g, Op::FlashDecode))
    promises.push_back(node_hints(g, id, Device::cuda()).stable_kv_prefix);
  return promises;
}

TEST(NodeHints, DecodeStepAttentionReadsAStablePrefix) {
  for (int rope_arm : {0, 1}) {
    SCOPED_TRACE(rope_arm == 1 ? "rope_kv_append fused" : "rope and write_at decomposed");
    const Graph g = llama(rope_arm);
    const std::vector<NodeId> flash = nodes_of(g, Op::FlashDecode);
    ASSERT_EQ(flash.size(), 2u);
    for (NodeId id : flash) {
      EXPECT_TRUE(node_hints(g, id, Device::cuda()).stable_kv_prefix);
      EXPECT_FALSE(node_hints(g, id, Device::cpu()).stable_kv_prefix);
    }
    const std::vector<NodeId> rope = nodes_of(g, Op::RopeKvAppend);
    EXPECT_EQ(rope.size(), rope_arm == 1 ? 2u : 0u);
    for (NodeId id : rope) {
      EXPECT_TRUE(node_hints(g, id, Device::cuda()).stable_position);
      EXPECT_FALSE(node_hints(g, id, Device::cpu()).stable_position);
      // Its q feeds an attention that works before its wait: let that launch early.
      EXPECT_TRUE(node_hints(g, id, Device::cuda()).trigger_dependents_first);
      EXPECT_FALSE(node_hints(g, id, Device::cpu()).trigger_dependents_first);
    }
  }
}

TEST(NodeHints, AnyOtherCacheWriterTakesThePromiseAway) {
  const testing::TinyLlamaSpec spec = testing::rope_kv_append_llama_spec();
  const std::int64_t head_dim = spec.hidden / spec.heads;
  struct Writer {
    const char* what;
    std::int64_t axis;
    int offset_kind;  // 0: row 0, 1: k_len - 2
  };
  const Writer writers[] = {{"row 0", 2, 0}, {"k_len - 2", 2, 1}, {"axis 1", 1, 0}};
  for (const Writer& w : writers) {
    SCOPED_TRACE(w.what);
    Graph g = llama(1);
    const NodeId cache = state_named(g, "model.layers.1.v_cache");
    const SymId k_len = *g.symbols().find("k_len");
    const Dims row = w.axis == 2 ? Dims{1, spec.kv_heads, 1, head_dim} : Dims{1, 1, 16, head_dim};
    const NodeId value = g.constant(Tensor::zeros(row, DType::bf16), "extra_row");
    const DynScalar offset =
        w.offset_kind == 0 ? DynScalar::Concrete(0) : DynScalar::Expr(SymExpr(k_len) - SymExpr(2));
    g.write_at(cache, value, w.axis, offset);
    // Layer 1's attention loses the promise; layer 0's keeps it, and so do the RoPE kernels'
    // triggers.
    EXPECT_EQ(flash_promises(g), (std::vector<bool>{true, false}));
    std::vector<bool> triggers;
    for (NodeId id : nodes_of(g, Op::RopeKvAppend))
      triggers.push_back(node_hints(g, id, Device::cuda()).trigger_dependents_first);
    EXPECT_EQ(triggers, (std::vector<bool>{true, false}));
  }
}

// The default hybrid model with its KDA fused arms offered: `select` collapses every branch to
// the fused arm (timed faster), else both arms stay in.
DecodeModel kda_model(bool select) {
  const ModelConfig config = default_model_config();
  const Weights weights = Weights::from_tensors(make_kda_weights(config, 5));
  BuildOptions options;
  options.max_seq_len = 16;
  DecodeModel model = build_kda_decode_model(config, weights, options);
  OptimizeOptions opt;
  opt.select = select;
  opt.tune.warmup = 0;
  opt.tune.repeats = 1;
  opt.tune.time_override = [](NodeId, int arm, std::int64_t) { return arm == 0 ? 100.0 : 1.0; };
  optimize_graph(model.graph, model.attention_specs, opt, model.kda_specs);
  return model;
}

std::vector<bool> kda_promises(const Graph& g, Device device) {
  std::vector<bool> promises;
  for (NodeId id : nodes_of(g, Op::KdaDecode))
    promises.push_back(node_hints(g, id, device).stable_kda_state);
  return promises;
}

TEST(NodeHints, KdaDecodeReadsAStableState) {
  for (bool select : {true, false}) {
    SCOPED_TRACE(select ? "fused arm chosen" : "both arms in the branch");
    const DecodeModel m = kda_model(select);
    const std::vector<bool> cuda = kda_promises(m.graph, Device::cuda());
    ASSERT_GE(cuda.size(), 2u);
    EXPECT_EQ(cuda, std::vector<bool>(cuda.size(), true));
    EXPECT_EQ(kda_promises(m.graph, Device::cpu()), std::vector<bool>(cuda.size(), false));
    std::size_t branches = 0;
    for (NodeId id : m.graph.live_nodes()) branches += m.graph.node(id).op == Op::Branch;
    EXPECT_EQ(branches > 0, !select);
  }
}

TEST(NodeHints, AnyOtherKdaStateWriterTakesThePromiseAway) {
  DecodeModel m = kda_model(true);
  Graph& g = m.graph;
  const std::vector<NodeId> kda = nodes_of(g, Op::KdaDecode);
  ASSERT_GE(kda.size(), 2u);
  const NodeId state = g.node(kda[0]).inputs[8];
  Dims row = {1};
  for (std::size_t d = 1; d < g.node(state).shape.size(); ++d)
    row.push_back(g.node(state).shape[d].constant());
  const NodeId value = g.constant(Tensor::zeros(row, g.node(state).dtype), "extra_state_row");
  g.write_at(state, value, 0, DynScalar::Concrete(1));
  std::vector<bool> want(kda.size(), true);
  want[0] = false;
  EXPECT_EQ(kda_promises(g, Device::cuda()), want);
}

}  // namespace
}  // namespace splice
