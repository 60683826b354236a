// The public flash-decode attention op (spec decode_attention.md §5): argument validation against
// the backend's contract row, output allocation and device dispatch.
//
//  1. Presence and devices: q, k, v, k_len are required; every given tensor (alibi, out, lse too)
//     must sit on q's device, and that device's backend must be compiled in.
//  2. Contract row of q's device (cpu_flash_decode_contract / cuda_flash_decode_contract): dtype,
//     head_dim, q_len <= max_sq, group size <= max_group, and every feature the call uses.
//  3. Shapes, dtypes and layouts: q [B, Hq, Sq, D]; k, v [B, Hkv, capacity, D] of q's dtype with
//     Hq % Hkv == 0; k_len int32 [B] or [1]; alibi f32 [Hq]; out [B, Hq, Sq, D] of q's dtype;
//     lse f32 [B, Hq, Sq]; q/k/v/out have a unit last stride (other strides are free); out and
//     lse share no memory with an input or each other (flash_decode_checks.h).
//  4. Options: windows >= 0, softcap > 0 and finite, softmax_scale finite, num_splits >= 0.
//  5. Value contract 0 <= k_len[b] <= capacity: always on the CPU; on CUDA only with
//     options.validate (it reads k_len back, a device sync).
//  6. Allocate out / lse when undefined and dispatch to cpu::flash_decode or cuda::flash_decode.
// Every refusal is a typed error naming the argument, the value seen and what is allowed.
#include "splice/ops/decode_attention.h"

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "backend/flash_decode_checks.h"
#include "splice/backend/cpu/flash_decode.h"
#include "splice/core/error.h"

// The CUDA launcher's header lands separately; until it exists a CUDA build refuses CUDA tensors.
#if defined(SPLICE_WITH_CUDA) && __has_include("splice/backend/cuda/flash_decode.h")
#include "splice/backend/cuda/flash_decode.h"
#define SPLICE_FD_CUDA 1
#else
#define SPLICE_FD_CUDA 0
#endif

namespace splice {

namespace {

constexpr std::int64_t kAttentionRank = 4;  // [batch, heads, length, head_dim]

const std::vector<AttentionFeature> kAllAttentionFeatures = {
    AttentionFeature::causal,  AttentionFeature::window_left, AttentionFeature::window_right,
    AttentionFeature::softcap, AttentionFeature::alibi,       AttentionFeature::per_seq_klen,
    AttentionFeature::lse};

template <typename T>
std::string list_str(const std::vector<T>& values) {
  std::ostringstream out;
  out << "{";
  for (std::size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << values[i];
  out << "}";
  return out.str();
}

std::string dtype_list_str(const std::vector<DType>& dtypes) {
  std::string out;
  for (DType d : dtypes) out += std::string(out.empty() ? "" : " or ") + dtype_name(d);
  return out;
}

void check_same_device(const Tensor& t, const char* name, const Device& device) {
  if (!(t.device() == device))
    fail<DeviceError>("`", name, "` must be on ", device.str(), " (the device of `q`), got ",
                      t.device().str());
}

void check_unit_last_stride(const Tensor& t, const char* name) {
  if (t.dim() > 0 && t.size(-1) > 1 && t.stride(-1) != 1)
    fail<LayoutError>("`", name, "` must have a unit stride on its last axis, got strides ",
                      dims_str(t.strides()), " for shape ", dims_str(t.shape()));
}

void require_feature(const AttentionContract& row, AttentionFeature f, const std::string& why) {
  if (!row.supports(f))
    fail<UnsupportedError>("decode_attention: the ", row.backend, " kernel '", row.kernel,
                           "' (revision ", row.revision, ") does not support ",
                           attention_feature_name(f), ", which ", why, " asks for");
}

// Stage 5: 0 <= k_len[b] <= capacity, k_len read on the host.
void check_k_len_values(const Tensor& k_len_host, std::int64_t capacity) {
  const std::int32_t* data = k_len_host.data<std::int32_t>();
  for (std::int64_t b = 0; b < k_len_host.size(0); ++b) {
    const std::int64_t len = data[b * k_len_host.stride(0)];
    if (len < 0 || len > capacity)
      fail<ValueError>("`k_len[", b, "]` must be in [0, ", capacity,
                       "] (the capacity of `k`), got ", len);
  }
}

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

Tensor decode_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_len,
                        const Tensor* alibi, const DecodeAttentionOptions& options, Tensor out,
                        Tensor* lse) {
  // Stage 1: presence and devices.
  check_defined(q, "q");
  check_defined(k, "k");
  check_defined(v, "v");
  check_defined(k_len, "k_len");
  if (alibi) check_defined(*alibi, "alibi");
  const Device device = q.device();
  check_same_device(k, "k", device);
  check_same_device(v, "v", device);
  check_same_device(k_len, "k_len", device);
  if (alibi) check_same_device(*alibi, "alibi", device);
  if (out.defined()) check_same_device(out, "out", device);
  if (lse && lse->defined()) check_same_device(*lse, "lse", device);
#if !SPLICE_FD_CUDA
  if (device.is_cuda())
    fail<DeviceError>("decode_attention: `q` is on ", device.str(),
                      " but this build has no CUDA backend (allowed: cpu)");
#endif
  const AttentionContract& row =
      device.is_cuda() ? cuda_flash_decode_contract() : cpu_flash_decode_contract();

  // Stage 3 (ranks first, so the contract checks below can name dims).
  check_rank(q, "q", kAttentionRank);
  check_rank(k, "k", kAttentionRank);
  check_rank(v, "v", kAttentionRank);
  const std::int64_t batch = q.size(0), num_qo_heads = q.size(1), q_len = q.size(2),
                     head_dim = q.size(3);
  const std::int64_t num_kv_heads = k.size(1), capacity = k.size(2);
  if (batch < 1 || num_qo_heads < 1 || q_len < 1 || head_dim < 1)
    fail<ShapeError>(
        "`q` must have shape [batch, num_qo_heads, q_len, head_dim] with every dim "
        ">= 1, got ",
        dims_str(q.shape()));

  // Stage 2: the contract row.
  if (!row.supports_dtype(q.dtype()))
    fail<DTypeError>("`q` must be ", dtype_list_str(row.dtypes), " for the ", row.backend,
                     " flash_decode kernel, got ", dtype_name(q.dtype()));
  if (!row.supports_head_dim(head_dim))
    fail<UnsupportedError>("`q` head_dim must be one of ", list_str(row.head_dims), " for the ",
                           row.backend, " flash_decode kernel, got ", head_dim);
  if (q_len > row.max_sq)
    fail<UnsupportedError>("`q` q_len must be <= ", row.max_sq, " for the ", row.backend,
                           " flash_decode kernel, got ", q_len);

  // Stage 3: shapes, dtypes, layouts.
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
  flash_decode_checks::check_aliasing(q, k, v, k_len, alibi, out, lse);  // out may be undefined

  // Stage 4: options.
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

  // Stage 2 (features the call uses).
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

  // Stage 5: value contract.
  if (device.is_cpu()) {
    check_k_len_values(k_len, capacity);
  } else if (options.validate) {
    check_k_len_values(k_len.to_device(Device::cpu()), capacity);
  }

  // Stage 6: allocate and dispatch.
  if (!out.defined()) out = Tensor::empty(out_shape, q.dtype(), device);
  if (lse && !lse->defined()) *lse = Tensor::empty(lse_shape, DType::f32, device);
  if (device.is_cpu()) {
    cpu::flash_decode(q, k, v, k_len, alibi, options, out, lse);
    return out;
  }
#if SPLICE_FD_CUDA
  cuda::flash_decode(q, k, v, k_len, alibi, options, out, lse);
  return out;
#else
  fail<DeviceError>("decode_attention: no backend for ", device.str(), " in this build");
#endif
}

}  // namespace splice
