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
    fail<GraphError>("attention: num_qo_heads ", num_qo_heads,
                     " must be a multiple of num_kv_heads ", num_kv_heads);
  const std::int64_t group = num_qo_heads / num_kv_heads;
  const float scale = a.softmax_scale > 0
                          ? a.softmax_scale
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
    const NodeId inner =
        g.unary(Op::Tanh, g.binary(Op::Mul, scores, g.scalar(1.0 / *a.softcap, DType::f32)));
    scores = g.binary(Op::Mul, inner, g.scalar(*a.softcap, DType::f32));
  }
  // Positions: row r = g*Sq + i holds query i at p_i = k_len - Sq + i; column j is key j.
  const NodeId query_index =
      g.reshape(g.iota({SymExpr(group), q_len, SymExpr(1)}, 1, DType::i32), {rows, SymExpr(1)});
  const NodeId position =
      L(g.binary(Op::Add, query_index, g.sym_value(DynScalar::Expr(a.k_len.expr() - q_len))),
        "query_position");  // [G*Sq, 1]
  const NodeId key_index = L(g.iota({SymExpr(1), a.k_len.expr()}, 1, DType::i32), "key_index");
  if (a.alibi) {
    const NodeId distance =
        g.cast(g.binary(Op::Sub, position, key_index), DType::f32);  // [G*Sq, k_len]
    const NodeId distance3 = g.reshape(distance, {SymExpr(group), q_len, a.k_len.expr()});
    const NodeId slopes =
        g.reshape(*a.alibi, {SymExpr(num_kv_heads), SymExpr(group), SymExpr(1), SymExpr(1)});
    NodeId bias = g.binary(Op::Mul, g.unary(Op::Neg, slopes), distance3);  // [Hkv, G, Sq, k_len]
    bias = g.reshape(bias, {SymExpr(num_kv_heads), rows, a.k_len.expr()});
    scores = L(g.binary(Op::Add, scores, bias), "alibi");
  }
  // 4. Masks.
  std::optional<NodeId> visible;
  auto both = [&](NodeId c) { visible = visible ? g.where(*visible, c, *visible) : c; };
  if (a.causal) both(g.binary(Op::LessEqual, key_index, position));
  if (a.window_left)
    both(g.binary(
        Op::GreaterEqual, key_index,
        g.binary(Op::Sub, position, g.scalar(static_cast<double>(*a.window_left), DType::i32))));
  if (a.window_right)
    both(g.binary(
        Op::LessEqual, key_index,
        g.binary(Op::Add, position, g.scalar(static_cast<double>(*a.window_right), DType::i32))));
  if (visible)
    scores =
        L(g.where(*visible, scores, g.scalar(-std::numeric_limits<double>::infinity(), DType::f32)),
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

namespace splice {

KdaRegion emit_decomposed_kda(Graph& g, const KdaRegionArgs& a) {
  const Node& xn = g.node(a.x);
  const Node& sn = g.node(a.state);
  if (xn.shape.size() != 2 || sn.shape.size() != 4 || !xn.shape[0].is_constant() ||
      !sn.shape[1].is_constant() || !sn.shape[3].is_constant())
    fail<GraphError>("kda: x must be [R, 3C] and state [slots, H, D, D] with concrete R, H, D");
  const std::int64_t rows = xn.shape[0].constant(), heads = sn.shape[1].constant(),
                     dim = sn.shape[3].constant(), channels = heads * dim;
  const DType state_dtype = sn.dtype;  // (node references dangle once the builders append)
  const SymExpr R(rows), H(heads), D(dim), C(channels), one(1);
  const DynScalar first = DynScalar::Concrete(a.first_slot);
  const DynScalar end = DynScalar::Concrete(a.first_slot + rows);
  auto L = [&](NodeId id, const char* what) { return g.labeled(id, a.site + "." + what); };
  auto f32 = [&](NodeId id) { return g.cast(id, DType::f32); };
  auto scalar = [&](double v) { return g.scalar(v, DType::f32); };
  auto mul = [&](NodeId p, NodeId q) { return g.binary(Op::Mul, p, q); };
  auto add = [&](NodeId p, NodeId q) { return g.binary(Op::Add, p, q); };

  // 1. Conv over [history, x] + SiLU, rounded to bf16.
  const NodeId history = L(g.slice(a.conv_state, 0, first, end), "conv_history");  // [R, 3, 3C]
  const NodeId x_row = g.reshape(a.x, {R, one, C * 3});
  const NodeId window = g.concat({history, x_row}, 1);                                 // [R, 4, 3C]
  const NodeId taps = g.reshape(g.permute(a.weight, {1, 0, 2}), {SymExpr(4), C * 3});  // [4, 3C]
  const NodeId pre = g.reduce(Op::ReduceSum, mul(f32(window), taps), 1, false);        // [R, 3C]
  const NodeId mixed = L(f32(g.cast(g.unary(Op::Silu, pre), DType::bf16)), "conv_silu");
  auto head_slice = [&](int block) {
    const NodeId s = g.slice(mixed, 1, DynScalar::Concrete(block * channels),
                             DynScalar::Concrete((block + 1) * channels));
    return g.reshape(s, {R, H, D});
  };
  const NodeId q = head_slice(0), k = head_slice(1), v = head_slice(2);
  // 2. L2 norms.
  auto l2 = [&](NodeId t, double scale) {
    const NodeId ss = g.reduce(Op::ReduceSum, mul(t, t), -1, true);
    return mul(mul(t, g.unary(Op::Rsqrt, add(ss, scalar(1e-6)))), scalar(scale));
  };
  const NodeId qn = L(l2(q, 1.0 / std::sqrt(static_cast<double>(dim))), "q_norm");
  const NodeId kn = L(l2(k, 1.0), "k_norm");
  // 3. Gate and beta.
  const NodeId z = add(g.reshape(f32(a.raw_gate), {R, H, D}), g.reshape(a.dt_bias, {H, D}));
  const NodeId decay_rate = g.reshape(g.unary(Op::Exp, a.A_log), {H, one});  // a = e^A_log
  NodeId log_decay;
  if (a.lower_bound) {
    log_decay = mul(scalar(*a.lower_bound), g.unary(Op::Sigmoid, mul(decay_rate, z)));
  } else {
    log_decay = mul(g.unary(Op::Neg, decay_rate), g.unary(Op::Softplus, z));
  }
  const NodeId decay = L(g.unary(Op::Exp, log_decay), "decay");  // [R, H, D] over key channels
  const NodeId beta = g.reshape(g.unary(Op::Sigmoid, f32(a.raw_beta)), {R, H, one, one});
  // 4. Delta rule on S [R, H, V, K].
  const NodeId s_old = f32(L(g.slice(a.state, 0, first, end), "state_rows"));
  const NodeId s_decayed = mul(s_old, g.reshape(decay, {R, H, one, D}));
  const NodeId pred = g.matmul(s_decayed, g.reshape(kn, {R, H, D, one}));  // [R, H, V, 1]
  const NodeId delta = mul(beta, g.binary(Op::Sub, g.reshape(v, {R, H, D, one}), pred));
  const NodeId s_new =
      L(add(s_decayed, g.matmul(delta, g.reshape(kn, {R, H, one, D}))), "state_new");
  const NodeId o_raw = g.reshape(g.matmul(s_new, g.reshape(qn, {R, H, D, one})), {R, H, D});
  // 5. Gated RMSNorm.
  const NodeId o = f32(g.cast(o_raw, DType::bf16));
  const NodeId inv =
      g.unary(Op::Rsqrt, add(g.reduce(Op::ReduceMean, mul(o, o), -1, true), scalar(a.norm_eps)));
  const NodeId gated =
      mul(mul(mul(o, inv), a.norm_weight), g.unary(Op::Sigmoid, f32(a.output_gate)));
  const NodeId out = L(g.reshape(g.cast(gated, DType::bf16), {one, R, H, D}), "kda_out");
  // 6. Cache writes, then the exit after them.
  const NodeId new_history =
      g.concat({g.slice(history, 1, DynScalar::Concrete(1), DynScalar::Concrete(3)), x_row}, 1);
  const NodeId conv_write = L(g.write_at(a.conv_state, new_history, 0, first), "conv_write");
  const NodeId state_write =
      L(g.write_at(a.state, g.cast(s_new, state_dtype), 0, first), "state_write");
  const NodeId exit = L(g.sequence(out, {conv_write, state_write}), "kda_exit");
  const NodeId merged = L(g.reshape(exit, {R, C}), "kda_merge");

  KdaRegion region;
  region.output = merged;
  KdaDecodeSpec& s = region.spec;
  s.x = a.x;
  s.weight = a.weight;
  s.conv_state = a.conv_state;
  s.raw_gate = a.raw_gate;
  s.raw_beta = a.raw_beta;
  s.A_log = a.A_log;
  s.dt_bias = a.dt_bias;
  Tensor slots = Tensor::empty({rows}, DType::i32);
  for (std::int64_t r = 0; r < rows; ++r) slots.set({r}, static_cast<double>(a.first_slot + r));
  s.state_indices = g.constant(std::move(slots), a.site + ".state_indices");
  s.state = a.state;
  s.output_gate = a.output_gate;
  s.norm_weight = a.norm_weight;
  s.lower_bound = a.lower_bound;
  s.norm_eps = a.norm_eps;
  s.decomposed_out = exit;
  s.reconverge = merged;
  s.site = a.site;
  return region;
}

}  // namespace splice
