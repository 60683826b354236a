// splice/ops/contract.h: kernel contracts, the one table per fused kernel and backend.
//
// A contract row says what a fused kernel accepts: dtypes, head dims, the largest query length,
// and which optional features it implements. The same row drives (1) the optimizer's gate (an arm
// is offered only when the row supports every feature the spec uses, else the decline reason
// names the missing feature), (2) the verifier's inputs and tolerance, and (3) the launcher's
// argument checks and error messages, so the three cannot drift apart.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "splice/core/dtype.h"
#include "splice/core/tensor.h"
#include "splice/core/tolerance.h"

namespace splice {

// Optional features a fused attention kernel may implement.
enum class AttentionFeature : std::uint8_t {
  causal,        // causal masking for Sq > 1 (Sq == 1 needs none)
  window_left,   // sliding window bound to the left of the query position
  window_right,  // window bound to the right
  softcap,       // s = cap * tanh(s / cap)
  alibi,         // s += -slope[h] * (p_i - j)
  per_seq_klen,  // k_len as [B] int32 (ragged batch) instead of one scalar
  lse,           // optional fp32 log-sum-exp output
};
const char* attention_feature_name(AttentionFeature f);

struct AttentionContract {
  std::string kernel;                   // "flash_decode"
  std::string backend;                  // "cpu" or "cuda"
  std::string revision;                 // bumped whenever the kernel's numerics change
  std::vector<DType> dtypes;            // q/k/v/o dtypes (all one dtype)
  std::vector<std::int64_t> head_dims;  // supported D
  std::int64_t max_sq = 1;              // largest query length per call
  std::int64_t max_group = 0;           // largest Hq/Hkv (0 = any)
  std::vector<AttentionFeature> features;
  // The verifier's bound on the fused arm's output against the oracle, for every dtype; none: the
  // policy default for the output's dtype (tolerance.h).
  std::optional<Tolerance> verify_tolerance;
  bool supports(AttentionFeature f) const;
  bool supports_dtype(DType d) const;
  bool supports_head_dim(std::int64_t d) const;
  // Verification tolerance for outputs in `dtype`: verify_tolerance, else the policy default.
  // The offer records it in the branch's recipe, so arm selection checks the row's bound.
  Tolerance tolerance(DType dtype) const;
};

// The seed's capacity-K kernel as a contract row: no ALiBi, no windows, no softcap, Sq == 1.
AttentionContract seed_capacity_k_contract();

// The contract rows of the flash-decode kernel on each backend (src/core/contract.cc): the gate,
// the verifier and the argument checks of the op and of the CUDA launcher all read them.
const AttentionContract& cpu_flash_decode_contract();
const AttentionContract& cuda_flash_decode_contract();

// Contracts for the fused KDA decode kernel (spec kda_decode.md §4).
struct KdaContract {
  std::string kernel;  // "kda_decode"
  std::string backend;
  std::string revision;
  std::vector<DType> state_dtypes;      // f32, bf16
  std::vector<std::int64_t> head_dims;  // 128
  std::int64_t max_t = 0;               // 0 = any T the device can hold
  bool softplus_gate_any_t = true;      // lower_bound = none for T > 1 [beyond]
  Tolerance output_tolerance;           // against the float64 reference / the oracle
  Tolerance state_tolerance;
};

// The fused layer ops (passes/layer_ops.h): one contract row per backend lists the ops it
// implements and the activation dtypes it takes.
enum class LayerOpKind : std::uint8_t {
  rms_norm,         // y = x * rsqrt(mean(x^2, -1) + eps) * weight
  silu_mul,         // y = silu(a) * b (SwiGLU's activation)
  rope,             // rotate-half RoPE of x at a position read from a [1] i32 tensor
  matmul_add,       // y = a @ b^T + c: a linear layer plus its residual (fp32 sum, one rounding)
  rms_norm_matmul,  // y = round(rms_norm(x)) @ w^T: a norm and the projection it feeds
  silu_mul_matmul_add,  // y = round(silu(a) * b) @ w^T + c: SwiGLU's activation, down_proj and
                        // the residual
  rope_kv_append,       // rope of the q|k heads, k and v written into the KV caches at the
                        // position (Op::RopeKvAppend)
  rms_norm_matmul_rope_kv_append,  // rms_norm_matmul into the q|k|v row, then rope_kv_append
                                   // on it (Op::RmsNormMatMulRopeKvAppend): one GEMV whose
                                   // epilogue applies RoPE and writes the KV caches
  rms_norm_matmul_swiglu,  // rms_norm_matmul into the gate|up row, then silu(gate) * up on its
                           // halves (Op::RmsNormMatMulSwiglu): one GEMV whose epilogue applies
                           // SwiGLU's activation
};
const char* layer_op_name(LayerOpKind kind);

struct LayerOpContract {
  std::string kernel;            // "layer_ops"
  std::string backend;           // "cpu" or "cuda"
  std::string revision;          // bumped whenever a kernel's numerics change
  std::vector<LayerOpKind> ops;  // implemented ops
  std::vector<DType> dtypes;     // activation (x / a / b / out) dtypes
  std::int64_t max_row = 0;      // largest last-axis length (0 = any)
  // rms_norm_matmul_rope_kv_append only (its CUDA kernel is a register-prologue GEMV with a RoPE
  // epilogue, narrower than the other ops): the activation dtypes it takes (empty: `dtypes`), the
  // head dims (empty: any even D), the largest K (0: any), the largest batch B (0: any), and
  // what K must be a multiple of.
  std::vector<DType> qkv_rope_dtypes = {};
  std::vector<std::int64_t> qkv_rope_head_dims = {};
  std::int64_t qkv_rope_max_k = 0;
  std::int64_t qkv_rope_max_batch = 0;
  std::int64_t qkv_rope_k_multiple = 1;  // K a multiple of this (whole 16-byte vectors)
  bool qkv_rope_one_dtype = false;       // x, norm_weight, w and the caches of one dtype
  bool supports(LayerOpKind kind) const;
  bool supports_dtype(DType d) const;
  // Empty when rms_norm_matmul_rope_kv_append's limits above take x's, norm_weight's, w's and
  // the caches' dtypes, head dim `head_dim`, row length `k` and batch `batch` (the largest the
  // shapes allow), else what is missing, for a gate's decline reason or the public entry's
  // UnsupportedError.
  std::string qkv_rope_gate(DType x, DType norm_weight, DType w, DType caches,
                            std::int64_t head_dim, std::int64_t k, std::int64_t batch) const;
  // Verification tolerance for outputs in `dtype` (the policy default: each op rounds once to
  // the storage dtype after fp32 math, silu_mul twice exactly as its primitive region does).
  Tolerance tolerance(DType dtype) const;
};

}  // namespace splice
