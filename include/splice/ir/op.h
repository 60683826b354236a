// splice/ir/op.h: the closed set of graph operations, one sentence of semantics each.
//
// Shapes are symbolic (SymShape); scalar parameters are DynScalars bound per pass. Every op reads
// its inputs in order and produces one tensor. Numeric ops accumulate in fp32 and store in the
// node's dtype. Ops marked (view) produce a view of their input and own no memory; ops marked
// (effect) write persistent state and are kept by dead-code elimination.
#pragma once

#include <cstdint>
#include <string>

namespace splice {

enum class Op : std::uint8_t {
  // --- sources ---
  Input,     // A per-step input fed by name (token ids, positions); shape may be symbolic.
  Param,     // A weight tensor owned by the graph; read-only.
  Constant,  // A small literal tensor owned by the graph.
  State,     // A persistent buffer that lives across steps (KV cache, recurrent state, conv
             // history), allocated once at its shape's upper bound and zero-initialized.
  SymValue,  // A [1] i32/i64 tensor holding the value of a DynScalar under the pass's SymEnv.
  Iota,      // out[..., i on `axis`, ...] = i (i32/i64/f32), shape from the node.
  // --- unary (elementwise, float in and out, fp32 math) ---
  Exp,         // e^x.
  Log,         // Natural logarithm.
  Neg,         // -x.
  Abs,         // |x|.
  Sqrt,        // Square root.
  Rsqrt,       // 1 / sqrt(x).
  Reciprocal,  // 1 / x.
  Sigmoid,     // 1 / (1 + e^-x).
  Silu,        // x * sigmoid(x).
  Softplus,    // x if x > 20, else log(1 + e^x).
  Tanh,        // Hyperbolic tangent.
  // --- binary with NumPy broadcasting (operands of one dtype) ---
  Add,      // a + b.
  Sub,      // a - b.
  Mul,      // a * b.
  Div,      // a / b.
  Minimum,  // min(a, b).
  Maximum,  // max(a, b).
  // --- comparisons (bool result, broadcasting) and selection ---
  Less,          // a < b.
  LessEqual,     // a <= b.
  Greater,       // a > b.
  GreaterEqual,  // a >= b.
  Equal,         // a == b.
  Where,         // cond ? a : b, broadcasting over all three.
  // --- reductions over `axis` (keepdim optional) ---
  ReduceSum,   // Sum over `axis` (fp32 accumulation).
  ReduceMax,   // Maximum over `axis`.
  ReduceMean,  // Mean over `axis` (fp32 accumulation).
  Softmax,     // Softmax over `axis` with fp32 accumulation; an all -inf slice gives zeros.
  MatMul,      // Batched a[..., m, k] @ b[..., k, n] (b read as [..., n, k] if transpose_b),
               // batch dims broadcast.
  // --- layout ---
  Reshape,     // (view when the input is contiguous, else a copy) Same elements, the node's shape.
  Permute,     // (view) Axes reordered by `perm`.
  Slice,       // (view) input[..., start:end on `axis`, ...] with DynScalar bounds: the exact
               // live prefix k[:, :, 0:k_len] is a Slice with end = k_len.
  Concat,      // Inputs concatenated along `axis`.
  Gather,      // table[indices] along axis 0 (embedding lookup); out = indices.shape + row shape.
  Cast,        // Elementwise dtype conversion (round to nearest even for 16-bit floats).
  WriteAt,     // (view, effect) state.slice(axis, offset, offset + value.size(axis)) = value;
               // returns the state, so later readers of the new contents consume this node.
  Sequence,    // (view) Returns input 0 once every other input has run: orders side effects so
               // that a branch arm's exit depends on the cache writes inside the arm.
  StateAfter,  // (view) Input 0 (a state, or a view of one) as left by the effects that inputs
               // 1.. depend on: its readers read the new contents, so the planner counts them as
               // readers of the written version, never of the one input 0 names.
  // --- fused ops (each has a decomposition into the primitives above) ---
  FlashDecode,  // Decode attention of spec decode_attention.md §5: inputs q, k, v [, alibi];
                // k_len and the features in attrs.flash.
  KdaDecode,    // (effect) Fused KDA decode of spec kda_decode.md: inputs as the spec's argument
                // list; attrs.kda; updates conv_state and state in place; output [1, R, H, D].
  RmsNorm,      // y = x * rsqrt(mean(x^2 over the last axis) + attrs.eps) * weight: inputs
                // x [..., H], weight [H] (float dtypes); fp32 math, stored in the node's dtype.
  SiluMul,      // y = round(round(silu(a)) * b) over same-shape a, b (SwiGLU's activation, rounded
                // to the node's dtype after each step exactly like its Silu -> Mul region).
  Rope,         // Rotate-half RoPE of x [..., D] at position p = pos[0] (input 3, [1] i32):
                // y = x * cos[p] + rotate_half(x) * sin[p], tables cos, sin [max_seq_len, D];
                // fp32 math, stored in x's dtype.
  MatMulAdd,    // y = a @ b^T + c: a [..., M, K], b [N, K] (a's dtype), c [..., M, N] (the
                // product's shape, any float dtype); the fp32 sum plus c rounded once into the
                // node's dtype (its MatMul -> Add region rounds the product first).
  RmsNormMatMul,     // y = round_w(rms_norm(x, weight, attrs.eps)) @ w^T: inputs x [..., M, K],
                     // weight [K], w [N, K] (float dtypes); the normalized row rounded to w's dtype
                     // (the RmsNorm -> MatMul region's intermediate), then the product's fp32 sum
                     // rounded once into the node's dtype.
  SiluMulMatMulAdd,  // y = round(round(round(silu(a)) * b) @ w^T + c): inputs a, b [..., M, K]
                     // (one dtype), w [N, K] (a's dtype), c [..., M, N] (any float dtype); the
                     // activation rounded as SiluMul, then MatMulAdd's fp32 sum plus c rounded
                     // once.
  RopeKvAppend,      // (effect) The attention prologue of one token: qkv [B, 1, (Hq + 2 Hkv) D] is
                     // read as q, k, v heads; Rope's rule (tables cos, sin inputs 1, 2, position
                     // input 3, [1] i32, p = position[0]) rotates the q and k heads; in place,
                     // k_cache[:, :, p] = rotated k, v_cache[:, :, p] = v (caches [B, Hkv,
                     // capacity, D], inputs 4, 5, qkv's dtype); output the rotated q [B, Hq, 1, D].
  RmsNormMatMulRopeKvAppend,  // (effect) RmsNormMatMul then RopeKvAppend in one op: inputs x
                              // [B, 1, K], norm_weight [K], w [N, K] (attrs.eps), cos, sin
                              // (3, 4), position (5, [1] i32), k_cache, v_cache (6, 7, [B, Hkv,
                              // capacity, D]); qkv = round_c(round_w(rms_norm(x)) @ w^T) with
                              // N = (Hq + 2 Hkv) D and c the caches' dtype, then RopeKvAppend's
                              // rule on qkv; output the rotated q [B, Hq, 1, D] (caches' dtype).
  RmsNormMatMulSwiglu,  // RmsNormMatMul then SwiGLU's activation in one op: inputs x [..., M, K],
                        // norm_weight [K], w [2I, K] (attrs.eps; rows 0..I-1 gate, I..2I-1 up);
                        // y = round_T(round_w(rms_norm(x)) @ w^T), then SiluMul's rule on the
                        // halves: out[..., j] = round_T(round_T(silu(y[..., j])) * y[..., I + j]);
                        // output [..., M, I] in the node's dtype T.
  // --- control ---
  Branch,  // (view) Equivalent arms: inputs are the arms' exits (arm 0 first, the oracle);
           // returns the chosen arm's exit (arm 0 unless a decision selects another).
};

const char* op_name(Op op);
bool is_unary(Op op);
bool is_binary_arith(Op op);
bool is_compare(Op op);
bool is_reduce(Op op);
bool is_source(Op op);
// Produces a view of (aliases) one of its inputs: Permute, Slice, WriteAt, Sequence, StateAfter,
// Branch.
// Reshape aliases when its input is contiguous at run time and copies otherwise.
bool is_view(Op op);
// Writes persistent state: WriteAt, KdaDecode, RopeKvAppend, RmsNormMatMulRopeKvAppend.
bool has_effect(Op op);

}  // namespace splice
