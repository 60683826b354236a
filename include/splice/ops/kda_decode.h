// splice/ops/kda_decode.h: the fused Kimi-Delta-Attention decode op (spec kda_decode.md).
//
// Two entry points, call-compatible with FlashInfer's `fused_kda_decode` (plain T = 1: one slot per
// row) and `packed_fused_kda_decode` (packed ragged rows, T >= 1 verify tokens per sequence,
// per-token state checkpoints, a rolling conv window of length T + 2). Both validate every
// argument on the host (spec §4), build one `KdaDecodeArgs`, and dispatch it to the backend of the
// tensors' device (`splice::cpu::kda_decode` / `splice::cuda::kda_decode`).
//
// Stages of a call:
//   1. Structural validation (dtypes, shapes, strides, devices, scalars): typed errors naming the
//      argument, the value seen and the allowed set.
//   2. Value contracts (spec §4: qsl[0] == 0, non-decreasing, L <= T, qsl[N] <= R, accepted counts
//      in [1, T], live slots < num_slots, no cross-sequence slot aliasing): always on the CPU, and
//      on CUDA only when `options.validate` is set (it copies the metadata to the host). They are
//      checked before anything is written, so a failing call leaves conv_state and state as they
//      were.
//   3. Dispatch by device. The plain form is the packed T = 1 form with per-row slots (mode
//      `plain`, handled exactly like mode `t1`), so the two agree bit for bit.
#pragma once

#include <cstdint>
#include <optional>

#include "splice/core/dtype.h"
#include "splice/core/tensor.h"
#include "splice/ops/contract.h"

namespace splice {

// Head dim (K = V) and causal-conv width of the KDA layer; the only values the kernels support.
inline constexpr std::int64_t kKdaHeadDim = 128;
inline constexpr std::int64_t kKdaConvWidth = 4;
// Number of projection blocks packed in x (q, k, v).
inline constexpr std::int64_t kKdaNumProjections = 3;
// Epsilon added to the sum of squares in the q/k L2 norm (spec §2(b)).
inline constexpr float kKdaL2NormEps = 1e-6f;
// softplus(z) = z above this threshold (spec §2(c)).
inline constexpr float kKdaSoftplusThreshold = 20.0f;

struct KdaDecodeOptions {
  // Gate mode (spec §2(c)): a finite negative bound selects g = lb * sigmoid(a z); none selects
  // g = -a * softplus(z). Both are allowed for every T.
  std::optional<float> lower_bound = -5.0f;
  // RMSNorm epsilon of the gated output norm; finite and >= 0.
  float norm_eps = 1e-5f;
  // CUDA: also check the value contracts on the host (copies metadata back; syncs). The CPU
  // backend always checks them.
  bool validate = false;
  // CUDA: the caller's promise of KdaDecodeArgs::stable_state (no kernel still in flight on the
  // stream writes the slot tables, query_start_loc, num_accepted_tokens or a source state slot;
  // a session sets it where its graph shows that, NodeHints::stable_kda_state). Ignored on the
  // CPU; never changes a result.
  bool stable_state = false;
};

// How rows find their cache slots.
enum class KdaMode : std::uint8_t {
  plain,   // fused_kda_decode: row r uses slot row_slots[r] (<= 0: null row); T = 1
  packed,  // packed_fused_kda_decode: sequences from query_start_loc / num_accepted_tokens
  t1,      // packed, T = 1, with t1_state_indices: row r uses slot row_slots[r]; qsl not read
};

// The validated arguments both backends consume. Tensor members are views of the caller's tensors
// (no copies), normalized to the ranks below; sizes are derived once here.
// Layout guarantees after validation (the backends rely on these and nothing more):
//   x            [R, 3C] bf16, stride(1) == 1, stride(0) >= 3C (row stride may be padded)
//   weight       [3, 4, C] f32 contiguous
//   conv_state   [num_slots, 3C, hist_len] bf16, strides [slot_stride, 1, 3C],
//                slot_stride >= 3C * hist_len (or any when num_slots == 1)
//   raw_gate     [R, H, D] bf16, stride(2) == 1 (row and head strides free)
//   raw_beta     [R, H] bf16, any strides
//   A_log        [H] f32, stride 1;  dt_bias [C] f32, stride 1;  norm_weight [D] f32, stride 1
//   state        [num_slots, H, D, D] f32 or bf16, strides [slot_stride, D*D, D, 1],
//                slot_stride >= H*D*D (or any when num_slots == 1)
//   output_gate  [R, H, D] bf16, stride(2) == 1 (row and head strides free)
//   output       [R, H, D] bf16 contiguous (a view of the returned [1, R, H, D] tensor)
//   state_indices        packed/t1: [N, T] int32 contiguous; plain: [R] int32 contiguous
//   query_start_loc      packed/t1: [N + 1] int32 contiguous; plain: undefined
//   num_accepted_tokens  packed/t1: [N] int32 contiguous;     plain: undefined
//   row_slots            plain: == state_indices [R]; t1: t1_state_indices [R]; packed: undefined
struct KdaDecodeArgs {
  Tensor x;                    // [R, 3C] bf16
  Tensor weight;               // [3, 4, C] f32
  Tensor conv_state;           // [num_slots, 3C, hist_len] bf16
  Tensor raw_gate;             // [R, H, D] bf16
  Tensor raw_beta;             // [R, H] bf16
  Tensor A_log;                // [H] f32
  Tensor dt_bias;              // [C] f32
  Tensor state_indices;        // [N, T] int32 (plain: [R])
  Tensor state;                // [num_slots, H, D, D] f32 | bf16
  Tensor output_gate;          // [R, H, D] bf16
  Tensor norm_weight;          // [D] f32
  Tensor output;               // [R, H, D] bf16 contiguous
  Tensor query_start_loc;      // [N + 1] int32 (undefined in plain mode)
  Tensor num_accepted_tokens;  // [N] int32 (undefined in plain mode)
  Tensor row_slots;            // [R] int32 (plain and t1 modes only)

  KdaMode mode = KdaMode::packed;
  std::int64_t num_rows = 0;            // R
  std::int64_t num_heads = 0;           // H
  std::int64_t head_dim = kKdaHeadDim;  // D
  std::int64_t channels = 0;            // C = H * D (one projection block)
  std::int64_t num_seqs = 0;            // N (plain: R)
  std::int64_t max_t = 1;               // T (plain: 1)
  std::int64_t hist_len = 3;            // conv history positions = T + 2
  std::int64_t num_slots = 0;
  DType state_dtype = DType::f32;
  std::optional<float> lower_bound;  // none = softplus gate
  float norm_eps = 1e-5f;
  bool validate = false;
  // CUDA: the caller's promise that no kernel still in flight on the launch stream writes
  // query_start_loc, num_accepted_tokens, the slot tables or a source state slot (a decode step
  // whose per-token scalars the host wrote before the step, and whose only writer of the state is
  // this call: the previous token's call has completed). The per-head kernels then read those
  // before their programmatic-dependent-launch wait, beside the predecessor's tail; the results
  // are bitwise the same. Ignored on the CPU.
  bool stable_state = false;
};

// Packed T >= 1 decode (spec §1, §3). `output` is the caller's [1, R, H, D] bf16 contiguous buffer
// (allocated on x's device when undefined) and is returned. conv_state and state are updated in
// place. `t1_state_indices` ([R] int32) is allowed only when T == 1.
Tensor packed_fused_kda_decode(const Tensor& x,              // [R, 3C] bf16
                               const Tensor& weight,         // [3, 4, C] f32
                               Tensor& conv_state,           // [slots, 3C, T+2] bf16
                               const Tensor& raw_gate,       // [1, R, H, D] bf16
                               const Tensor& raw_beta,       // [1, R, H] bf16
                               const Tensor& A_log,          // [H] f32
                               const Tensor& dt_bias,        // [C] f32
                               const Tensor& state_indices,  // [N, T] int32
                               Tensor& state,                // [slots, H, D, D] f32 | bf16
                               const Tensor& output_gate,    // [R, H, D] or [1, R, H, D] bf16
                               const Tensor& norm_weight,    // [D] f32
                               const KdaDecodeOptions& options,
                               Tensor output,                      // [1, R, H, D] bf16 or {}
                               const Tensor& query_start_loc,      // [N + 1] int32
                               const Tensor& num_accepted_tokens,  // [N] int32
                               const Tensor* t1_state_indices = nullptr);  // [R] int32

// Plain T = 1 decode: row r uses slot state_indices[r] (<= 0: null row, zero output, no cache
// touched); conv_state is [slots, 3C, 3]. Bit-identical to the packed T = 1 path.
Tensor fused_kda_decode(const Tensor& x,              // [R, 3C] bf16
                        const Tensor& weight,         // [3, 4, C] f32
                        Tensor& conv_state,           // [slots, 3C, 3] bf16
                        const Tensor& raw_gate,       // [1, R, H, D] bf16
                        const Tensor& raw_beta,       // [1, R, H] bf16
                        const Tensor& A_log,          // [H] f32
                        const Tensor& dt_bias,        // [C] f32
                        const Tensor& state_indices,  // [R] int32
                        Tensor& state,                // [slots, H, D, D] f32 | bf16
                        const Tensor& output_gate,    // [R, H, D] or [1, R, H, D] bf16
                        const Tensor& norm_weight,    // [D] f32
                        const KdaDecodeOptions& options,
                        Tensor output = {});  // [1, R, H, D] bf16 or {}

// Checks every value contract of spec §4 on host copies of the metadata (throws ValueError naming
// the sequence/row and the value). Reads nothing but the index tensors; writes nothing.
void check_kda_value_contracts(const KdaDecodeArgs& args);

// The contract rows of the KDA decode kernel on each backend (kernel "kda_decode").
const KdaContract& cpu_kda_contract();
const KdaContract& cuda_kda_contract();

}  // namespace splice
