// The Llama family decode step (LlamaForCausalLM, Qwen2, SmolLM naming).
//
//   h = embed[tokens]                                            [B, 1, hidden]
//   per layer: a = rms_norm(h) -> q|k|v = a @ W_qkv^T (one matmul over the stacked q, k, v
//              weights, q, k, v views of its output; BuildOptions::stack_projections)
//              -> RoPE(q|k) at position k_len - 1 (one call over the q and k heads; q, k views)
//              k_cache[:, :, k_len-1] = k, v_cache[...] = v     (write_at, the KV append; with
//              stacked projections one rope_kv_append region whose fused arm is one kernel,
//              attention reading the caches through StateAfter views)
//              h += o_proj(attention(q, k_cache, v_cache, k_len))   (primitive region + spec)
//              h += down(silu(gate) * up),  gate|up = rms_norm(h) @ W_gate_up^T (one matmul
//              over the stacked gate and up weights)
//   logits = rms_norm(h) @ lm_head^T (embed when tied)            [B, vocab] f32
// Every RMSNorm, RoPE and SwiGLU activation also hands the optimizer a LayerOpSpec
// (m.layer_specs) for its fused arm; with stacked projections the two per-layer norms are fused
// with the q|k|v and gate|up products (rms_norm_matmul); the q|k|v product's region and the
// rope_kv_append region nest in a third whose fused arm is one GEMV with a RoPE and KV-append
// epilogue (rms_norm_matmul_rope_kv_append; the two inner arms stay its oracle, where it is
// declined too); the gate|up product's region and the SwiGLU activation nest in one whose fused
// arm is one GEMV with the activation in its epilogue (rms_norm_matmul_swiglu), and down_proj
// with the residual is a matmul_add region.
#include <cmath>
#include <optional>

#include "splice/core/error.h"
#include "splice/model/blocks.h"
#include "splice/model/model.h"

namespace splice {

DecodeModel build_llama_decode_model(const ModelConfig& c, const Weights& w,
                                     const BuildOptions& o) {
  DecodeModel m;
  m.config = c;
  m.options = o;
  Graph& g = m.graph;
  const std::int64_t hidden = c.hidden_size, heads = c.num_attention_heads,
                     kv_heads = c.num_key_value_heads, head_dim = c.head_dim, vocab = c.vocab_size;
  if (hidden <= 0 || heads <= 0 || kv_heads <= 0 || head_dim <= 0 || vocab <= 0 || heads % kv_heads)
    fail<ValueError>(c.source, ": inconsistent attention shape (hidden ", hidden, ", heads ", heads,
                     ", kv heads ", kv_heads, ", head_dim ", head_dim, ")");
  if (c.max_position_embeddings > 0 && o.max_seq_len > c.max_position_embeddings)
    fail<ValueError>("--max-seq-len ", o.max_seq_len,
                     " exceeds the model's max_position_embeddings ", c.max_position_embeddings);
  m.k_len = g.declare_symbol("k_len", 1, o.max_seq_len);
  const DynScalar k_len = DynScalar::Sym(m.k_len);
  const SymExpr B(o.batch), one(1);
  const DType dt = o.dtype;
  auto param = [&](const std::string& name, const Dims& shape) {
    return g.param(name, w.get(name, dt, shape));
  };
  auto maybe_bias = [&](const std::string& name, std::int64_t n,
                        bool present) -> std::optional<NodeId> {
    if (!present) return std::nullopt;
    return param(name, {n});
  };
  using Parts = layers::LinearParts;

  const NodeId embed = param("model.embed_tokens.weight", {vocab, hidden});
  auto [cos, sin] = layers::rope_tables(c, head_dim, o.max_seq_len);
  const NodeId cos_table = g.param("rope.cos", std::move(cos));
  const NodeId sin_table = g.param("rope.sin", std::move(sin));
  const NodeId position = g.sym_value(DynScalar::Expr(k_len.expr() - 1), DType::i32);

  const NodeId tokens = g.input("tokens", {B}, DType::i32);
  NodeId h = g.reshape(g.gather(embed, tokens), {B, one, SymExpr(hidden)});
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const std::string site = "layer" + std::to_string(l) + ".attn";
    const std::string layer = "layer" + std::to_string(l);
    const NodeId input_norm = param(p + "input_layernorm.weight", {hidden});
    // a = rms_norm(h), then the q|k|v projection of it (norm_project: one rms_norm_matmul region
    // when stacked).
    auto norm_project = [&](const std::string& stacked_prefix, const Parts& parts, bool bias,
                            std::vector<std::size_t> groups = {}) {
      return layers::norm_project(g, w, dt, o.stack_projections, h, input_norm, c.rms_norm_eps,
                                  hidden, stacked_prefix, parts, bias, std::move(groups),
                                  &m.layer_specs, layer + ".input_norm");
    };
    const std::int64_t q_dim = heads * head_dim, kv_dim = kv_heads * head_dim;
    const Parts qkv_parts = {{p + "self_attn.q_proj.", q_dim},
                             {p + "self_attn.k_proj.", kv_dim},
                             {p + "self_attn.v_proj.", kv_dim}};
    auto heads_of = [&](NodeId x, std::int64_t n) {
      return g.permute(g.reshape(x, {B, one, SymExpr(n), SymExpr(head_dim)}),
                       {0, 2, 1, 3});  // [B, n, 1, D]
    };
    const SymShape cache{B, SymExpr(kv_heads), SymExpr(o.max_seq_len), SymExpr(head_dim)};
    const NodeId k_state = g.state(p + "k_cache", cache, dt);
    const NodeId v_state = g.state(p + "v_cache", cache, dt);
    const DynScalar write = DynScalar::Expr(k_len.expr() - 1);
    NodeId q_rot, k_cache, v_cache;
    if (o.stack_projections) {
      // q, k, v are adjacent columns of the q|k|v matmul: one rope_kv_append region (one RoPE
      // over the q and k heads, both appends) with its fused arm.
      const std::size_t specs_before = m.layer_specs.size();
      const NodeId qkv =
          norm_project(p + "self_attn.qkv_proj.", qkv_parts, c.attention_bias, {3})[0];
      // The rms_norm_matmul region norm_project built (none with a bias): with it, both regions
      // nest in one rms_norm_matmul_rope_kv_append region (one GEMV with a RoPE epilogue).
      const bool one_region = m.layer_specs.size() == specs_before + 1 &&
                              m.layer_specs.back().kind == LayerOpKind::rms_norm_matmul;
      const std::optional<LayerOpSpec> projection =
          one_region ? std::optional<LayerOpSpec>(m.layer_specs.back()) : std::nullopt;
      const layers::RopeKvAppendOut r =
          layers::rope_kv_append(g, qkv, heads, cos_table, sin_table, position, k_state, v_state,
                                 write, &m.layer_specs, site, projection ? &*projection : nullptr);
      q_rot = r.q;
      k_cache = r.k_cache;
      v_cache = r.v_cache;
    } else {
      const std::vector<NodeId> qkv =
          norm_project(p + "self_attn.qkv_proj.", qkv_parts, c.attention_bias);
      q_rot = layers::rope(g, heads_of(qkv[0], heads), cos_table, sin_table, position,
                           &m.layer_specs, site + ".q");
      const NodeId k_rot = layers::rope(g, heads_of(qkv[1], kv_heads), cos_table, sin_table,
                                        position, &m.layer_specs, site + ".k");
      k_cache = g.labeled(g.write_at(k_state, k_rot, 2, write), site + ".k_append");
      v_cache =
          g.labeled(g.write_at(v_state, heads_of(qkv[2], kv_heads), 2, write), site + ".v_append");
    }
    g.labeled(q_rot, site + ".q");
    AttentionRegionArgs args;
    args.q = q_rot;
    args.k_cache = k_cache;
    args.v_cache = v_cache;
    args.k_len = k_len;
    args.site = site;
    AttentionRegion region = emit_decomposed_attention(g, args);
    m.attention_specs.push_back(region.spec);
    const NodeId attn = g.reshape(region.output, {B, one, SymExpr(heads * head_dim)});
    h = layers::linear_residual(
        g, h, attn, param(p + "self_attn.o_proj.weight", {hidden, heads * head_dim}),
        maybe_bias(p + "self_attn.o_proj.bias", hidden, c.attention_out_bias), &m.layer_specs,
        site + ".o_proj", site + ".residual");
    const std::int64_t inter = c.intermediate_size;
    h = layers::swiglu_mlp(g, w, dt, o.stack_projections, h,
                           param(p + "post_attention_layernorm.weight", {hidden}), c.rms_norm_eps,
                           hidden, inter, p + "mlp.", &m.layer_specs,
                           layer + ".post_attention_norm", layer + ".mlp");
  }
  const bool tied = c.tie_word_embeddings || !w.has("lm_head.weight");
  const NodeId head = tied ? embed : param("lm_head.weight", {vocab, hidden});
  // The final norm and lm_head: one rms_norm_matmul region.
  const NodeId logits =
      g.cast(layers::norm_linear(g, h, param("model.norm.weight", {hidden}), c.rms_norm_eps, dt,
                                 head, &m.layer_specs, "final_norm"),
             DType::f32);
  g.mark_output("logits", g.reshape(logits, {B, SymExpr(vocab)}));
  return m;
}

}  // namespace splice
