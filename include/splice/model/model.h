// splice/model/model.h: decode graphs of real models, built once and planned once.
//
// A model's decode step is one graph: input "tokens" [batch] i32, symbol "k_len" in
// [1, max_seq_len] (the number of positions after this token is appended; the token sits at
// position k_len - 1), output "logits" [batch, vocab] f32. KV caches and KDA caches are state
// buffers sized by max_seq_len / batch. Every fused kernel enters through a spec (attention:
// DecodeFlashSpec, KDA: KdaDecodeSpec, RMSNorm / SwiGLU activation / RoPE: LayerOpSpec) beside
// its primitive region.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "splice/ir/graph.h"
#include "splice/model/config.h"
#include "splice/passes/decode_flash.h"
#include "splice/passes/kda.h"
#include "splice/passes/layer_ops.h"

namespace splice {

// Named weights (Hugging Face names), from safetensors files, GGUF, or memory.
class Weights {
 public:
  // Every *.safetensors file in `dir` (sharded checkpoints included), memory-mapped.
  static Weights from_directory(const std::string& dir);
  static Weights from_tensors(std::vector<std::pair<std::string, Tensor>> tensors);
  bool has(const std::string& name) const;
  // The tensor converted to `dtype` (a zero-copy view when it already is); IoError naming the
  // tensor and the source when it is missing, ShapeError when `shape` is given and differs.
  Tensor get(const std::string& name, DType dtype, const Dims& shape = {}) const;
  std::vector<std::string> names() const;

 private:
  struct Source;
  std::vector<std::shared_ptr<Source>> sources_;
  std::map<std::string, std::size_t> where_;
  std::string description_;
};

struct BuildOptions {
  std::int64_t batch = 1;
  std::int64_t max_seq_len = 512;
  DType dtype = DType::bf16;           // weights and activations between layers
  DType kda_state_dtype = DType::f32;  // recurrent state storage
  // One matmul over stacked weights for q|k|v, for gate|up, and for the KDA mixer's six input
  // projections; the projections are views of its output, and one RoPE covers the q and k heads.
  // Off: one matmul per Hugging Face linear (bitwise the same logits in bf16; f32 goes through
  // BLAS, whose summation order depends on the matmul's width: ulp-level differences).
  bool stack_projections = true;
};

struct DecodeModel {
  ModelConfig config;
  BuildOptions options;
  Graph graph;
  SymId k_len;
  std::vector<DecodeFlashSpec> attention_specs;
  std::vector<KdaDecodeSpec> kda_specs;
  std::vector<LayerOpSpec> layer_specs;  // rms_norm, silu_mul, rope
};

// Builds the decode graph of `config` (Llama family or FLA's KDAForCausalLM) from `weights`.
DecodeModel build_decode_model(const ModelConfig& config, const Weights& weights,
                               const BuildOptions& options);

// The Llama family (LlamaForCausalLM, Qwen2, SmolLM): RoPE, GQA attention, SwiGLU, RMSNorm.
DecodeModel build_llama_decode_model(const ModelConfig& config, const Weights& weights,
                                     const BuildOptions& options);
// FLA's hybrid KDAForCausalLM: KDA layers and GQA attention layers at `attn.layers`.
DecodeModel build_kda_decode_model(const ModelConfig& config, const Weights& weights,
                                   const BuildOptions& options);

// Shared building blocks for the builders (primitive regions).
//
// rms_norm, swiglu's activation and rope accept a spec sink: when `specs` is given, the primitive
// region is followed by a sole-consumer merge node (a same-shape view reshape labelled
// `<site>.<op>_merge`, which is what they return) and a LayerOpSpec for the fused arm is appended,
// so the optimizer can offer Op::RmsNorm / SiluMul / Rope beside the region.
namespace layers {
// y = x * rsqrt(mean(x^2, -1) + eps) * weight, computed in f32, returned in `out_dtype`.
NodeId rms_norm(Graph& g, NodeId x, NodeId weight, double eps, DType out_dtype,
                std::vector<LayerOpSpec>* specs = nullptr, const std::string& site = "");
// x @ W^T (+ bias) for a Hugging Face [out, in] weight; the product is labelled after a weight
// param named "<linear>.weight". With a bias and `specs`, the product and its bias add are a
// matmul_add region (inputs {x, weight, bias}; the fused op broadcasts the bias over the rows).
NodeId linear(Graph& g, NodeId x, NodeId weight, std::optional<NodeId> bias = {},
              std::vector<LayerOpSpec>* specs = nullptr, const std::string& site = "");
// residual + x @ W^T (+ bias): a linear layer and its residual add. Without a bias and with the
// residual of the product's shape, the region is a matmul_add LayerOpSpec (inputs {x, weight,
// residual}) so the optimizer can offer Op::MatMulAdd beside it; `label` names the add.
NodeId linear_residual(Graph& g, NodeId residual, NodeId x, NodeId weight,
                       std::optional<NodeId> bias = {}, std::vector<LayerOpSpec>* specs = nullptr,
                       const std::string& site = "", const std::string& label = "");
// silu(x W_gate^T) * (x W_up^T) then W_down^T (the activation silu(.) * (.) is the spec's region).
NodeId swiglu(Graph& g, NodeId x, NodeId gate, NodeId up, NodeId down,
              std::vector<LayerOpSpec>* specs = nullptr, const std::string& site = "");
// SwiGLU's activation alone: silu(gate_out) * up_out over two same-shape projections.
NodeId swiglu_activation(Graph& g, NodeId gate_out, NodeId up_out,
                         std::vector<LayerOpSpec>* specs = nullptr, const std::string& site = "");
// Rotary embedding of x [B, heads, 1, D] at position `position` ([1] i32; cos/sin rows gathered
// from the [max_seq_len, D] tables; HF's rotate-half layout).
NodeId rope(Graph& g, NodeId x, NodeId cos_table, NodeId sin_table, NodeId position,
            std::vector<LayerOpSpec>* specs = nullptr, const std::string& site = "");
// The attention prologue of one token from the q|k|v projection row qkv [B, 1, (Hq + 2 Hkv) D]:
// one RoPE over the adjacent q and k heads at `position`, k and v written into the caches
// k_state, v_state [B, Hkv, capacity, D] at row `write` (the same position), the rotated q
// sequenced after both write_at: arm 0 of a rope_kv_append LayerOpSpec (with `specs`; a fused
// Op::RopeKvAppend arm does all three in one kernel). Returns the rotated q [B, Hq, 1, D] and the
// caches as left by the appends (StateAfter views: what attention reads).
struct RopeKvAppendOut {
  NodeId q, k_cache, v_cache;
};
// With `specs` and `projection` (the rms_norm_matmul spec of the region whose merge qkv is a
// view of: inputs {h, norm_weight, w}), the two regions are nested in a third one: a
// rms_norm_matmul_rope_kv_append spec (inputs {h, norm_weight, w, cos, sin, position, k_state,
// v_state}) whose decomposed_out is this region's merge, appended after this region's spec, so
// the optimizer selects the two inner branches first and then the one-kernel arm against them.
RopeKvAppendOut rope_kv_append(Graph& g, NodeId qkv, std::int64_t heads, NodeId cos_table,
                               NodeId sin_table, NodeId position, NodeId k_state, NodeId v_state,
                               const DynScalar& write, std::vector<LayerOpSpec>* specs = nullptr,
                               const std::string& site = "",
                               const LayerOpSpec* projection = nullptr);
// Hugging Face linears of one input, as (weight/bias name prefix, output rows); stacked, a part
// with an empty prefix is that many zero rows of padding (in no group's view).
using LinearParts = std::vector<std::pair<std::string, std::int64_t>>;
// x [..., in_features] through the linears `parts` (prefix + "weight" [rows, in_features], prefix
// + "bias" [rows] when `bias`), weights read from `w` in `dtype`. With `stack`: one matmul over
// their weights stacked along the output axis (one param named `stacked_prefix` + "weight", the
// copies exact), each output a last-axis view of it covering `groups[i]` adjacent parts (default
// one each); otherwise one matmul per part (groups must then be all 1). Every output element is
// the same dot product either way.
std::vector<NodeId> project(Graph& g, const Weights& w, DType dtype, bool stack, NodeId x,
                            std::int64_t in_features, const std::string& stacked_prefix,
                            const LinearParts& parts, bool bias,
                            std::vector<std::size_t> groups = {});
// rms_norm(h) then project(): with `stack`, a spec sink, no bias and h of rank >= 2, the norm and
// the stacked product are ONE region (the RmsNorm primitives without their own spec, then the
// matmul over the stacked weight) ending in a merge, with a rms_norm_matmul LayerOpSpec (inputs
// {h, norm_weight, stacked weight}, `site`), so the optimizer can offer Op::RmsNormMatMul; the
// outputs are views of the merge. Otherwise exactly rms_norm(..., specs, site) then project().
std::vector<NodeId> norm_project(Graph& g, const Weights& w, DType dtype, bool stack, NodeId h,
                                 NodeId norm_weight, double eps, std::int64_t in_features,
                                 const std::string& stacked_prefix, const LinearParts& parts,
                                 bool bias, std::vector<std::size_t> groups,
                                 std::vector<LayerOpSpec>* specs, const std::string& site);
// rms_norm(h) @ weight^T for a 2-D weight [N, K] (the final norm and lm_head): with a spec sink
// and h of rank >= 2 one rms_norm_matmul region (inputs {h, norm_weight, weight}, `site`) ending
// in its merge; otherwise linear(rms_norm(..., specs, site), weight).
NodeId norm_linear(Graph& g, NodeId h, NodeId norm_weight, double eps, DType dtype, NodeId weight,
                   std::vector<LayerOpSpec>* specs = nullptr, const std::string& site = "");
// residual + (silu(gate_out) * up_out) @ down^T: SwiGLU's activation, down projection and the
// residual add. With a spec sink, a 2-D down weight and the residual of the product's shape, ONE
// region (Silu -> Mul -> MatMul -> Add primitives, the add labelled `label`) with a
// silu_mul_matmul_add LayerOpSpec (inputs {gate_out, up_out, down, residual}, `site`), so the
// optimizer can offer Op::SiluMulMatMulAdd; otherwise swiglu_activation(..., site) then
// linear_residual(..., down_site, label).
// With a spec sink and `projection` (the rms_norm_matmul spec of the gate|up product whose merge
// gate_out and up_out are the [0, I) and [I, 2I) views of: inputs {h, norm_weight, w [2I, K]}),
// the activation instead nests around that product: Silu -> Mul ending in a merge, with a
// rms_norm_matmul_swiglu spec (inputs {h, norm_weight, w}, `site`) whose region holds the
// product's region (Op::RmsNormMatMulSwiglu: SwiGLU in the gate|up GEMV's epilogue), then
// linear_residual(..., down_site, label) over the merge (a matmul_add region). No
// silu_mul_matmul_add spec on that path.
NodeId swiglu_down_residual(Graph& g, NodeId residual, NodeId gate_out, NodeId up_out, NodeId down,
                            std::vector<LayerOpSpec>* specs = nullptr, const std::string& site = "",
                            const std::string& down_site = "", const std::string& label = "",
                            const LayerOpSpec* projection = nullptr);
// The SwiGLU MLP with its residual, h + down(silu(gate) * up) with [gate | up] = rms_norm(h) @
// [W_gate; W_up]^T: norm_project's gate|up product (weights `mlp_prefix` + gate_proj. / up_proj.,
// stacked as `mlp_prefix` + gate_up_proj. when `stack`; an rms_norm_matmul region at `norm_site`
// when stacked), then the Param `mlp_prefix` + down_proj.weight [hidden, inter] and
// swiglu_down_residual with that region as its `projection` (sites `site`, `site` +
// ".down_proj", label `site` + ".residual").
NodeId swiglu_mlp(Graph& g, const Weights& w, DType dtype, bool stack, NodeId h, NodeId norm_weight,
                  double eps, std::int64_t hidden, std::int64_t inter,
                  const std::string& mlp_prefix, std::vector<LayerOpSpec>* specs,
                  const std::string& norm_site, const std::string& site);
// cos/sin tables [max_seq_len, D] for rope_theta and optional llama3 scaling.
std::pair<Tensor, Tensor> rope_tables(const ModelConfig& config, std::int64_t head_dim,
                                      std::int64_t max_seq_len);
}  // namespace layers

}  // namespace splice
