// The CUDA launchers' host-side argument checks, without a GPU, in CI too (label `cuda_host`):
// every tensor here is host memory borrowed as a `cuda:0` tensor (testing::FakeDeviceMemory),
// which no check dereferences. A launcher that lost a check would go on to a CUDA call and fail
// with a CudaError (no device here) or launch; each case expects the typed error that names the
// argument. Aliasing: splice::check_output_aliasing and the per-op rules of
// backend/layer_op_checks.h and backend/flash_decode_checks.h, the CPU backend's rules.
//
//   1. Primitives: an out overlapping an input other than as its identical view, an expanded out,
//      a reduce whose out starts inside its input, matmul's out and residual, gather, concat,
//      write_at with host and device offsets.
//   2. Layer ops: rms_norm, silu_mul, rope, rms_norm_matmul, silu_mul_matmul_add,
//      rms_norm_matmul_swiglu, rope_kv_append and rms_norm_matmul_rope_kv_append.
//   3. Flash decode's launcher (what a decode session calls): out inside k, out over q, lse over
//      out; and its checks against the CUDA contract row.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "splice/backend/cuda/flash_decode.h"
#include "splice/backend/cuda/layer_ops.h"
#include "splice/backend/cuda/primitives.h"
#include "splice/backend/cuda/rope_kv_append.h"
#include "splice/core/error.h"
#include "splice/core/tensor.h"
#include "support/test_util.h"

namespace splice {
namespace {

using cpu::BinaryKind;
using cpu::ReduceKind;
using cpu::UnaryKind;

constexpr float kEps = 1e-5f;

void refused(const std::function<void()>& call, const std::string& needle) {
  testing::expect_error_with<LayoutError>(call, needle);
}

TEST(CudaLauncherChecksHost, PrimitivesRefuseOutputsThatShareMemory) {
  testing::FakeDeviceMemory mem(1 << 16);
  Tensor buf = mem.at(0, {8, 16}, DType::f32);                    // [8, 16]
  Tensor top = buf.slice(0, 0, 4), shifted = buf.slice(0, 1, 5);  // [4, 16]: rows 0-3, 1-4
  Tensor expanded = buf.slice(0, 6, 7).expand({4, 16});           // row 6 four times
  refused([&] { cuda::unary(UnaryKind::exp, top, shifted); }, "overlaps `in`");
  refused([&] { cuda::unary(UnaryKind::exp, top, expanded); }, "share an address");
  refused([&] { cuda::binary(BinaryKind::add, top, top, shifted); }, "overlaps `a`");
  refused([&] { cuda::cast(top, shifted); }, "overlaps `in`");
  refused([&] { cuda::softmax(top, 1, shifted); }, "overlaps `in`");
  // Before: an out starting at its input's address passed whatever its shape.
  Tensor sums = buf.select(0, 0).slice(0, 0, 4);  // [4]
  refused([&] { cuda::reduce(ReduceKind::sum, top, 1, false, sums); }, "overlaps `in`");
  const Tensor b = mem.at(256, {16, 4}, DType::f32);  // [16, 4], past buf
  Tensor product_in_a = top.slice(1, 0, 4);           // [4, 4] inside a's rows
  refused([&] { cuda::matmul(top, b, product_in_a); }, "overlaps `a`");
  Tensor product = mem.at(512, {4, 4}, DType::f32);
  Tensor product_expanded = mem.at(528, {1, 4}, DType::f32).expand({4, 4});
  refused([&] { cuda::matmul(top, b, product_expanded); }, "share an address");
  cuda::MatmulOptions with_residual;
  const Tensor residual_shifted = mem.at(513, {4, 4}, DType::f32);
  with_residual.residual = &residual_shifted;
  refused([&] { cuda::matmul(top, b, product, false, with_residual); }, "overlaps `residual`");
  Tensor gathered = buf.slice(0, 6, 8);  // [2, 16]
  const Tensor indices = mem.at(1024, {2}, DType::i32);
  refused([&] { cuda::gather(buf, indices, gathered); }, "overlaps `table`");
  Tensor joined = buf.slice(0, 1, 5);  // [4, 16]: rows 1-4, over inputs[0]'s row 1
  refused(
      [&] {
        cuda::concat({buf.slice(0, 0, 2), buf.slice(0, 6, 8)}, 0, joined);
      },
      "overlaps `inputs[0]`");
  // write_at: a value straddling rows 2 and 3 meets the host-offset window (row 2); with a device
  // offset the window is unknown on the host, so any overlap with the state is refused.
  const Tensor straddling = mem.view(40, {1, 16}, {16, 1}, DType::f32);
  refused([&] { cuda::write_at(buf, straddling, 0, 2); }, "`state window`");
  const Tensor offset = mem.at(1040, {1}, DType::i32);
  refused([&] { cuda::write_at(buf, buf.slice(0, 7, 8), 0, offset); }, "overlaps `value`");
}

TEST(CudaLauncherChecksHost, LayerOpsRefuseOutputsThatShareMemory) {
  testing::FakeDeviceMemory mem(1 << 16);
  Tensor buf = mem.at(0, {6, 8}, DType::bf16);  // [6, 8]
  Tensor x = buf.slice(0, 0, 2), shifted = buf.slice(0, 1, 3), spare = buf.slice(0, 4, 6);
  Tensor expanded = buf.slice(0, 5, 6).expand({2, 8});
  const Tensor weight = mem.at(64, {8}, DType::bf16);
  refused([&] { cuda::rms_norm(x, weight, kEps, shifted); }, "only an identical view");
  refused([&] { cuda::rms_norm(x, weight, kEps, expanded); }, "share an address");
  refused([&] { cuda::silu_mul(x, spare, shifted); }, "overlaps `a`");
  const Tensor cos = mem.at(128, {4, 8}, DType::f32);  // bytes 512..639
  const Tensor position = mem.at(1024, {1}, DType::i32);
  Tensor out_over_cos = mem.at(256, {2, 8}, DType::bf16);  // bytes 512..543
  refused([&] { cuda::rope(x, cos, cos, position, out_over_cos); }, "overlaps `cos`");
  // Products: x [1, 2, 8] against w [4, 8]; out [1, 2, 4].
  const Tensor x3 = x.unsqueeze(0);
  const Tensor w = mem.at(384, {4, 8}, DType::bf16);  // bytes 768..831
  Tensor out_over_weight = mem.view(64, {1, 2, 4}, {8, 4, 1}, DType::bf16);
  refused([&] { cuda::rms_norm_matmul(x3, weight, kEps, w, out_over_weight); },
          "overlaps `weight`");
  const Tensor c = mem.at(512, {1, 2, 4}, DType::bf16);
  Tensor out_next_to_c = mem.at(513, {1, 2, 4}, DType::bf16);  // c shifted by one element
  refused([&] { cuda::silu_mul_matmul_add(x3, spare.unsqueeze(0), w, c, out_next_to_c); },
          "only an identical view");
  Tensor out_in_w = mem.at(384, {1, 2, 2}, DType::bf16);
  refused([&] { cuda::rms_norm_matmul_swiglu(x3, weight, kEps, w, out_in_w); }, "overlaps `w`");
}

TEST(CudaLauncherChecksHost, RopeKvAppendOperandsAndAliasing) {
  testing::FakeDeviceMemory mem(1 << 16);
  // Hq = Hkv = 1, D = 8, capacity 4: qkv [1, 1, 24], caches [1, 1, 4, 8], out [1, 1, 1, 8].
  const Tensor qkv = mem.at(0, {1, 1, 24}, DType::bf16);
  const Tensor cos = mem.at(64, {4, 8}, DType::f32), sin = mem.at(96, {4, 8}, DType::f32);
  const Tensor position = mem.at(600, {1}, DType::i32);  // bytes 2400..2403
  Tensor k_cache = mem.at(512, {1, 1, 4, 8}, DType::bf16);
  Tensor v_cache = mem.at(576, {1, 1, 4, 8}, DType::bf16);
  Tensor out = mem.at(640, {1, 1, 1, 8}, DType::bf16);
  refused([&] { cuda::rope_kv_append(qkv, cos, sin, position, k_cache, k_cache, out); },
          "`k_cache` and `v_cache` must not overlap");
  Tensor out_in_v = v_cache.slice(2, 1, 2);
  refused([&] { cuda::rope_kv_append(qkv, cos, sin, position, k_cache, v_cache, out_in_v); },
          "`v_cache` and `out` must not overlap");
  Tensor k_over_qkv = mem.at(0, {1, 1, 4, 8}, DType::bf16);
  refused([&] { cuda::rope_kv_append(qkv, cos, sin, position, k_over_qkv, v_cache, out); },
          "overlaps `qkv`");
  // The shared operand checks name each argument (the launcher's "shapes disagree" before).
  Tensor out_wide = mem.at(640, {1, 2, 1, 8}, DType::bf16);
  testing::expect_error_with<ShapeError>(
      [&] { cuda::rope_kv_append(qkv, cos, sin, position, k_cache, v_cache, out_wide); },
      "`out` must be [1, 1, 1, 8]");
  // rms_norm_matmul_rope_kv_append: x [1, 1, 16] inside k_cache.
  const Tensor x = mem.at(512, {1, 1, 16}, DType::bf16);
  const Tensor norm_weight = mem.at(1024, {16}, DType::bf16);
  const Tensor w = mem.at(2048, {24, 16}, DType::bf16);
  refused(
      [&] {
        cuda::rms_norm_matmul_rope_kv_append(x, norm_weight, kEps, w, cos, sin, position, k_cache,
                                             v_cache, out);
      },
      "overlaps `x`");
}

TEST(CudaLauncherChecksHost, FlashDecodeLauncherRefusesOutputsThatShareMemory) {
  testing::FakeDeviceMemory mem(1 << 20);
  const Tensor q = mem.at(0, {1, 4, 1, 128}, DType::bf16);  // 512 elements
  Tensor k = mem.at(1024, {1, 1, 64, 128}, DType::bf16);    // 8192 elements
  const Tensor k_len = mem.at(16384, {1}, DType::i32);
  const DecodeAttentionOptions options;
  const auto call = [&](Tensor& out, Tensor* lse) {
    return [&, lse] { cuda::flash_decode(q, k, k, k_len, nullptr, options, out, lse); };
  };
  Tensor out_in_k = k.slice(2, 8, 12).permute({0, 2, 1, 3});  // [1, 4, 1, 128]: rows 8-11 of k
  refused(call(out_in_k, nullptr), "overlaps `k`");
  Tensor out_is_q = q;
  refused(call(out_is_q, nullptr), "overlaps `q`");
  Tensor out = mem.at(20480, {1, 4, 1, 128}, DType::bf16);
  Tensor lse_over_out = mem.at(10240, {1, 4, 1}, DType::f32);  // bytes 40960.., out's first
  refused(call(out, &lse_over_out), "`out` and `lse` must not overlap");
}

// The launcher's checks are the public op's against the CUDA contract row
// (flash_decode_checks::check_call) plus this kernel's own limits; each refusal names the
// argument (the GPU test this replaces allocated device memory for them).
TEST(CudaLauncherChecksHost, FlashDecodeLauncherChecksTheCudaContractRow) {
  testing::FakeDeviceMemory mem(1 << 22);
  const Tensor q = mem.at(0, {1, 4, 1, 128}, DType::bf16);
  const Tensor k = mem.at(4096, {1, 1, 64, 128}, DType::bf16);
  const Tensor k_len = mem.at(65536, {1}, DType::i32);
  Tensor out = mem.at(81920, {1, 4, 1, 128}, DType::bf16);
  const DecodeAttentionOptions options;
  const auto launch = [&](const Tensor& q_, const Tensor& k_, Tensor& out_,
                          const DecodeAttentionOptions& o = {}, const Tensor* alibi = nullptr,
                          Tensor* lse = nullptr) {
    return [&, o, alibi, lse] { cuda::flash_decode(q_, k_, k_, k_len, alibi, o, out_, lse); };
  };
  const Tensor q32 = mem.at(0, {1, 4, 1, 128}, DType::f32);
  testing::expect_error_with<DTypeError>(launch(q32, k, out), "`q` must be bf16 or f16");
  const Tensor q96 = mem.at(0, {1, 4, 1, 96}, DType::bf16);
  const Tensor k96 = mem.at(4096, {1, 1, 64, 96}, DType::bf16);
  Tensor out96 = mem.at(81920, {1, 4, 1, 96}, DType::bf16);
  testing::expect_error_with<UnsupportedError>(launch(q96, k96, out96),
                                               "head_dim must be one of {64, 128, 256}");
  const Tensor q9 = mem.at(0, {1, 4, 9, 128}, DType::bf16);  // past the row's max_sq 8
  Tensor out9 = mem.at(81920, {1, 4, 9, 128}, DType::bf16);
  testing::expect_error_with<UnsupportedError>(launch(q9, k, out9), "q_len must be <= 8");
  const Tensor k_odd = mem.view(4096, {1, 1, 64, 128}, {129 * 64, 129 * 64, 129, 1}, DType::bf16);
  testing::expect_error_with<LayoutError>(launch(q, k_odd, out), "16-byte aligned rows");
  const Tensor q3 = mem.at(0, {1, 3, 1, 128}, DType::bf16);
  const Tensor k2 = mem.at(4096, {1, 2, 64, 128}, DType::bf16);
  Tensor out3 = mem.at(81920, {1, 3, 1, 128}, DType::bf16);
  testing::expect_error_with<ShapeError>(launch(q3, k2, out3), "must be a multiple of");
  const Tensor alibi_strided = mem.view(200000, {4}, {2}, DType::f32);
  testing::expect_error_with<LayoutError>(launch(q, k, out, options, &alibi_strided), "`alibi`");
  DecodeAttentionOptions nan_softcap;
  nan_softcap.softcap = std::numeric_limits<float>::quiet_NaN();
  testing::expect_error_with<ValueError>(launch(q, k, out, nan_softcap), "softcap");
  Tensor lse_short = mem.at(200000, {1, 4}, DType::f32);
  testing::expect_error_with<ShapeError>(launch(q, k, out, options, nullptr, &lse_short), "`lse`");
  const Tensor host_q = Tensor::empty({1, 4, 1, 128}, DType::bf16);
  testing::expect_error_with<DeviceError>(launch(host_q, k, out), "`q`");
}

}  // namespace
}  // namespace splice
