// The rope_kv_append region alone as a graph, shared by the CPU graph test
// (tests/graph/rope_kv_append_graph_test.cc) and the GPU replay test
// (tests/cuda/rope_kv_append_test.cc), so both check the same graph.
#pragma once

#include <cstdint>
#include <vector>

#include "splice/core/random.h"
#include "splice/core/sym.h"
#include "splice/ir/graph.h"
#include "splice/model/model.h"
#include "splice/ops/layer_ops.h"
#include "splice/passes/layer_ops.h"
#include "support/test_util.h"

namespace splice::testing {

inline constexpr std::int64_t kRegionHeads = 4, kRegionKvHeads = 2, kRegionDim = 64;
inline constexpr std::int64_t kRegionRow = (kRegionHeads + 2 * kRegionKvHeads) * kRegionDim;

// qkv [1, 1, (Hq + 2 Hkv) D] bf16 -> layers::rope_kv_append at position k_len - 1 (k_len in
// [1, capacity]); outputs q, k_seen, v_seen: f32 copies (exact) of the rotated q and of both
// caches read through their StateAfter views (every row: what attention would see). The branch
// is offered by `contract` and collapsed to `arm` (0 decomposed, 1 fused).
inline Graph rope_kv_append_region_graph(int arm, std::int64_t capacity,
                                         const LayerOpContract& contract) {
  Graph g;
  const SymExpr k_len = g.declare_symbol("k_len", 1, capacity);
  const NodeId qkv = g.input("qkv", {SymExpr(1), SymExpr(1), SymExpr(kRegionRow)}, DType::bf16);
  Rng rng(41);
  const NodeId cos = g.param("cos", random_tensor(rng, {capacity, kRegionDim}, DType::f32));
  const NodeId sin = g.param("sin", random_tensor(rng, {capacity, kRegionDim}, DType::f32));
  const NodeId position = g.sym_value(DynScalar::Expr(k_len - 1), DType::i32);
  // [1, Hkv, capacity, D]
  const SymShape cache{SymExpr(1), SymExpr(kRegionKvHeads), SymExpr(capacity), SymExpr(kRegionDim)};
  const NodeId k_state = g.state("k_cache", cache, DType::bf16);
  const NodeId v_state = g.state("v_cache", cache, DType::bf16);
  std::vector<LayerOpSpec> specs;
  const layers::RopeKvAppendOut r =
      layers::rope_kv_append(g, qkv, kRegionHeads, cos, sin, position, k_state, v_state,
                             DynScalar::Expr(k_len - 1), &specs, "region");
  g.mark_output("q", g.cast(r.q, DType::f32));
  g.mark_output("k_seen", g.cast(r.k_cache, DType::f32));
  g.mark_output("v_seen", g.cast(r.v_cache, DType::f32));
  EXPECT_EQ(specs.size(), 1u);
  const OfferResult offer = offer_layer_op_arm(g, specs.at(0), contract);
  EXPECT_TRUE(offer.offered) << offer.reason;
  collapse(g, offer.branch, arm);
  eliminate_dead_code(g);
  verify_graph(g);
  return g;
}

}  // namespace splice::testing
