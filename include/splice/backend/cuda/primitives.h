// splice/backend/cuda/primitives.h: the CUDA backend's primitive kernels, checked against the CPU
// backend (include/splice/backend/cpu/primitives.h, the oracle) in tests/cuda/primitives_test.cc.
//
// The API and semantics are the CPU backend's, on CUDA tensors, with these differences:
//   - Everything launches on splice::cuda::current_stream() and returns without synchronizing;
//     nothing reads device memory back to the host, so every call can be captured in a CUDA graph
//     (write_at also takes its offset from device memory for replay with new offsets).
//   - Strided operands of any layout (stride 0 included for inputs) up to rank 6 after adjacent
//     dims that are contiguous in every operand are merged (ShapeError beyond that).
//   - Data-dependent errors cannot be raised without a read-back: integer division by zero gives
//     0, and a gather index outside [0, rows) gives a zero row. Everything that the shapes, dtypes
//     and devices decide is validated on the host before the launch, with the CPU's typed errors.
//   - Reductions and softmax sum in a different order than the CPU (a warp per row), so results
//     agree within default_tolerance(out dtype), not bitwise; copies (cast to the same dtype,
//     concat, gather, write_at) move raw bits and are bit-exact.
//   - matmul goes through cuBLASLt (fp32 compute, one cached handle and 32 MiB workspace): bf16,
//     f16 and f32 operands of one dtype in a layout with a unit stride in one of the two matrix
//     dims are read in place, batch dims that collapse to one uniform stride become one strided
//     batched call (a broadcast operand gets batch stride 0), other batch layouts loop over
//     calls; mixed dtypes or other layouts are first copied to contiguous f32. Scratch tensors are
//     handed to the retain_scratch sink when one is set, so a captured graph keeps them alive.
//     Skinny products (a few activation rows times a weight, the decode case) go to splice's own
//     bandwidth-bound GEMV kernels instead (src/backend/cuda/gemv_kernel.cuh, launched by
//     gemv.cu; the routing rule and the measurements behind it are in try_gemv,
//     primitives_gemm.cc). It joins the programmatic
//     dependent launch chain of the other kernels here; MatmulOptions::b_constant lets it start
//     streaming a constant weight before its producers finish.
#pragma once

#include <cstdint>
#include <vector>

#include "splice/backend/cpu/primitives.h"
#include "splice/core/tensor.h"

namespace splice::cuda {

using cpu::BinaryKind;
using cpu::CompareKind;
using cpu::ReduceKind;
using cpu::UnaryKind;

// out = f(in), elementwise (float dtypes).
void unary(UnaryKind kind, const Tensor& in, Tensor& out);
// out = a (op) b with NumPy broadcasting; fp32 math when any operand is a float, int64 otherwise.
void binary(BinaryKind kind, const Tensor& a, const Tensor& b, Tensor& out);
// out (bool) = a (cmp) b with broadcasting (ints compared exactly).
void compare(CompareKind kind, const Tensor& a, const Tensor& b, Tensor& out);
// out = cond ? a : b with broadcasting over all three.
void where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out);
// out[..., i (on axis), ...] = start + i * step.
void iota(Tensor& out, std::int64_t axis, double start = 0.0, double step = 1.0);
// Reduces `axis` (fp32 accumulation; max propagates NaN; ShapeError for max of an empty axis).
void reduce(ReduceKind kind, const Tensor& in, std::int64_t axis, bool keepdim, Tensor& out);
// Softmax over `axis`, fp32, max-subtracted; an all -inf slice gives zeros.
void softmax(const Tensor& in, std::int64_t axis, Tensor& out);
// Batched a [..., m, k] @ b [..., k, n] (b read as [..., n, k] when transpose_b) through cuBLASLt.
void matmul(const Tensor& a, const Tensor& b, Tensor& out, bool transpose_b = false);

// What the caller guarantees about a matmul's operands (every field defaults to no promise).
struct MatmulOptions {
  // No kernel that may still be running when this matmul is launched (under programmatic
  // dependent launch: any earlier kernel of the stream since its last non-kernel operation)
  // writes `b`, and none writes it before this matmul completes: a model weight (a session's
  // Param). The GEMV route then issues its first weight loads before waiting on its producers,
  // overlapping their DRAM latency with the previous kernel's tail (gemv.h, Params::w_constant).
  // A false promise is a silent race.
  bool b_constant = false;
  // Optional residual epilogue: out = a @ b + residual, the product's fp32 sum plus residual in
  // fp32 with one rounding into out's dtype (the MatMulAdd layer op). residual: out's shape, any
  // float dtype and strides, on out's device; it may be out itself (the identical view: h += ...)
  // but must not otherwise overlap it. The GEMV route adds it before its store; other products
  // go through an f32 scratch product and one elementwise add.
  const Tensor* residual = nullptr;
};
// The same product with the caller's guarantees.
void matmul(const Tensor& a, const Tensor& b, Tensor& out, bool transpose_b,
            const MatmulOptions& options);
// out = concat(inputs) along axis.
void concat(const std::vector<Tensor>& inputs, std::int64_t axis, Tensor& out);
// out[i..., :] = table[indices[i...], :] along axis 0 of table.
void gather(const Tensor& table, const Tensor& indices, Tensor& out);
// Elementwise copy with dtype conversion (raw bits when the dtypes match).
void cast(const Tensor& in, Tensor& out);
// state.slice(axis, offset, offset + value.size(axis)) = value, `offset` known on the host
// (ValueError when the window does not fit).
void write_at(Tensor& state, const Tensor& value, std::int64_t axis, std::int64_t offset);
// The same with the offset read by the kernel from `offset` ([1] i32/i64 in device memory), so a
// captured launch writes wherever the offset points at replay time. A window that does not fit
// writes nothing (the caller validates the value on the host before it copies it in).
void write_at(Tensor& state, const Tensor& value, std::int64_t axis, const Tensor& offset);
// out = value everywhere (any dtype).
void fill(Tensor& out, double value);

// One thread that spins for `microseconds` of device time (%globaltimer): work queued behind it
// starts only after, so a host can enqueue a whole step first and time its kernels back to back
// (Session's per-node profile).
void hold_stream(double microseconds);

// While `sink` is non-null, every scratch tensor a primitive allocates on this host thread is also
// appended to it (a captured graph's launches keep pointing at them).
void retain_scratch(std::vector<Tensor>* sink);

}  // namespace splice::cuda
