// The demo attention decoder (see demo.h).
#include "splice/model/demo.h"

#include <cmath>

#include "splice/core/dtype.h"
#include "splice/core/error.h"
#include "splice/core/random.h"

namespace splice {

namespace {

void validate(const DemoAttentionOptions& o) {
  const auto at_least = [](const char* name, std::int64_t value, std::int64_t lo) {
    if (value < lo)
      fail<ValueError>("DemoAttentionOptions: `", name, "` must be >= ", lo, ", got ", value);
  };
  at_least("num_layers", o.num_layers, 0);
  at_least("batch", o.batch, 1);
  at_least("num_qo_heads", o.num_qo_heads, 1);
  at_least("num_kv_heads", o.num_kv_heads, 1);
  at_least("head_dim", o.head_dim, 1);
  at_least("capacity", o.capacity, 1);
  if (o.num_qo_heads % o.num_kv_heads != 0)
    fail<ValueError>("DemoAttentionOptions: `num_qo_heads` (", o.num_qo_heads,
                     ") must be a multiple of `num_kv_heads` (", o.num_kv_heads, ")");
  if (!is_floating(o.dtype))
    fail<ValueError>("DemoAttentionOptions: `dtype` must be f32, bf16 or f16, got ",
                     dtype_name(o.dtype));
  if (o.softcap && !(std::isfinite(*o.softcap) && *o.softcap > 0))
    fail<ValueError>("DemoAttentionOptions: `softcap` must be finite and > 0 when set, got ",
                     *o.softcap);
  if (o.concrete_k_len && (*o.concrete_k_len < 1 || *o.concrete_k_len > o.capacity))
    fail<ValueError>("DemoAttentionOptions: `concrete_k_len` must be in [1, capacity ", o.capacity,
                     "], got ", *o.concrete_k_len);
}

}  // namespace

DemoAttentionGraph build_demo_attention_graph(const DemoAttentionOptions& o) {
  validate(o);
  DemoAttentionGraph out;
  Graph& g = out.graph;
  const std::int64_t dim = o.num_qo_heads * o.head_dim;
  const std::int64_t kv_dim = o.num_kv_heads * o.head_dim;
  out.model_dim = dim;
  out.k_len = g.declare_symbol("k_len", 1, o.capacity);
  const DynScalar k_len =
      o.concrete_k_len ? DynScalar::Concrete(*o.concrete_k_len) : DynScalar::Sym(out.k_len);
  const SymExpr B(o.batch), one(1);
  Rng rng(o.seed);
  auto weight = [&](const std::string& name, std::int64_t rows, std::int64_t cols) {
    Tensor w = Tensor::empty({rows, cols}, o.dtype);
    rng.normal(w, 0.0, 1.0 / std::sqrt(static_cast<double>(rows)));
    return g.param(name, std::move(w));
  };
  std::optional<NodeId> alibi;
  if (o.alibi) {
    Tensor slopes = Tensor::empty({o.num_qo_heads}, DType::f32);
    for (std::int64_t h = 0; h < o.num_qo_heads; ++h)
      slopes.set({h}, std::pow(2.0, -8.0 * static_cast<double>(h + 1) /
                                        static_cast<double>(o.num_qo_heads)));
    alibi = g.param("alibi_slopes", std::move(slopes));
  }
  NodeId x = g.input("x", {B, one, SymExpr(dim)}, o.dtype);
  for (std::int64_t l = 0; l < o.num_layers; ++l) {
    const std::string site = "layer" + std::to_string(l) + ".attn";
    const NodeId wq = weight("layer" + std::to_string(l) + ".wq", dim, dim);
    const NodeId wk = weight("layer" + std::to_string(l) + ".wk", dim, kv_dim);
    const NodeId wv = weight("layer" + std::to_string(l) + ".wv", dim, kv_dim);
    const NodeId wo = weight("layer" + std::to_string(l) + ".wo", dim, dim);
    auto heads = [&](NodeId proj, std::int64_t num_heads) {
      const NodeId r = g.reshape(proj, {B, one, SymExpr(num_heads), SymExpr(o.head_dim)});
      return g.permute(r, {0, 2, 1, 3});  // [B, heads, 1, D]
    };
    const NodeId q = g.labeled(heads(g.matmul(x, wq), o.num_qo_heads), site + ".q");
    const NodeId k = heads(g.matmul(x, wk), o.num_kv_heads);
    const NodeId v = heads(g.matmul(x, wv), o.num_kv_heads);
    const SymShape cache_shape{B, SymExpr(o.num_kv_heads), SymExpr(o.capacity),
                               SymExpr(o.head_dim)};
    const NodeId k_state = g.state("layer" + std::to_string(l) + ".k_cache", cache_shape, o.dtype);
    const NodeId v_state = g.state("layer" + std::to_string(l) + ".v_cache", cache_shape, o.dtype);
    const DynScalar write_pos = DynScalar::Expr(k_len.expr() - 1);
    const NodeId k_cache = g.labeled(g.write_at(k_state, k, 2, write_pos), site + ".k_append");
    const NodeId v_cache = g.labeled(g.write_at(v_state, v, 2, write_pos), site + ".v_append");
    AttentionRegionArgs args;
    args.q = q;
    args.k_cache = k_cache;
    args.v_cache = v_cache;
    args.alibi = alibi;
    args.softcap = o.softcap;
    args.window_left = o.window_left;
    args.k_len = k_len;
    args.site = site;
    AttentionRegion region = emit_decomposed_attention(g, args);
    out.specs.push_back(region.spec);
    const NodeId flat = g.reshape(region.output, {B, one, SymExpr(dim)});
    x = g.labeled(g.binary(Op::Add, x, g.matmul(flat, wo)), site + ".residual");
  }
  g.mark_output("y", x);
  return out;
}

}  // namespace splice
