// FLA's hybrid KDAForCausalLM (model_type "kda") decode step, exactly as FLA 0.6 computes it.
//
// One step per token (batch row r is sequence r, kept in cache slot r + 1; slot 0 is reserved):
//   1. h = embeddings[tokens]                                          [B, 1, hidden]
//   2. per layer l (FLA's KDABlock, names `model.layers.{l}.`):
//        a = rms_norm(h, attn_norm);  h += mixer(a);  h += swiglu(rms_norm(h, mlp_norm))
//      mixer = KimiDeltaAttention (KDA layers) or FLA's Attention (layers in `attn.layers`).
//   3. logits = rms_norm(h, model.norm) @ lm_head^T (embeddings when tied)  [B, vocab] f32
//
// KDA mixer (fla/layers/kda.py with its fused_recurrent decode kernel), per row, on bf16
// activations between ops:
//   a. x = [q_proj a | k_proj a | v_proj a]; conv_c = silu(sum_w hist[w] * Wc[c, w]) rounded to the
//      activation dtype (depthwise causal conv, no bias; tap W-1 is the current input);
//   b. q^ = q / sqrt(|q|^2 + 1e-6) * Dk^-1/2,  k^ = k / sqrt(|k|^2 + 1e-6)  (per q/k head; value
//      head hv reads q/k head hv / (HV / H): grouped value attention);
//   c. raw_gate = f_proj.1(f_proj.0 a);  z = raw_gate + dt_bias;  A = e^A_log
//      g = lower_bound * sigmoid(A z)  if lower_bound is set,  else  -A softplus(z);
//   d. beta = sigmoid(b_proj a), times 2 when allow_neg_eigval;
//   e. S = S e^g (per key column);  S += beta (v - S k^) k^T;  o = S q^   (S: [V, K], fp32);
//   f. out = o_proj(rms_norm(o) * o_norm.weight * sigmoid(g_proj.1(g_proj.0 a) + bias)).
// When a layer fits the fused op's contract (head dims 128, one value head per q/k head, short
// convs of width 4, beta in (0, 1), bf16 activations) it is emitted through
// `emit_decomposed_kda` with its KdaDecodeSpec, so the optimizer can offer the fused arm.
// Otherwise (other head sizes, GVA, other conv widths, no short conv, allow_neg_eigval, f32
// activations) it is emitted from primitives here with no spec (arm 0 only): the same math,
// docs/model-formats.md says why.
// With BuildOptions::stack_projections the mixer's six input projections (q, k, v, f_proj.0,
// g_proj.0, b_proj), the attention q|k|v and each MLP's gate|up are one matmul over stacked
// weights each (the projections are views of its output; x is its q|k|v columns).
// Attention mixer (fla/layers/attn.py): q/k/v projections (bias iff `qkv_bias`), head_dim =
// hidden / num_heads, RoPE (rotate-half, `attn.rope_theta`) at position k_len - 1, the KV append
// by write_at, causal GQA attention over [0, k_len) (primitive region + DecodeFlashSpec), o_proj.
// RMSNorms, the SwiGLU activations and the RoPE (one call over the q and k heads when stacked)
// hand the optimizer LayerOpSpecs.
#include <cmath>
#include <optional>
#include <string>

#include "splice/core/error.h"
#include "splice/model/blocks.h"
#include "splice/model/model.h"
#include "splice/ops/kda_decode.h"

namespace splice {

namespace {

// Cache slot of batch row 0 (slot 0 is reserved and never written).
constexpr std::int64_t kFirstSlot = 1;

struct Builder {
  const ModelConfig& c;
  const Weights& w;
  const BuildOptions& o;
  DecodeModel& m;
  Graph& g;
  SymExpr B;
  DynScalar k_len;

  NodeId param(const std::string& name, const Dims& shape, DType dtype) {
    return g.param(name, w.get(name, dtype, shape));
  }
  NodeId param(const std::string& name, const Dims& shape) { return param(name, shape, o.dtype); }
  NodeId f32(NodeId x) { return g.cast(x, DType::f32); }
  NodeId scalar(double v) { return g.scalar(v, DType::f32); }
  NodeId mul(NodeId a, NodeId b) { return g.binary(Op::Mul, a, b); }
  NodeId add(NodeId a, NodeId b) { return g.binary(Op::Add, a, b); }

  using Parts = layers::LinearParts;

  // x [..., hidden] through the linears `parts` (layers::project; stacked with stack_projections).
  std::vector<NodeId> project(NodeId x, const std::string& stacked_prefix, const Parts& parts,
                              bool bias, std::vector<std::size_t> groups = {}) {
    return layers::project(g, w, o.dtype, o.stack_projections, x, c.hidden_size, stacked_prefix,
                           parts, bias, std::move(groups));
  }

  // A mixer's input norm: its weight [hidden] and the spec site.
  struct Norm {
    NodeId weight;
    std::string site;
  };

  // rms_norm(x, norm) [..., hidden] through the linears `parts` (layers::norm_project: with
  // stack_projections one rms_norm_matmul region of the norm and the stacked product).
  std::vector<NodeId> norm_project(const Norm& norm, NodeId x, const std::string& stacked_prefix,
                                   const Parts& parts, bool bias,
                                   std::vector<std::size_t> groups = {}) {
    return layers::norm_project(g, w, o.dtype, o.stack_projections, x, norm.weight,
                                c.rms_norm_eps, c.hidden_size, stacked_prefix, parts, bias,
                                std::move(groups), &m.layer_specs, norm.site);
  }

  // Whether KDA layers fit the fused op's contract (see the file comment).
  bool kda_fits_fused_op() const {
    const KdaLayerConfig& k = c.kda;
    return k.head_dim == kKdaHeadDim && k.head_v_dim == kKdaHeadDim &&
           k.num_v_heads == k.num_heads && k.use_short_conv && k.conv_size == kKdaConvWidth &&
           !k.allow_neg_eigval && o.dtype == DType::bf16;
  }

  // The three depthwise conv weights [dim, 1, W] as taps [W, sum dims] f32 (q | k | v channels).
  Tensor conv_taps(const std::string& p) {
    const KdaLayerConfig& k = c.kda;
    const std::int64_t width = k.conv_size, kd = k.key_dim(), vd = k.value_dim();
    Tensor taps = Tensor::empty({width, 2 * kd + vd}, DType::f32);
    std::int64_t base = 0;
    for (const auto& [name, dim] : {std::pair<const char*, std::int64_t>{"q_conv1d", kd},
                                    {"k_conv1d", kd},
                                    {"v_conv1d", vd}}) {
      const Tensor wc =
          w.get(p + "attn." + name + ".weight", DType::f32, {dim, 1, width});  // [dim, 1, W]
      for (std::int64_t ch = 0; ch < dim; ++ch)
        for (std::int64_t t = 0; t < width; ++t) taps.set({t, base + ch}, wc.at({ch, 0, t}));
      base += dim;
    }
    return taps;
  }

  // The fused op's weight layout [3, 4, C] f32 from the same taps.
  Tensor fused_conv_weight(const Tensor& taps) {
    const std::int64_t channels = c.kda.key_dim();
    Tensor weight = Tensor::empty({kKdaNumProjections, kKdaConvWidth, channels}, DType::f32);
    for (std::int64_t p = 0; p < kKdaNumProjections; ++p)
      for (std::int64_t t = 0; t < kKdaConvWidth; ++t)
        for (std::int64_t ch = 0; ch < channels; ++ch)
          weight.set({p, t, ch}, taps.at({t, p * channels + ch}));
    return weight;
  }

  // A mixer's output before its o_proj: x [B, 1, in] and the o_proj weight [hidden, in]; the
  // layer adds x @ weight^T to the residual stream as one layers::linear_residual region (a
  // matmul_add LayerOpSpec).
  struct MixerOut {
    NodeId x, weight;
  };

  // KDA mixer of layer `l` on rms_norm(h, norm), h [B, 1, hidden]; returns its o_proj input
  // [B, 1, vd] and weight.
  MixerOut kda_mixer(std::int64_t l, NodeId h, const Norm& norm) {
    const KdaLayerConfig& k = c.kda;
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const std::string site = "layer" + std::to_string(l) + ".kda";
    const std::int64_t hidden = c.hidden_size, kd = k.key_dim(), vd = k.value_dim(),
                       H = k.num_heads, HV = k.num_v_heads, Dk = k.head_dim, Dv = k.head_v_dim,
                       gate_dim = HV * Dk, batch = o.batch;
    const SymExpr one(1);
    auto L = [&](NodeId id, const std::string& what) { return g.labeled(id, site + "." + what); };
    // [B, hidden]: the residual stream flattened; the norm runs on it inside norm_project (rows of
    // the last axis either way).
    const NodeId flat = g.reshape(h, {B, SymExpr(hidden)});
    // Projections of `flat` (each a bf16 linear like torch's, rounded at its output): with
    // stack_projections one matmul over the stacked q, k, v, f_proj.0, b_proj, g_proj.0 weights,
    // whose q|k|v columns are x (a view, strided when the batch has several rows).
    // (b_proj's few rows last, so every view that feeds a matmul or the fused op starts at a
    // multiple of a head dim: 16-byte aligned.)
    const Parts parts = {{p + "attn.q_proj.", kd},   {p + "attn.k_proj.", kd},
                         {p + "attn.v_proj.", vd},   {p + "attn.f_proj.0.", Dv},
                         {p + "attn.g_proj.0.", Dv}, {p + "attn.b_proj.", HV}};
    NodeId x, f_low, g_low, beta_low;
    if (o.stack_projections) {
      // Zero rows up to a multiple of 8 (the default model's 1026 -> 1032): every row of the
      // stacked product, and the strided views of it that a batch makes, start 16-byte aligned
      // in bf16, as the KDA kernels' staged inputs need (inputs_stageable).
      Parts padded = parts;
      std::int64_t rows = 0;
      for (const auto& part : parts) rows += part.second;
      if (rows % 8 != 0) padded.push_back({"", 8 - rows % 8});
      const std::vector<NodeId> y =
          norm_project(norm, flat, p + "attn.in_proj.", padded, false, {3, 1, 1, 1});
      x = L(g.reshape(y[0], {B, SymExpr(2 * kd + vd)}), "x");  // [B, 2*kd + vd]
      f_low = y[1], g_low = y[2], beta_low = y[3];
    } else {
      const std::vector<NodeId> y = norm_project(norm, flat, "", parts, false);
      x = L(g.concat({y[0], y[1], y[2]}, 1), "x");  // [B, 2*kd + vd]
      f_low = y[3], g_low = y[4], beta_low = y[5];
    }
    const NodeId raw_gate =
        L(layers::linear(g, f_low, param(p + "attn.f_proj.1.weight", {gate_dim, Dv})),
          "raw_gate");                                // [B, HV*Dk]
    const NodeId raw_beta = L(beta_low, "raw_beta");  // [B, HV]
    // The output gate's product and bias add: a matmul_add region (the bias broadcast).
    const NodeId out_gate = L(layers::linear(g, g_low, param(p + "attn.g_proj.1.weight", {vd, Dv}),
                                             param(p + "attn.g_proj.1.bias", {vd}), &m.layer_specs,
                                             site + ".output_gate"),
                              "output_gate");  // [B, HV*Dv]
    const NodeId A_log = param(p + "attn.A_log", {HV}, DType::f32);
    const NodeId dt_bias = param(p + "attn.dt_bias", {gate_dim}, DType::f32);
    const NodeId norm_weight = param(p + "attn.o_norm.weight", {Dv}, DType::f32);
    const SymExpr slots(batch + kFirstSlot);
    NodeId mixed_out;
    if (kda_fits_fused_op()) {
      Tensor taps = conv_taps(p);
      KdaRegionArgs r;
      r.x = x;
      r.weight = g.param(p + "attn.conv_weight", fused_conv_weight(taps));
      r.conv_state =
          g.state(p + "attn.conv_state", {slots, SymExpr(kKdaConvWidth - 1), SymExpr(3 * kd)},
                  DType::bf16);  // [slots, 3, 3C]
      r.raw_gate = g.reshape(raw_gate, {one, B, SymExpr(H), SymExpr(Dk)});
      r.raw_beta = g.reshape(raw_beta, {one, B, SymExpr(H)});
      r.A_log = A_log;
      r.dt_bias = dt_bias;
      r.output_gate = g.reshape(out_gate, {B, SymExpr(H), SymExpr(Dv)});
      r.norm_weight = norm_weight;
      r.state = g.state(p + "attn.recurrent_state", {slots, SymExpr(H), SymExpr(Dv), SymExpr(Dk)},
                        o.kda_state_dtype);  // [slots, H, V, K]
      r.first_slot = kFirstSlot;
      r.lower_bound =
          k.lower_bound ? std::optional<float>(static_cast<float>(*k.lower_bound)) : std::nullopt;
      r.norm_eps = static_cast<float>(c.rms_norm_eps);
      r.site = site;
      KdaRegion region = emit_decomposed_kda(g, r);
      m.kda_specs.push_back(region.spec);
      mixed_out = region.output;  // [B, C]
    } else {
      mixed_out =
          generic_kda(p, site, x, raw_gate, raw_beta, out_gate, A_log, dt_bias, norm_weight);
    }
    return {g.reshape(mixed_out, {B, one, SymExpr(vd)}),
            param(p + "attn.o_proj.weight", {hidden, vd})};
  }

  // Stages a-f of the file comment from primitives, for any KDA layer shape (no spec).
  NodeId generic_kda(const std::string& p, const std::string& site, NodeId x, NodeId raw_gate,
                     NodeId raw_beta, NodeId out_gate, NodeId A_log, NodeId dt_bias,
                     NodeId norm_weight) {
    const KdaLayerConfig& k = c.kda;
    const std::int64_t kd = k.key_dim(), vd = k.value_dim(), H = k.num_heads, HV = k.num_v_heads,
                       Dk = k.head_dim, Dv = k.head_v_dim, group = HV / H, width = k.conv_size,
                       channels = 2 * kd + vd, batch = o.batch;
    const DType dt = o.dtype;
    const SymExpr one(1), slots(batch + kFirstSlot);
    const DynScalar first = DynScalar::Concrete(kFirstSlot),
                    end = DynScalar::Concrete(kFirstSlot + batch);
    auto L = [&](NodeId id, const std::string& what) { return g.labeled(id, site + "." + what); };
    std::vector<NodeId> writes;
    // a. Short convs (+ SiLU), rounded to the activation dtype.
    NodeId mixed;
    if (k.use_short_conv) {
      if (width < 2)
        fail<UnsupportedError>(c.source, ": `conv_size` ", width,
                               " is not supported (must be >= 2)");
      const NodeId taps = g.param(p + "attn.conv_taps", conv_taps(p));  // [W, channels] f32
      const NodeId conv_state =
          g.state(p + "attn.conv_state", {slots, SymExpr(width - 1), SymExpr(channels)},
                  dt);  // [slots, W-1, ch]
      const NodeId history = L(g.slice(conv_state, 0, first, end), "conv_history");  // [B, W-1, ch]
      const NodeId x_row = g.reshape(x, {B, one, SymExpr(channels)});
      const NodeId window = g.concat({history, x_row}, 1);                           // [B, W, ch]
      const NodeId pre = g.reduce(Op::ReduceSum, mul(f32(window), taps), 1, false);  // [B, ch]
      mixed = f32(g.cast(g.unary(Op::Silu, pre), dt));
      const NodeId new_history = width > 2 ? g.concat({g.slice(history, 1, DynScalar::Concrete(1),
                                                               DynScalar::Concrete(width - 1)),
                                                       x_row},
                                                      1)
                                           : x_row;
      writes.push_back(L(g.write_at(conv_state, new_history, 0, first), "conv_write"));
    } else {
      mixed = f32(g.cast(g.unary(Op::Silu, f32(x)), dt));
    }
    mixed = L(mixed, "conv_silu");
    auto block = [&](std::int64_t begin, std::int64_t size, std::int64_t heads, std::int64_t dim) {
      const NodeId s =
          g.slice(mixed, 1, DynScalar::Concrete(begin), DynScalar::Concrete(begin + size));
      return g.reshape(s, {B, SymExpr(heads), SymExpr(dim)});
    };
    NodeId q = block(0, kd, H, Dk), kk = block(kd, kd, H, Dk);
    const NodeId v = block(2 * kd, vd, HV, Dv);  // [B, HV, Dv]
    // b. L2 norms, then q/k heads repeated for the value heads (hv = h * group + j).
    auto l2 = [&](NodeId t, double scale) {
      const NodeId ss = g.reduce(Op::ReduceSum, mul(t, t), -1, true);
      return mul(mul(t, g.unary(Op::Rsqrt, add(ss, scalar(kKdaL2NormEps)))), scalar(scale));
    };
    q = l2(q, 1.0 / std::sqrt(static_cast<double>(Dk)));
    kk = l2(kk, 1.0);
    if (group > 1) {
      Tensor ones = Tensor::empty({1, 1, group, 1}, DType::f32);
      ones.fill(1.0);
      const NodeId spread = g.constant(std::move(ones), site + ".gva_spread");
      auto expand = [&](NodeId t) {
        const NodeId r =
            mul(g.reshape(t, {B, SymExpr(H), one, SymExpr(Dk)}), spread);  // [B, H, G, Dk]
        return g.reshape(r, {B, SymExpr(HV), SymExpr(Dk)});
      };
      q = expand(q);
      kk = expand(kk);
    }
    q = L(q, "q_norm");
    kk = L(kk, "k_norm");
    // c. Gate (log decay per key channel).
    const NodeId z = add(g.reshape(f32(raw_gate), {B, SymExpr(HV), SymExpr(Dk)}),
                         g.reshape(dt_bias, {SymExpr(HV), SymExpr(Dk)}));
    const NodeId rate = g.reshape(g.unary(Op::Exp, A_log), {SymExpr(HV), one});
    const NodeId log_decay = k.lower_bound
                                 ? mul(scalar(*k.lower_bound), g.unary(Op::Sigmoid, mul(rate, z)))
                                 : mul(g.unary(Op::Neg, rate), g.unary(Op::Softplus, z));
    const NodeId decay = L(g.unary(Op::Exp, log_decay), "decay");  // [B, HV, Dk]
    // d. Beta.
    NodeId beta = g.unary(Op::Sigmoid, f32(raw_beta));  // [B, HV]
    if (k.allow_neg_eigval) beta = mul(beta, scalar(2.0));
    beta = g.reshape(beta, {B, SymExpr(HV), one, one});
    // e. Delta rule on S [B, HV, Dv, Dk].
    const NodeId state = g.state(p + "attn.recurrent_state",
                                 {slots, SymExpr(HV), SymExpr(Dv), SymExpr(Dk)}, o.kda_state_dtype);
    const NodeId s_old = f32(L(g.slice(state, 0, first, end), "state_rows"));
    const NodeId s_decayed = mul(s_old, g.reshape(decay, {B, SymExpr(HV), one, SymExpr(Dk)}));
    const NodeId k_col = g.reshape(kk, {B, SymExpr(HV), SymExpr(Dk), one});
    const NodeId pred = g.matmul(s_decayed, k_col);  // [B, HV, Dv, 1]
    const NodeId delta =
        mul(beta, g.binary(Op::Sub, g.reshape(v, {B, SymExpr(HV), SymExpr(Dv), one}), pred));
    const NodeId s_new =
        L(add(s_decayed, g.matmul(delta, g.reshape(kk, {B, SymExpr(HV), one, SymExpr(Dk)}))),
          "state_new");
    const NodeId o_raw =
        g.reshape(g.matmul(s_new, g.reshape(q, {B, SymExpr(HV), SymExpr(Dk), one})),
                  {B, SymExpr(HV), SymExpr(Dv)});
    writes.push_back(
        L(g.write_at(state, g.cast(s_new, o.kda_state_dtype), 0, first), "state_write"));
    // f. Gated RMSNorm over each value head (the kernel's output is stored in the activation
    // dtype).
    const NodeId o_act = f32(g.cast(o_raw, dt));
    const NodeId inv = g.unary(Op::Rsqrt, add(g.reduce(Op::ReduceMean, mul(o_act, o_act), -1, true),
                                              scalar(c.rms_norm_eps)));
    const NodeId gate =
        g.unary(Op::Sigmoid, f32(g.reshape(out_gate, {B, SymExpr(HV), SymExpr(Dv)})));
    const NodeId gated = g.cast(mul(mul(mul(o_act, inv), norm_weight), gate), dt);  // [B, HV, Dv]
    const NodeId out = L(g.sequence(gated, writes), "kda_exit");
    return L(g.reshape(out, {B, SymExpr(vd)}), "kda_merge");
  }

  // FLA's Attention of layer `l` on rms_norm(h, norm), h [B, 1, hidden]; returns its o_proj
  // input [B, 1, heads * head_dim] and weight.
  MixerOut attention_mixer(std::int64_t l, NodeId h, const Norm& norm, NodeId cos_table,
                           NodeId sin_table, NodeId position) {
    const std::string p = "model.layers." + std::to_string(l) + ".attn.";
    const std::string site = "layer" + std::to_string(l) + ".attn";
    const std::int64_t hidden = c.hidden_size, heads = c.num_attention_heads,
                       kv_heads = c.num_key_value_heads, head_dim = c.head_dim;
    const SymExpr one(1);
    const Parts qkv_parts = {{p + "q_proj.", heads * head_dim},
                             {p + "k_proj.", kv_heads * head_dim},
                             {p + "v_proj.", kv_heads * head_dim}};
    auto heads_of = [&](NodeId t, std::int64_t n) {  // [B, 1, n*D] -> [B, n, 1, D]
      return g.permute(g.reshape(t, {B, one, SymExpr(n), SymExpr(head_dim)}), {0, 2, 1, 3});
    };
    NodeId q_rot, k_rot, v;
    if (o.stack_projections) {
      // One q|k|v matmul; one RoPE over the adjacent q and k heads; q, k are head views of it.
      const std::vector<NodeId> qk_v =
          norm_project(norm, h, p + "qkv_proj.", qkv_parts, c.attention_bias, {2, 1});
      const NodeId qk = layers::rope(g, heads_of(qk_v[0], heads + kv_heads), cos_table, sin_table,
                                     position, &m.layer_specs, site + ".qk");
      q_rot = g.slice(qk, 1, DynScalar::Concrete(0), DynScalar::Concrete(heads));
      k_rot = g.slice(qk, 1, DynScalar::Concrete(heads), DynScalar::Concrete(heads + kv_heads));
      v = qk_v[1];
    } else {
      const std::vector<NodeId> qkv = norm_project(norm, h, "", qkv_parts, c.attention_bias);
      q_rot = layers::rope(g, heads_of(qkv[0], heads), cos_table, sin_table, position,
                           &m.layer_specs, site + ".q");
      k_rot = layers::rope(g, heads_of(qkv[1], kv_heads), cos_table, sin_table, position,
                           &m.layer_specs, site + ".k");
      v = qkv[2];
    }
    g.labeled(q_rot, site + ".q");
    const SymShape cache{B, SymExpr(kv_heads), SymExpr(o.max_seq_len), SymExpr(head_dim)};
    const NodeId k_state = g.state(p + "k_cache", cache, o.dtype);  // [B, Hkv, capacity, D]
    const NodeId v_state = g.state(p + "v_cache", cache, o.dtype);
    const DynScalar write = DynScalar::Expr(k_len.expr() - 1);
    const NodeId k_cache = g.labeled(g.write_at(k_state, k_rot, 2, write), site + ".k_append");
    const NodeId v_cache =
        g.labeled(g.write_at(v_state, heads_of(v, kv_heads), 2, write), site + ".v_append");
    AttentionRegionArgs args;
    args.q = q_rot;
    args.k_cache = k_cache;
    args.v_cache = v_cache;
    args.k_len = k_len;
    args.site = site;
    AttentionRegion region = emit_decomposed_attention(g, args);
    m.attention_specs.push_back(region.spec);
    const NodeId merged = g.reshape(region.output, {B, one, SymExpr(heads * head_dim)});
    return {merged, param(p + "o_proj.weight", {hidden, heads * head_dim})};
  }

  void build() {
    const std::int64_t hidden = c.hidden_size, vocab = c.vocab_size;
    const DType dt = o.dtype;
    const SymExpr one(1);
    if (c.family != ModelFamily::kda)
      fail<ValueError>(c.source, ": build_kda_decode_model needs a KDAForCausalLM config, got '",
                       c.architecture, "'");
    if (o.batch < 1) fail<ValueError>("batch must be >= 1, got ", o.batch);
    if (o.max_seq_len < 1) fail<ValueError>("max_seq_len must be >= 1, got ", o.max_seq_len);
    if (dt != DType::bf16 && dt != DType::f16 && dt != DType::f32)
      fail<DTypeError>("BuildOptions.dtype must be a float dtype, got ", dtype_name(dt));
    if (o.kda_state_dtype != DType::f32 && o.kda_state_dtype != DType::bf16)
      fail<DTypeError>("BuildOptions.kda_state_dtype must be f32 or bf16, got ",
                       dtype_name(o.kda_state_dtype));
    if (static_cast<std::int64_t>(c.layer_kinds.size()) != c.num_hidden_layers)
      fail<ValueError>(c.source, ": ", c.layer_kinds.size(), " layer kinds for ",
                       c.num_hidden_layers, " layers");
    const bool has_attention = !c.attention_layers.empty();
    if (has_attention && c.max_position_embeddings > 0 && o.max_seq_len > c.max_position_embeddings)
      fail<ValueError>("--max-seq-len ", o.max_seq_len,
                       " exceeds the model's max_position_embeddings ", c.max_position_embeddings);
    m.k_len = g.declare_symbol("k_len", 1, o.max_seq_len);
    k_len = DynScalar::Sym(m.k_len);

    const NodeId embed = param("model.embeddings.weight", {vocab, hidden});
    std::optional<NodeId> cos_table, sin_table, position;
    if (has_attention) {
      auto [cos, sin] = layers::rope_tables(c, c.head_dim, o.max_seq_len);
      cos_table = g.param("rope.cos", std::move(cos));
      sin_table = g.param("rope.sin", std::move(sin));
      position = g.sym_value(DynScalar::Expr(k_len.expr() - 1), DType::i32);
    }
    const NodeId tokens = g.input("tokens", {B}, DType::i32);
    NodeId h = g.reshape(g.gather(embed, tokens), {B, one, SymExpr(hidden)});  // [B, 1, hidden]
    for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      const std::string name = "layer" + std::to_string(l);
      // The mixer's norm runs inside its input projections (one rms_norm_matmul region when
      // stacked).
      const Norm attn_norm{param(p + "attn_norm.weight", {hidden}), name + ".attn_norm"};
      const MixerOut mixed =
          c.is_attention_layer(l)
              ? attention_mixer(l, h, attn_norm, *cos_table, *sin_table, *position)
              : kda_mixer(l, h, attn_norm);
      h = layers::linear_residual(g, h, mixed.x, mixed.weight, {}, &m.layer_specs,
                                  name + ".mixer.o_proj", name + ".mixer.residual");
      const std::int64_t inter = c.intermediate_size;
      // gate|up = rms_norm(h) @ W_gate_up^T: one matmul over their stacked weights when
      // stack_projections, then one rms_norm_matmul region with the norm (layers::norm_project);
      // the activation nests around it (a rms_norm_matmul_swiglu region: one GEMV with the
      // SwiGLU epilogue), then down_proj and the residual are one matmul_add region.
      h = layers::swiglu_mlp(g, w, dt, o.stack_projections, h,
                             param(p + "mlp_norm.weight", {hidden}), c.rms_norm_eps, hidden, inter,
                             p + "mlp.", &m.layer_specs, name + ".mlp_norm", name + ".mlp");
    }
    const bool tied = c.tie_word_embeddings || !w.has("lm_head.weight");
    const NodeId head = tied ? embed : param("lm_head.weight", {vocab, hidden});
    // The final norm and lm_head: one rms_norm_matmul region.  [B, 1, vocab]
    const NodeId logits =
        g.cast(layers::norm_linear(g, h, param("model.norm.weight", {hidden}), c.rms_norm_eps, dt,
                                   head, &m.layer_specs, "final_norm"),
               DType::f32);
    g.mark_output("logits", g.reshape(logits, {B, SymExpr(vocab)}));
  }
};

}  // namespace

DecodeModel build_kda_decode_model(const ModelConfig& config, const Weights& weights,
                                   const BuildOptions& options) {
  DecodeModel m;
  m.config = config;
  m.options = options;
  Builder b{config, weights, options, m, m.graph, SymExpr(options.batch), DynScalar::Concrete(1)};
  b.build();
  return m;
}

}  // namespace splice
