// Weights, the shared layer blocks and the builder dispatch (see model.h).
#include "splice/model/model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>

#include "splice/core/error.h"
#include "splice/model/safetensors.h"

namespace splice {

struct Weights::Source {
  std::unique_ptr<SafeTensorsFile> file;  // a safetensors file, or
  std::map<std::string, Tensor> tensors;  // tensors in memory
};

Weights Weights::from_directory(const std::string& dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) fail<IoError>("model directory '", dir, "' does not exist");
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".safetensors") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  if (files.empty()) fail<IoError>("model directory '", dir, "' has no *.safetensors file");
  Weights w;
  w.description_ = dir;
  for (const auto& path : files) {
    auto source = std::make_shared<Source>();
    source->file = std::make_unique<SafeTensorsFile>(SafeTensorsFile::open(path.string()));
    for (const auto& name : source->file->names()) {
      if (w.where_.count(name))
        fail<IoError>("tensor '", name, "' appears in two files of '", dir, "'");
      w.where_[name] = w.sources_.size();
    }
    w.sources_.push_back(source);
  }
  return w;
}

Weights Weights::from_tensors(std::vector<std::pair<std::string, Tensor>> tensors) {
  Weights w;
  w.description_ = "in-memory weights";
  auto source = std::make_shared<Source>();
  for (auto& [name, t] : tensors) {
    if (w.where_.count(name)) fail<ValueError>("tensor '", name, "' is given twice");
    w.where_[name] = 0;
    source->tensors[name] = std::move(t);
  }
  w.sources_.push_back(source);
  return w;
}

bool Weights::has(const std::string& name) const { return where_.count(name) != 0; }

std::vector<std::string> Weights::names() const {
  std::vector<std::string> out;
  for (const auto& [name, index] : where_) out.push_back(name);
  return out;
}

Tensor Weights::get(const std::string& name, DType dtype, const Dims& shape) const {
  auto it = where_.find(name);
  if (it == where_.end()) fail<IoError>("weight '", name, "' is missing from ", description_);
  const Source& s = *sources_[it->second];
  Tensor t = s.file ? s.file->tensor_as(name, dtype) : s.tensors.at(name);
  if (t.dtype() != dtype) t = t.to(dtype);
  if (!shape.empty() && t.shape() != shape)
    fail<ShapeError>("weight '", name, "' must have shape ", dims_str(shape), ", got ",
                     dims_str(t.shape()), " in ", description_);
  return t;
}

DecodeModel build_decode_model(const ModelConfig& config, const Weights& weights,
                               const BuildOptions& options) {
  if (options.batch < 1) fail<ValueError>("batch must be >= 1, got ", options.batch);
  if (options.max_seq_len < 1)
    fail<ValueError>("max_seq_len must be >= 1, got ", options.max_seq_len);
  switch (config.family) {
    case ModelFamily::llama:
      return build_llama_decode_model(config, weights, options);
    case ModelFamily::kda:
      return build_kda_decode_model(config, weights, options);
  }
  fail<UnsupportedError>("unknown model family of '", config.architecture, "'");
}

namespace layers {
namespace {

// Ends a primitive region at `out`: without a spec sink, `out` itself; with one, a same-shape
// view reshape (the sole consumer of `out`, the branch's merge) and the region's LayerOpSpec.
NodeId end_region(Graph& g, NodeId out, LayerOpSpec spec, std::vector<LayerOpSpec>* specs,
                  const std::string& site) {
  if (!specs) return out;
  const std::string name = layer_op_name(spec.kind);
  const std::string where = site.empty() ? name : site;
  const NodeId merge = g.labeled(g.reshape(out, g.node(out).shape), where + "." + name + "_merge");
  spec.decomposed_out = out;
  spec.reconverge = merge;
  spec.site = where;
  specs->push_back(std::move(spec));
  return merge;
}

}  // namespace

NodeId rms_norm(Graph& g, NodeId x, NodeId weight, double eps, DType out_dtype,
                std::vector<LayerOpSpec>* specs, const std::string& site) {
  const NodeId x32 = g.cast(x, DType::f32);
  const NodeId mean_sq = g.reduce(Op::ReduceMean, g.binary(Op::Mul, x32, x32), -1, true);
  const NodeId inv = g.unary(Op::Rsqrt, g.binary(Op::Add, mean_sq, g.scalar(eps, DType::f32)));
  const NodeId w32 = g.cast(weight, DType::f32);
  const NodeId out = g.cast(g.binary(Op::Mul, g.binary(Op::Mul, x32, inv), w32), out_dtype);
  LayerOpSpec spec;
  spec.kind = LayerOpKind::rms_norm;
  spec.inputs = {x, weight};
  spec.eps = static_cast<float>(eps);
  return end_region(g, out, std::move(spec), specs, site);
}

NodeId linear(Graph& g, NodeId x, NodeId weight, std::optional<NodeId> bias,
              std::vector<LayerOpSpec>* specs, const std::string& site) {
  NodeId y = g.matmul(x, weight, /*transpose_b=*/true);
  // The product named after its weight ("model.layers.0.attn.in_proj" for a param named
  // "...in_proj.weight"), so profiles and printed graphs say which linear it is; a caller's
  // label replaces it.
  const Node& w = g.node(weight);
  const std::string suffix = ".weight";
  if (w.op == Op::Param && w.attrs.name.size() > suffix.size() && w.attrs.name.ends_with(suffix))
    y = g.labeled(y, w.attrs.name.substr(0, w.attrs.name.size() - suffix.size()));
  if (!bias) return y;
  const NodeId out = g.binary(Op::Add, y, *bias);
  if (g.node(weight).shape.size() != 2) return out;
  LayerOpSpec spec;
  spec.kind = LayerOpKind::matmul_add;
  spec.inputs = {x, weight, *bias};
  return end_region(g, out, std::move(spec), specs, site);
}

NodeId linear_residual(Graph& g, NodeId residual, NodeId x, NodeId weight,
                       std::optional<NodeId> bias, std::vector<LayerOpSpec>* specs,
                       const std::string& site, const std::string& label) {
  const NodeId y = linear(g, x, weight, bias);
  NodeId out = g.binary(Op::Add, residual, y);
  if (!label.empty()) out = g.labeled(out, label);
  if (bias || g.node(weight).shape.size() != 2 ||
      !same_shape(g.node(residual).shape, g.node(y).shape))
    return out;
  LayerOpSpec spec;
  spec.kind = LayerOpKind::matmul_add;
  spec.inputs = {x, weight, residual};
  return end_region(g, out, std::move(spec), specs, site);
}

NodeId swiglu(Graph& g, NodeId x, NodeId gate, NodeId up, NodeId down,
              std::vector<LayerOpSpec>* specs, const std::string& site) {
  const NodeId gate_out = linear(g, x, gate), up_out = linear(g, x, up);  // [..., I]
  return linear(g, swiglu_activation(g, gate_out, up_out, specs, site), down);
}

NodeId swiglu_activation(Graph& g, NodeId gate_out, NodeId up_out, std::vector<LayerOpSpec>* specs,
                         const std::string& site) {
  const NodeId act = g.binary(Op::Mul, g.unary(Op::Silu, gate_out), up_out);
  LayerOpSpec spec;
  spec.kind = LayerOpKind::silu_mul;
  spec.inputs = {gate_out, up_out};
  return end_region(g, act, std::move(spec), specs, site);
}

NodeId rope(Graph& g, NodeId x, NodeId cos_table, NodeId sin_table, NodeId position,
            std::vector<LayerOpSpec>* specs, const std::string& site) {
  const Node& xn = g.node(x);
  const SymShape shape = xn.shape;  // [B, heads, 1, D]
  const DType dtype = xn.dtype;
  const std::int64_t d = shape[3].constant(), half = d / 2;
  const NodeId cos = g.gather(cos_table, position);  // [1, D]
  const NodeId sin = g.gather(sin_table, position);
  const NodeId x32 = g.cast(x, DType::f32);
  const NodeId x1 = g.slice(x32, 3, DynScalar::Concrete(0), DynScalar::Concrete(half));
  const NodeId x2 = g.slice(x32, 3, DynScalar::Concrete(half), DynScalar::Concrete(d));
  const NodeId rotated = g.concat({g.unary(Op::Neg, x2), x1}, 3);  // rotate_half
  const NodeId y = g.binary(Op::Add, g.binary(Op::Mul, x32, cos), g.binary(Op::Mul, rotated, sin));
  LayerOpSpec spec;
  spec.kind = LayerOpKind::rope;
  spec.inputs = {x, cos_table, sin_table, position};
  return end_region(g, g.cast(y, dtype), std::move(spec), specs, site);
}

RopeKvAppendOut rope_kv_append(Graph& g, NodeId qkv, std::int64_t heads, NodeId cos_table,
                               NodeId sin_table, NodeId position, NodeId k_state, NodeId v_state,
                               const DynScalar& write, std::vector<LayerOpSpec>* specs,
                               const std::string& site, const LayerOpSpec* projection) {
  // A copy: `projection` may point into `specs`, which the regions below append to.
  const std::optional<LayerOpSpec> outer_of =
      projection ? std::optional<LayerOpSpec>(*projection) : std::nullopt;
  SPLICE_INTERNAL_CHECK(
      !outer_of || (outer_of->kind == LayerOpKind::rms_norm_matmul && outer_of->inputs.size() == 3),
      "rope_kv_append: `projection` must be an rms_norm_matmul spec");
  const SymShape cache = g.node(k_state).shape;  // [B, Hkv, capacity, D]
  const SymExpr batch = g.node(qkv).shape[0];
  const std::int64_t kv_heads = cache[1].constant(), d = cache[3].constant();
  auto L = [&](NodeId id, const char* what) { return g.labeled(id, site + "." + what); };
  // [B, n, 1, D] heads of the row, from head `first`.
  auto heads_of = [&](std::int64_t first, std::int64_t n) {
    const NodeId cols =
        g.slice(qkv, 2, DynScalar::Concrete(first * d), DynScalar::Concrete((first + n) * d));
    return g.permute(g.reshape(cols, {batch, SymExpr(1), SymExpr(n), SymExpr(d)}), {0, 2, 1, 3});
  };
  // RoPE is per head row: one call over the q and k heads (no nested rope spec).
  const NodeId qk = rope(g, heads_of(0, heads + kv_heads), cos_table, sin_table, position);
  const NodeId q = g.slice(qk, 1, DynScalar::Concrete(0), DynScalar::Concrete(heads));
  const NodeId k =
      g.slice(qk, 1, DynScalar::Concrete(heads), DynScalar::Concrete(heads + kv_heads));
  const NodeId k_write = L(g.write_at(k_state, k, 2, write), "k_append");
  const NodeId v_write =
      L(g.write_at(v_state, heads_of(heads + kv_heads, kv_heads), 2, write), "v_append");
  const NodeId exit = L(g.sequence(q, {k_write, v_write}), "rope_kv_exit");  // [B, Hq, 1, D]
  NodeId merge = exit;
  if (specs) {
    LayerOpSpec spec;
    spec.kind = LayerOpKind::rope_kv_append;
    spec.inputs = {qkv, cos_table, sin_table, position, k_state, v_state};
    merge = end_region(g, exit, std::move(spec), specs, site);
    if (outer_of) {
      // The outer region: from h through the projection's region and this one (both inner
      // branches stay in its arm 0, the oracle); its fused arm is one GEMV with the RoPE and
      // append epilogue. Offered after the inner specs, so it is selected after them.
      LayerOpSpec outer;
      outer.kind = LayerOpKind::rms_norm_matmul_rope_kv_append;
      outer.inputs = {outer_of->inputs[0],
                      outer_of->inputs[1],
                      outer_of->inputs[2],
                      cos_table,
                      sin_table,
                      position,
                      k_state,
                      v_state};
      outer.eps = outer_of->eps;
      merge = end_region(g, merge, std::move(outer), specs, site);
    }
  }
  // q is a view of the merge, so a branch diverging at q (attention's) does not take in the
  // StateAfter views, which follow the merge itself.
  return {L(g.reshape(merge, g.node(merge).shape), "q"),
          L(g.state_after(k_state, {merge}), "k_cache"),
          L(g.state_after(v_state, {merge}), "v_cache")};
}

namespace {

// One param of the parts' tensors stacked along the output axis (`cols` = 0: biases).
NodeId stacked_param(Graph& g, const Weights& w, DType dtype, const std::string& stacked_prefix,
                     const LinearParts& parts, const std::string& suffix, std::int64_t cols) {
  std::int64_t rows = 0;
  for (const auto& part : parts) rows += part.second;
  Tensor t = Tensor::zeros(cols ? Dims{rows, cols} : Dims{rows}, dtype);
  std::int64_t at = 0;
  for (const auto& [prefix, n] : parts) {
    if (!prefix.empty()) {  // an empty prefix: n zero rows of padding (LinearParts)
      Tensor dst = t.slice(0, at, at + n);
      dst.copy_from(w.get(prefix + suffix, dtype, cols ? Dims{n, cols} : Dims{n}));
    }
    at += n;
  }
  return g.param(stacked_prefix + suffix, std::move(t));
}

// Last-axis views of y [..., sum rows], each covering `groups[i]` adjacent parts.
std::vector<NodeId> split_views(Graph& g, NodeId y, const LinearParts& parts,
                                const std::vector<std::size_t>& groups) {
  const auto axis = static_cast<std::int64_t>(g.node(y).shape.size()) - 1;
  std::vector<NodeId> out;
  std::int64_t at = 0;
  std::size_t next = 0;
  for (std::size_t size : groups) {
    std::int64_t n = 0;
    for (std::size_t i = 0; i < size; ++i) n += parts.at(next++).second;
    out.push_back(g.slice(y, axis, DynScalar::Concrete(at), DynScalar::Concrete(at + n)));
    at += n;
  }
  return out;
}

}  // namespace

std::vector<NodeId> project(Graph& g, const Weights& w, DType dtype, bool stack, NodeId x,
                            std::int64_t in_features, const std::string& stacked_prefix,
                            const LinearParts& parts, bool bias, std::vector<std::size_t> groups) {
  if (groups.empty()) groups.assign(parts.size(), 1);
  auto param = [&](const std::string& name, const Dims& shape) {
    return g.param(name, w.get(name, dtype, shape));
  };
  std::vector<NodeId> out;
  if (!stack) {
    for (std::size_t size : groups)
      SPLICE_INTERNAL_CHECK(size == 1, "project: grouped projections need stacking");
    for (const auto& [prefix, n] : parts)
      if (!prefix.empty())  // padding parts exist only stacked
        out.push_back(
            linear(g, x, param(prefix + "weight", {n, in_features}),
                   bias ? std::optional<NodeId>(param(prefix + "bias", {n})) : std::nullopt));
    return out;
  }
  std::optional<NodeId> stacked_bias;
  if (bias) stacked_bias = stacked_param(g, w, dtype, stacked_prefix, parts, "bias", 0);
  const NodeId y = linear(
      g, x, stacked_param(g, w, dtype, stacked_prefix, parts, "weight", in_features), stacked_bias);
  return split_views(g, y, parts, groups);
}

std::vector<NodeId> norm_project(Graph& g, const Weights& w, DType dtype, bool stack, NodeId h,
                                 NodeId norm_weight, double eps, std::int64_t in_features,
                                 const std::string& stacked_prefix, const LinearParts& parts,
                                 bool bias, std::vector<std::size_t> groups,
                                 std::vector<LayerOpSpec>* specs, const std::string& site) {
  if (!stack || bias || !specs || g.node(h).shape.size() < 2) {
    const NodeId a = rms_norm(g, h, norm_weight, eps, dtype, specs, site);
    return project(g, w, dtype, stack, a, in_features, stacked_prefix, parts, bias,
                   std::move(groups));
  }
  if (groups.empty()) groups.assign(parts.size(), 1);
  const NodeId weight = stacked_param(g, w, dtype, stacked_prefix, parts, "weight", in_features);
  // [..., sum rows]: the merge of the rms_norm_matmul region
  const NodeId y = norm_linear(g, h, norm_weight, eps, dtype, weight, specs, site);
  return split_views(g, y, parts, groups);
}

NodeId norm_linear(Graph& g, NodeId h, NodeId norm_weight, double eps, DType dtype, NodeId weight,
                   std::vector<LayerOpSpec>* specs, const std::string& site) {
  if (!specs || g.node(h).shape.size() < 2 || g.node(weight).shape.size() != 2)
    return linear(g, rms_norm(g, h, norm_weight, eps, dtype, specs, site), weight);
  const NodeId a = rms_norm(g, h, norm_weight, eps, dtype);  // the region's RmsNorm, no spec
  const NodeId y = linear(g, a, weight);
  LayerOpSpec spec;
  spec.kind = LayerOpKind::rms_norm_matmul;
  spec.inputs = {h, norm_weight, weight};
  spec.eps = static_cast<float>(eps);
  return end_region(g, y, std::move(spec), specs, site);
}

NodeId swiglu_down_residual(Graph& g, NodeId residual, NodeId gate_out, NodeId up_out, NodeId down,
                            std::vector<LayerOpSpec>* specs, const std::string& site,
                            const std::string& down_site, const std::string& label,
                            const LayerOpSpec* projection) {
  if (specs && projection) {
    // A copy: `projection` may point into `specs`, which the regions below append to.
    const LayerOpSpec gate_up = *projection;
    SPLICE_INTERNAL_CHECK(gate_up.kind == LayerOpKind::rms_norm_matmul &&
                              gate_up.inputs.size() == 3 &&
                              g.node(gate_up.inputs[2]).shape.size() == 2 &&
                              g.node(gate_up.inputs[2])
                                  .shape[0]
                                  .structurally_equal(g.node(gate_out).shape.back() * 2),
                          "swiglu_down_residual: `projection` must be the rms_norm_matmul spec "
                          "of the [2I, K] gate|up product");
    // act = silu(gate) * up  [..., M, I]: the outer region runs from h through the gate|up
    // product's region (its branch stays in arm 0, the oracle), the two views and Silu -> Mul;
    // its fused arm is one GEMV with the SwiGLU epilogue. Offered after the product's spec, so
    // it is selected after it.
    const NodeId act = g.binary(Op::Mul, g.unary(Op::Silu, gate_out), up_out);
    LayerOpSpec outer;
    outer.kind = LayerOpKind::rms_norm_matmul_swiglu;
    outer.inputs = gate_up.inputs;
    outer.eps = gate_up.eps;
    const NodeId merged = end_region(g, act, std::move(outer), specs, site);
    // The down projection and the residual: a matmul_add region.
    return linear_residual(g, residual, merged, down, {}, specs, down_site, label);
  }
  SymShape product = g.node(gate_out).shape;  // [..., M, I] -> the product's [..., M, N]
  const bool fits = specs && g.node(down).shape.size() == 2 && product.size() >= 2 &&
                    product.back().structurally_equal(g.node(down).shape[1]);
  if (fits) product.back() = g.node(down).shape[0];
  if (!fits || !same_shape(g.node(residual).shape, product)) {
    const NodeId act = swiglu_activation(g, gate_out, up_out, specs, site);
    return linear_residual(g, residual, act, down, {}, specs, down_site, label);
  }
  const NodeId act = g.binary(Op::Mul, g.unary(Op::Silu, gate_out), up_out);  // no spec
  NodeId out = g.binary(Op::Add, residual, linear(g, act, down));
  if (!label.empty()) out = g.labeled(out, label);
  LayerOpSpec spec;
  spec.kind = LayerOpKind::silu_mul_matmul_add;
  spec.inputs = {gate_out, up_out, down, residual};
  return end_region(g, out, std::move(spec), specs, site);
}

NodeId swiglu_mlp(Graph& g, const Weights& w, DType dtype, bool stack, NodeId h, NodeId norm_weight,
                  double eps, std::int64_t hidden, std::int64_t inter,
                  const std::string& mlp_prefix, std::vector<LayerOpSpec>* specs,
                  const std::string& norm_site, const std::string& site) {
  const std::size_t specs_before = specs ? specs->size() : 0;
  const std::vector<NodeId> gate_up =
      norm_project(g, w, dtype, stack, h, norm_weight, eps, hidden, mlp_prefix + "gate_up_proj.",
                   {{mlp_prefix + "gate_proj.", inter}, {mlp_prefix + "up_proj.", inter}}, false,
                   {}, specs, norm_site);
  // The rms_norm_matmul region norm_project built when stacked: with it, the activation's region
  // nests around it (one GEMV with the SwiGLU epilogue) and down_proj plus the residual are a
  // matmul_add region. A copy: swiglu_down_residual appends to `specs`.
  const std::optional<LayerOpSpec> gate_up_spec =
      specs && specs->size() == specs_before + 1 &&
              specs->back().kind == LayerOpKind::rms_norm_matmul
          ? std::optional<LayerOpSpec>(specs->back())
          : std::nullopt;
  const std::string down_name = mlp_prefix + "down_proj.weight";
  const NodeId down = g.param(down_name, w.get(down_name, dtype, {hidden, inter}));
  return swiglu_down_residual(g, h, gate_up[0], gate_up[1], down, specs, site, site + ".down_proj",
                              site + ".residual", gate_up_spec ? &*gate_up_spec : nullptr);
}

std::pair<Tensor, Tensor> rope_tables(const ModelConfig& c, std::int64_t head_dim,
                                      std::int64_t max_seq_len) {
  const std::int64_t half = head_dim / 2;
  std::vector<double> inv_freq(static_cast<std::size_t>(half));
  for (std::int64_t i = 0; i < half; ++i)
    inv_freq[i] =
        1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / static_cast<double>(head_dim));
  if (c.rope_scaling && c.rope_scaling->type == "llama3") {
    // Llama 3 frequency scaling: low frequencies divided by `factor`, high ones kept, a smooth
    // blend between the two wavelength thresholds.
    const RopeScaling& s = *c.rope_scaling;
    const double old_len = static_cast<double>(s.original_max_position_embeddings);
    const double low_wavelen = old_len / s.low_freq_factor,
                 high_wavelen = old_len / s.high_freq_factor;
    for (auto& f : inv_freq) {
      const double wavelen = 2 * M_PI / f;
      if (wavelen > low_wavelen) {
        f = f / s.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth =
            (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1 - smooth) * f / s.factor + smooth * f;
      }
    }
  } else if (c.rope_scaling && c.rope_scaling->type == "linear") {
    for (auto& f : inv_freq) f /= c.rope_scaling->factor;
  } else if (c.rope_scaling && !c.rope_scaling->type.empty() && c.rope_scaling->type != "default") {
    fail<UnsupportedError>(c.source, ": rope_scaling type '", c.rope_scaling->type,
                           "' is not supported (llama3, linear, default are)");
  }
  Tensor cos = Tensor::empty({max_seq_len, head_dim}, DType::f32);
  Tensor sin = Tensor::empty({max_seq_len, head_dim}, DType::f32);
  float* pc = cos.data<float>();
  float* ps = sin.data<float>();
  for (std::int64_t p = 0; p < max_seq_len; ++p)
    for (std::int64_t i = 0; i < head_dim; ++i) {
      // Angles in float32 like the reference implementations (position * inv_freq in fp32).
      const float angle = static_cast<float>(p) * static_cast<float>(inv_freq[i % half]);
      pc[p * head_dim + i] = std::cos(angle);
      ps[p * head_dim + i] = std::sin(angle);
    }
  return {cos, sin};
}

}  // namespace layers
}  // namespace splice
