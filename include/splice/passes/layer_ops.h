// splice/passes/layer_ops.h: LayerOpSpec and the offer of a fused layer-op arm (RmsNorm, SiluMul,
// Rope, MatMulAdd, RmsNormMatMul, SiluMulMatMulAdd, RopeKvAppend, RmsNormMatMulRopeKvAppend,
// RmsNormMatMulSwiglu) — the mechanism of attention and KDA (passes/decode_flash.h,
// tune/select.h) for the small per-layer ops a model builds from primitives.
//
// One spec struct and one pass serve the nine ops: they differ only in their input list and one
// attribute, and share the contract row (LayerOpContract: ops and dtypes per backend).
// A model builds each op from primitives (arm 0, the oracle) ending in `decomposed_out`, adds a
// sole-consumer merge node (`<site>.<op>_merge`, a same-shape view reshape) and hands the optimizer
// this spec. offer_layer_op_arm:
//   1. validates the spec: ids live; the input list of the op (rms_norm: x [..., H], weight [H];
//      silu_mul: a, b of one shape and dtype; rope: x [..., D], cos, sin [max_seq_len, D],
//      position [1] i32; matmul_add: a [..., M, K], b [N, K], c [..., M, N]; rms_norm_matmul:
//      x [..., M, K], norm_weight [K], w [N, K]; silu_mul_matmul_add: a, b [..., M, K], w [N, K],
//      c [..., M, N]; rope_kv_append: qkv [B, 1, (Hq + 2 Hkv) D], cos, sin, position, k_cache,
//      v_cache State nodes [B, Hkv, capacity, D]; rms_norm_matmul_rope_kv_append: x [B, 1, K],
//      norm_weight [K], w [(Hq + 2 Hkv) D, K], cos, sin, position, k_cache, v_cache State nodes;
//      its region may hold the rms_norm_matmul and rope_kv_append regions' branches: a branch
//      nested in arm 0, selected first since it is offered first); rms_norm_matmul_swiglu: x
//      [..., M, K], norm_weight [K], w [2I, K] (gate rows, then up rows; its region may hold the
//      gate|up product's rms_norm_matmul branch the same way); decomposed_out of the fused op's
//      shape and dtype; reconverge the sole consumer of decomposed_out; eps finite and >= 0. A
//      malformed spec is a GraphError.
//   2. gates it on the contract row: the op is implemented, the activation dtype is taken (and
//      the residual's, and the norm products' projection weight's), the row length is within
//      max_row; rms_norm_matmul_rope_kv_append also within the row's qkv_rope_* limits (dtypes,
//      head_dim, K, batch: LayerOpContract::qkv_rope_gate). A decline records the reason and
//      leaves the graph untouched.
//   3. appends the fused node (Op::RmsNorm / SiluMul / Rope / MatMulAdd / RmsNormMatMul /
//      SiluMulMatMulAdd / RopeKvAppend / RmsNormMatMulRopeKvAppend / RmsNormMatMulSwiglu over the
//      spec's inputs) and
//      splices an Op::Branch at inputs[0] whose merge is `reconverge`. The recipe's kind is the
//      op's name, its roles are the inputs (x / weight, a / b, x / cos / sin / position, a / b / c,
//      x / norm_weight / w, a / b / w / c, qkv / cos / sin / position / k_cache / v_cache: the
//      caches become the region's states; x / norm_weight / w / cos / sin / position / k_cache /
//      v_cache; x / norm_weight / w), no selector.
// Verifying, timing, choosing and collapsing are left to select_arms (tune/select.h); the
// recipe's generator (tune/generators.cc) fills the roles.
#pragma once

#include <string>
#include <vector>

#include "splice/ir/graph.h"
#include "splice/ops/contract.h"
#include "splice/passes/decisions.h"
#include "splice/passes/decode_flash.h"

namespace splice {

struct LayerOpSpec {
  LayerOpKind kind = LayerOpKind::rms_norm;
  // rms_norm: {x, weight}; silu_mul: {a, b}; rope: {x, cos, sin, position}; matmul_add: {a, b, c}
  // (y = a @ b^T + c); rms_norm_matmul: {x, norm_weight, w} (y = rms_norm(x) @ w^T);
  // silu_mul_matmul_add: {a, b, w, c} (y = (silu(a) * b) @ w^T + c); rope_kv_append: {qkv, cos,
  // sin, position, k_cache, v_cache} (the caches State nodes; arm 0's exit sequenced after its
  // two write_at); rms_norm_matmul_rope_kv_append: {x, norm_weight, w, cos, sin, position,
  // k_cache, v_cache} (eps as rms_norm_matmul's); rms_norm_matmul_swiglu: {x, norm_weight, w}
  // (y = silu(g) * u with g|u = rms_norm(x) @ w^T, w [2I, K]). inputs[0] is the diverge point.
  std::vector<NodeId> inputs;
  float eps = 0.0f;       // rms_norm and the three rms_norm_matmul* ops
  NodeId decomposed_out;  // arm 0's exit (the oracle), the fused op's shape and dtype
  NodeId reconverge;      // its sole consumer (the merge)
  std::string site;       // where it came from ("layer3.input_norm")
};

// Validates, gates and (when the contract supports the spec) splices the branch.
OfferResult offer_layer_op_arm(Graph& graph, const LayerOpSpec& spec,
                               const LayerOpContract& contract, DecisionLog* log = nullptr);

// The gate alone: empty when `contract` supports the spec, else the reason.
std::string layer_op_gate(const Graph& graph, const LayerOpSpec& spec,
                          const LayerOpContract& contract);

}  // namespace splice
