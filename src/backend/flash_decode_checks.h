// The argument checks of a flash-decode attention call against a kernel contract row (spec
// decode_attention.md §2 and §5), shared by the public op (ops/decode_attention.cc, both
// backends) and the CUDA launcher a decode session calls directly (backend/cuda/flash_decode.cu),
// so the row drives both and their messages cannot drift apart (design.md §1). Devices are each
// caller's own check (before this); the value contract on k_len is the op's (it reads k_len).
//
//  1. Ranks (so the row's checks can name dims), then the row: dtype, head_dim, q_len <= max_sq,
//     the GQA group size <= max_group.
//  2. Shapes, dtypes and layouts: k, v [B, Hkv, capacity, D] of q's dtype, Hq % Hkv == 0; unit
//     last strides on q, k, v and out; k_len int32 [B] or [1]; alibi f32 [Hq] contiguous; out (when
//     defined: the op allocates it otherwise) [B, Hq, Sq, D] of q's dtype; lse (when defined) f32
//     [B, Hq, Sq].
//  3. Options: softmax_scale finite, windows >= 0, softcap finite and > 0, num_splits >= 0.
//  4. Every feature the call uses is in the row (causal at Sq > 1, windows, softcap, alibi,
//     per-sequence k_len, lse).
//  5. Aliasing: out and lse share no memory with q, k, v, k_len, alibi or each other (no in-place
//     form: FlashInfer and PyTorch SDPA offer none; one split's merge writes out while another
//     may still read q, and an out inside the KV cache would change what later splits read).
// Every refusal is a typed error naming the argument, the value seen and what is allowed.
#pragma once

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "splice/core/error.h"
#include "splice/core/tensor.h"
#include "splice/ops/contract.h"
#include "splice/ops/decode_attention.h"

namespace splice::flash_decode_checks {

constexpr std::int64_t kAttentionRank = 4;  // [batch, heads, length, head_dim]

template <typename T>
std::string list_str(const std::vector<T>& values) {
  std::ostringstream out;
  out << "{";
  for (std::size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << values[i];
  out << "}";
  return out.str();
}

inline std::string dtype_list_str(const std::vector<DType>& dtypes) {
  std::string out;
  for (DType d : dtypes) out += std::string(out.empty() ? "" : " or ") + dtype_name(d);
  return out;
}

inline void check_unit_last_stride(const Tensor& t, const char* name) {
  if (t.dim() > 0 && t.size(-1) > 1 && t.stride(-1) != 1)
    fail<LayoutError>("`", name, "` must have a unit stride on its last axis, got strides ",
                      dims_str(t.strides()), " for shape ", dims_str(t.shape()));
}

inline void require_feature(const AttentionContract& row, AttentionFeature f,
                            const std::string& why) {
  if (!row.supports(f))
    fail<UnsupportedError>("decode_attention: the ", row.backend, " kernel '", row.kernel,
                           "' (revision ", row.revision, ") does not support ",
                           attention_feature_name(f), ", which ", why, " asks for");
}

// Stage 5: out and lse (each may be absent or undefined) against the inputs and each other.
inline void check_aliasing(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_len,
                           const Tensor* alibi, const Tensor& out, const Tensor* lse) {
  static const Tensor kNone;  // an absent optional tensor: skipped
  check_output_aliasing(
      {{out, "out"}, {lse ? *lse : kNone, "lse"}},
      {{q, "q"}, {k, "k"}, {v, "v"}, {k_len, "k_len"}, {alibi ? *alibi : kNone, "alibi"}});
}

// Stages 1-5 above. `lse` non-null asks for the log-sum-exp (its tensor may be undefined);
// `out` may be undefined.
inline void check_call(const AttentionContract& row, const Tensor& q, const Tensor& k,
                       const Tensor& v, const Tensor& k_len, const Tensor* alibi,
                       const DecodeAttentionOptions& options, const Tensor& out,
                       const Tensor* lse) {
  // 1. Ranks first, so the row's checks can name dims.
  check_rank(q, "q", kAttentionRank);
  check_rank(k, "k", kAttentionRank);
  check_rank(v, "v", kAttentionRank);
  const std::int64_t batch = q.size(0), num_qo_heads = q.size(1), q_len = q.size(2),
                     head_dim = q.size(3);
  const std::int64_t num_kv_heads = k.size(1);
  if (batch < 1 || num_qo_heads < 1 || q_len < 1 || head_dim < 1)
    fail<ShapeError>(
        "`q` must have shape [batch, num_qo_heads, q_len, head_dim] with every dim "
        ">= 1, got ",
        dims_str(q.shape()));

  // The row.
  if (!row.supports_dtype(q.dtype()))
    fail<DTypeError>("`q` must be ", dtype_list_str(row.dtypes), " for the ", row.backend,
                     " flash_decode kernel, got ", dtype_name(q.dtype()));
  if (!row.supports_head_dim(head_dim))
    fail<UnsupportedError>("`q` head_dim must be one of ", list_str(row.head_dims), " for the ",
                           row.backend, " flash_decode kernel, got ", head_dim);
  if (q_len > row.max_sq)
    fail<UnsupportedError>("`q` q_len must be <= ", row.max_sq, " for the ", row.backend,
                           " flash_decode kernel, got ", q_len);

  // 2. Shapes, dtypes, layouts.
  if (k.dtype() != q.dtype())
    fail<DTypeError>("`k` must have the dtype of `q` (", dtype_name(q.dtype()), "), got ",
                     dtype_name(k.dtype()));
  if (v.dtype() != q.dtype())
    fail<DTypeError>("`v` must have the dtype of `q` (", dtype_name(q.dtype()), "), got ",
                     dtype_name(v.dtype()));
  if (k.size(0) != batch || num_kv_heads < 1 || k.size(3) != head_dim)
    fail<ShapeError>("`k` must have shape [", batch, ", num_kv_heads >= 1, capacity, ", head_dim,
                     "] to match `q` ", dims_str(q.shape()), ", got ", dims_str(k.shape()));
  check_shape(v, "v", k.shape());
  if (num_qo_heads % num_kv_heads != 0)
    fail<ShapeError>("`q` num_qo_heads (", num_qo_heads,
                     ") must be a multiple of `k` num_kv_heads (", num_kv_heads, ")");
  const std::int64_t group = num_qo_heads / num_kv_heads;
  if (row.max_group > 0 && group > row.max_group)
    fail<UnsupportedError>("num_qo_heads / num_kv_heads must be <= ", row.max_group, " for the ",
                           row.backend, " flash_decode kernel, got ", group);
  check_unit_last_stride(q, "q");
  check_unit_last_stride(k, "k");
  check_unit_last_stride(v, "v");

  check_dtype(k_len, "k_len", {DType::i32});
  check_rank(k_len, "k_len", 1);
  if (k_len.size(0) != batch && k_len.size(0) != 1)
    fail<ShapeError>("`k_len` must have shape [", batch, "] (per sequence) or [1], got ",
                     dims_str(k_len.shape()));
  if (alibi) {
    check_dtype(*alibi, "alibi", {DType::f32});
    check_shape(*alibi, "alibi", {num_qo_heads});
    check_contiguous(*alibi, "alibi");
  }
  const Dims out_shape = {batch, num_qo_heads, q_len, head_dim};
  if (out.defined()) {
    if (out.dtype() != q.dtype())
      fail<DTypeError>("`out` must have the dtype of `q` (", dtype_name(q.dtype()), "), got ",
                       dtype_name(out.dtype()));
    check_shape(out, "out", out_shape);
    check_unit_last_stride(out, "out");
  }
  const Dims lse_shape = {batch, num_qo_heads, q_len};
  if (lse && lse->defined()) {
    check_dtype(*lse, "lse", {DType::f32});
    check_shape(*lse, "lse", lse_shape);
  }

  // 3. Options.
  if (!std::isfinite(options.softmax_scale))
    fail<ValueError>("`options.softmax_scale` must be finite (0 means 1/sqrt(head_dim)), got ",
                     options.softmax_scale);
  if (options.window_left && *options.window_left < 0)
    fail<ValueError>("`options.window_left` must be >= 0, got ", *options.window_left);
  if (options.window_right && *options.window_right < 0)
    fail<ValueError>("`options.window_right` must be >= 0, got ", *options.window_right);
  if (options.softcap && !(std::isfinite(*options.softcap) && *options.softcap > 0.0f))
    fail<ValueError>("`options.softcap` must be finite and > 0, got ", *options.softcap);
  if (options.num_splits < 0)
    fail<ValueError>("`options.num_splits` must be >= 0 (0 = planned), got ", options.num_splits);

  // 4. Features the call uses.
  if (options.causal && q_len > 1)
    require_feature(row, AttentionFeature::causal, "`options.causal` with q_len > 1");
  if (options.window_left)
    require_feature(row, AttentionFeature::window_left, "`options.window_left`");
  if (options.window_right)
    require_feature(row, AttentionFeature::window_right, "`options.window_right`");
  if (options.softcap) require_feature(row, AttentionFeature::softcap, "`options.softcap`");
  if (alibi) require_feature(row, AttentionFeature::alibi, "`alibi`");
  if (k_len.size(0) != 1)
    require_feature(row, AttentionFeature::per_seq_klen, "`k_len` of shape [batch]");
  if (lse) require_feature(row, AttentionFeature::lse, "`lse`");

  // 5. Aliasing.
  check_aliasing(q, k, v, k_len, alibi, out, lse);
}

}  // namespace splice::flash_decode_checks
