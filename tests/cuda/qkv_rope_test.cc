// cuda::rms_norm_matmul_rope_kv_append (Op::RmsNormMatMulRopeKvAppend's one-launch CUDA kernel:
// the register-prologue q|k|v GEMV with a RoPE and KV-append epilogue, gemv_kernel.cuh's
// rope_pairs_kernel) against the two CUDA kernels it replaces (cuda::rms_norm_matmul into a q|k|v
// row, then cuda::rope_kv_append), a replayed region graph, and a tiny Llama.
//
//  1. Kernel grid: head_dim 64, 128 x (Hq, Hkv) (9, 3), (4, 4), (8, 2) x K 576, 2048 x positions
//     0, 17, capacity - 1 x bf16 / f16 x position_stable off / on x w_constant off / on; caches
//     random in every row, the model's RoPE tables. K = 576: out and both caches bit for bit the
//     two kernels (the same register prologue, per-lane order and reduction tree, gemv.h's
//     launch_rope). K = 2048: the two-kernel GEMV sums x^2 in shared memory in another order, so a
//     normalized element may round one ulp apart: out and caches within the arm generator's
//     tolerance (the bf16 / f16 policy with a 4x atol); both ways every cache row but p bit for bit
//     unchanged. Also within that tolerance of the CPU op.
//  1b. 2-8 rows (gemv_kernel.cuh's norm_rows_kernel with the RoPE epilogue, one launch):
//     (Hq, Hkv, D) (9, 3, 64), (8, 2, 128) and (3, 1, 10) (an odd count of RoPE pairs: the last
//     warp's second pair is never stored) x K 64, 576, 768 x B 2, 3, 4, 5, 8 x bf16 / f16,
//     positions 0, 17, capacity - 1 and the stable-position promise and w_constant alternating:
//     out and caches within the tolerance of the two CUDA kernels and of the CPU op, every other
//     cache row and every other sequence's row bit for bit unchanged. A position outside the
//     caches zeroes out and leaves them. B = 3 at K = 1536 (past the multi-row kernel's 768)
//     runs the two kernels, bit for bit.
//  2. A position outside the caches zeroes out and leaves the caches (as rope_kv_append).
//  3. Errors (typed, caches untouched): batch 9, f32, K not in whole vectors, K > 2048, a
//     misaligned x, a host tensor.
//  4. Region: h -> rms_norm_matmul region -> rope_kv_append region nested in the outer region,
//     collapsed to the fused arm, replayed as a CUDA graph with the position changing every step
//     (out of order, one row twice): bit for bit the same graph run eagerly (per-call launches),
//     within tolerance of the CPU session.
//  5. Llama: the tiny bf16 Llama with the outer branch collapsed to the fused arm issues one kernel
//     fewer per layer than with it collapsed to arm 0 (inner fused arms: the qkv GEMV and
//     rope_kv_append), counted by the launch counters of the eager first step; logits and caches
//     bit for bit the arm-0 graph (K = 128: register prologue on both sides) over 6 replayed
//     steps.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../../src/backend/cuda/gemv.h"  // internal: launch counters
#include "splice/backend/cuda/layer_ops.h"
#include "splice/backend/cuda/rope_kv_append.h"
#include "splice/backend/cuda/runtime.h"
#include "splice/core/error.h"
#include "splice/exec/session.h"
#include "splice/model/model.h"
#include "splice/ops/layer_ops.h"
#include "splice/passes/layer_ops.h"
#include "splice/tune/optimize.h"
#include "support/cuda_test_util.h"
#include "support/test_util.h"
#include "support/tiny_llama.h"

namespace splice {
namespace {

constexpr std::int64_t kCapacity = 40;
constexpr float kEps = 1e-5f;

// The arm generator's policy for this op (generators.cc QkvRopeGenerator): 4x the default atol.
Tolerance qkv_rope_tolerance(DType dtype) {
  Tolerance t = default_tolerance(dtype);
  t.atol *= 4.0;
  return t;
}

// RoPE tables [rows, D] as a model has them (theta 1e4, rotate-half layout: entry (t, e) at
// angle t * theta^(-2 (e mod D/2) / D)), so |cos|, |sin| <= 1 and a one-ulp difference of a q|k|v
// element moves the rotated element by at most about one ulp (random N(0, 1) tables could
// amplify it past the policy).
std::pair<Tensor, Tensor> rope_tables(std::int64_t rows, std::int64_t dim) {
  Tensor cos = Tensor::empty({rows, dim}, DType::f32), sin = Tensor::empty({rows, dim}, DType::f32);
  for (std::int64_t t = 0; t < rows; ++t)
    for (std::int64_t e = 0; e < dim; ++e) {
      const double angle =
          static_cast<double>(t) *
          std::pow(1e4, -2.0 * static_cast<double>(e % (dim / 2)) / static_cast<double>(dim));
      cos.data<float>()[t * dim + e] = static_cast<float>(std::cos(angle));
      sin.data<float>()[t * dim + e] = static_cast<float>(std::sin(angle));
    }
  return {cos, sin};
}

struct Operands {
  Tensor x, norm_weight, w, cos, sin, position, k_cache, v_cache;  // host tensors
};

// x [1, 1, K], norm_weight [K] ~ 1 + N(0, 0.1), w [N, K] ~ N(0, 1 / K), rope_tables [kCapacity,
// D], caches [1, Hkv, kCapacity, D] random in every row.
Operands make_operands(std::int64_t heads, std::int64_t kv_heads, std::int64_t dim, std::int64_t k,
                       DType dtype, std::int64_t position, Rng& rng) {
  const std::int64_t n = (heads + 2 * kv_heads) * dim;
  Operands o;
  o.x = testing::random_tensor(rng, {1, 1, k}, dtype);
  o.norm_weight = testing::random_tensor(rng, {k}, dtype, 0.1, 1.0);
  o.w = testing::random_tensor(rng, {n, k}, dtype, 1.0 / std::sqrt(static_cast<double>(k)));
  std::tie(o.cos, o.sin) = rope_tables(kCapacity, dim);
  o.position = Tensor::empty({1}, DType::i32);
  o.position.data<std::int32_t>()[0] = static_cast<std::int32_t>(position);
  o.k_cache = testing::random_tensor(rng, {1, kv_heads, kCapacity, dim}, dtype);
  o.v_cache = testing::random_tensor(rng, {1, kv_heads, kCapacity, dim}, dtype);
  return o;
}

// Every row of `cache` but `position` equals `before`'s.
void expect_other_rows_unchanged(const Tensor& cache, const Tensor& before, std::int64_t position) {
  for (std::int64_t t = 0; t < cache.size(2); ++t) {
    if (t == position) continue;
    EXPECT_TRUE(
        testing::bit_equal(cache.slice(2, t, t + 1).clone(), before.slice(2, t, t + 1).clone()))
        << "row " << t;
  }
}

void check_kernel(std::int64_t heads, std::int64_t kv_heads, std::int64_t dim, std::int64_t k,
                  DType dtype, std::int64_t position, bool position_stable, bool w_constant,
                  bool bitwise, Rng& rng) {
  SCOPED_TRACE(std::string(dtype_name(dtype)) + " Hq " + std::to_string(heads) + " Hkv " +
               std::to_string(kv_heads) + " D " + std::to_string(dim) + " K " + std::to_string(k) +
               " p " + std::to_string(position) + (position_stable ? " position_stable" : "") +
               (w_constant ? " w_constant" : ""));
  const Operands o = make_operands(heads, kv_heads, dim, k, dtype, position, rng);
  const Tensor x = testing::upload(o.x), nw = testing::upload(o.norm_weight),
               w = testing::upload(o.w), cos = testing::upload(o.cos), sin = testing::upload(o.sin),
               pos = testing::upload(o.position);
  // The two kernels.
  Tensor qkv = Tensor::empty({1, 1, w.size(0)}, dtype, Device::cuda());  // [1, 1, N]
  cuda::rms_norm_matmul(x, nw, kEps, w, qkv, w_constant);
  Tensor k_two = testing::upload(o.k_cache), v_two = testing::upload(o.v_cache);
  Tensor out_two = Tensor::empty({1, heads, 1, dim}, dtype, Device::cuda());
  cuda::rope_kv_append(qkv, cos, sin, pos, k_two, v_two, out_two, position_stable);
  // The fused kernel.
  Tensor k_one = testing::upload(o.k_cache), v_one = testing::upload(o.v_cache);
  Tensor out_one = Tensor::empty({1, heads, 1, dim}, dtype, Device::cuda());
  const cuda::QkvRopeLaunches before = cuda::rms_norm_matmul_rope_kv_append_launches();
  // The early trigger (a scheduling hint) with the stable position, as a session sets both.
  cuda::rms_norm_matmul_rope_kv_append(x, nw, kEps, w, cos, sin, pos, k_one, v_one, out_one,
                                       w_constant, position_stable,
                                       /*trigger_dependents_first=*/position_stable);
  const cuda::QkvRopeLaunches after = cuda::rms_norm_matmul_rope_kv_append_launches();
  EXPECT_EQ(after.launches - before.launches, 1u);
  EXPECT_EQ(after.early_position - before.early_position, position_stable ? 1u : 0u);
  EXPECT_EQ(after.early_weights - before.early_weights, w_constant ? 1u : 0u);
  EXPECT_EQ(after.early_trigger - before.early_trigger, position_stable ? 1u : 0u);
  const Tensor got_out = testing::download(out_one), got_k = testing::download(k_one),
               got_v = testing::download(v_one);
  const Tensor want_out = testing::download(out_two), want_k = testing::download(k_two),
               want_v = testing::download(v_two);
  // `bitwise`: the two-kernel GEMV takes its register prologue in a one-batch instance (gemv.h).
  if (bitwise) {
    EXPECT_TRUE(testing::bit_equal(got_out, want_out))
        << compare_tensors(got_out, want_out, Tolerance{0.0, 0.0}).str();
    EXPECT_TRUE(testing::bit_equal(got_k, want_k))
        << compare_tensors(got_k, want_k, Tolerance{0.0, 0.0}).str();
    EXPECT_TRUE(testing::bit_equal(got_v, want_v))
        << compare_tensors(got_v, want_v, Tolerance{0.0, 0.0}).str();
  } else {
    const Tolerance tol = qkv_rope_tolerance(dtype);
    EXPECT_TRUE(testing::close(got_out, want_out, tol));
    EXPECT_TRUE(testing::close(got_k, want_k, tol));
    EXPECT_TRUE(testing::close(got_v, want_v, tol));
  }
  expect_other_rows_unchanged(got_k, o.k_cache, position);
  expect_other_rows_unchanged(got_v, o.v_cache, position);
  // Against the CPU op (same formula; the CPU sums in another order).
  Tensor k_cpu = o.k_cache.clone(), v_cpu = o.v_cache.clone();
  Tensor out_cpu = Tensor::empty({1, heads, 1, dim}, dtype);
  fused_rms_norm_matmul_rope_kv_append(o.x, o.norm_weight, kEps, o.w, o.cos, o.sin, o.position,
                                       k_cpu, v_cpu, out_cpu);
  const Tolerance tol = qkv_rope_tolerance(dtype);
  EXPECT_TRUE(testing::close(got_out, out_cpu, tol)) << "vs CPU";
  EXPECT_TRUE(testing::close(got_k, k_cpu, tol)) << "vs CPU";
  EXPECT_TRUE(testing::close(got_v, v_cpu, tol)) << "vs CPU";
}

TEST(QkvRopeCuda, FusedKernelMatchesTheTwoKernels) {
  SKIP_WITHOUT_GPU();
  Rng rng(31);
  const std::pair<std::int64_t, std::int64_t> heads[] = {{9, 3}, {4, 4}, {8, 2}};
  for (DType dtype : {DType::bf16, DType::f16})
    for (std::int64_t dim : {64, 128})
      for (const auto& [hq, hkv] : heads)
        for (std::int64_t k : {576, 2048})
          for (std::int64_t p : {std::int64_t{0}, std::int64_t{17}, kCapacity - 1})
            for (bool stable : {false, true})
              for (bool constant : {false, true})
                check_kernel(hq, hkv, dim, k, dtype, p, stable, constant, /*bitwise=*/k <= 768,
                             rng);
}

// The other two per-lane orders: 4 columns per warp in the two-kernel GEMV (n >= 4 x 4 x SMs:
// 3072 and 6144 columns on the H200's 132 SMs; one FMA chain per lane, kPartials false) and the
// 6-slot one-batch instance (K = 1536 at n = 960: 1 column per warp on any GPU with >= 60 SMs),
// both bit for bit.
TEST(QkvRopeCuda, FusedKernelMatchesTheTwoKernelsInEveryOneBatchInstance) {
  SKIP_WITHOUT_GPU();
  Rng rng(34);
  for (DType dtype : {DType::bf16, DType::f16})
    for (bool stable : {false, true}) {
      for (std::int64_t dim : {64, 128})
        check_kernel(32, 8, dim, 576, dtype, 17, stable, /*w_constant=*/true, /*bitwise=*/true,
                     rng);
      check_kernel(9, 3, 64, 1536, dtype, kCapacity - 1, stable, /*w_constant=*/true,
                   /*bitwise=*/true, rng);
    }
}

// ---- 2-8 rows ----

struct BatchCase {
  std::int64_t heads, kv_heads, dim, k, batch;
  DType dtype;
  std::int64_t position;
  bool position_stable, w_constant;
};

std::string batch_label(const BatchCase& c) {
  return std::string(dtype_name(c.dtype)) + " Hq " + std::to_string(c.heads) + " Hkv " +
         std::to_string(c.kv_heads) + " D " + std::to_string(c.dim) + " K " + std::to_string(c.k) +
         " B " + std::to_string(c.batch) + " p " + std::to_string(c.position) +
         (c.position_stable ? " position_stable" : "") + (c.w_constant ? " w_constant" : "");
}

// One batched call against the two CUDA kernels and the CPU op; `fused`: whether the one-launch
// multi-row kernel must take it (else the op runs the two kernels and equals them bit for bit).
void check_batch(const BatchCase& c, bool fused, Rng& rng) {
  SCOPED_TRACE(batch_label(c));
  const std::int64_t n = (c.heads + 2 * c.kv_heads) * c.dim;
  const Tensor hx = testing::random_tensor(rng, {c.batch, 1, c.k}, c.dtype);   // [B, 1, K]
  const Tensor hnorm = testing::random_tensor(rng, {c.k}, c.dtype, 0.1, 1.0);  // [K]
  const Tensor hw = testing::random_tensor(rng, {n, c.k}, c.dtype,
                                           1.0 / std::sqrt(static_cast<double>(c.k)));  // [N, K]
  const auto [hcos, hsin] = rope_tables(kCapacity, c.dim);  // [kCapacity, D] each
  Tensor hpos = Tensor::empty({1}, DType::i32);
  hpos.data<std::int32_t>()[0] = static_cast<std::int32_t>(c.position);
  // [B, Hkv, kCapacity, D] each, random in every row.
  const Tensor hk = testing::random_tensor(rng, {c.batch, c.kv_heads, kCapacity, c.dim}, c.dtype);
  const Tensor hv = testing::random_tensor(rng, {c.batch, c.kv_heads, kCapacity, c.dim}, c.dtype);
  const Tensor x = testing::upload(hx), nw = testing::upload(hnorm), w = testing::upload(hw),
               cos = testing::upload(hcos), sin = testing::upload(hsin),
               pos = testing::upload(hpos);
  // The two kernels.
  Tensor qkv = Tensor::empty({c.batch, 1, n}, c.dtype, Device::cuda());  // [B, 1, N]
  cuda::rms_norm_matmul(x, nw, kEps, w, qkv, c.w_constant);
  Tensor k_two = testing::upload(hk), v_two = testing::upload(hv);
  Tensor out_two = Tensor::empty({c.batch, c.heads, 1, c.dim}, c.dtype, Device::cuda());
  cuda::rope_kv_append(qkv, cos, sin, pos, k_two, v_two, out_two, c.position_stable);
  // The op.
  Tensor k_one = testing::upload(hk), v_one = testing::upload(hv);
  Tensor out_one = Tensor::empty({c.batch, c.heads, 1, c.dim}, c.dtype, Device::cuda());
  const std::uint64_t kernels_before = cuda::gemv::rope_launches();
  cuda::rms_norm_matmul_rope_kv_append(x, nw, kEps, w, cos, sin, pos, k_one, v_one, out_one,
                                       c.w_constant, c.position_stable,
                                       /*trigger_dependents_first=*/c.position_stable);
  EXPECT_EQ(cuda::gemv::rope_launches() - kernels_before, fused ? 1u : 0u)
      << (fused ? "one fused launch" : "the two kernels");
  const Tensor got_out = testing::download(out_one), got_k = testing::download(k_one),
               got_v = testing::download(v_one);
  const Tensor want_out = testing::download(out_two), want_k = testing::download(k_two),
               want_v = testing::download(v_two);
  const Tolerance tol = fused ? qkv_rope_tolerance(c.dtype) : Tolerance{0.0, 0.0};
  EXPECT_TRUE(testing::close(got_out, want_out, tol))
      << compare_tensors(got_out, want_out, tol).str();
  EXPECT_TRUE(testing::close(got_k, want_k, tol)) << compare_tensors(got_k, want_k, tol).str();
  EXPECT_TRUE(testing::close(got_v, want_v, tol)) << compare_tensors(got_v, want_v, tol).str();
  const bool inside = c.position >= 0 && c.position < kCapacity;
  if (inside) {
    expect_other_rows_unchanged(got_k, hk, c.position);
    expect_other_rows_unchanged(got_v, hv, c.position);
  } else {
    EXPECT_TRUE(testing::bit_equal(got_k, hk));
    EXPECT_TRUE(testing::bit_equal(got_v, hv));
    EXPECT_TRUE(testing::bit_equal(got_out, Tensor::zeros(got_out.shape(), c.dtype)));
    return;
  }
  // The CPU op (same formula; the CPU sums in another order).
  Tensor k_cpu = hk.clone(), v_cpu = hv.clone();
  Tensor out_cpu = Tensor::empty({c.batch, c.heads, 1, c.dim}, c.dtype);
  fused_rms_norm_matmul_rope_kv_append(hx, hnorm, kEps, hw, hcos, hsin, hpos, k_cpu, v_cpu,
                                       out_cpu);
  const Tolerance cpu_tol = qkv_rope_tolerance(c.dtype);
  EXPECT_TRUE(testing::close(got_out, out_cpu, cpu_tol)) << "vs CPU";
  EXPECT_TRUE(testing::close(got_k, k_cpu, cpu_tol)) << "vs CPU";
  EXPECT_TRUE(testing::close(got_v, v_cpu, cpu_tol)) << "vs CPU";
}

TEST(QkvRopeCuda, FusedKernelAtTwoToEightRows) {
  SKIP_WITHOUT_GPU();
  Rng rng(35);
  struct Heads {
    std::int64_t heads, kv_heads, dim;
  };
  int cases = 0;
  for (DType dtype : {DType::bf16, DType::f16})
    for (const Heads& h : {Heads{9, 3, 64}, Heads{8, 2, 128}, Heads{3, 1, 10}})
      for (std::int64_t k : {64, 576, 768})
        for (std::int64_t batch : {2, 3, 4, 5, 8}) {
          const std::int64_t positions[] = {0, 17, kCapacity - 1};
          const BatchCase c{
              h.heads,        h.kv_heads,   h.dim, k, batch, dtype, positions[cases % 3],
              cases % 2 == 0, cases % 4 < 2};
          check_batch(c, /*fused=*/true, rng);
          ++cases;
        }
  EXPECT_EQ(cases, 90);
  // Positions outside the caches (both reads of p), and past the multi-row kernel's K.
  for (const std::int64_t bad : {std::int64_t{-1}, kCapacity})
    for (const bool stable : {false, true})
      check_batch({9, 3, 64, 576, 5, DType::bf16, bad, stable, true}, /*fused=*/true, rng);
  check_batch({9, 3, 64, 1536, 3, DType::bf16, 17, true, true}, /*fused=*/false, rng);
}

TEST(QkvRopeCuda, PositionOutsideTheCachesZeroesOutAndWritesNoCache) {
  SKIP_WITHOUT_GPU();
  Rng rng(32);
  const std::int64_t heads = 4, kv_heads = 2, dim = 64, k = 576;
  Operands o = make_operands(heads, kv_heads, dim, k, DType::bf16, 0, rng);
  for (const std::int32_t bad : {-1, static_cast<std::int32_t>(kCapacity)})
    for (const bool stable : {false, true}) {
      SCOPED_TRACE("p " + std::to_string(bad) + (stable ? " position_stable" : ""));
      Tensor pos = Tensor::empty({1}, DType::i32);
      pos.data<std::int32_t>()[0] = bad;
      Tensor k_cache = testing::upload(o.k_cache), v_cache = testing::upload(o.v_cache);
      Tensor out = testing::upload(testing::random_tensor(rng, {1, heads, 1, dim}, DType::bf16));
      cuda::rms_norm_matmul_rope_kv_append(testing::upload(o.x), testing::upload(o.norm_weight),
                                           kEps, testing::upload(o.w), testing::upload(o.cos),
                                           testing::upload(o.sin), testing::upload(pos), k_cache,
                                           v_cache, out, /*w_constant=*/true, stable);
      EXPECT_TRUE(testing::bit_equal(testing::download(out),
                                     Tensor::zeros({1, heads, 1, dim}, DType::bf16)));
      EXPECT_TRUE(testing::bit_equal(testing::download(k_cache), o.k_cache));
      EXPECT_TRUE(testing::bit_equal(testing::download(v_cache), o.v_cache));
    }
}

TEST(QkvRopeCuda, ArgumentErrorsLeaveTheCaches) {
  SKIP_WITHOUT_GPU();
  Rng rng(33);
  const std::int64_t heads = 4, kv_heads = 2, dim = 64;
  auto expect_rejected = [&](auto&& make, auto error_tag, const char* what) {
    using E = decltype(error_tag);
    SCOPED_TRACE(what);
    Operands o = make();
    Tensor k_cache = testing::upload(o.k_cache), v_cache = testing::upload(o.v_cache);
    Tensor out = Tensor::empty({o.x.size(0), heads, 1, dim}, o.k_cache.dtype(), Device::cuda());
    EXPECT_THROW(fused_rms_norm_matmul_rope_kv_append(
                     testing::upload(o.x), testing::upload(o.norm_weight), kEps,
                     testing::upload(o.w), testing::upload(o.cos), testing::upload(o.sin),
                     testing::upload(o.position), k_cache, v_cache, out),
                 E);
    EXPECT_TRUE(testing::bit_equal(testing::download(k_cache), o.k_cache));
    EXPECT_TRUE(testing::bit_equal(testing::download(v_cache), o.v_cache));
  };
  auto operands = [&](std::int64_t k, DType dtype) {
    return make_operands(heads, kv_heads, dim, k, dtype, 3, rng);
  };
  expect_rejected([&] { return operands(576, DType::f32); }, UnsupportedError{""}, "f32");
  expect_rejected([&] { return operands(580, DType::bf16); }, UnsupportedError{""}, "K 580");
  expect_rejected([&] { return operands(4096, DType::bf16); }, UnsupportedError{""}, "K 4096");
  expect_rejected(
      [&] {
        Operands o = operands(576, DType::bf16);
        o.x = testing::random_tensor(rng, {9, 1, 576}, DType::bf16);
        o.k_cache = testing::random_tensor(rng, {9, kv_heads, kCapacity, dim}, DType::bf16);
        o.v_cache = o.k_cache.clone();
        return o;
      },
      UnsupportedError{""}, "batch 9");
  expect_rejected(
      [&] {
        Operands o = operands(576, DType::bf16);
        o.x = testing::random_tensor(rng, {1, 1, 577}, DType::bf16).slice(2, 1, 577);
        return o;
      },
      LayoutError{""}, "misaligned x");
  {
    SCOPED_TRACE("a host norm weight");
    Operands o = operands(576, DType::bf16);
    Tensor k_cache = testing::upload(o.k_cache), v_cache = testing::upload(o.v_cache);
    Tensor out = Tensor::empty({1, heads, 1, dim}, DType::bf16, Device::cuda());
    EXPECT_THROW(
        fused_rms_norm_matmul_rope_kv_append(
            testing::upload(o.x), o.norm_weight, kEps, testing::upload(o.w), testing::upload(o.cos),
            testing::upload(o.sin), testing::upload(o.position), k_cache, v_cache, out),
        DeviceError);
    EXPECT_TRUE(testing::bit_equal(testing::download(k_cache), o.k_cache));
  }
  // The row's limits agree with the kernel's (the contract table is compiled without CUDA).
  const LayerOpContract& row = cuda_layer_ops_contract();
  EXPECT_EQ(row.qkv_rope_max_k, cuda::kQkvRopeMaxK);
  EXPECT_EQ(row.qkv_rope_max_batch, cuda::kQkvRopeMaxBatch);
  EXPECT_EQ(row.qkv_rope_k_multiple, cuda::kQkvRopeKMultiple);
}

SessionOptions gpu_options(bool cuda_graph) {
  SessionOptions options;
  options.device = Device::cuda();
  options.cuda_graph = cuda_graph;
  options.require_cuda_graph = cuda_graph;
  return options;
}

// ---- the region ----

constexpr std::int64_t kRegionHeads = 9, kRegionKvHeads = 3, kRegionDim = 64, kRegionK = 576;

// h [1, 1, K] bf16 -> layers::norm_linear (the rms_norm_matmul region of the stacked q|k|v
// weight) -> layers::rope_kv_append nested with it in the outer region at position k_len - 1;
// outputs q and f32 copies of both caches (through their StateAfter views). Every branch is
// offered by the CUDA row; the outer one is collapsed to `outer_arm`, the inner ones to arm 1.
Graph region_graph(int outer_arm) {
  Graph g;
  const SymExpr k_len = g.declare_symbol("k_len", 1, kCapacity);
  const std::int64_t n = (kRegionHeads + 2 * kRegionKvHeads) * kRegionDim;
  const NodeId h = g.input("h", {SymExpr(1), SymExpr(1), SymExpr(kRegionK)}, DType::bf16);
  Rng rng(43);
  const NodeId norm =
      g.param("norm", testing::random_tensor(rng, {kRegionK}, DType::bf16, 0.1, 1.0));
  const NodeId w = g.param("w", testing::random_tensor(rng, {n, kRegionK}, DType::bf16, 0.04));
  const auto [cos_table, sin_table] = rope_tables(kCapacity, kRegionDim);
  const NodeId cos = g.param("cos", cos_table);
  const NodeId sin = g.param("sin", sin_table);
  const NodeId position = g.sym_value(DynScalar::Expr(k_len - 1), DType::i32);
  const SymShape cache{SymExpr(1), SymExpr(kRegionKvHeads), SymExpr(kCapacity),
                       SymExpr(kRegionDim)};  // [1, Hkv, capacity, D]
  const NodeId k_state = g.state("k_cache", cache, DType::bf16);
  const NodeId v_state = g.state("v_cache", cache, DType::bf16);
  std::vector<LayerOpSpec> specs;
  const NodeId qkv = layers::norm_linear(g, h, norm, kEps, DType::bf16, w, &specs, "qkv");
  const LayerOpSpec projection = specs.at(0);
  const layers::RopeKvAppendOut r =
      layers::rope_kv_append(g, qkv, kRegionHeads, cos, sin, position, k_state, v_state,
                             DynScalar::Expr(k_len - 1), &specs, "region", &projection);
  g.mark_output("q", g.cast(r.q, DType::f32));
  g.mark_output("k_seen", g.cast(r.k_cache, DType::f32));
  g.mark_output("v_seen", g.cast(r.v_cache, DType::f32));
  EXPECT_EQ(specs.size(), 3u);
  std::vector<NodeId> branches;
  for (const LayerOpSpec& s : specs) {
    const OfferResult offer = offer_layer_op_arm(g, s, cuda_layer_ops_contract());
    EXPECT_TRUE(offer.offered) << offer.reason;
    branches.push_back(offer.branch);
  }
  collapse(g, branches[0], 1);
  collapse(g, branches[1], 1);
  collapse(g, branches[2], outer_arm);
  eliminate_dead_code(g);
  verify_graph(g);
  return g;
}

TEST(QkvRopeCuda, ReplayedRegionEqualsPerCallLaunches) {
  SKIP_WITHOUT_GPU();
  const Graph graph = region_graph(1);
  int fused = 0;
  for (NodeId id : graph.live_nodes()) fused += graph.node(id).op == Op::RmsNormMatMulRopeKvAppend;
  ASSERT_EQ(fused, 1);
  testing::PdlScope pdl_scope;
  for (bool pdl : {true, false}) {
    SCOPED_TRACE(pdl ? "PDL" : "no PDL");
    cuda::set_pdl_enabled(pdl);
    Session replayed(graph, gpu_options(true)), eager(graph, gpu_options(false)), cpu(graph);
    Rng rng(8);
    const std::int64_t k_lens[] = {1, 2, 3, 17, 4, 40, 5, 6, 39, 8, 9, 2};
    for (std::size_t step = 0; step < std::size(k_lens); ++step) {
      const std::int64_t k_len = k_lens[step];
      SCOPED_TRACE("k_len " + std::to_string(k_len));
      const Tensor h = testing::random_tensor(rng, {1, 1, kRegionK}, DType::bf16);
      replayed.step({{"k_len", k_len}}, {{"h", h.to_device(Device::cuda())}});
      eager.step({{"k_len", k_len}}, {{"h", h.to_device(Device::cuda())}});
      cpu.step({{"k_len", k_len}}, {{"h", h}});
      if (step >= 2) {
        EXPECT_TRUE(replayed.last_step_replayed()) << replayed.cuda_graph_status();
      }
      for (const char* name : {"q", "k_seen", "v_seen"}) {
        const Tensor got = testing::download(replayed.output(name));
        EXPECT_TRUE(testing::bit_equal(got, testing::download(eager.output(name)))) << name;
        EXPECT_TRUE(testing::close(got, cpu.output(name), qkv_rope_tolerance(DType::bf16)))
            << name << " vs CPU";
      }
      for (const char* name : {"k_cache", "v_cache"})
        EXPECT_TRUE(testing::bit_equal(testing::download(replayed.state(name)),
                                       testing::download(eager.state(name))))
            << name;
    }
  }
}

// ---- the Llama ----

// The tiny bf16 Llama (hidden 128, two heads of 64, one KV head), every outer
// rms_norm_matmul_rope_kv_append branch collapsed to `outer_arm`, attention to the flash arm, every
// other branch to arm 1 (the fused layer ops).
Graph llama(int outer_arm) {
  Graph g = testing::collapsed_rope_kv_append_llama(
      testing::process_temp_path("qkv_rope_cuda_llama"), Device::cuda(),
      [&](const std::string& kind) {
        return kind == "rms_norm_matmul_rope_kv_append" ? outer_arm : 1;
      });
  int fused = 0;
  for (NodeId id : g.live_nodes()) fused += g.node(id).op == Op::RmsNormMatMulRopeKvAppend;
  EXPECT_EQ(fused, outer_arm == 1 ? 2 : 0);
  return g;
}

struct Counts {
  std::uint64_t gemv = 0, rope_kv_append = 0, qkv_rope = 0;
  std::uint64_t qkv_early_position = 0, qkv_early_weights = 0, qkv_early_trigger = 0;
};
Counts counts() {
  const cuda::QkvRopeLaunches q = cuda::rms_norm_matmul_rope_kv_append_launches();
  return {cuda::gemv::launch_stats().launches,
          cuda::rope_kv_append_launches().launches,
          q.launches,
          q.early_position,
          q.early_weights,
          q.early_trigger};
}

TEST(QkvRopeCuda, LlamaIssuesOneKernelFewerPerLayer) {
  SKIP_WITHOUT_GPU();
  constexpr std::uint64_t kLayers = 2;
  const Graph fused_graph = llama(1), plain_graph = llama(0);
  Session fused(fused_graph, gpu_options(true)), plain(plain_graph, gpu_options(true));
  const char* const caches[] = {"model.layers.0.k_cache", "model.layers.0.v_cache",
                                "model.layers.1.k_cache", "model.layers.1.v_cache"};
  for (std::int64_t step = 1; step <= 6; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    Tensor tokens = Tensor::empty({1}, DType::i32);
    tokens.data<std::int32_t>()[0] = static_cast<std::int32_t>(step * 7 % 61);
    const Counts a0 = counts();
    fused.step({{"k_len", step}}, {{"tokens", tokens.to_device(Device::cuda())}});
    const Counts a1 = counts();
    plain.step({{"k_len", step}}, {{"tokens", tokens.to_device(Device::cuda())}});
    const Counts a2 = counts();
    if (step == 1) {  // the eager first step issues every launch
      EXPECT_EQ(a1.qkv_rope - a0.qkv_rope, kLayers);
      // The session's hints: every fused launch reads p before its wait, streams its weight
      // before it and (its q feeds the stable-prefix flash arm) triggers the attention first.
      EXPECT_EQ(a1.qkv_early_position - a0.qkv_early_position, kLayers);
      EXPECT_EQ(a1.qkv_early_weights - a0.qkv_early_weights, kLayers);
      EXPECT_EQ(a1.qkv_early_trigger - a0.qkv_early_trigger, kLayers);
      EXPECT_EQ(a1.rope_kv_append - a0.rope_kv_append, 0u);
      EXPECT_EQ(a2.qkv_rope - a1.qkv_rope, 0u);
      EXPECT_EQ(a2.rope_kv_append - a1.rope_kv_append, kLayers);
      // The qkv GEMV is gone: one kernel fewer per layer.
      const std::uint64_t fused_kernels = (a1.gemv - a0.gemv) + (a1.qkv_rope - a0.qkv_rope);
      const std::uint64_t plain_kernels =
          (a2.gemv - a1.gemv) + (a2.rope_kv_append - a1.rope_kv_append);
      EXPECT_EQ(plain_kernels - fused_kernels, kLayers);
      EXPECT_EQ((a2.gemv - a1.gemv) - (a1.gemv - a0.gemv), kLayers);
    }
    if (step >= 3) {
      EXPECT_TRUE(fused.last_step_replayed()) << fused.cuda_graph_status();
      EXPECT_TRUE(plain.last_step_replayed()) << plain.cuda_graph_status();
    }
    const Tensor got = testing::download(fused.output("logits"));
    const Tensor want = testing::download(plain.output("logits"));
    EXPECT_TRUE(testing::bit_equal(got, want))
        << "logits: " << compare_tensors(got, want, Tolerance{0.0, 0.0}).str();
    for (const char* name : caches)
      EXPECT_TRUE(testing::bit_equal(testing::download(fused.state(name)),
                                     testing::download(plain.state(name))))
          << name;
  }
}

}  // namespace
}  // namespace splice
