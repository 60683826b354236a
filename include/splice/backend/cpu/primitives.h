// splice/backend/cpu/primitives.h: the CPU backend's primitive kernels, the oracle for every
// later backend.
//
// Every kernel reads strided inputs of any float dtype (f32/f16/bf16), accumulates in fp32 (f64
// where stated) and writes a preallocated output of the node's dtype (its strides may be
// anything too). Shapes are concrete here; the executor evaluates symbolic shapes before calling.
// Broadcasting follows NumPy: shapes align at the trailing axis; a dim of 1 stretches.
// Large kernels split their outer loop over the thread pool (parallel.h).
#pragma once

#include <cstdint>
#include <vector>

#include "splice/core/tensor.h"

namespace splice::cpu {

enum class UnaryKind : std::uint8_t {
  exp, log, neg, abs, sqrt, rsqrt, reciprocal, sigmoid, silu, softplus, tanh
};
enum class BinaryKind : std::uint8_t { add, sub, mul, div, minimum, maximum };
enum class CompareKind : std::uint8_t { less, less_equal, greater, greater_equal, equal, not_equal };
enum class ReduceKind : std::uint8_t { sum, max, mean };

// out = f(in), elementwise; in and out have one shape. softplus(z) = z if z > 20 else log1p(e^z).
void unary(UnaryKind kind, const Tensor& in, Tensor& out);
// out = a (op) b with broadcasting; out has the broadcast shape.
void binary(BinaryKind kind, const Tensor& a, const Tensor& b, Tensor& out);
// out (bool) = a (cmp) b with broadcasting; numeric inputs of any dtype (ints compared exactly).
void compare(CompareKind kind, const Tensor& a, const Tensor& b, Tensor& out);
// out = cond ? a : b with broadcasting over all three.
void where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out);
// out[..., i (on axis), ...] = start + i * step (any dtype).
void iota(Tensor& out, std::int64_t axis, double start = 0.0, double step = 1.0);
// Reduces `axis` of `in`; out has that axis removed, or kept as 1 when `keepdim`.
void reduce(ReduceKind kind, const Tensor& in, std::int64_t axis, bool keepdim, Tensor& out);
// Softmax over `axis`, fp32 accumulation, max-subtracted. A slice whose entries are all -inf
// yields zeros (no visible key), never NaN.
void softmax(const Tensor& in, std::int64_t axis, Tensor& out);
// Batched matmul with broadcast batch dims: a [..., m, k] @ b [..., k, n] -> out [..., m, n].
// `transpose_b` reads b as [..., n, k]. fp32 accumulation (through BLAS sgemm for large f32
// problems, a blocked loop otherwise).
void matmul(const Tensor& a, const Tensor& b, Tensor& out, bool transpose_b = false);
// out = concat(inputs) along axis.
void concat(const std::vector<Tensor>& inputs, std::int64_t axis, Tensor& out);
// out[i..., :] = table[indices[i...], :] (embedding lookup along axis 0 of table). Indices are
// i32/i64; an index outside [0, rows) throws ValueError naming it.
void gather(const Tensor& table, const Tensor& indices, Tensor& out);
// Elementwise copy with dtype conversion (RNE for 16-bit floats); shapes must match.
void cast(const Tensor& in, Tensor& out);
// state.slice(axis, offset, offset + value.size(axis)) = value (the KV append). Throws ValueError
// when the window does not fit in state's axis.
void write_at(Tensor& state, const Tensor& value, std::int64_t axis, std::int64_t offset);

// Threads used by the CPU kernels (default: hardware concurrency; SPLICE_NUM_THREADS overrides).
int num_threads();
void set_num_threads(int n);

}  // namespace splice::cpu
