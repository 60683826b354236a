// A float64 reference of the fused KDA decode op, written straight from spec kda_decode.md §2-§3
// with plain loops. It shares no code with the CPU kernel: it reads every input through its
// strides, carries the state in double, and rounds only where the spec rounds (bf16 conv output,
// bf16 o, bf16 final output, the state dtype at checkpoint stores).
//
// Algorithm (per sequence, in order):
//   1. Resolve rows b..e-1, accepted offset a = clamp(nat - 1, 0, T - 1), conv slot cs =
//      si[n, 0], source slot ss = si[n, a]; skip empty and null sequences (zero rows).
//   2. hist = conv_state[cs, :, a..a+2]; S = state[ss] in double.
//   3. For each token: conv + SiLU (rounded to bf16), L2 norms, gate, beta, delta rule
//      (decay, pred = S k^, S += b (v - pred) k^^T, o_raw = S q^), gated RMSNorm; shift hist;
//      store the state into si[n, t] when positive.
//   4. Conv write-back into slot cs: [old a+1, old a+2, x[b], .., x[e-1]].
// Inputs are never modified; the results are new contiguous tensors.
#pragma once

#include <optional>

#include "splice/core/tensor.h"

namespace splice::testing {

struct KdaReferenceResult {
  Tensor output;            // [1, R, H, D] bf16
  Tensor output_unrounded;  // [1, R, H, D] f32: the final value before its bf16 rounding
  Tensor conv_state;        // [slots, 3C, T+2] bf16, a contiguous updated copy
  Tensor state;             // [slots, H, D, D] in state's dtype, a contiguous updated copy
};

// Packed T >= 1 (and T = 1 with t1_state_indices [R]).
KdaReferenceResult reference_packed_kda_decode(
    const Tensor& x, const Tensor& weight, const Tensor& conv_state, const Tensor& raw_gate,
    const Tensor& raw_beta, const Tensor& A_log, const Tensor& dt_bias, const Tensor& state_indices,
    const Tensor& state, const Tensor& output_gate, const Tensor& norm_weight,
    std::optional<double> lower_bound, double norm_eps, const Tensor& query_start_loc,
    const Tensor& num_accepted_tokens, const Tensor* t1_state_indices = nullptr);

// Plain T = 1: state_indices [R], row r uses slot state_indices[r].
KdaReferenceResult reference_fused_kda_decode(const Tensor& x, const Tensor& weight,
                                              const Tensor& conv_state, const Tensor& raw_gate,
                                              const Tensor& raw_beta, const Tensor& A_log,
                                              const Tensor& dt_bias, const Tensor& state_indices,
                                              const Tensor& state, const Tensor& output_gate,
                                              const Tensor& norm_weight,
                                              std::optional<double> lower_bound, double norm_eps);

// Rounds a double to the nearest bfloat16 value (round-to-nearest-even, no double rounding).
double round_bf16(double value);

}  // namespace splice::testing
