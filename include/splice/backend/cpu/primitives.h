// splice/backend/cpu/primitives.h: the CPU backend's primitive kernels, the oracle for every
// later backend.
//
// Every kernel reads strided inputs of any float dtype (f32/f16/bf16), accumulates in fp32 (f64
// where stated) and writes a preallocated output of the node's dtype (its strides may be
// anything too). Shapes are concrete here; the executor evaluates symbolic shapes before calling.
// Broadcasting follows NumPy: shapes align at the trailing axis; a dim of 1 stretches.
// Large kernels split their outer loop over the thread pool (src/backend/cpu/parallel.h); every
// output element has one owner and one summation order, so results are bitwise independent of
// the thread count (BLAS calls aside).
//
// Contract shared by every entry point:
//   - Inputs and outputs are CPU tensors with any strides (stride 0 included for inputs);
//     undefined tensors throw ValueError, device tensors DeviceError, wrong dtypes DTypeError,
//     wrong shapes ShapeError naming the operand and both shapes. Everything is validated before
//     the first write, so a throwing call leaves its output untouched (integer division by zero
//     excepted: it is found while computing).
//   - Aliasing: an elementwise op (unary, binary, compare, where, cast), softmax and reduce may
//     write into the very same view as an input (identical offset, shape, strides and dtype).
//     Any other overlap between the output and an input throws LayoutError (byte ranges are
//     compared). matmul, concat and gather outputs never alias an input.
//   - Rounding: math in fp32, one RNE rounding when storing a 16-bit float; same-dtype copies
//     (cast, concat, gather, write_at) move raw bits. Float -> int stores truncate toward zero and
//     saturate (NaN -> 0); int -> int stores wrap; anything -> bool is "nonzero".
#pragma once

#include <cstdint>
#include <vector>

#include "splice/core/tensor.h"

namespace splice::cpu {

enum class UnaryKind : std::uint8_t {
  exp,
  log,
  neg,
  abs,
  sqrt,
  rsqrt,
  reciprocal,
  sigmoid,
  silu,
  softplus,
  tanh
};
enum class BinaryKind : std::uint8_t { add, sub, mul, div, minimum, maximum };
enum class CompareKind : std::uint8_t {
  less,
  less_equal,
  greater,
  greater_equal,
  equal,
  not_equal
};
enum class ReduceKind : std::uint8_t { sum, max, mean };

// out = f(in), elementwise; in and out have one shape, any float dtypes (they may differ).
// softplus(z) = z if z > 20 else log1p(e^z); sigmoid(z) = 1 / (1 + e^-z); silu(z) = z sigmoid(z).
void unary(UnaryKind kind, const Tensor& in, Tensor& out);
// out = a (op) b with broadcasting; out has the broadcast shape. Dtypes f32/f16/bf16/i32/i64,
// mixed freely: fp32 math when any operand is a float, exact int64 math otherwise (add/sub/mul
// wrap, div truncates toward zero and throws ValueError on a zero divisor). minimum/maximum
// propagate NaN.
void binary(BinaryKind kind, const Tensor& a, const Tensor& b, Tensor& out);
// out (bool) = a (cmp) b with broadcasting; numeric inputs of any dtype (ints compared exactly).
void compare(CompareKind kind, const Tensor& a, const Tensor& b, Tensor& out);
// out = cond ? a : b with broadcasting over all three; cond is bool, a/b/out any dtype.
void where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out);
// out[..., i (on axis), ...] = start + i * step (computed in double, rounded once into out's
// dtype: f32/f16/bf16/i32/i64).
void iota(Tensor& out, std::int64_t axis, double start = 0.0, double step = 1.0);
// Reduces `axis` of `in` (float dtypes, fp32 accumulation); out has that axis removed, or kept
// as 1 when `keepdim`. max propagates NaN and throws ShapeError on an empty axis; sum of an
// empty axis is 0, mean is NaN.
void reduce(ReduceKind kind, const Tensor& in, std::int64_t axis, bool keepdim, Tensor& out);
// Softmax over `axis`, fp32 accumulation, max-subtracted. A slice whose entries are all -inf
// yields zeros (no visible key), never NaN.
void softmax(const Tensor& in, std::int64_t axis, Tensor& out);
// Batched matmul with broadcast batch dims: a [..., m, k] @ b [..., k, n] -> out [..., m, n]
// (ranks >= 2, float dtypes, mixed freely). `transpose_b` reads b as [..., n, k]. fp32
// accumulation: all-f32 operands in BLAS-readable layouts go through cblas_sgemm/sgemv; small m
// (<= 8, decode) with any dtype or strides runs a direct loop that streams b once in its storage
// dtype; the rest is converted to contiguous f32 and goes through sgemm. k == 0 gives zeros.
void matmul(const Tensor& a, const Tensor& b, Tensor& out, bool transpose_b = false);
// out = concat(inputs) along axis; inputs match out on every other axis, any dtypes.
void concat(const std::vector<Tensor>& inputs, std::int64_t axis, Tensor& out);
// out[i..., :] = table[indices[i...], :] (embedding lookup along axis 0 of table); out's shape
// is indices.shape + table.shape[1:]. Indices are i32/i64 (any strides); an index outside
// [0, rows) throws ValueError naming its position and value, before anything is written.
void gather(const Tensor& table, const Tensor& indices, Tensor& out);
// Elementwise copy with dtype conversion (RNE for 16-bit floats); shapes must match.
void cast(const Tensor& in, Tensor& out);
// state.slice(axis, offset, offset + value.size(axis)) = value (the KV append; exact when the
// dtypes match, RNE otherwise). value matches state on every other axis (ShapeError). Throws
// ValueError when the window does not fit in state's axis; state is then untouched.
void write_at(Tensor& state, const Tensor& value, std::int64_t axis, std::int64_t offset);

// Threads used by the CPU kernels (default: hardware concurrency; SPLICE_NUM_THREADS overrides;
// OpenBLAS keeps its own count, OPENBLAS_NUM_THREADS). set_num_threads throws ValueError for
// n < 1 and must not run concurrently with a kernel.
int num_threads();
void set_num_threads(int n);

}  // namespace splice::cpu
