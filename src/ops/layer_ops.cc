// The public fused layer ops (see splice/ops/layer_ops.h): device and contract checks, then the
// backend kernel.
//
//  1. Devices: every tensor on the first input's device; a CUDA tensor in a build without the
//     CUDA backend is a DeviceError.
//  2. Contract row of that device: the op is listed, the activation dtype is listed, the row
//     length is within max_row (0 = any). A refusal is an UnsupportedError naming the row.
//     rms_norm_matmul_rope_kv_append also checks the row's qkv_rope_* limits.
//  3. Dispatch: cpu::rms_norm / silu_mul / rope / matmul_add / rms_norm_matmul /
//     silu_mul_matmul_add / rope_kv_append / rms_norm_matmul_rope_kv_append /
//     rms_norm_matmul_swiglu or their cuda::
//     launchers (matmul_add on CUDA: the op's operand checks, layer_op_checks::check_matmul_add,
//     then cuda::matmul with the residual epilogue, MatmulOptions; the two prologue products:
//     cuda layer_ops.h).
#include "splice/ops/layer_ops.h"

#include <initializer_list>
#include <string>
#include <vector>

#include "backend/layer_op_checks.h"
#include "splice/backend/cpu/layer_ops.h"
#include "splice/core/error.h"

#if defined(SPLICE_WITH_CUDA)
#include "splice/backend/cuda/layer_ops.h"
#include "splice/backend/cuda/primitives.h"
#include "splice/backend/cuda/rope_kv_append.h"
#endif

namespace splice {
namespace {

// cuda::kQkvRopeMaxK, the 16-bit vector width and cuda::kQkvRopeMaxBatch (spelled here too: this
// table is compiled without the CUDA backend; tests/cuda checks they agree).
constexpr std::int64_t kCudaQkvRopeMaxK = 2048;
constexpr std::int64_t kCudaQkvRopeKMultiple = 8;
constexpr std::int64_t kCudaQkvRopeMaxBatch = 8;
const std::vector<DType> kFloatDtypes = {DType::bf16, DType::f16, DType::f32};
const std::vector<LayerOpKind> kAllLayerOps = {LayerOpKind::rms_norm,
                                               LayerOpKind::silu_mul,
                                               LayerOpKind::rope,
                                               LayerOpKind::matmul_add,
                                               LayerOpKind::rms_norm_matmul,
                                               LayerOpKind::silu_mul_matmul_add,
                                               LayerOpKind::rope_kv_append,
                                               LayerOpKind::rms_norm_matmul_rope_kv_append,
                                               LayerOpKind::rms_norm_matmul_swiglu};

// The device op runs on: its first argument's. Every argument must be defined and on it; they
// are checked in the order given, so the first bad one is the one an error names.
struct NamedTensor {
  const char* name;
  const Tensor& tensor;
};
Device common_device(const char* op, std::initializer_list<NamedTensor> args) {
  const NamedTensor& first = *args.begin();
  check_defined(first.tensor, first.name);
  const Device device = first.tensor.device();
  for (const NamedTensor& a : args) {
    check_defined(a.tensor, a.name);
    if (!(a.tensor.device() == device))
      fail<DeviceError>(op, ": `", a.name, "` must be on the device of `", first.name, "` (",
                        device.str(), "), got ", a.tensor.device().str());
  }
  return device;
}

const LayerOpContract& contract_for(const Device& device, const char* op) {
  if (device.is_cpu()) return cpu_layer_ops_contract();
#if defined(SPLICE_WITH_CUDA)
  if (device.is_cuda()) return cuda_layer_ops_contract();
#endif
  fail<DeviceError>(op, ": no kernel for ", device.str(), " in this build");
}

// `activation` names the argument whose dtype is the op's activation dtype (x, a or qkv).
void check_contract(const LayerOpContract& row, LayerOpKind kind, const char* activation,
                    DType dtype, std::int64_t row_length) {
  const char* op = layer_op_name(kind);
  if (!row.supports(kind))
    fail<UnsupportedError>(op, ": the ", row.backend, " kernel '", row.kernel, "' (revision ",
                           row.revision, ") does not implement ", op);
  if (!row.supports_dtype(dtype)) {
    std::string allowed;
    for (DType d : row.dtypes) {
      if (!allowed.empty()) allowed += ", ";
      allowed += dtype_name(d);
    }
    fail<UnsupportedError>(op, ": `", activation, "` must be ", allowed, " for the ", row.backend,
                           " kernel '", row.kernel, "', got ", dtype_name(dtype));
  }
  if (row.max_row > 0 && row_length > row.max_row)
    fail<UnsupportedError>(op, ": the ", row.backend, " kernel '", row.kernel,
                           "' takes rows of at most ", row.max_row, " elements, got ", row_length);
}

std::int64_t last_dim(const Tensor& t) { return t.dim() > 0 ? t.size(-1) : 1; }

}  // namespace

void fused_rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  const char* op = "rms_norm";
  const Device device = common_device(op, {{"x", x}, {"weight", weight}, {"out", out}});
  check_contract(contract_for(device, op), LayerOpKind::rms_norm, "x", x.dtype(), last_dim(x));
#if defined(SPLICE_WITH_CUDA)
  if (device.is_cuda()) return cuda::rms_norm(x, weight, eps, out);
#endif
  cpu::rms_norm(x, weight, eps, out);
}

void fused_silu_mul(const Tensor& a, const Tensor& b, Tensor& out) {
  const char* op = "silu_mul";
  const Device device = common_device(op, {{"a", a}, {"b", b}, {"out", out}});
  check_contract(contract_for(device, op), LayerOpKind::silu_mul, "a", a.dtype(), last_dim(a));
#if defined(SPLICE_WITH_CUDA)
  if (device.is_cuda()) return cuda::silu_mul(a, b, out);
#endif
  cpu::silu_mul(a, b, out);
}

void fused_rope(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& position,
                Tensor& out) {
  const char* op = "rope";
  const Device device = common_device(
      op, {{"x", x}, {"cos", cos}, {"sin", sin}, {"position", position}, {"out", out}});
  check_contract(contract_for(device, op), LayerOpKind::rope, "x", x.dtype(), last_dim(x));
#if defined(SPLICE_WITH_CUDA)
  if (device.is_cuda()) return cuda::rope(x, cos, sin, position, out);
#endif
  cpu::rope(x, cos, sin, position, out);
}

void fused_rope_kv_append(const Tensor& qkv, const Tensor& cos, const Tensor& sin,
                          const Tensor& position, Tensor& k_cache, Tensor& v_cache, Tensor& out,
                          bool position_stable, bool trigger_dependents_first) {
  const char* op = "rope_kv_append";
  const Device device = common_device(op, {{"qkv", qkv},
                                           {"cos", cos},
                                           {"sin", sin},
                                           {"position", position},
                                           {"k_cache", k_cache},
                                           {"v_cache", v_cache},
                                           {"out", out}});
  check_contract(contract_for(device, op), LayerOpKind::rope_kv_append, "qkv", qkv.dtype(),
                 last_dim(out));
#if defined(SPLICE_WITH_CUDA)
  if (device.is_cuda())
    return cuda::rope_kv_append(qkv, cos, sin, position, k_cache, v_cache, out, position_stable,
                                trigger_dependents_first);
#endif
  (void)position_stable;  // a CPU kernel has no launch ordering to relax
  (void)trigger_dependents_first;
  cpu::rope_kv_append(qkv, cos, sin, position, k_cache, v_cache, out);
}

void fused_rms_norm_matmul_rope_kv_append(const Tensor& x, const Tensor& norm_weight, float eps,
                                          const Tensor& w, const Tensor& cos, const Tensor& sin,
                                          const Tensor& position, Tensor& k_cache, Tensor& v_cache,
                                          Tensor& out, bool w_constant, bool position_stable,
                                          bool trigger_dependents_first) {
  const char* op = "rms_norm_matmul_rope_kv_append";
  const Device device = common_device(op, {{"x", x},
                                           {"norm_weight", norm_weight},
                                           {"w", w},
                                           {"cos", cos},
                                           {"sin", sin},
                                           {"position", position},
                                           {"k_cache", k_cache},
                                           {"v_cache", v_cache},
                                           {"out", out}});
  const LayerOpContract& row = contract_for(device, op);
  check_contract(row, LayerOpKind::rms_norm_matmul_rope_kv_append, "x", x.dtype(), last_dim(x));
  // The row's qkv_rope limits, on the shapes as given (the backend checks them in full); an odd
  // head dim is no backend's (rotate-half pairs), so a shape error first.
  const std::int64_t head_dim = k_cache.dim() == 4 ? k_cache.size(3) : 0;
  if (head_dim % 2 != 0)
    fail<ShapeError>(op, ": `k_cache`'s head_dim D must be even (rotate-half RoPE), got ",
                     dims_str(k_cache.shape()));
  const std::int64_t batch = x.dim() > 0 ? x.size(0) : 0;
  if (const std::string why = row.qkv_rope_gate(x.dtype(), norm_weight.dtype(), w.dtype(),
                                                k_cache.dtype(), head_dim, last_dim(x), batch);
      !why.empty())
    fail<UnsupportedError>(op, ": the ", row.backend, " kernel '", row.kernel, "' (revision ",
                           row.revision, ") ", why);
#if defined(SPLICE_WITH_CUDA)
  if (device.is_cuda())
    return cuda::rms_norm_matmul_rope_kv_append(x, norm_weight, eps, w, cos, sin, position, k_cache,
                                                v_cache, out, w_constant, position_stable,
                                                trigger_dependents_first);
#endif
  (void)w_constant;  // a CPU kernel has no launch ordering to relax
  (void)position_stable;
  (void)trigger_dependents_first;
  cpu::rms_norm_matmul_rope_kv_append(x, norm_weight, eps, w, cos, sin, position, k_cache, v_cache,
                                      out);
}

void fused_matmul_add(const Tensor& a, const Tensor& b, const Tensor& c, Tensor& out,
                      bool b_constant) {
  const char* op = "matmul_add";
  const Device device = common_device(op, {{"a", a}, {"b", b}, {"c", c}, {"out", out}});
  check_contract(contract_for(device, op), LayerOpKind::matmul_add, "a", a.dtype(), last_dim(a));
  // A c that broadcasts to the product a @ b^T (a bias [N], a column [..., M, 1], a scalar) is
  // read through a stride-0 view of the product's shape; a wrong `out` is the backend's error.
  Tensor residual = c;
  if (a.dim() >= 2 && b.dim() == 2) {
    Dims product = a.shape();
    product.back() = b.size(0);
    if (c.shape() != product) {
      try {
        residual = c.expand(product);
      } catch (const ShapeError&) {
        fail<ShapeError>(op, ": `c` ", dims_str(c.shape()), " does not broadcast to the product ",
                         dims_str(product), " of `a` ", dims_str(a.shape()), " and `b` ",
                         dims_str(b.shape()));
      }
    }
  }
#if defined(SPLICE_WITH_CUDA)
  if (device.is_cuda()) {
    // The op's operand rules under its own names (cuda::matmul names c `residual` and is more
    // permissive: strided rows, mixed dtypes).
    layer_op_checks::check_matmul_add(a, b, residual, out, op);
    cuda::MatmulOptions options;
    options.b_constant = b_constant;
    options.residual = &residual;
    return cuda::matmul(a, b, out, /*transpose_b=*/true, options);
  }
#endif
  (void)b_constant;  // a CPU kernel has no launch ordering to relax
  cpu::matmul_add(a, b, residual, out);
}

void fused_rms_norm_matmul(const Tensor& x, const Tensor& weight, float eps, const Tensor& w,
                           Tensor& out, bool w_constant) {
  const char* op = "rms_norm_matmul";
  const Device device = common_device(op, {{"x", x}, {"weight", weight}, {"w", w}, {"out", out}});
  check_contract(contract_for(device, op), LayerOpKind::rms_norm_matmul, "x", x.dtype(),
                 last_dim(x));
#if defined(SPLICE_WITH_CUDA)
  if (device.is_cuda()) return cuda::rms_norm_matmul(x, weight, eps, w, out, w_constant);
#endif
  (void)w_constant;  // a CPU kernel has no launch ordering to relax
  cpu::rms_norm_matmul(x, weight, eps, w, out);
}

void fused_rms_norm_matmul_swiglu(const Tensor& x, const Tensor& norm_weight, float eps,
                                  const Tensor& w, Tensor& out, bool w_constant) {
  const char* op = "rms_norm_matmul_swiglu";
  const Device device =
      common_device(op, {{"x", x}, {"norm_weight", norm_weight}, {"w", w}, {"out", out}});
  check_contract(contract_for(device, op), LayerOpKind::rms_norm_matmul_swiglu, "x", x.dtype(),
                 last_dim(x));
#if defined(SPLICE_WITH_CUDA)
  if (device.is_cuda())
    return cuda::rms_norm_matmul_swiglu(x, norm_weight, eps, w, out, w_constant);
#endif
  (void)w_constant;  // a CPU kernel has no launch ordering to relax
  cpu::rms_norm_matmul_swiglu(x, norm_weight, eps, w, out);
}

void fused_silu_mul_matmul_add(const Tensor& a, const Tensor& b, const Tensor& w, const Tensor& c,
                               Tensor& out, bool w_constant) {
  const char* op = "silu_mul_matmul_add";
  const Device device = common_device(op, {{"a", a}, {"b", b}, {"w", w}, {"c", c}, {"out", out}});
  check_contract(contract_for(device, op), LayerOpKind::silu_mul_matmul_add, "a", a.dtype(),
                 last_dim(a));
#if defined(SPLICE_WITH_CUDA)
  if (device.is_cuda()) return cuda::silu_mul_matmul_add(a, b, w, c, out, w_constant);
#endif
  (void)w_constant;
  cpu::silu_mul_matmul_add(a, b, w, c, out);
}

const LayerOpContract& cpu_layer_ops_contract() {
  static const LayerOpContract row{"layer_ops",  "cpu",        "cpu-layer-ops-1",
                                   kAllLayerOps, kFloatDtypes, 0};
  return row;
}

// rms_norm_matmul_rope_kv_append's limits on CUDA (cuda::rms_norm_matmul_rope_kv_append): up to
// cuda::kQkvRopeMaxBatch decode rows (the multi-row GEMV's bucket; one launch where it takes the
// product, else the two-kernel chain), 16-bit activations, K in whole 16-byte vectors of at most
// cuda::kQkvRopeMaxK (the register prologue's row: every warp holds the normalized row), any
// even head_dim.
const LayerOpContract& cuda_layer_ops_contract() {
  static const LayerOpContract row = [] {
    LayerOpContract r{"layer_ops", "cuda", "cuda-layer-ops-1", kAllLayerOps, kFloatDtypes, 0};
    r.qkv_rope_dtypes = {DType::bf16, DType::f16};
    r.qkv_rope_max_k = kCudaQkvRopeMaxK;
    r.qkv_rope_max_batch = kCudaQkvRopeMaxBatch;
    r.qkv_rope_k_multiple = kCudaQkvRopeKMultiple;
    r.qkv_rope_one_dtype = true;
    return r;
  }();
  return row;
}

}  // namespace splice
