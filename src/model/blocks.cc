// Primitive attention region (see blocks.h for the stages).
#include "splice/model/blocks.h"

#include <cmath>
#include <limits>

#include "splice/core/error.h"

namespace splice {

AttentionRegion emit_decomposed_attention(Graph& g, const AttentionRegionArgs& a) {
  const Node& qn = g.node(a.q);
  const Node& kn = g.node(a.k_cache);
  if (qn.shape.size() != 4 || kn.shape.size() != 4)
    fail<GraphError>("attention: q must be [B, Hq, Sq, D] and the caches [B, Hkv, capacity, D]");
  const SymExpr batch = qn.shape[0], q_len = qn.shape[2], head_dim = qn.shape[3];
  if (!qn.shape[1].is_constant() || !kn.shape[1].is_constant() || !head_dim.is_constant())
    fail<GraphError>("attention: head counts and head_dim must be concrete");
  const std::int64_t num_qo_heads = qn.shape[1].constant(), num_kv_heads = kn.shape[1].constant();
  if (num_kv_heads <= 0 || num_qo_heads % num_kv_heads != 0)
    fail<GraphError>("attention: num_qo_heads ", num_qo_heads, " must be a multiple of num_kv_heads ",
                     num_kv_heads);
  const std::int64_t group = num_qo_heads / num_kv_heads;
  const float scale = a.softmax_scale > 0 ? a.softmax_scale
                                          : 1.0f / std::sqrt(static_cast<float>(head_dim.constant()));
  const DType io_dtype = qn.dtype;
  const std::string& site = a.site;
  auto L = [&](NodeId id, const char* what) { return g.labeled(id, site + "." + what); };

  // 1. Exact live prefix, widened to f32.
  const NodeId k_live = L(g.slice(a.k_cache, 2, DynScalar::Concrete(0), a.k_len), "k_live");
  const NodeId v_live = L(g.slice(a.v_cache, 2, DynScalar::Concrete(0), a.k_len), "v_live");
  const NodeId k32 = g.cast(k_live, DType::f32);
  const NodeId v32 = g.cast(v_live, DType::f32);
  const NodeId q32 = g.cast(a.q, DType::f32);
  // 2. Scores with the GQA group folded into the query rows: [B, Hkv, G*Sq, k_len].
  const SymExpr rows = q_len * group;
  const NodeId q_grouped = g.reshape(q32, {batch, SymExpr(num_kv_heads), rows, head_dim});
  NodeId scores = L(g.matmul(q_grouped, k32, /*transpose_b=*/true), "scores");
  scores = g.binary(Op::Mul, scores, g.scalar(scale, DType::f32));
  // 3. Softcap, then ALiBi.
  if (a.softcap) {
    const NodeId inner = g.unary(Op::Tanh, g.binary(Op::Mul, scores, g.scalar(1.0 / *a.softcap, DType::f32)));
    scores = g.binary(Op::Mul, inner, g.scalar(*a.softcap, DType::f32));
  }
  // Positions: row r = g*Sq + i holds query i at p_i = k_len - Sq + i; column j is key j.
  const NodeId query_index = g.reshape(g.iota({SymExpr(group), q_len, SymExpr(1)}, 1, DType::i32),
                                       {rows, SymExpr(1)});
  const NodeId position = L(g.binary(Op::Add, query_index,
                                     g.sym_value(DynScalar::Expr(a.k_len.expr() - q_len))),
                            "query_position");  // [G*Sq, 1]
  const NodeId key_index = L(g.iota({SymExpr(1), a.k_len.expr()}, 1, DType::i32), "key_index");
  if (a.alibi) {
    const NodeId distance = g.cast(g.binary(Op::Sub, position, key_index), DType::f32);  // [G*Sq, k_len]
    const NodeId distance3 = g.reshape(distance, {SymExpr(group), q_len, a.k_len.expr()});
    const NodeId slopes = g.reshape(*a.alibi, {SymExpr(num_kv_heads), SymExpr(group), SymExpr(1), SymExpr(1)});
    NodeId bias = g.binary(Op::Mul, g.unary(Op::Neg, slopes), distance3);  // [Hkv, G, Sq, k_len]
    bias = g.reshape(bias, {SymExpr(num_kv_heads), rows, a.k_len.expr()});
    scores = L(g.binary(Op::Add, scores, bias), "alibi");
  }
  // 4. Masks.
  std::optional<NodeId> visible;
  auto both = [&](NodeId c) { visible = visible ? g.where(*visible, c, *visible) : c; };
  if (a.causal) both(g.binary(Op::LessEqual, key_index, position));
  if (a.window_left)
    both(g.binary(Op::GreaterEqual, key_index,
                  g.binary(Op::Sub, position, g.scalar(static_cast<double>(*a.window_left), DType::i32))));
  if (a.window_right)
    both(g.binary(Op::LessEqual, key_index,
                  g.binary(Op::Add, position, g.scalar(static_cast<double>(*a.window_right), DType::i32))));
  if (visible)
    scores = L(g.where(*visible, scores,
                       g.scalar(-std::numeric_limits<double>::infinity(), DType::f32)),
               "masked_scores");
  // 5. Softmax, values, back to [B, Hq, Sq, D].
  const NodeId probs = L(g.softmax(scores, -1), "probs");
  const NodeId o = g.matmul(probs, v32);
  const NodeId o_heads = g.reshape(o, {batch, SymExpr(num_qo_heads), q_len, head_dim});
  const NodeId out = L(g.cast(o_heads, io_dtype), "attention_out");
  // 6. The merge.
  const NodeId merged = L(g.permute(out, {0, 2, 1, 3}), "attention_merge");

  AttentionRegion region;
  region.output = merged;
  DecodeFlashSpec& s = region.spec;
  s.q = a.q;
  s.k = a.k_cache;
  s.v = a.v_cache;
  s.alibi = a.alibi;
  s.softmax_scale = scale;
  s.causal = a.causal;
  s.window_size_left = a.window_left;
  s.window_size_right = a.window_right;
  s.softcap = a.softcap;
  s.k_len = a.k_len;
  s.decomposed_out = out;
  s.reconverge = merged;
  s.site = site;
  return region;
}

}  // namespace splice
