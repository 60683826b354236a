// offer_decode_flash_arm: validate the spec, gate it on the kernel contract, splice the branch
// (see splice/passes/decode_flash.h for the three stages).
#include "splice/passes/decode_flash.h"

#include <cmath>
#include <sstream>
#include <utility>

#include "passes/offer.h"
#include "splice/core/error.h"

namespace splice {
namespace {

void validate_spec(const Graph& g, const DecodeFlashSpec& s) {
  auto live = [&](NodeId id, const char* what) {
    if (!g.is_live(id))
      fail<GraphError>("DecodeFlashSpec: `", what, "` = %", id.index,
                       " is not a live node of the graph (", g.size(), " nodes)");
  };
  live(s.q, "q");
  live(s.k, "k");
  live(s.v, "v");
  if (s.alibi) live(*s.alibi, "alibi");
  live(s.decomposed_out, "decomposed_out");
  live(s.reconverge, "reconverge");
  const Node &q = g.node(s.q), &k = g.node(s.k), &v = g.node(s.v), &out = g.node(s.decomposed_out);
  const SymTable* t = &g.symbols();
  if (q.shape.size() != 4)
    fail<GraphError>("DecodeFlashSpec: `q` must be [B, Hq, Sq, D], got ",
                     sym_shape_str(q.shape, t));
  if (k.shape.size() != 4 || !same_shape(k.shape, v.shape))
    fail<GraphError>("DecodeFlashSpec: `k` and `v` must both be [B, Hkv, capacity, D], got ",
                     sym_shape_str(k.shape, t), " and ", sym_shape_str(v.shape, t));
  if (!q.shape[0].structurally_equal(k.shape[0]) || !q.shape[3].structurally_equal(k.shape[3]))
    fail<GraphError>("DecodeFlashSpec: `q` ", sym_shape_str(q.shape, t), " and `k` ",
                     sym_shape_str(k.shape, t), " disagree on batch or head_dim");
  if (!q.shape[1].is_constant() || !k.shape[1].is_constant() || k.shape[1].constant() <= 0 ||
      q.shape[1].constant() % k.shape[1].constant() != 0)
    fail<GraphError>("DecodeFlashSpec: num_qo_heads ", q.shape[1].str(t),
                     " must be a multiple of num_kv_heads ", k.shape[1].str(t));
  if (q.dtype != k.dtype || q.dtype != v.dtype)
    fail<GraphError>("DecodeFlashSpec: q, k, v dtypes differ (", dtype_name(q.dtype), ", ",
                     dtype_name(k.dtype), ", ", dtype_name(v.dtype), ")");
  if (!same_shape(out.shape, q.shape) || out.dtype != q.dtype)
    fail<GraphError>("DecodeFlashSpec: `decomposed_out` is ", dtype_name(out.dtype),
                     sym_shape_str(out.shape, t), " but `q` is ", dtype_name(q.dtype),
                     sym_shape_str(q.shape, t), "; they must match");
  if (s.alibi) {
    const Node& a = g.node(*s.alibi);
    if (a.shape.size() != 1 || !a.shape[0].structurally_equal(q.shape[1]) || a.dtype != DType::f32)
      fail<GraphError>("DecodeFlashSpec: `alibi` must be f32 [Hq] = [", q.shape[1].str(t),
                       "], got ", dtype_name(a.dtype), sym_shape_str(a.shape, t));
  }
  if (!(std::isfinite(s.softmax_scale) && s.softmax_scale > 0))
    fail<GraphError>("DecodeFlashSpec: `softmax_scale` must be finite and > 0, got ",
                     s.softmax_scale);
  if (s.softcap && !(std::isfinite(*s.softcap) && *s.softcap > 0))
    fail<GraphError>("DecodeFlashSpec: `softcap` must be finite and > 0, got ", *s.softcap);
  std::vector<SymId> syms;
  s.k_len.expr().collect_symbols(syms);
  for (SymId id : syms)
    if (id.id >= g.symbols().size())
      fail<GraphError>("DecodeFlashSpec: `k_len` reads undeclared symbol s", id.id);
  // reconverge must be the sole consumer of decomposed_out.
  const auto users = g.users();
  const auto& consumers = users[s.decomposed_out.index];
  bool only_reconverge = !consumers.empty();
  for (NodeId c : consumers) only_reconverge &= c == s.reconverge;
  bool is_output = false;
  for (const auto& [name, id] : g.outputs()) is_output |= id == s.decomposed_out;
  if (!only_reconverge || is_output)
    fail<GraphError>("DecodeFlashSpec: `reconverge` %", s.reconverge.index,
                     " must be the sole consumer of `decomposed_out` %", s.decomposed_out.index,
                     ", which has ", consumers.size(), " consumer(s)",
                     is_output ? " and is an output" : "");
}

}  // namespace

std::string decode_flash_gate(const Graph& g, const DecodeFlashSpec& s,
                              const AttentionContract& c) {
  const Node& q = g.node(s.q);
  std::ostringstream why;
  if (!c.supports_dtype(q.dtype))
    why << c.kernel << "/" << c.backend << " does not take dtype " << dtype_name(q.dtype) << "; ";
  const SymExpr& d = q.shape[3];
  if (!d.is_constant() || !c.supports_head_dim(d.constant()))
    why << c.kernel << "/" << c.backend << " does not take head_dim " << d.str() << "; ";
  const SymExpr& sq = q.shape[2];
  const std::int64_t sq_max = sq.upper_bound(g.symbols());
  if (sq_max > c.max_sq)
    why << "q_len " << sq.str(&g.symbols()) << " exceeds the kernel's max_sq " << c.max_sq << "; ";
  const std::int64_t group = q.shape[1].constant() / g.node(s.k).shape[1].constant();
  if (c.max_group > 0 && group > c.max_group)
    why << "GQA group " << group << " exceeds the kernel's max_group " << c.max_group << "; ";
  auto need = [&](bool used, AttentionFeature f) {
    if (used && !c.supports(f))
      why << "the spec uses " << attention_feature_name(f) << ", which " << c.kernel << "/"
          << c.backend << " (rev " << c.revision << ") does not support; ";
  };
  need(s.causal && sq_max > 1, AttentionFeature::causal);
  need(s.window_size_left.has_value(), AttentionFeature::window_left);
  need(s.window_size_right.has_value(), AttentionFeature::window_right);
  need(s.softcap.has_value(), AttentionFeature::softcap);
  need(s.alibi.has_value(), AttentionFeature::alibi);
  std::string reason = why.str();
  if (reason.size() >= 2) reason.resize(reason.size() - 2);
  return reason;
}

OfferResult offer_decode_flash_arm(Graph& g, const DecodeFlashSpec& s, const AttentionContract& c,
                                   DecisionLog* log) {
  validate_spec(g, s);
  Decision decision;
  decision.kind = "flash_decode";
  decision.site = s.site;
  const std::string reason = decode_flash_gate(g, s, c);
  if (!reason.empty()) return decline_offer(std::move(decision), reason, log);
  FlashDecodeAttrs attrs;
  attrs.softmax_scale = s.softmax_scale;
  attrs.causal = s.causal;
  if (s.window_size_left) attrs.window_left = static_cast<std::int64_t>(*s.window_size_left);
  if (s.window_size_right) attrs.window_right = static_cast<std::int64_t>(*s.window_size_right);
  attrs.softcap = s.softcap;
  attrs.k_len = s.k_len;
  const NodeId fused = g.flash_decode(s.q, s.k, s.v, s.alibi, attrs);
  g.labeled(fused, s.site.empty() ? "flash_decode" : s.site + ".flash_decode");
  ArmRecipe recipe;
  recipe.kind = "flash_decode";
  recipe.roles = {{"q", s.q}, {"k", s.k}, {"v", s.v}};
  if (s.alibi) recipe.roles["alibi"] = *s.alibi;
  recipe.selector = s.k_len;
  recipe.contract_revision = c.revision;
  recipe.output_tolerance = c.tolerance(g.node(s.q).dtype);
  return splice_offer(g, s.q, s.decomposed_out, fused, s.reconverge, recipe,
                      c.kernel + "/" + c.backend,
                      "offered: " + c.kernel + "/" + c.backend + " rev " + c.revision +
                          " supports every feature the spec uses",
                      std::move(decision), log);
}

}  // namespace splice
