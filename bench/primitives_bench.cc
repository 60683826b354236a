// CPU primitive kernels: decode-shaped matmuls and the elementwise / softmax ops of a decode step.
//
//  1. Matmul [1, k] x [k, n] (and x [n, k]^T) for the decode shapes [1,576]x[576,1536] and
//     [1,4096]x[4096,4096] in f32 and bf16: bytes moved are dominated by the weight (k*n*size),
//     reported as bytes_per_second so the number reads against memory bandwidth.
//  2. Elementwise ops over [n] contiguous tensors (f32 and bf16): add, mul with a broadcast row,
//     silu, cast, softmax over the last axis; bytes = inputs read + output written.
// Threads: cpu::num_threads() (SPLICE_NUM_THREADS overrides). Run once to check it builds:
//   ./primitives_bench --benchmark_min_time=0.05
#include <benchmark/benchmark.h>

#include <cstdint>

#include "splice/backend/cpu/primitives.h"
#include "splice/core/random.h"

namespace splice {
namespace {

constexpr std::uint64_t kSeed = 0xBE7C4;

Tensor random(const Dims& shape, DType dtype, double stddev = 1.0) {
  static Rng rng(kSeed);
  Tensor t = Tensor::empty(shape, dtype);
  rng.normal(t, 0.0, stddev);
  return t;
}

DType dtype_arg(std::int64_t code) { return code == 0 ? DType::f32 : DType::bf16; }

// args: k, n, dtype (0 f32, 1 bf16), transpose_b.
void BM_MatmulDecode(benchmark::State& state) {
  const std::int64_t k = state.range(0), n = state.range(1);
  const DType dtype = dtype_arg(state.range(2));
  const bool transpose_b = state.range(3) != 0;
  const Tensor a = random({1, k}, dtype);                                       // [1, k]
  const Tensor b = random(transpose_b ? Dims{n, k} : Dims{k, n}, dtype, 0.03);  // weights
  Tensor out = Tensor::empty({1, n}, dtype);                                    // [1, n]
  for (auto _ : state) {
    cpu::matmul(a, b, out, transpose_b);
    benchmark::DoNotOptimize(out.raw_data());
  }
  state.SetBytesProcessed(state.iterations() * (a.nbytes() + b.nbytes() + out.nbytes()));
  state.SetLabel(std::string(dtype_name(dtype)) + (transpose_b ? " b^T" : ""));
}
BENCHMARK(BM_MatmulDecode)
    ->ArgNames({"k", "n", "bf16", "bT"})
    ->Args({576, 1536, 0, 0})
    ->Args({576, 1536, 1, 0})
    ->Args({576, 1536, 0, 1})
    ->Args({576, 1536, 1, 1})
    ->Args({4096, 4096, 0, 0})
    ->Args({4096, 4096, 1, 0})
    ->Args({4096, 4096, 1, 1})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// Batched prefill-like matmul: [64, 576] x [576, 1536] (BLAS or packed path).
void BM_MatmulPrefill(benchmark::State& state) {
  const DType dtype = dtype_arg(state.range(0));
  const Tensor a = random({64, 576}, dtype);
  const Tensor b = random({576, 1536}, dtype, 0.03);
  Tensor out = Tensor::empty({64, 1536}, dtype);
  for (auto _ : state) {
    cpu::matmul(a, b, out);
    benchmark::DoNotOptimize(out.raw_data());
  }
  state.SetItemsProcessed(state.iterations() * 2 * 64 * 576 * 1536);  // flops
  state.SetLabel(dtype_name(dtype));
}
BENCHMARK(BM_MatmulPrefill)
    ->ArgNames({"bf16"})
    ->Arg(0)
    ->Arg(1)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

enum class Elementwise : std::int64_t { add, mul_row, silu, cast, softmax };

// args: op, n (elements), dtype.
void BM_Elementwise(benchmark::State& state) {
  const auto op = static_cast<Elementwise>(state.range(0));
  const std::int64_t n = state.range(1);
  const DType dtype = dtype_arg(state.range(2));
  constexpr std::int64_t kRow = 1536;  // row length for mul_row / softmax
  const Dims shape = {n / kRow, kRow};
  const Tensor a = random(shape, dtype), b = random(shape, dtype), row = random({kRow}, dtype);
  Tensor out = Tensor::empty(shape, op == Elementwise::cast ? DType::f32 : dtype);
  std::int64_t bytes = a.nbytes() + out.nbytes();
  for (auto _ : state) {
    switch (op) {
      case Elementwise::add:
        cpu::binary(cpu::BinaryKind::add, a, b, out);
        break;
      case Elementwise::mul_row:
        cpu::binary(cpu::BinaryKind::mul, a, row, out);
        break;
      case Elementwise::silu:
        cpu::unary(cpu::UnaryKind::silu, a, out);
        break;
      case Elementwise::cast:
        cpu::cast(a, out);
        break;
      case Elementwise::softmax:
        cpu::softmax(a, -1, out);
        break;
    }
    benchmark::DoNotOptimize(out.raw_data());
  }
  if (op == Elementwise::add) bytes += b.nbytes();
  state.SetBytesProcessed(state.iterations() * bytes);
  static const char* kNames[] = {"add", "mul_row", "silu", "cast->f32", "softmax"};
  state.SetLabel(std::string(kNames[state.range(0)]) + " " + dtype_name(dtype));
}
BENCHMARK(BM_Elementwise)
    ->ArgNames({"op", "n", "bf16"})
    ->ArgsProduct({{0, 1, 2, 3, 4}, {1536, 1536 * 1024}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace splice

BENCHMARK_MAIN();
