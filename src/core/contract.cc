// Kernel contracts (see splice/ops/contract.h): feature names, the row queries, and the seed's
// capacity-K kernel row. Compiled into core so the optimizer's gate, the verifier and the
// launchers share one table without depending on each other. The flash-decode rows live beside
// their op in src/ops/decode_attention.cc.
//
//  1. `supports*` are plain lookups in the row; nothing is inferred.
//  2. `tolerance(dtype)` is the written policy default for that dtype (tolerance.h) unless the row
//     states its own bound. The flash rows need no loosening: outputs round once to the storage
//     dtype after fp32 accumulation, which the default's two-roundings budget already covers
//     (measured by the kernel grid tests). The flash offer copies it into the branch's recipe,
//     where the verifier (tune/select.cc) reads it.
#include "splice/ops/contract.h"

#include <algorithm>
#include <string>
#include <utility>

namespace splice {

const char* attention_feature_name(AttentionFeature f) {
  switch (f) {
    case AttentionFeature::causal:
      return "causal";
    case AttentionFeature::window_left:
      return "window_left";
    case AttentionFeature::window_right:
      return "window_right";
    case AttentionFeature::softcap:
      return "softcap";
    case AttentionFeature::alibi:
      return "alibi";
    case AttentionFeature::per_seq_klen:
      return "per_seq_klen";
    case AttentionFeature::lse:
      return "lse";
  }
  return "?";
}

bool AttentionContract::supports(AttentionFeature f) const {
  return std::find(features.begin(), features.end(), f) != features.end();
}

bool AttentionContract::supports_dtype(DType d) const {
  return std::find(dtypes.begin(), dtypes.end(), d) != dtypes.end();
}

bool AttentionContract::supports_head_dim(std::int64_t d) const {
  return std::find(head_dims.begin(), head_dims.end(), d) != head_dims.end();
}

Tolerance AttentionContract::tolerance(DType dtype) const {
  return verify_tolerance.value_or(default_tolerance(dtype));
}

AttentionContract seed_capacity_k_contract() {
  AttentionContract row;
  row.kernel = "capacity_k_decode";
  row.backend = "cuda";
  row.revision = "seed";
  row.dtypes = {DType::bf16, DType::f16, DType::f32};
  row.head_dims = {64, 128};
  row.max_sq = 1;
  row.max_group = 0;
  // `causal` is accepted and ignored: with Sq == 1 the query sits at k_len - 1 and sees the whole
  // [0, k_len) prefix either way. No ALiBi, windows, softcap, ragged k_len or LSE output.
  row.features = {AttentionFeature::causal};
  return row;
}

const char* layer_op_name(LayerOpKind kind) {
  switch (kind) {
    case LayerOpKind::rms_norm:
      return "rms_norm";
    case LayerOpKind::silu_mul:
      return "silu_mul";
    case LayerOpKind::rope:
      return "rope";
    case LayerOpKind::matmul_add:
      return "matmul_add";
    case LayerOpKind::rms_norm_matmul:
      return "rms_norm_matmul";
    case LayerOpKind::silu_mul_matmul_add:
      return "silu_mul_matmul_add";
    case LayerOpKind::rope_kv_append:
      return "rope_kv_append";
    case LayerOpKind::rms_norm_matmul_rope_kv_append:
      return "rms_norm_matmul_rope_kv_append";
    case LayerOpKind::rms_norm_matmul_swiglu:
      return "rms_norm_matmul_swiglu";
  }
  return "?";
}

bool LayerOpContract::supports(LayerOpKind kind) const {
  return std::find(ops.begin(), ops.end(), kind) != ops.end();
}

bool LayerOpContract::supports_dtype(DType d) const {
  return std::find(dtypes.begin(), dtypes.end(), d) != dtypes.end();
}

std::string LayerOpContract::qkv_rope_gate(DType x, DType norm_weight, DType w, DType caches,
                                           std::int64_t head_dim, std::int64_t k,
                                           std::int64_t batch) const {
  std::string why;
  const auto add = [&](const std::string& what) { why += (why.empty() ? "" : "; ") + what; };
  const std::vector<DType>& taken = qkv_rope_dtypes.empty() ? dtypes : qkv_rope_dtypes;
  for (const auto& [dtype, name] : {std::pair<DType, const char*>{x, "x"},
                                    {norm_weight, "norm_weight"},
                                    {w, "w"},
                                    {caches, "k_cache"}})
    if (std::find(taken.begin(), taken.end(), dtype) == taken.end())
      add(std::string("takes no `") + name + "` of dtype " + dtype_name(dtype));
  if (qkv_rope_one_dtype && (norm_weight != x || w != x || caches != x))
    add(std::string("takes x, norm_weight, w and the caches of one dtype, got ") + dtype_name(x) +
        ", " + dtype_name(norm_weight) + ", " + dtype_name(w) + ", " + dtype_name(caches));
  if (head_dim % 2 != 0)
    add("needs an even head_dim (`k_cache`'s D), got " + std::to_string(head_dim));
  if (!qkv_rope_head_dims.empty() && std::find(qkv_rope_head_dims.begin(), qkv_rope_head_dims.end(),
                                               head_dim) == qkv_rope_head_dims.end())
    add("takes no head_dim " + std::to_string(head_dim));
  if (qkv_rope_max_k > 0 && k > qkv_rope_max_k)
    add("takes K <= " + std::to_string(qkv_rope_max_k) + ", got " + std::to_string(k));
  if (qkv_rope_k_multiple > 1 && k % qkv_rope_k_multiple != 0)
    add("takes K a multiple of " + std::to_string(qkv_rope_k_multiple) + ", got " +
        std::to_string(k));
  if (qkv_rope_max_batch > 0 && batch > qkv_rope_max_batch)
    add("takes batch <= " + std::to_string(qkv_rope_max_batch) + ", got " + std::to_string(batch));
  return why;
}

Tolerance LayerOpContract::tolerance(DType dtype) const { return default_tolerance(dtype); }

namespace {

// Every feature both flash-decode kernels implement.
const std::vector<AttentionFeature> kAllAttentionFeatures = {
    AttentionFeature::causal,  AttentionFeature::window_left, AttentionFeature::window_right,
    AttentionFeature::softcap, AttentionFeature::alibi,       AttentionFeature::per_seq_klen,
    AttentionFeature::lse};

}  // namespace

const AttentionContract& cpu_flash_decode_contract() {
  static const AttentionContract row = [] {
    AttentionContract c;
    c.kernel = "flash_decode";
    c.backend = "cpu";
    c.revision = "cpu-fd-1";
    c.dtypes = {DType::f32, DType::f16, DType::bf16};
    c.head_dims = {32, 64, 80, 96, 128, 160, 192, 256};
    c.max_sq = 64;
    c.max_group = 0;
    c.features = kAllAttentionFeatures;
    return c;
  }();
  return row;
}

const AttentionContract& cuda_flash_decode_contract() {
  static const AttentionContract row = [] {
    AttentionContract c;
    c.kernel = "flash_decode";
    c.backend = "cuda";
    c.revision = "cuda-fd-1";
    c.dtypes = {DType::bf16, DType::f16};
    c.head_dims = {64, 128, 256};
    c.max_sq = 8;
    c.max_group = 0;
    c.features = kAllAttentionFeatures;
    return c;
  }();
  return row;
}

}  // namespace splice
