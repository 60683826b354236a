// GPU tests of the CUDA flash-decode kernel (spec decode_attention.md §5) against a float64
// reference written here with plain loops.
//
//   1. Grid: bf16/f16 x head_dim {64, 128, 256} x GQA groups x q_len {1, 3, 8} x causal /
//      windows / softcap / ALiBi / LSE, at k_len 1, 17, 97, 4095, 4097; K/V rows at and beyond
//      k_len are NaN (they must not leak), strides are padded, the output is NaN before the call.
//   2. Ragged batches (k_len per sequence, one of them 0) and misaligned q / out rows.
//   3. Split invariance: forced split counts 1, 2, 5, 13, 64 against the planned one, within
//      2 ulp of the dtype at the output's largest magnitude and 1e-5 relative in the LSE.
//   4. CUDA graph: one capture at the capacity bound replayed with k_len changed in device memory
//      between replays (and K/V re-poisoned beyond each new k_len), each replay against the
//      reference.
//   5. Plan paths: one split (no partials, no counter) and the split merge on both sides of the
//      single-split limit (plan_flash_decode's single_split_keys) for every head_dim, in a grid
//      planned for more splits; the SmolLM2 attention shape (Hq 9, Hkv 3, head_dim 64); merges
//      of more than one load batch (> 16 splits); split 0's speculative K/V tiles (issued before
//      k_len is known) against NaN tails; back-to-back launches on one stream with programmatic
//      dependent launch on and off, each reading the previous call's output.
//   6. Split 0's speculative tile (the first 64 keys, read before k_len is known, up to the
//      capacity) at short k_len in a large NaN-tailed cache (0-700 keys, every head_dim), in
//      graph replays whose k_len crosses the speculated keys and the single-split limit both
//      ways (the model's capacity-256 cache and a merged-split grid), and in back-to-back
//      launches with PDL on and off.
//   7. The stable-prefix promise (k_len and the cache rows below k_len - q_len read before the PDL
//      wait): bitwise the plain kernel over the grid's features, and the rows [k_len - q_len,
//      k_len) written by write_at launches just before, or by a late copy 50 us after the launch
//      started (tests/support/late_copy.h), are the ones read, never their old NaN. Without the
//      promise, a late copy of k_len (from a stale length) and the new rows is what the kernel
//      sees.
//   8. Bad arguments raise the typed errors that name them.
#include "splice/backend/cuda/flash_decode.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "splice/backend/cuda/primitives.h"
#include "splice/backend/cuda/runtime.h"
#include "splice/core/error.h"
#include "splice/core/random.h"
#include "splice/core/tolerance.h"
#include "support/cuda_test_util.h"
#include "support/late_copy.h"
#include "support/test_util.h"

namespace splice {
namespace {

void cuda_ok(cudaError_t status, const char* what) {
  ASSERT_EQ(status, cudaSuccess) << what << ": " << cudaGetErrorString(status);
}

// A tensor with a host copy and a device copy of one padded layout (same strides on both).
struct Mirrored {
  Tensor host_base, host;  // host_base: the whole padded allocation; host: the logical view
  Tensor device_base, device;
  Dims shape;
  std::int64_t pad = 0;

  // Copies the whole padded host allocation (poison included) to the device.
  void upload() {
    device_copy(device_base.raw_data(), device_base.device(), host_base.raw_data(), Device::cpu(),
                host_base.nbytes());
  }
  // Copies the device allocation back and returns the logical host view of it.
  Tensor download() {
    device_copy(host_base.raw_data(), Device::cpu(), device_base.raw_data(), device_base.device(),
                host_base.nbytes());
    return host;
  }
};

Tensor slice_to(const Tensor& base, const Dims& shape) {
  Tensor view = base;
  for (std::size_t axis = 0; axis < shape.size(); ++axis)
    view = view.slice(static_cast<std::int64_t>(axis), 0, shape[axis]);
  return view;
}

// Every axis but the last gets `pad` extra entries; `last_pad` widens the last axis's row (for
// misaligned rows). The host allocation is NaN before anything is written.
Mirrored mirrored(const Dims& shape, DType dtype, std::int64_t pad, std::int64_t last_pad = 0) {
  Mirrored m;
  m.shape = shape;
  m.pad = pad;
  Dims padded = shape;
  for (std::size_t axis = 0; axis + 1 < padded.size(); ++axis) padded[axis] += pad;
  padded.back() += last_pad;
  m.host_base = Tensor::empty(padded, dtype);
  poison_nan(m.host_base);
  m.host = slice_to(m.host_base, shape);
  m.device_base = Tensor::empty(padded, dtype, Device::cuda());
  m.device = slice_to(m.device_base, shape);
  return m;
}

struct Case {
  DType dtype = DType::bf16;
  std::int64_t batch = 1, num_qo_heads = 4, num_kv_heads = 1, q_len = 1, head_dim = 128;
  std::int64_t capacity = 64;
  std::vector<std::int32_t> k_len = {17};  // one value (shared) or one per sequence
  bool causal = true;
  std::optional<std::int64_t> window_left, window_right;
  std::optional<float> softcap;
  bool alibi = false;
  bool want_lse = true;
  std::int64_t num_splits = 0;
  std::int64_t pad = 0;      // padding of every non-last axis of q, k, v, out
  std::int64_t row_pad = 0;  // extra row width of q and out (misaligned rows)
  float softmax_scale = 0.0f;

  std::string str() const {
    std::string s = std::string(dtype_name(dtype)) + " B=" + std::to_string(batch) +
                    " Hq=" + std::to_string(num_qo_heads) + " Hkv=" + std::to_string(num_kv_heads) +
                    " Sq=" + std::to_string(q_len) + " D=" + std::to_string(head_dim) +
                    " cap=" + std::to_string(capacity) + " k_len=";
    for (auto l : k_len) s += std::to_string(l) + ",";
    s += causal ? " causal" : " full";
    if (window_left) s += " wl=" + std::to_string(*window_left);
    if (window_right) s += " wr=" + std::to_string(*window_right);
    if (softcap) s += " softcap=" + std::to_string(*softcap);
    if (alibi) s += " alibi";
    if (num_splits) s += " splits=" + std::to_string(num_splits);
    if (pad) s += " pad=" + std::to_string(pad);
    if (row_pad) s += " row_pad=" + std::to_string(row_pad);
    return s;
  }
  std::int32_t len(std::int64_t b) const { return k_len.size() == 1 ? k_len[0] : k_len[b]; }
};

// The logical elements of a CPU tensor, row-major, as doubles.
std::vector<double> to_doubles(const Tensor& t) {
  std::vector<double> values(static_cast<std::size_t>(t.numel()));
  for (std::int64_t i = 0; i < t.numel(); ++i) values[static_cast<std::size_t>(i)] = t.at_linear(i);
  return values;
}

// The inputs of one case on both sides, and the float64 reference of §5.
struct Problem {
  Case c;
  Mirrored q, k, v, out, lse;
  Tensor k_len_host, k_len_device, alibi_host, alibi_device;

  explicit Problem(const Case& cs, Rng& rng) : c(cs) {
    q = mirrored({c.batch, c.num_qo_heads, c.q_len, c.head_dim}, c.dtype, c.pad, c.row_pad);
    k = mirrored({c.batch, c.num_kv_heads, c.capacity, c.head_dim}, c.dtype, c.pad);
    v = mirrored({c.batch, c.num_kv_heads, c.capacity, c.head_dim}, c.dtype, c.pad);
    out = mirrored({c.batch, c.num_qo_heads, c.q_len, c.head_dim}, c.dtype, c.pad, c.row_pad);
    lse = mirrored({c.batch, c.num_qo_heads, c.q_len}, DType::f32, 0);
    rng.normal(q.host);
    fill_kv(rng);
    q.upload();
    Tensor lens = Tensor::empty({static_cast<std::int64_t>(c.k_len.size())}, DType::i32);
    for (std::size_t i = 0; i < c.k_len.size(); ++i) lens.data<std::int32_t>()[i] = c.k_len[i];
    k_len_host = lens;
    k_len_device = lens.to_device(Device::cuda());
    if (c.alibi) {
      alibi_host = Tensor::empty({c.num_qo_heads}, DType::f32);
      for (std::int64_t h = 0; h < c.num_qo_heads; ++h)  // the usual geometric slopes
        alibi_host.data<float>()[h] =
            std::pow(2.0f, -8.0f * static_cast<float>(h + 1) / static_cast<float>(c.num_qo_heads));
      alibi_device = alibi_host.to_device(Device::cuda());
    }
  }

  // Random K/V below each sequence's k_len, NaN at and beyond it; uploads both.
  void fill_kv(Rng& rng) {
    rng.normal(k.host);
    rng.normal(v.host);
    for (std::int64_t b = 0; b < c.batch; ++b)
      for (std::int64_t h = 0; h < c.num_kv_heads; ++h)
        for (std::int64_t j = c.len(b); j < c.capacity; ++j) {
          const std::int64_t ko = k.host.element_offset({b, h, j, 0});
          const std::int64_t vo = v.host.element_offset({b, h, j, 0});
          for (std::int64_t d = 0; d < c.head_dim; ++d) {
            store_from_double(k.host.storage()->data, c.dtype, ko + d, NAN);
            store_from_double(v.host.storage()->data, c.dtype, vo + d, NAN);
          }
        }
    k.upload();
    v.upload();
  }

  DecodeAttentionOptions options() const {
    DecodeAttentionOptions o;
    o.softmax_scale = c.softmax_scale;
    o.causal = c.causal;
    o.window_left = c.window_left;
    o.window_right = c.window_right;
    o.softcap = c.softcap;
    o.num_splits = c.num_splits;
    return o;
  }

  // Runs the kernel on a NaN-poisoned output; returns (out, lse) on the host.
  std::pair<Tensor, Tensor> run(cuda::Stream stream = nullptr, bool stable_prefix = false) {
    poison_nan(out.host_base);
    out.upload();
    poison_nan(lse.host_base);
    lse.upload();
    Tensor* lse_ptr = c.want_lse ? &lse.device : nullptr;
    cuda::flash_decode(q.device, k.device, v.device, k_len_device,
                       c.alibi ? &alibi_device : nullptr, options(), out.device, lse_ptr, stream,
                       stable_prefix);
    cuda::synchronize();
    return {out.download().clone(), lse.download().clone()};
  }

  // float64 reference of §5: returns (out f32, lse f32) on the host.
  std::pair<Tensor, Tensor> reference() const {
    Tensor ro = Tensor::empty({c.batch, c.num_qo_heads, c.q_len, c.head_dim}, DType::f32);
    Tensor rl = Tensor::empty({c.batch, c.num_qo_heads, c.q_len}, DType::f32);
    const std::int64_t group = c.num_qo_heads / c.num_kv_heads;
    const double scale = c.softmax_scale != 0.0f ? c.softmax_scale
                                                 : 1.0 / std::sqrt(static_cast<double>(c.head_dim));
    const std::vector<double> qd = to_doubles(q.host), kd = to_doubles(k.host),
                              vd = to_doubles(v.host);
    const auto kv_row = [&](std::int64_t b, std::int64_t h, std::int64_t j) {
      return ((b * c.num_kv_heads + h) * c.capacity + j) * c.head_dim;
    };
    std::vector<double> scores, acc(c.head_dim);
    for (std::int64_t b = 0; b < c.batch; ++b) {
      const std::int64_t kl = c.len(b);
      for (std::int64_t h = 0; h < c.num_qo_heads; ++h) {
        const std::int64_t kvh = h / group;
        for (std::int64_t i = 0; i < c.q_len; ++i) {
          const std::int64_t pos = kl - c.q_len + i;
          const double* qrow = qd.data() + ((b * c.num_qo_heads + h) * c.q_len + i) * c.head_dim;
          scores.assign(kl, -INFINITY);
          double best = -INFINITY;
          for (std::int64_t j = 0; j < kl; ++j) {
            if (c.causal && j > pos) continue;
            if (c.window_left && j < pos - *c.window_left) continue;
            if (c.window_right && j > pos + *c.window_right) continue;
            const double* krow = kd.data() + kv_row(b, kvh, j);
            double dot = 0.0;
            for (std::int64_t d = 0; d < c.head_dim; ++d) dot += qrow[d] * krow[d];
            double s = scale * dot;
            if (c.softcap) s = *c.softcap * std::tanh(s / *c.softcap);
            if (c.alibi) s += -static_cast<double>(alibi_host.data<float>()[h]) * (pos - j);
            scores[j] = s;
            best = std::max(best, s);
          }
          std::fill(acc.begin(), acc.end(), 0.0);
          double denom = 0.0;
          if (best != -INFINITY) {
            for (std::int64_t j = 0; j < kl; ++j) {
              if (scores[j] == -INFINITY) continue;
              const double w = std::exp(scores[j] - best);
              denom += w;
              const double* vrow = vd.data() + kv_row(b, kvh, j);
              for (std::int64_t d = 0; d < c.head_dim; ++d) acc[d] += w * vrow[d];
            }
          }
          for (std::int64_t d = 0; d < c.head_dim; ++d)
            ro.set({b, h, i, d}, denom > 0 ? acc[d] / denom : 0.0);
          rl.set({b, h, i}, denom > 0 ? best + std::log(denom) : -INFINITY);
        }
      }
    }
    return {ro, rl};
  }
};

constexpr Tolerance kLseTolerance{1e-4, 1e-4};

void check_case(const Case& c, std::uint64_t seed) {
  SCOPED_TRACE(c.str());
  Rng rng(seed);
  Problem problem(c, rng);
  const auto [out, lse] = problem.run();
  const auto [ref_out, ref_lse] = problem.reference();
  EXPECT_TRUE(testing::close(out, ref_out, default_tolerance(c.dtype)));
  if (c.want_lse) {
    EXPECT_TRUE(testing::close(lse, ref_lse, kLseTolerance));
  }
  // The CPU kernel through the op entry on the same (host) inputs: the previous link of the chain.
  Tensor cpu_lse;
  const Tensor cpu_out = decode_attention(
      problem.q.host, problem.k.host, problem.v.host, problem.k_len_host,
      c.alibi ? &problem.alibi_host : nullptr, problem.options(), Tensor{}, &cpu_lse);
  EXPECT_TRUE(testing::close(out, cpu_out, default_tolerance(c.dtype))) << "vs the CPU kernel";
  if (c.want_lse) {
    EXPECT_TRUE(testing::close(lse, cpu_lse, kLseTolerance)) << "vs the CPU kernel";
  }
}

TEST(FlashDecodeCuda, OpEntryDispatchesToTheCudaKernel) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.num_qo_heads = 8;
  c.num_kv_heads = 2;
  c.q_len = 4;
  c.capacity = 700;
  c.k_len = {600};
  c.alibi = true;
  c.softcap = 30.0f;
  Rng rng(50);
  Problem problem(c, rng);
  Tensor lse;
  const Tensor out =
      decode_attention(problem.q.device, problem.k.device, problem.v.device, problem.k_len_device,
                       &problem.alibi_device, problem.options(), Tensor{}, &lse);
  cuda::synchronize();
  const auto [ref_out, ref_lse] = problem.reference();
  EXPECT_TRUE(testing::close(out.to_device(Device::cpu()), ref_out, default_tolerance(c.dtype)));
  EXPECT_TRUE(testing::close(lse.to_device(Device::cpu()), ref_lse, kLseTolerance));
}

// The value contract k_len[b] in [0, capacity] is not read on the host for a CUDA call (a
// replayed graph never syncs; the kernel clamps k_len into range, stage 2) unless `validate` asks:
// then a bad k_len is the ValueError the CPU backend raises, before anything is written.
TEST(FlashDecodeCuda, ValidateModeChecksKLenOnTheHost) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.batch = 2;
  c.k_len = {40, 64};
  c.want_lse = false;
  Rng rng(71);
  Problem problem(c, rng);
  Tensor bad_host = Tensor::empty({2}, DType::i32);  // [batch]: k_len[1] past the capacity
  bad_host.data<std::int32_t>()[0] = 40;
  bad_host.data<std::int32_t>()[1] = 65;
  const Tensor bad = bad_host.to_device(Device::cuda());
  DecodeAttentionOptions validated = problem.options();
  validated.validate = true;
  poison_nan(problem.out.host_base);
  problem.out.upload();
  try {
    decode_attention(problem.q.device, problem.k.device, problem.v.device, bad, nullptr, validated,
                     problem.out.device);
    ADD_FAILURE() << "validate: no error for k_len 65 > capacity 64";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("`k_len[1]` must be in [0, 64]"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("got 65"), std::string::npos) << e.what();
  }
  cuda::synchronize();
  EXPECT_TRUE(
      testing::bit_equal(problem.out.device_base.to_device(Device::cpu()), problem.out.host_base))
      << "a refused call wrote `out`";
  // Without validate nothing is read on the host: the call runs, and the kernel's clamp makes
  // k_len[1] = 65 attend what 64 attends.
  const Dims out_shape{c.batch, c.num_qo_heads, c.q_len, c.head_dim};
  Tensor clamped = Tensor::empty(out_shape, c.dtype, Device::cuda());   // [B, Hq, Sq, D]
  Tensor in_range = Tensor::empty(out_shape, c.dtype, Device::cuda());  // [B, Hq, Sq, D]
  EXPECT_NO_THROW(decode_attention(problem.q.device, problem.k.device, problem.v.device, bad,
                                   nullptr, problem.options(), clamped));
  decode_attention(problem.q.device, problem.k.device, problem.v.device, problem.k_len_device,
                   nullptr, problem.options(), in_range);
  cuda::synchronize();
  EXPECT_TRUE(
      testing::bit_equal(clamped.to_device(Device::cpu()), in_range.to_device(Device::cpu())));
}

TEST(FlashDecodeCuda, SpecGridMatchesFloat64Reference) {
  SKIP_WITHOUT_GPU();
  const std::int32_t lengths[] = {1, 17, 97, 4095, 4097};
  struct Heads {
    std::int64_t qo, kv;
  };
  const Heads heads[] = {{4, 1}, {8, 8}, {6, 2}, {32, 8}};
  const std::int64_t q_lens[] = {1, 3, 8};
  std::uint64_t seed = 1;
  int index = 0;
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (std::int64_t head_dim : {64, 128, 256}) {
      for (const Heads& hd : heads) {
        for (std::int64_t q_len : q_lens) {
          ++index;
          Case c;
          c.dtype = dtype;
          c.batch = 2;
          c.num_qo_heads = hd.qo;
          c.num_kv_heads = hd.kv;
          c.q_len = q_len;
          c.head_dim = head_dim;
          const std::int32_t len = lengths[index % 5];
          c.k_len = {len};
          c.capacity = len + 3 + index % 7;
          c.pad = index % 3 == 0 ? 2 : 0;
          c.causal = index % 4 != 1;
          if (index % 5 == 2) c.window_left = 5 + index % 11;
          if (index % 7 == 3) c.window_right = 1 + index % 4;
          if (index % 3 == 1) c.softcap = 2.0f + static_cast<float>(index % 5);
          c.alibi = index % 4 == 2;
          c.want_lse = index % 6 != 5;
          if (head_dim == 256 && len > 97 && hd.qo == 32)
            c.k_len = {97};  // keep the reference fast
          if (c.k_len[0] != len) c.capacity = c.k_len[0] + 5;
          check_case(c, seed++);
        }
      }
    }
  }
}

TEST(FlashDecodeCuda, OddLengthsWithPoisonedTails) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 100;
  for (std::int32_t len : {1, 17, 97, 4095, 4097}) {
    for (DType dtype : {DType::bf16, DType::f16}) {
      Case c;
      c.dtype = dtype;
      c.batch = 1;
      c.num_qo_heads = 32;
      c.num_kv_heads = 8;
      c.k_len = {len};
      c.capacity = 8192;
      check_case(c, seed++);
    }
  }
}

// The keys one split takes at most (the plan's device rule), for head_dim `head_dim`.
std::int32_t single_split_keys(std::int64_t head_dim) {
  return cuda::plan_flash_decode(1, 8, 8, 1, head_dim, 1 << 16, 1 << 16, 132).single_split_keys;
}

// For each head_dim, k_len at and around the single-split limit in a grid planned for many
// splits (capacity 4x the limit): at the limit one CTA per (b, kv head) writes o directly (no
// partials, no counter), one key more and the splits merge through global partials.
TEST(FlashDecodeCuda, SingleSplitAndMergeBoundary) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 150;
  for (std::int64_t head_dim : {64, 128, 256}) {
    const std::int32_t limit = single_split_keys(head_dim);
    for (std::int32_t len : {1, limit - 1, limit, limit + 1, 2 * limit + 17}) {
      Case c;
      c.dtype = len % 2 == 0 ? DType::bf16 : DType::f16;
      c.batch = 1;
      c.num_qo_heads = 32;
      c.num_kv_heads = 8;
      c.head_dim = head_dim;
      c.k_len = {len};
      c.capacity = 4 * limit;
      c.causal = len % 3 != 0;
      check_case(c, seed++);
    }
  }
}

// The SmolLM2-135M attention shape (Hq 9, Hkv 3, head_dim 64, one row block of 3 rows) at the
// benchmark's lengths and around the single-split limit (512 keys), capacity 2048, NaN beyond
// k_len; with a left window (no speculative loads) too.
TEST(FlashDecodeCuda, SmolLM2ShapeMatchesFloat64Reference) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 170;
  for (std::int32_t len : {1, 64, 255, 256, 511, 512, 513, 1024, 2047}) {
    Case c;
    c.batch = 1;
    c.num_qo_heads = 9;
    c.num_kv_heads = 3;
    c.head_dim = 64;
    c.k_len = {len};
    c.capacity = 2048;
    c.want_lse = len % 2 == 0;
    check_case(c, seed++);
    c.window_left = 300;
    check_case(c, seed++);
  }
}

TEST(FlashDecodeCuda, RaggedBatchAndEmptySequence) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.batch = 5;
  c.num_qo_heads = 8;
  c.num_kv_heads = 2;
  c.q_len = 2;
  c.capacity = 4100;
  c.k_len = {4097, 0, 1, 17, 2050};
  check_case(c, 200);
  c.dtype = DType::f16;
  c.q_len = 8;
  c.window_left = 100;
  c.k_len = {300, 4095, 8, 0, 1};
  check_case(c, 201);
}

TEST(FlashDecodeCuda, MisalignedQueryAndOutputRows) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.batch = 2;
  c.num_qo_heads = 8;
  c.num_kv_heads = 2;
  c.q_len = 3;
  c.head_dim = 64;
  c.capacity = 300;
  c.k_len = {257};
  c.row_pad = 1;
  check_case(c, 300);
}

// The stated split rounding: P = 2^(t - m) is rounded to the input dtype before P V, and m is the
// running max of the split, so another split rounds the probabilities differently. The output is
// a cancelling weighted mean, so the difference is absolute at the output's scale:
//   |a - b| <= 2 ulp(dtype) * max |b|   (ulp = 2^-7 for bf16, 2^-10 for f16, relative spacing).
::testing::AssertionResult within_split_rounding(const Tensor& a, const Tensor& b, DType dtype) {
  const double ulp = dtype == DType::bf16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -10);
  double scale = 0.0;
  for (std::int64_t i = 0; i < b.numel(); ++i) scale = std::max(scale, std::fabs(b.at_linear(i)));
  return testing::close(a, b, Tolerance{2.0 * ulp * scale, 0.0});
}

TEST(FlashDecodeCuda, OutputIndependentOfSplitCount) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::bf16, DType::f16}) {
    Case c;
    c.dtype = dtype;
    c.batch = 2;
    c.num_qo_heads = 16;
    c.num_kv_heads = 4;
    c.q_len = 4;
    c.capacity = 5000;
    c.k_len = {4097, 1500};
    c.alibi = true;
    Rng rng(400);
    Problem problem(c, rng);
    const auto [base_out, base_lse] = problem.run();
    const auto [ref_out, ref_lse] = problem.reference();
    EXPECT_TRUE(testing::close(base_out, ref_out, default_tolerance(dtype)));
    // 16, 17, 33 and 64 splits take one, two, three and four merge load batches.
    for (std::int64_t splits : {1, 2, 5, 8, 13, 16, 17, 33, 64}) {
      SCOPED_TRACE("num_splits=" + std::to_string(splits));
      problem.c.num_splits = splits;
      const auto [out, lse] = problem.run();
      EXPECT_TRUE(within_split_rounding(out, base_out, dtype));
      EXPECT_TRUE(testing::close(lse, base_lse, Tolerance{1e-6, 1e-5}));
    }
  }
}

// A grid of many (b, kv head) units of 2 MiB of K+V each (16 query and 8 kv heads: one row block a
// unit; kFlashDecodeTailMinUnitBytes), for the plan rules that count CTA slots (the tail and the
// late splits). `slots`: the 4-warp plans' CTA slots on this device.
struct UnitGrid {
  Case c;
  int sm_count = cuda::current_device_facts().sm_count;
  std::int64_t slots = 0;

  explicit UnitGrid(std::int64_t head_dim) {
    c.num_qo_heads = 16;
    c.num_kv_heads = 8;
    c.head_dim = head_dim;
    c.capacity = 4096 * 128 / head_dim;
    slots = std::int64_t{sm_count} * plan(64).ctas_per_sm;  // 512 units: a 4-warp plan
  }
  cuda::FlashDecodePlan plan(std::int64_t batch) const {
    return cuda::plan_flash_decode(batch, c.num_qo_heads, c.num_kv_heads, 1, c.head_dim, c.capacity,
                                   c.capacity, sm_count);
  }
  // `batch` sequences, their lengths `lengths` over and over.
  void set_batch(std::int64_t batch, const std::vector<std::int32_t>& lengths) {
    c.batch = batch;
    c.k_len.clear();
    for (std::int64_t b = 0; b < batch; ++b)
      c.k_len.push_back(lengths[static_cast<std::size_t>(b) % lengths.size()]);
  }
};

// Sets FlashDecodeDevKnobs for a scope and restores them after: `field` (e.g.
// &FlashDecodeDevKnobs::warps; 0: the plan's rule) to `value`.
class ForcedKnob {
 public:
  ForcedKnob(int cuda::FlashDecodeDevKnobs::*field, int value) {
    cuda::FlashDecodeDevKnobs knobs = saved_;
    knobs.*field = value;
    cuda::set_flash_decode_dev_knobs(knobs);
  }
  ~ForcedKnob() { cuda::set_flash_decode_dev_knobs(saved_); }
  ForcedKnob(const ForcedKnob&) = delete;
  ForcedKnob& operator=(const ForcedKnob&) = delete;

 private:
  cuda::FlashDecodeDevKnobs saved_ = cuda::flash_decode_dev_knobs();
};

// The tail split (plan_flash_decode): a one-split grid of more units than CTA slots streams the
// units past its last full wave in kFlashDecodeTailSplits splits, the others in one. Ragged
// lengths (0, 1, within and past the single-split limit) on both sides of split_from_bh, against
// the float64 reference and within split rounding of every unit in one split (a forced count);
// the late-split knob replacing the tail split (every unit's split 0, then 1 or 2 pieces of
// n / 16 or n / 32 a unit) against the reference too.
TEST(FlashDecodeCuda, TailSplitOfAMultiWaveGrid) {
  SKIP_WITHOUT_GPU();
  for (const std::int64_t head_dim : {128, 64}) {
    UnitGrid grid(head_dim);
    // Units = batch * 8 (one row block each) between 2 and 3 waves of 4-warp CTAs.
    const std::int64_t batch = (2 * grid.slots + grid.slots / 2) / grid.c.num_kv_heads;
    const auto plan = grid.plan(batch);
    SCOPED_TRACE("head_dim " + std::to_string(head_dim) + ", split_from_bh " +
                 std::to_string(plan.split_from_bh));
    ASSERT_EQ(plan.warps, 4);
    ASSERT_EQ(plan.num_splits, cuda::kFlashDecodeTailSplits);
    ASSERT_EQ(plan.split_from_bh, 2 * grid.slots);
    const std::int32_t limit = single_split_keys(head_dim);
    grid.set_batch(batch, {static_cast<std::int32_t>(grid.c.capacity), 0, 1, 17, limit, limit + 1,
                           3 * limit + 5});
    const Case& c = grid.c;
    Rng rng(450 + head_dim);
    Problem problem(c, rng);
    const auto [out, lse] = problem.run();
    const auto [ref_out, ref_lse] = problem.reference();
    EXPECT_TRUE(testing::close(out, ref_out, default_tolerance(c.dtype)));
    EXPECT_TRUE(testing::close(lse, ref_lse, Tolerance{1e-5, 1e-5}));
    for (const auto& [late, shift] : {std::pair{1, 4}, std::pair{2, 5}}) {
      ForcedKnob forced(&cuda::FlashDecodeDevKnobs::late_splits, late);
      ForcedKnob pieces(&cuda::FlashDecodeDevKnobs::late_shift, shift);
      const auto [late_out, late_lse] = problem.run();
      EXPECT_TRUE(testing::close(late_out, ref_out, default_tolerance(c.dtype))) << late;
      EXPECT_TRUE(testing::close(late_lse, ref_lse, Tolerance{1e-5, 1e-5})) << late;
    }
    problem.c.num_splits = 1;  // every unit in one split
    const auto [one_out, one_lse] = problem.run();
    EXPECT_TRUE(within_split_rounding(out, one_out, c.dtype));
    EXPECT_TRUE(testing::close(lse, one_lse, Tolerance{1e-6, 1e-5}));
  }
}

// The late splits of a one-wave one-split grid (plan_flash_decode's rule takes them for >= 8 MiB
// of K+V a unit; the knob forces them here on 2 MiB units so the float64 reference stays small):
// every unit's last pieces in CTAs dispatched after every split 0, merged through the global
// workspace. Ragged lengths (0, 1, 17, at and past the single-split limit, short of and at the
// keys 15 pieces of n / 16 need, the capacity) against the float64 reference with the rule's count
// and 1, 8, 10 and 15 pieces of n / 16 and 16 and 24 of n / 32, the stable prefix bit for bit,
// and within split rounding of one split; and halving pieces (the few-idle rule's: n / 16,
// n / 32, ..) of 1-12 pieces from n / 16 and n / 32 around where a unit starts to split.
TEST(FlashDecodeCuda, LateSplitsOfAOneWaveGrid) {
  SKIP_WITHOUT_GPU();
  for (const std::int64_t head_dim : {128, 64}) {
    UnitGrid grid(head_dim);
    const std::int64_t batch = grid.slots / grid.c.num_kv_heads;  // one wave, just under its slots
    const auto plan = grid.plan(batch);
    SCOPED_TRACE("head_dim " + std::to_string(head_dim) + ", batch " + std::to_string(batch));
    ASSERT_EQ(plan.warps, 4);
    ASSERT_EQ(plan.num_splits, 1);
    ASSERT_EQ(plan.split_from_bh, 0);
    ForcedKnob rule_count(&cuda::FlashDecodeDevKnobs::late_splits, cuda::kFlashDecodeLateSplits);
    const std::int32_t limit = single_split_keys(head_dim);
    const auto cap = static_cast<std::int32_t>(grid.c.capacity);
    // Lengths within and past the single-split limit, and on both sides of (L + 1) c for 15
    // pieces of n / 16 (split 0 keeps a piece): 2 limit - 1 keys stay in one split there (c =
    // 2 limit / 16), 2 limit split.
    grid.set_batch(
        batch, {cap, 0, 1, 17, limit, limit + 1, 2 * limit - 1, 2 * limit, cap / 2 + 3, cap - 1});
    const Case& c = grid.c;
    Rng rng(470 + head_dim);
    Problem problem(c, rng);
    const auto [out, lse] = problem.run();
    const auto [ref_out, ref_lse] = problem.reference();
    EXPECT_TRUE(testing::close(out, ref_out, default_tolerance(c.dtype)));
    EXPECT_TRUE(testing::close(lse, ref_lse, Tolerance{1e-5, 1e-5}));
    const auto stable = problem.run(nullptr, /*stable_prefix=*/true);
    EXPECT_TRUE(testing::bit_equal(stable.first, out)) << "stable prefix";
    EXPECT_TRUE(testing::bit_equal(stable.second, lse)) << "stable prefix";
    for (const int late : {1, 8, 10, 15}) {  // pieces of n / 16: split 0 keeps 1 / 16 at 15
      ForcedKnob forced(&cuda::FlashDecodeDevKnobs::late_splits, late);
      const auto [late_out, late_lse] = problem.run();
      EXPECT_TRUE(testing::close(late_out, ref_out, default_tolerance(c.dtype))) << late;
      EXPECT_TRUE(testing::close(late_lse, ref_lse, Tolerance{1e-5, 1e-5})) << late;
    }
    {
      ForcedKnob shift(&cuda::FlashDecodeDevKnobs::late_shift, 5);  // pieces of n / 32
      for (const int late : {16, 24}) {
        ForcedKnob forced(&cuda::FlashDecodeDevKnobs::late_splits, late);
        const auto [late_out, late_lse] = problem.run();
        EXPECT_TRUE(testing::close(late_out, ref_out, default_tolerance(c.dtype))) << late;
        EXPECT_TRUE(testing::close(late_lse, ref_lse, Tolerance{1e-5, 1e-5})) << late;
      }
    }
    {
      ForcedKnob none(&cuda::FlashDecodeDevKnobs::late_splits, 0);  // every unit in one split
      const auto [one_out, one_lse] = problem.run();
      EXPECT_TRUE(within_split_rounding(out, one_out, c.dtype));
      EXPECT_TRUE(testing::close(lse, one_lse, Tolerance{1e-6, 1e-5}));
    }
    {
      // Halving pieces (the few-idle rule's, FlashDecodePlan::late_halving): c, c / 2, ..; around
      // where the unit starts to split (L = 5 of n / 16: 752 keys, 496 of them in the pieces),
      // and counts whose pieces exceed the capacity (L = 8, 12: one split).
      ForcedKnob halving(&cuda::FlashDecodeDevKnobs::late_halving, 1);
      grid.set_batch(batch, {cap, 751, 752, 753, 0, 17, 1000, cap / 2 + 5, cap - 1});
      Problem pieces(grid.c, rng);
      const auto [ref_p_out, ref_p_lse] = pieces.reference();
      for (const int shift : {4, 5})
        for (const int late : {1, 2, 3, 5, 8, 12}) {
          ForcedKnob count(&cuda::FlashDecodeDevKnobs::late_splits, late);
          ForcedKnob size(&cuda::FlashDecodeDevKnobs::late_shift, shift);
          const auto [p_out, p_lse] = pieces.run();
          EXPECT_TRUE(testing::close(p_out, ref_p_out, default_tolerance(c.dtype)))
              << late << " halving from n / 2^" << shift;
          EXPECT_TRUE(testing::close(p_lse, ref_p_lse, Tolerance{1e-5, 1e-5}))
              << late << " halving from n / 2^" << shift;
        }
    }
  }
}

// 4-warp and 8-warp CTAs (the plan picks 8 for small grids of long, split ranges at head_dim <=
// 128, 4 elsewhere; here each width is forced on the same cases): each against the float64
// reference over the features, one split and merged splits, q_len 1 and 8, ragged lengths, the
// stable prefix; and the two widths within the stated split rounding of each other (a width
// deals the tiles to the warps differently, so P is rounded against other running maxima).
TEST(FlashDecodeCuda, NarrowAndWideCtasMatchTheReference) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 450;
  int index = 0;
  for (std::int64_t head_dim : {64, 128}) {
    for (std::int32_t len : {1, 17, 200, 700, 4097}) {
      ++index;
      Case c;
      c.dtype = index % 2 == 0 ? DType::bf16 : DType::f16;
      c.batch = index % 3 == 0 ? 2 : 1;
      c.num_qo_heads = index % 2 == 0 ? 9 : 8;
      c.num_kv_heads = index % 2 == 0 ? 3 : 2;
      c.q_len = index % 4 == 1 ? 8 : 1;
      c.head_dim = head_dim;
      c.capacity = len + 40;
      c.k_len = c.batch == 2 ? std::vector<std::int32_t>{len, len / 2} : std::vector{len};
      if (index % 5 == 2) c.window_left = 50;
      if (index % 3 == 1) c.softcap = 20.0f;
      c.alibi = index % 4 == 3;
      Rng rng(seed++);
      Problem problem(c, rng);
      const auto [ref_out, ref_lse] = problem.reference();
      std::pair<Tensor, Tensor> outs[2];
      for (int w = 0; w < 2; ++w) {
        const int warps = w == 0 ? cuda::kFlashDecodeWarps : cuda::kFlashDecodeWideWarps;
        SCOPED_TRACE(c.str() + " warps=" + std::to_string(warps));
        const ForcedKnob forced(&cuda::FlashDecodeDevKnobs::warps, warps);
        outs[w] = problem.run();
        EXPECT_TRUE(testing::close(outs[w].first, ref_out, default_tolerance(c.dtype)));
        EXPECT_TRUE(testing::close(outs[w].second, ref_lse, kLseTolerance));
        for (std::int64_t splits : {2, 5}) {  // merged splits at every length
          problem.c.num_splits = splits;
          const auto [out, lse] = problem.run();
          problem.c.num_splits = 0;
          EXPECT_TRUE(within_split_rounding(out, outs[w].first, c.dtype)) << "splits " << splits;
        }
        const auto [out, lse] = problem.run(nullptr, /*stable_prefix=*/true);
        EXPECT_TRUE(testing::bit_equal(out, outs[w].first)) << "stable prefix";
      }
      SCOPED_TRACE(c.str());
      EXPECT_TRUE(within_split_rounding(outs[1].first, outs[0].first, c.dtype));
      EXPECT_TRUE(testing::close(outs[1].second, outs[0].second, Tolerance{1e-6, 1e-5}));
    }
  }
}

TEST(FlashDecodeCuda, RepeatedRunsAreBitwiseIdentical) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.num_qo_heads = 32;
  c.num_kv_heads = 8;
  c.capacity = 16384;
  c.k_len = {16000};
  for (std::int32_t len : {16000, 200}) {  // merged splits; one split
    SCOPED_TRACE("k_len=" + std::to_string(len));
    c.k_len = {len};
    Rng rng(500 + len);
    Problem problem(c, rng);
    const auto first = problem.run();
    for (int r = 0; r < 3; ++r) {
      const auto again = problem.run();
      EXPECT_TRUE(testing::bit_equal(again.first, first.first));
      EXPECT_TRUE(testing::bit_equal(again.second, first.second));
    }
  }
}

// What a replay's (out, lse) is checked against: the float64 reference when empty, else this
// (called with the problem as replayed, its outputs and the stream).
using ReplayCheck =
    std::function<void(Problem&, const Tensor& out, const Tensor& lse, cudaStream_t stream)>;

// One capture at the capacity bound, replayed with each schedule entry's k_len per sequence.
void check_graph_replay(Case c, const std::vector<std::vector<std::int32_t>>& schedule,
                        std::uint64_t seed, const ReplayCheck& check = {}) {
  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  Rng rng(seed);
  Problem problem(c, rng);
  problem.run(stream);  // sizes the workspace outside capture

  Tensor* lse_ptr = &problem.lse.device;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  cuda::flash_decode(problem.q.device, problem.k.device, problem.v.device, problem.k_len_device,
                     nullptr, problem.options(), problem.out.device, lse_ptr, stream);
  cuda_ok(cudaStreamEndCapture(stream, &graph), "end capture");
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");

  for (const auto& lens : schedule) {
    std::string trace = "k_len=";
    for (auto l : lens) trace += std::to_string(l) + ",";
    SCOPED_TRACE(trace);
    problem.c.k_len = lens;
    problem.fill_kv(rng);  // fresh data, NaN from the new k_len on
    cuda_ok(cudaMemcpyAsync(problem.k_len_device.raw_data(), lens.data(),
                            lens.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice, stream),
            "k_len upload");
    poison_nan(problem.out.host_base);
    problem.out.upload();
    cuda_ok(cudaGraphLaunch(exec, stream), "replay");
    cuda_ok(cudaStreamSynchronize(stream), "sync");
    const Tensor out = problem.out.download().clone();
    const Tensor lse = problem.lse.download().clone();
    if (check) {
      check(problem, out, lse, stream);
      continue;
    }
    const auto [ref_out, ref_lse] = problem.reference();
    EXPECT_TRUE(testing::close(out, ref_out, default_tolerance(c.dtype)));
    EXPECT_TRUE(testing::close(lse, ref_lse, kLseTolerance));
  }
  cuda_ok(cudaGraphExecDestroy(exec), "exec destroy");
  cuda_ok(cudaGraphDestroy(graph), "graph destroy");
  cuda_ok(cudaStreamDestroy(stream), "stream destroy");
}

TEST(FlashDecodeCuda, GraphReplayWithChangingKLen) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.batch = 2;
  c.num_qo_heads = 32;
  c.num_kv_heads = 8;
  c.q_len = 2;
  c.capacity = 8192;
  c.k_len = {8192, 8192};
  check_graph_replay(c, {{1, 17}, {4095, 4097}, {8192, 1}, {97, 3000}, {0, 5000}, {4097, 4095}},
                     600);
}

// B = 1 at capacity 16384 (a grid of 33 splits): replays switch between one split (<= 256 keys),
// merges of one to three load batches and an empty range, so the merge counters must be back at
// zero after every path; then the SmolLM2 shape at capacity 2048.
void check_plan_path_replays() {
  Case c;
  c.batch = 1;
  c.num_qo_heads = 32;
  c.num_kv_heads = 8;
  c.capacity = 16384;
  c.k_len = {16384};
  check_graph_replay(
      c, {{12000}, {257}, {16384}, {17}, {256}, {2049}, {1}, {0}, {9000}, {3000}, {255}}, 650);
  Case smol;
  smol.batch = 1;
  smol.num_qo_heads = 9;
  smol.num_kv_heads = 3;
  smol.head_dim = 64;
  smol.capacity = 2048;
  smol.k_len = {2048};
  check_graph_replay(smol, {{64}, {513}, {256}, {1024}, {512}, {1}, {2048}, {97}}, 660);
}

TEST(FlashDecodeCuda, GraphReplaySwitchesPlanPaths) {
  SKIP_WITHOUT_GPU();
  check_plan_path_replays();
}

// Launches back to back on one created stream (programmatic dependent launch on): each call's q
// is the previous call's output, which is NaN until that call writes it, and consecutive calls
// share the global-merge workspace. Each output is checked against the reference built from
// the previous output as read back.
// Lengths above `capacity` are clamped to it (a smaller cache keeps the host fill short).
void check_back_to_back(std::uint64_t seed, std::int32_t capacity = 16384) {
  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  const std::int32_t lengths[] = {12000, 9000, 4097, 97, 16384, 1, 256, 257, 4096, 2049};
  Rng rng(seed);
  std::vector<std::unique_ptr<Problem>> chain;
  for (std::int32_t len : lengths) {
    Case c;
    c.batch = 1;
    c.num_qo_heads = 32;
    c.num_kv_heads = 8;
    c.capacity = capacity;
    c.k_len = {std::min(len, capacity)};
    c.causal = false;
    chain.push_back(std::make_unique<Problem>(c, rng));
    poison_nan(chain.back()->out.host_base);
    chain.back()->out.upload();
  }
  for (std::size_t i = 0; i < chain.size(); ++i) {
    Problem& p = *chain[i];
    const Tensor& q = i == 0 ? p.q.device : chain[i - 1]->out.device;
    cuda::flash_decode(q, p.k.device, p.v.device, p.k_len_device, nullptr, p.options(),
                       p.out.device, nullptr, stream);
  }
  cuda_ok(cudaStreamSynchronize(stream), "sync");
  for (std::size_t i = 0; i < chain.size(); ++i) {
    Problem& p = *chain[i];
    SCOPED_TRACE("call " + std::to_string(i) + " k_len=" + std::to_string(p.c.k_len[0]));
    if (i > 0) {  // the reference reads the previous output as this call's q
      const Mirrored& prev = chain[i - 1]->out;
      ASSERT_EQ(prev.host_base.nbytes(), p.q.host_base.nbytes());
      std::memcpy(p.q.host_base.raw_data(), prev.host_base.raw_data(), prev.host_base.nbytes());
    }
    const Tensor out = p.out.download().clone();
    const auto [ref_out, ref_lse] = p.reference();
    EXPECT_TRUE(testing::close(out, ref_out, default_tolerance(p.c.dtype)));
  }
  cuda_ok(cudaStreamDestroy(stream), "stream destroy");
}

TEST(FlashDecodeCuda, BackToBackLaunchesSeeThePreviousOutput) {
  SKIP_WITHOUT_GPU();
  testing::PdlScope restore_pdl;
  for (bool pdl : {true, false}) {
    SCOPED_TRACE(pdl ? "PDL on" : "PDL off");
    cuda::set_pdl_enabled(pdl);
    check_back_to_back(pdl ? 700 : 710);
  }
}

// FlashDecodeDevKnobs::cluster_merge for a scope: -1 the plan's rule, 0 the global merge, 1
// clusters wherever they fit (the splits capped at 16).
struct ForcedMerge : ForcedKnob {
  explicit ForcedMerge(int cluster_merge)
      : ForcedKnob(&cuda::FlashDecodeDevKnobs::cluster_merge, cluster_merge) {}
};

// Runs `problem` under the cluster-merge knob `cluster_merge`; whether the launch merged in
// clusters.
std::pair<Tensor, Tensor> run_merge(Problem& problem, int cluster_merge, bool* clustered,
                                    cuda::Stream stream = nullptr) {
  const ForcedMerge forced(cluster_merge);
  const std::uint64_t before = cuda::flash_decode_launches().cluster_merge;
  auto result = problem.run(stream);
  *clustered = cuda::flash_decode_launches().cluster_merge > before;
  return result;
}

// The cluster merge (a unit's splits in one thread-block cluster, each peer's fp32 partial sent
// into split 0's shared memory with st.async) against the global merge (partials through global
// memory, a counter, the last CTA merges) on the same inputs: bit for bit, out and lse, since both
// fold the same partials in split order through the same code; and both against the float64
// reference. Cases: every head_dim, GQA groups of 1-4 with 1 query and 16 rows (group 2 x 8
// queries), ragged lengths with live split counts from 1 to 16 (8 and 9 on both sides of the
// cluster fold's batch width) and an empty sequence, a window, softcap and ALiBi, a forced split
// count below the plan's (still clusters), and the case the receive area does not fit (16 rows x
// 16 splits at head_dim 64: the global merge).
TEST(FlashDecodeCuda, ClusterMergeIsBitwiseTheGlobalMerge) {
  SKIP_WITHOUT_GPU();
  struct MergeCase {
    Case c;
    bool clusters;  // whether the cluster merge applies (the receive area fits)
  };
  std::vector<MergeCase> cases;
  const auto add = [&](std::int64_t qo, std::int64_t kv, std::int64_t q_len, std::int64_t head_dim,
                       std::int64_t capacity, std::vector<std::int32_t> lens, bool clusters) {
    MergeCase m;
    m.c.num_qo_heads = qo;
    m.c.num_kv_heads = kv;
    m.c.q_len = q_len;
    m.c.head_dim = head_dim;
    m.c.capacity = capacity;
    m.c.batch = static_cast<std::int64_t>(lens.size());
    m.c.k_len = std::move(lens);
    m.clusters = clusters;
    cases.push_back(m);
    return &cases.back().c;
  };
  // Capacities <= 1024 keep the plan at <= 16 splits (64 keys each at least), so capping the
  // splits at 16 changes nothing and both runs split the same way.
  add(32, 8, 1, 128, 1024, {1024}, true);  // issue 5's B = 1 shape, 8 splits of 128 keys
  add(32, 8, 1, 128, 1024, {300}, true)->dtype = DType::f16;  // 5 live splits of 16
  add(9, 3, 1, 64, 1024, {1000}, true);                       // SmolLM2's heads
  add(4, 4, 1, 256, 1024, {1023}, true);                      // head_dim 256, one row
  add(16, 8, 8, 128, 448, {448}, true);                       // 16 rows, 7 splits
  add(8, 2, 1, 128, 1024, {1000, 40, 0}, true);               // ragged: 16 / 1 / no live split
  add(8, 2, 1, 128, 1024, {512, 513}, true);                  // 8 / 9 of 16: 8- / 16-entry folds
  add(8, 2, 8, 64, 1024, {1024}, false);                      // 16 rows x 16 splits: global
  Case* window = add(8, 2, 1, 128, 1024, {1000}, true);       // 601 visible keys, 10 splits
  window->window_left = 600;
  window->softcap = 30.0f;
  window->alibi = true;
  Case* forced = add(8, 2, 1, 128, 1024, {1024}, true);
  forced->num_splits = 5;
  std::uint64_t seed = 1200;
  for (const MergeCase& m : cases) {
    SCOPED_TRACE(m.c.str());
    Rng rng(seed++);
    Problem problem(m.c, rng);
    bool global_clustered = true, cluster_clustered = false;
    const auto [global_out, global_lse] = run_merge(problem, 0, &global_clustered);
    const auto [out, lse] = run_merge(problem, 1, &cluster_clustered);
    EXPECT_FALSE(global_clustered);
    EXPECT_EQ(cluster_clustered, m.clusters);
    EXPECT_TRUE(testing::bit_equal(out, global_out));
    EXPECT_TRUE(testing::bit_equal(lse, global_lse));
    const auto [ref_out, ref_lse] = problem.reference();
    EXPECT_TRUE(testing::close(out, ref_out, default_tolerance(m.c.dtype)));
    EXPECT_TRUE(testing::close(lse, ref_lse, kLseTolerance));
  }
}

// One capture under the cluster merge at the capacity bound, replayed with k_len changed in
// device memory between replays (live splits 1 to 16, an empty range, back): every replay bit for
// bit the eager global merge on the same inputs. Then back-to-back PDL launches whose q is the
// previous output, under the cluster merge.
TEST(FlashDecodeCuda, ClusterMergeGraphReplayAndBackToBack) {
  SKIP_WITHOUT_GPU();
  const ForcedMerge forced(1);
  Case c;
  c.num_qo_heads = 32;
  c.num_kv_heads = 8;
  c.capacity = 1024;
  c.k_len = {1024};
  const std::uint64_t clustered = cuda::flash_decode_launches().cluster_merge;
  check_graph_replay(c, {{1024}, {257}, {17}, {1000}, {0}, {700}, {256}, {1023}}, 1300,
                     [](Problem& problem, const Tensor& out, const Tensor& lse, cudaStream_t s) {
                       bool global_clustered = true;
                       const auto [global_out, global_lse] =
                           run_merge(problem, 0, &global_clustered, s);
                       EXPECT_FALSE(global_clustered);
                       EXPECT_TRUE(testing::bit_equal(out, global_out));
                       EXPECT_TRUE(testing::bit_equal(lse, global_lse));
                     });
  // The warm-up and the captured launch merged in clusters.
  EXPECT_GE(cuda::flash_decode_launches().cluster_merge, clustered + 2);
  check_back_to_back(1310, 1024);
}

// The cluster rule's wide plan for long ranges (B = 1, (32, 8), capacity 16K, and 4K, the rule's
// first bound: 8 eight-warp splits in one cluster per kv head; and head_dim 64 at 8K): one
// capture replayed over live split counts 1 to 8, an empty range and a ragged back-and-forth,
// each against the float64 reference. (Capacity 32K passed too, run 74, at twice the test's
// ~30 s.)
TEST(FlashDecodeCuda, ClusterMergeWideLongRanges) {
  SKIP_WITHOUT_GPU();
  for (const std::int32_t capacity : {16384, 4096}) {
    const auto plan = cuda::plan_flash_decode(1, 32, 8, 1, 128, capacity, capacity,
                                              cuda::current_device_facts().sm_count);
    EXPECT_EQ(plan.cluster, plan.num_splits);
    Case c;
    c.num_qo_heads = 32;
    c.num_kv_heads = 8;
    c.capacity = capacity;
    c.k_len = {capacity};
    if (capacity == 16384)
      check_graph_replay(c, {{16384}, {10240}, {300}, {1}, {0}, {4097}, {16383}}, 1320);
    else
      check_graph_replay(c, {{4096}, {2500}, {300}, {1}, {0}, {4095}, {1100}}, 1321);
  }
  // head_dim 64 at capacity 8K: the same clusters, triggering right after the wait.
  const auto d64 =
      cuda::plan_flash_decode(1, 32, 8, 1, 64, 8192, 8192, cuda::current_device_facts().sm_count);
  EXPECT_EQ(d64.cluster, d64.num_splits);
  Case c;
  c.num_qo_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 64;
  c.capacity = 8192;
  c.k_len = {8192};
  check_graph_replay(c, {{8192}, {5000}, {300}, {1}, {0}, {8191}, {2049}}, 1322);
}

// Split 0's speculative tile (keys [0, 64), issued before k_len is known and read up to the
// capacity) at the model's lengths: short k_len in a large cache whose rows beyond k_len are NaN,
// on both sides of one warp tile (16), of the speculated keys (64) and of the single-split limit,
// for every head_dim; with a left window (no speculation) for comparison.
TEST(FlashDecodeCuda, SpeculativeTileAtShortLengthsInALargeCache) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 900;
  for (std::int64_t head_dim : {64, 128, 256}) {
    const std::int32_t limit = single_split_keys(head_dim);
    for (std::int32_t len : {0, 1, 16, 17, 48, 63, 64, 65, 97, limit, limit + 1, 700}) {
      Case c;
      c.dtype = len % 3 == 0 ? DType::f16 : DType::bf16;
      c.num_qo_heads = head_dim == 64 ? 9 : (head_dim == 128 ? 32 : 8);  // (8, 2): host time
      c.num_kv_heads = head_dim == 64 ? 3 : (head_dim == 128 ? 8 : 2);
      c.head_dim = head_dim;
      c.capacity = 1024;
      c.k_len = {len};
      c.causal = len % 2 == 1;
      check_case(c, seed++);
      if (len == 17 || len == limit + 1) {
        c.window_left = 40;
        check_case(c, seed++);
      }
    }
  }
}

// One capture at the capacity bound, replayed with k_len crossing the speculated keys (64) and
// the single-split limit both ways, K/V NaN beyond each new k_len: the model's SmolLM2 cache
// (capacity 256, one split at every k_len) and (32, 8) head_dim 128 at capacity 1024 (one split
// up to 256 keys, merged splits above); then back-to-back launches on one stream (each call's q
// is the previous output) with PDL on and off, across the same boundaries.
TEST(FlashDecodeCuda, SpeculationGraphReplayAndBackToBack) {
  SKIP_WITHOUT_GPU();
  Case smol;
  smol.batch = 1;
  smol.num_qo_heads = 9;
  smol.num_kv_heads = 3;
  smol.head_dim = 64;
  smol.capacity = 256;
  smol.k_len = {256};
  check_graph_replay(smol, {{17}, {64}, {65}, {1}, {256}, {63}, {0}, {18}, {200}, {16}}, 940);
  Case wide;
  wide.batch = 1;
  wide.num_qo_heads = 32;
  wide.num_kv_heads = 8;
  wide.capacity = 1024;
  wide.k_len = {1024};
  check_graph_replay(wide, {{17}, {1024}, {63}, {257}, {64}, {0}, {65}, {600}, {1}, {256}}, 950);
  testing::PdlScope restore_pdl;
  for (bool pdl : {true, false}) {
    SCOPED_TRACE(pdl ? "PDL on" : "PDL off");
    cuda::set_pdl_enabled(pdl);
    check_back_to_back(pdl ? 960 : 970, 1024);
  }
}

// The head plan (speculating grids: every split's warp w streams keys [16 (W s + w), + 16) first,
// issued before k_len is known, then its share of the keys past the head region of
// 16 W num_splits keys): one capture at the capacity bound replayed across the single-split
// limit, the head region's end (1024 keys for (32, 8)'s 8 eight-warp splits at 4K, 512 for the
// 4-warp plan at 1K and head_dim 64's) and tile edges on both sides, K/V NaN beyond each k_len;
// then q_len 3 causal and ragged batches through check_case.
TEST(FlashDecodeCuda, HeadPlanAcrossTheHeadRegion) {
  SKIP_WITHOUT_GPU();
  Case base;  // (32, 8) at capacity 4096: 8 eight-warp splits, a 1024-key head region
  base.num_qo_heads = 32;
  base.num_kv_heads = 8;
  base.capacity = 4096;
  base.k_len = {4096};
  check_graph_replay(
      base,
      {{4096}, {1024}, {1025}, {1023}, {257}, {256}, {1041}, {3000}, {129}, {2049}, {1}, {4095}},
      1400);
  Case c = base;
  c.capacity = 1024;
  c.k_len = {1024};
  check_graph_replay(c, {{1024}, {512}, {513}, {511}, {300}, {1000}}, 1410);
  c = base;
  c.head_dim = 64;
  check_graph_replay(c, {{4096}, {2048}, {2049}, {513}, {700}, {1100}}, 1420);
  std::uint64_t seed = 1430;
  for (std::int32_t len : {1023, 1025, 1041, 2500}) {
    Case q3 = base;
    q3.q_len = 3;
    q3.k_len = {len};
    q3.window_right = len % 2 == 0 ? std::optional<std::int64_t>(1) : std::nullopt;
    check_case(q3, seed++);
  }
  Case ragged = base;
  ragged.batch = 2;
  ragged.k_len = {1500, 300};
  check_case(ragged, seed++);
}

// The stable-prefix promise (k_len and the rows below k_len - q_len read before the PDL wait)
// changes when loads are issued, never what is computed: bitwise the plain kernel's output and
// LSE over head dims, q_len, both plan paths, windows, ALiBi, softcap and ragged batches.
TEST(FlashDecodeCuda, StablePrefixIsBitwiseThePlainKernel) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 1100;
  std::vector<Case> cases;
  for (std::int64_t head_dim : {64, 128, 256}) {
    const std::int32_t limit = single_split_keys(head_dim);
    for (std::int64_t q_len : {1, 3, 8})
      for (std::int32_t len : {0, 1, 17, 97, limit, limit + 1, 3000}) {
        if (len > 0 && len < q_len) continue;
        Case c;
        c.dtype = len % 2 == 0 ? DType::f16 : DType::bf16;
        c.num_qo_heads = head_dim == 64 ? 9 : 8;
        c.num_kv_heads = head_dim == 64 ? 3 : 2;
        c.head_dim = head_dim;
        c.q_len = q_len;
        c.capacity = 3072;
        c.k_len = {len};
        cases.push_back(c);
      }
  }
  Case windowed;
  windowed.capacity = 2048;
  windowed.k_len = {1500};
  windowed.q_len = 3;
  windowed.window_left = 700;
  windowed.window_right = 0;
  windowed.alibi = true;
  windowed.softcap = 30.0f;
  cases.push_back(windowed);
  Case ragged;
  ragged.batch = 3;
  ragged.num_qo_heads = 32;
  ragged.num_kv_heads = 8;
  ragged.capacity = 4096;
  ragged.k_len = {4096, 0, 33};
  cases.push_back(ragged);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.str());
    Rng rng(seed++);
    Problem problem(c, rng);
    const auto plain = problem.run();
    const auto stable = problem.run(nullptr, /*stable_prefix=*/true);
    EXPECT_TRUE(testing::bit_equal(stable.first, plain.first));
    EXPECT_TRUE(testing::bit_equal(stable.second, plain.second));
  }
}

// One sequence of `len` keys in a 1024-key cache, (Hq, Hkv) = (9, 3) at head_dim 64 and (32, 8)
// at 128: the cases of the PDL producer tests below.
Case pdl_case(std::int64_t head_dim, std::int64_t q_len, std::int32_t len) {
  Case c;
  c.num_qo_heads = head_dim == 64 ? 9 : 32;
  c.num_kv_heads = head_dim == 64 ? 3 : 8;
  c.head_dim = head_dim;
  c.q_len = q_len;
  c.capacity = 1024;
  c.k_len = {len};
  return c;
}

// The device copies that put rows [first, first + n) of `cache` ([B, Hkv, capacity, D], batch 0)
// from `rows` ([1, Hkv, n, D], contiguous, on the device): one a head where the cache's rows are
// contiguous, else one a (head, row).
std::vector<testing::DeviceCopy> row_copies(const Tensor& cache, const Tensor& rows,
                                            std::int64_t first) {
  std::vector<testing::DeviceCopy> copies;
  const std::size_t es = dtype_size(cache.dtype());
  const std::int64_t head_dim = cache.shape()[3], n = rows.shape()[2];
  const bool dense = cache.strides()[3] == 1 && cache.strides()[2] == head_dim;
  auto at = [es](const Tensor& t, const Dims& index) {
    return static_cast<char*>(t.storage()->data) + t.element_offset(index) * es;
  };
  for (std::int64_t h = 0; h < cache.shape()[1]; ++h)
    for (std::int64_t i = 0; i < n; i += dense ? n : 1)
      copies.push_back({at(cache, {0, h, first + i, 0}), at(rows, {0, h, i, 0}),
                        static_cast<std::size_t>((dense ? n : 1) * head_dim) * es});
  return copies;
}

// The promise's other half: the rows [k_len - q_len, k_len) are written by the kernel just before,
// and the stable-prefix kernel must read them after its wait, not the NaN they held before. Two
// producers: two write_at launches (PDL on), and a late copy (testing::launch_late_copies: the
// rows land 50 us after the flash launch started, so a read of them before its wait would see
// NaN for certain). Repeated on one stream, the caches re-poisoned between rounds.
TEST(FlashDecodeCuda, StablePrefixReadsTheRowsItsProducerWrites) {
  SKIP_WITHOUT_GPU();
  const testing::PdlStream pdl_stream;
  const cudaStream_t stream = pdl_stream.get();
  std::uint64_t seed = 1200;
  for (std::int64_t head_dim : {64, 128}) {
    for (std::int64_t q_len : {1, 4}) {
      for (std::int32_t len : {5, 40, 200, 700}) {
        const Case c = pdl_case(head_dim, q_len, len);
        SCOPED_TRACE(c.str());
        Rng rng(seed++);
        Problem problem(c, rng);  // rows >= len are NaN in the caches
        // The new rows [len - q_len, len): random on the host, NaN in the device caches.
        const Dims rows_shape{c.batch, c.num_kv_heads, q_len, head_dim};
        Tensor new_k = Tensor::empty(rows_shape, c.dtype),
               new_v = Tensor::empty(rows_shape, c.dtype);
        rng.normal(new_k);
        rng.normal(new_v);
        const std::int64_t first_new = len - q_len;
        // Writes the new rows (or NaN) into the host caches.
        const auto set_new_rows = [&](bool values) {
          for (std::int64_t h = 0; h < c.num_kv_heads; ++h)
            for (std::int64_t i = 0; i < q_len; ++i)
              for (std::int64_t d = 0; d < head_dim; ++d) {
                problem.k.host.set({0, h, first_new + i, d}, values ? new_k.at({0, h, i, d}) : NAN);
                problem.v.host.set({0, h, first_new + i, d}, values ? new_v.at({0, h, i, d}) : NAN);
              }
        };
        set_new_rows(true);
        const auto [ref_out, ref_lse] = problem.reference();  // sees the new rows
        set_new_rows(false);
        const Tensor new_k_device = new_k.to_device(Device::cuda());
        const Tensor new_v_device = new_v.to_device(Device::cuda());
        Tensor offset = Tensor::empty({1}, DType::i64);
        offset.data<std::int64_t>()[0] = first_new;
        const Tensor offset_device = offset.to_device(Device::cuda());
        std::vector<testing::DeviceCopy> late =
            row_copies(problem.k.device, new_k_device, first_new);
        for (const auto& copy : row_copies(problem.v.device, new_v_device, first_new))
          late.push_back(copy);
        for (int round = 0; round < 8; ++round) {
          const bool late_copy = round % 2 == 1;
          problem.k.upload();  // NaN in the new rows again
          problem.v.upload();
          poison_nan(problem.out.host_base);
          problem.out.upload();
          if (late_copy) {
            cuda::synchronize();  // the uploads (legacy stream) before the late copy
            testing::launch_late_copies(late, testing::kLateCopyDelayUs, stream);
          } else {
            cuda::StreamGuard on(stream);
            Tensor k_cache = problem.k.device, v_cache = problem.v.device;
            cuda::write_at(k_cache, new_k_device, 2, offset_device);
            cuda::write_at(v_cache, new_v_device, 2, offset_device);
          }
          cuda::flash_decode(problem.q.device, problem.k.device, problem.v.device,
                             problem.k_len_device, nullptr, problem.options(), problem.out.device,
                             nullptr, stream, /*stable_prefix=*/true);
          cuda_ok(cudaStreamSynchronize(stream), "sync");
          const Tensor out = problem.out.download().clone();
          EXPECT_TRUE(testing::close(out, ref_out, default_tolerance(c.dtype)))
              << "round " << round << (late_copy ? " (late copy)" : " (write_at)");
        }
      }
    }
  }
}

// Without the promise nothing is read before the PDL wait: a late copy (testing::
// launch_late_copies) rewrites k_len from a stale value (0, one key, the capacity, or a length
// that crosses the single-split limit the other way) and writes the rows [k_len - q_len, k_len)
// 50 us after the flash launch started; the kernel must see the new length and rows. Both plan
// paths (the head plan at head_dim 128, one split and merged splits).
TEST(FlashDecodeCuda, PlainKernelReadsKLenAfterItsWait) {
  SKIP_WITHOUT_GPU();
  const testing::PdlStream pdl_stream;
  const cudaStream_t stream = pdl_stream.get();
  std::uint64_t seed = 1300;
  for (std::int64_t head_dim : {64, 128}) {
    const std::int32_t limit = single_split_keys(head_dim);
    for (std::int64_t q_len : {1, 4}) {
      for (std::int32_t len : {5, limit + 1, 1000}) {
        const Case c = pdl_case(head_dim, q_len, len);
        SCOPED_TRACE(c.str());
        Rng rng(seed++);
        Problem problem(c, rng);  // rows >= len are NaN in the caches
        const auto [ref_out, ref_lse] = problem.reference();
        // The new rows as the producer writes them, then NaN in the device caches.
        const std::int64_t first_new = len - q_len;
        const Tensor new_k =
            problem.k.host.slice(2, first_new, len).clone().to_device(Device::cuda());
        const Tensor new_v =
            problem.v.host.slice(2, first_new, len).clone().to_device(Device::cuda());
        for (std::int64_t h = 0; h < c.num_kv_heads; ++h)
          for (std::int64_t i = first_new; i < len; ++i)
            for (std::int64_t d = 0; d < head_dim; ++d) {
              problem.k.host.set({0, h, i, d}, NAN);
              problem.v.host.set({0, h, i, d}, NAN);
            }
        const Tensor fresh_len = problem.k_len_host.to_device(Device::cuda());
        std::vector<testing::DeviceCopy> late = row_copies(problem.k.device, new_k, first_new);
        for (const auto& copy : row_copies(problem.v.device, new_v, first_new))
          late.push_back(copy);
        late.push_back(
            {problem.k_len_device.raw_data(), fresh_len.raw_data(), sizeof(std::int32_t)});
        for (std::int32_t stale :
             {0, 1, static_cast<std::int32_t>(c.capacity), len > limit ? 17 : limit + 1}) {
          problem.k.upload();
          problem.v.upload();
          poison_nan(problem.out.host_base);
          problem.out.upload();
          device_copy(problem.k_len_device.raw_data(), Device::cuda(), &stale, Device::cpu(),
                      sizeof(stale));
          cuda::synchronize();
          testing::launch_late_copies(late, testing::kLateCopyDelayUs, stream);
          cuda::flash_decode(problem.q.device, problem.k.device, problem.v.device,
                             problem.k_len_device, nullptr, problem.options(), problem.out.device,
                             nullptr, stream);
          cuda_ok(cudaStreamSynchronize(stream), "sync");
          const Tensor out = problem.out.download().clone();
          EXPECT_TRUE(testing::close(out, ref_out, default_tolerance(c.dtype)))
              << "stale k_len " << stale;
        }
      }
    }
  }
}

// The aliasing rule (backend/flash_decode_checks.h) on the launcher a session calls: out inside
// the KV cache, out over q, lse over out, an expanded out; refused before the launch, the cache's
// bytes unchanged.
TEST(FlashDecodeCuda, OutputsThatShareMemoryAreRefused) {
  SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda();
  Rng rng(23);
  const Tensor q = testing::upload(testing::random_tensor(rng, {1, 4, 1, 128}, DType::bf16));
  const Tensor k_host = testing::random_tensor(rng, {1, 1, 64, 128}, DType::bf16);
  Tensor k = testing::upload(k_host);
  Tensor k_len_host = Tensor::empty({1}, DType::i32);
  k_len_host.data<std::int32_t>()[0] = 64;
  const Tensor k_len = testing::upload(k_len_host);
  const DecodeAttentionOptions options;
  const auto refused = [&](Tensor& out, Tensor* lse, const std::string& needle) {
    testing::expect_error_with<LayoutError>(
        [&] { cuda::flash_decode(q, k, k, k_len, nullptr, options, out, lse); }, needle);
  };
  Tensor out_in_k = k.slice(2, 8, 12).permute({0, 2, 1, 3});  // [1, 4, 1, 128]: rows 8-11 of k
  refused(out_in_k, nullptr, "overlaps `k`");
  Tensor out_is_q = q;
  refused(out_is_q, nullptr, "overlaps `q`");
  Tensor expanded = Tensor::empty({1, 1, 1, 128}, DType::bf16, gpu).expand({1, 4, 1, 128});
  refused(expanded, nullptr, "share an address");
  Tensor out = Tensor::empty({1, 4, 1, 128}, DType::bf16, gpu);
  Tensor lse_over_out = Tensor::view_of(out.storage(), 0, {1, 4, 1}, {4, 1, 1}, DType::f32);
  refused(out, &lse_over_out, "`out` and `lse` must not overlap");
  cuda::synchronize();
  EXPECT_TRUE(testing::bit_equal(testing::download(k), k_host));
}

}  // namespace
}  // namespace splice
