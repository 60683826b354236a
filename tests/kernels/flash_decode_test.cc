// CPU flash-decode attention against the float64 reference (spec decode_attention.md §5), and
// every validation error of the `decode_attention` op.
//
//  1. Grid: a deterministic sample of the cross product batch 1..4 x (Hq, Hkv) in {(1,1), (4,1),
//     (12,4), (32,8)} x D in {64, 128} x Sq in {1, 2, 4} x k_len in {1, 17, 255, 256, 4097,
//     capacity} x one or ragged per-sequence lengths (including 0) x causal / window_left /
//     window_right / softcap / alibi / lse each on and off x bf16 / f16 / f32 x padded strides x
//     num_splits. Large cases shrink (batch, then Sq, then heads) to keep the file fast; a
//     coverage check asserts every axis value still appears several times.
//  2. Every key no query may see (at or beyond k_len, outside every window) and every padding
//     element is NaN, so any stray read shows up as NaN in the output.
//  3. Outputs compare with the contract row's tolerance for the output dtype; the LSE (f32) with
//     the f32 tolerance; the padding around a preallocated output must stay NaN (untouched).
//  4. Split counts 1, 2, 3, 7, 16 and planned agree within rounding; rows with no visible key are
//     zeros with LSE -inf; 16-bit storage conversions are exact for every bit pattern.
//  5. Each argument's typed error, with the argument named in the message.
#include "splice/backend/cpu/flash_decode.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "splice/core/error.h"
#include "splice/ops/contract.h"
#include "splice/ops/decode_attention.h"
#include "support/reference_attention.h"
#include "support/test_util.h"

namespace splice {
namespace {

using testing::close;
using testing::padded_tensor;
using testing::reference_decode_attention;

constexpr std::uint64_t kGridSeed = 0x5EED'F1A5'4DEC'0DE5ull;
constexpr int kGridCases = 160;
// Upper bound on batch * Hq * Sq * k_len * D per grid case (the float64 reference dominates).
constexpr std::int64_t kCaseCostBudget = 24'000'000;
constexpr int kMinAxisCoverage = 3;
constexpr std::int64_t kPad = 3;

// ---- fast deterministic inputs -----------------------------------------------------------------

// splitmix64 driving an Irwin-Hall(4) approximation of N(0, 1): cheap enough for the 10^7
// elements of a large KV cache, realistic in range.
class FastNormal {
 public:
  explicit FastNormal(std::uint64_t seed) : state_(seed) {}
  double next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    double sum = 0.0;
    for (int part = 0; part < 4; ++part) sum += static_cast<double>((z >> (16 * part)) & 0xFFFF);
    constexpr double kMean = 4 * 65535.0 / 2, kStd = 65536.0 * 0.5773502691896258;  // sqrt(4/12)
    return (sum - kMean) / kStd;
  }

 private:
  std::uint64_t state_;
};

// Writes row [a, b, c, :] of a rank-4 tensor from `gen`, or NaN when gen is null.
void write_row(Tensor& t, std::int64_t a, std::int64_t b, std::int64_t c, FastNormal* gen) {
  const std::int64_t base = t.offset() + a * t.stride(0) + b * t.stride(1) + c * t.stride(2);
  for (std::int64_t d = 0; d < t.size(3); ++d)
    store_from_double(t.storage()->data, t.dtype(), base + d * t.stride(3),
                      gen ? gen->next() : std::nan(""));
}

Tensor make_tensor(const Dims& shape, DType dtype, bool padded) {
  return padded ? padded_tensor(shape, dtype, kPad) : Tensor::empty(shape, dtype);
}

// Number of elements of the storage behind `t` (owned storage only).
std::int64_t storage_elements(const Tensor& t) {
  return static_cast<std::int64_t>(t.storage()->bytes / dtype_size(t.dtype()));
}

std::int64_t count_nan_in_storage(const Tensor& t) {
  std::int64_t nans = 0;
  for (std::int64_t x = 0; x < storage_elements(t); ++x)
    nans += std::isnan(load_as_double(t.storage()->data, t.dtype(), x)) ? 1 : 0;
  return nans;
}

// ---- one grid case -----------------------------------------------------------------------------

struct Case {
  std::int64_t batch = 1, num_qo_heads = 1, num_kv_heads = 1, head_dim = 64, q_len = 1;
  std::vector<std::int64_t> k_lens;  // [batch] or [1]
  std::int64_t capacity = 1;
  DType dtype = DType::bf16;
  bool padded = false, alibi = false, lse = false;
  DecodeAttentionOptions options;

  std::string str() const {
    std::ostringstream out;
    out << dtype_name(dtype) << " B=" << batch << " Hq=" << num_qo_heads << " Hkv=" << num_kv_heads
        << " D=" << head_dim << " Sq=" << q_len << " cap=" << capacity
        << " k_len=" << dims_str(k_lens) << " causal=" << options.causal;
    if (options.window_left) out << " wl=" << *options.window_left;
    if (options.window_right) out << " wr=" << *options.window_right;
    if (options.softcap) out << " softcap=" << *options.softcap;
    if (options.softmax_scale != 0.0f) out << " scale=" << options.softmax_scale;
    out << " alibi=" << alibi << " lse=" << lse << " padded=" << padded
        << " splits=" << options.num_splits;
    return out.str();
  }
  std::int64_t cost() const {
    std::int64_t longest = 0;
    for (auto len : k_lens) longest = std::max(longest, len);
    return batch * num_qo_heads * q_len * std::max<std::int64_t>(longest, 1) * head_dim;
  }
  std::int64_t len_of(std::int64_t b) const { return k_lens[k_lens.size() == 1 ? 0 : b]; }
  // Spec §5 visibility of key j to query row i of sequence b.
  bool visible(std::int64_t b, std::int64_t i, std::int64_t j) const {
    const std::int64_t len = len_of(b), p = len - q_len + i;
    if (j < 0 || j >= len) return false;
    if (options.causal && j > p) return false;
    if (options.window_left && j < p - *options.window_left) return false;
    if (options.window_right && j > p + *options.window_right) return false;
    return true;
  }
};

struct Inputs {
  Tensor q, k, v, k_len, alibi;
};

// Random q; k and v random exactly where some query may look, NaN everywhere else.
Inputs make_inputs(const Case& c, std::uint64_t seed) {
  FastNormal gen(seed);
  Inputs in;
  in.q = make_tensor({c.batch, c.num_qo_heads, c.q_len, c.head_dim}, c.dtype, c.padded);
  in.k = make_tensor({c.batch, c.num_kv_heads, c.capacity, c.head_dim}, c.dtype, c.padded);
  in.v = make_tensor({c.batch, c.num_kv_heads, c.capacity, c.head_dim}, c.dtype, c.padded);
  for (std::int64_t b = 0; b < c.batch; ++b) {
    for (std::int64_t h = 0; h < c.num_qo_heads; ++h)
      for (std::int64_t i = 0; i < c.q_len; ++i) write_row(in.q, b, h, i, &gen);
    for (std::int64_t j = 0; j < c.capacity; ++j) {
      bool seen = false;
      for (std::int64_t i = 0; i < c.q_len && !seen; ++i) seen = c.visible(b, i, j);
      for (std::int64_t h = 0; h < c.num_kv_heads; ++h) {
        write_row(in.k, b, h, j, seen ? &gen : nullptr);
        write_row(in.v, b, h, j, seen ? &gen : nullptr);
      }
    }
  }
  in.k_len = Tensor::empty({static_cast<std::int64_t>(c.k_lens.size())}, DType::i32);
  for (std::size_t b = 0; b < c.k_lens.size(); ++b)
    in.k_len.set({static_cast<std::int64_t>(b)}, static_cast<double>(c.k_lens[b]));
  if (c.alibi) {
    // The usual geometric ALiBi slopes 2^(-8 (h + 1) / Hq).
    in.alibi = Tensor::empty({c.num_qo_heads}, DType::f32);
    for (std::int64_t h = 0; h < c.num_qo_heads; ++h)
      in.alibi.set(
          {h}, std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(c.num_qo_heads)));
  }
  return in;
}

// Runs the op and the reference on fresh inputs and checks output, LSE and untouched padding.
void run_case(const Case& c, std::uint64_t seed) {
  SCOPED_TRACE(c.str());
  const Inputs in = make_inputs(c, seed);
  const Tensor* alibi = c.alibi ? &in.alibi : nullptr;
  Tensor out, lse;
  if (c.padded) {  // caller-provided strided outputs whose padding must stay NaN
    out = padded_tensor({c.batch, c.num_qo_heads, c.q_len, c.head_dim}, c.dtype, kPad);
    lse = padded_tensor({c.batch, c.num_qo_heads, c.q_len}, DType::f32, kPad);
  }
  out = decode_attention(in.q, in.k, in.v, in.k_len, alibi, c.options, out, c.lse ? &lse : nullptr);
  Tensor ref_lse;
  const Tensor ref = reference_decode_attention(in.q, in.k, in.v, in.k_len, alibi, c.options,
                                                c.lse ? &ref_lse : nullptr);
  const AttentionContract& row = cpu_flash_decode_contract();
  EXPECT_EQ(out.dtype(), c.dtype) << "the output is in q's dtype (spec §5)";
  EXPECT_EQ(out.shape(), in.q.shape());
  EXPECT_TRUE(close(out, ref, row.tolerance(c.dtype)));
  if (c.lse) {
    EXPECT_EQ(lse.dtype(), DType::f32);
    EXPECT_TRUE(close(lse, ref_lse, row.tolerance(DType::f32)));
  }
  if (c.padded) {
    EXPECT_EQ(count_nan_in_storage(out), storage_elements(out) - out.numel())
        << "the kernel wrote outside `out` (or produced NaN)";
    if (c.lse) {
      EXPECT_EQ(count_nan_in_storage(lse), storage_elements(lse) - lse.numel())
          << "the kernel wrote outside `lse` (or produced NaN)";
    }
  }
}

// ---- the sampled grid --------------------------------------------------------------------------

const std::vector<std::int64_t> kBatches = {1, 2, 3, 4};
const std::vector<std::pair<std::int64_t, std::int64_t>> kHeads = {
    {1, 1}, {4, 1}, {12, 4}, {32, 8}};
const std::vector<std::int64_t> kHeadDims = {64, 128};
const std::vector<std::int64_t> kQLens = {1, 2, 4};
constexpr std::int64_t kLenIsCapacity = -1;
const std::vector<std::int64_t> kLens = {1, 17, 255, 256, 4097, kLenIsCapacity};
const std::vector<DType> kDTypes = {DType::bf16, DType::f16, DType::f32};
const std::vector<std::int64_t> kWindowsLeft = {0, 1, 16, 100, 300};
const std::vector<std::int64_t> kWindowsRight = {0, 3, 50};
const std::vector<float> kSoftcaps = {2.0f, 10.0f, 30.0f};
const std::vector<std::int64_t> kSplits = {0, 0, 1, 2, 3, 8};

std::vector<Case> grid_cases(std::map<std::string, int>& coverage) {
  std::mt19937_64 rng(kGridSeed);
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
  auto coin = [&] { return (rng() & 1) != 0; };
  std::vector<Case> cases;
  for (int n = 0; n < kGridCases; ++n) {
    Case c;
    c.batch = kBatches[pick(kBatches.size())];
    std::tie(c.num_qo_heads, c.num_kv_heads) = kHeads[pick(kHeads.size())];
    c.head_dim = kHeadDims[pick(kHeadDims.size())];
    c.q_len = kQLens[pick(kQLens.size())];
    c.dtype = kDTypes[pick(kDTypes.size())];
    const std::int64_t len_choice = kLens[pick(kLens.size())];
    const bool ragged = coin();
    c.padded = coin();
    c.alibi = coin();
    c.lse = coin();
    c.options.causal = coin();
    if (coin()) c.options.window_left = kWindowsLeft[pick(kWindowsLeft.size())];
    if (coin()) c.options.window_right = kWindowsRight[pick(kWindowsRight.size())];
    if (coin()) c.options.softcap = kSoftcaps[pick(kSoftcaps.size())];
    if (pick(4) == 0) c.options.softmax_scale = 0.3f;  // peakier than 1/sqrt(D)
    c.options.num_splits = kSplits[pick(kSplits.size())];

    // Lengths: the chosen one for sequence 0; ragged batches draw the rest (0 included).
    const std::int64_t base_len = len_choice == kLenIsCapacity ? 97 + pick(200) : len_choice;
    c.k_lens = {base_len};
    if (ragged) {
      const std::vector<std::int64_t> others = {0, 1, 17, 255, 256, base_len};
      for (std::int64_t b = 1; b < c.batch; ++b) c.k_lens.push_back(others[pick(others.size())]);
    }
    // Shrink the most expensive cases: batch first, then Sq, then the head count.
    while (c.cost() > kCaseCostBudget) {
      if (c.batch > 1) {
        c.batch -= 1;
        if (c.k_lens.size() > 1) c.k_lens.resize(c.batch);
      } else if (c.q_len > 1) {
        c.q_len /= 2;
      } else {
        c.num_qo_heads /= 2;
        c.num_kv_heads = std::max<std::int64_t>(1, c.num_kv_heads / 2);
      }
    }
    std::int64_t longest = 0;
    for (auto len : c.k_lens) longest = std::max(longest, len);
    c.capacity =
        len_choice == kLenIsCapacity ? longest : longest + static_cast<std::int64_t>(pick(9));

    coverage["B=" + std::to_string(c.batch)]++;
    coverage["heads=" + std::to_string(c.num_qo_heads) + "/" + std::to_string(c.num_kv_heads)]++;
    coverage["D=" + std::to_string(c.head_dim)]++;
    coverage["Sq=" + std::to_string(c.q_len)]++;
    coverage["k_len=" + (len_choice == kLenIsCapacity ? std::string("capacity")
                                                      : std::to_string(len_choice))]++;
    coverage[std::string("dtype=") + dtype_name(c.dtype)]++;
    coverage[std::string("ragged=") + (c.k_lens.size() > 1 ? "1" : "0")]++;
    for (std::size_t b = 1; b < c.k_lens.size(); ++b)
      if (c.k_lens[b] == 0) {
        coverage["zero_len_sequence"]++;
        break;
      }
    coverage[std::string("causal=") + (c.options.causal ? "1" : "0")]++;
    coverage[std::string("window_left=") + (c.options.window_left ? "1" : "0")]++;
    coverage[std::string("window_right=") + (c.options.window_right ? "1" : "0")]++;
    coverage[std::string("softcap=") + (c.options.softcap ? "1" : "0")]++;
    coverage[std::string("alibi=") + (c.alibi ? "1" : "0")]++;
    coverage[std::string("lse=") + (c.lse ? "1" : "0")]++;
    coverage[std::string("padded=") + (c.padded ? "1" : "0")]++;
    coverage["splits=" + std::to_string(c.options.num_splits)]++;
    cases.push_back(std::move(c));
  }
  return cases;
}

TEST(FlashDecodeCpu, GridAgainstFloat64Reference) {
  std::map<std::string, int> coverage;
  const std::vector<Case> cases = grid_cases(coverage);
  for (std::size_t n = 0; n < cases.size(); ++n) run_case(cases[n], kGridSeed + n);

  // Every axis value of the grid is still exercised after shrinking.
  std::vector<std::string> required = {"ragged=0", "ragged=1", "zero_len_sequence",
                                       "k_len=capacity"};
  for (auto b : kBatches) required.push_back("B=" + std::to_string(b));
  for (auto [hq, hkv] : kHeads)
    required.push_back("heads=" + std::to_string(hq) + "/" + std::to_string(hkv));
  for (auto d : kHeadDims) required.push_back("D=" + std::to_string(d));
  for (auto s : kQLens) required.push_back("Sq=" + std::to_string(s));
  for (auto l : kLens)
    if (l != kLenIsCapacity) required.push_back("k_len=" + std::to_string(l));
  for (auto d : kDTypes) required.push_back(std::string("dtype=") + dtype_name(d));
  for (const char* f :
       {"causal", "window_left", "window_right", "softcap", "alibi", "lse", "padded"}) {
    required.push_back(std::string(f) + "=0");
    required.push_back(std::string(f) + "=1");
  }
  for (auto s : {0, 1, 2, 3, 8}) required.push_back("splits=" + std::to_string(s));
  for (const auto& key : required)
    EXPECT_GE(coverage[key], kMinAxisCoverage)
        << "grid axis value '" << key << "' is under-covered";
}

// The largest shapes of issue 3 at full size, features on, against the reference.
TEST(FlashDecodeCpu, FullSizeGqaWithEveryFeature) {
  Case c;
  c.batch = 2;
  c.num_qo_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.q_len = 2;
  c.k_lens = {4097, 1500};
  c.capacity = 4100;
  c.dtype = DType::bf16;
  c.padded = true;
  c.alibi = true;
  c.lse = true;
  c.options.causal = true;
  c.options.window_left = 3000;
  c.options.softcap = 10.0f;
  run_case(c, 11);
}

// Every head dim the contract row advertises (non-multiples of 16 exercise the dot-product tails)
// and the longest q_len it allows, with GQA, windows, softcap, ALiBi and LSE on.
TEST(FlashDecodeCpu, EveryContractHeadDimAndLongestQueryLength) {
  const AttentionContract& row = cpu_flash_decode_contract();
  std::uint64_t seed = 300;
  for (std::int64_t head_dim : row.head_dims) {
    Case c;
    c.batch = 2;
    c.num_qo_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = head_dim;
    c.q_len = 3;
    c.k_lens = {70, 33};
    c.capacity = 72;
    c.dtype = DType::bf16;
    c.padded = true;
    c.alibi = true;
    c.lse = true;
    c.options.window_left = 40;
    c.options.softcap = 10.0f;
    run_case(c, seed++);
  }
  Case c;
  c.batch = 2;
  c.num_qo_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.q_len = row.max_sq;
  c.k_lens = {300, 40};  // sequence 1 is shorter than q_len: its first 24 rows see no key
  c.capacity = 300;
  c.dtype = DType::f16;
  c.lse = true;
  c.options.window_left = 50;
  c.options.window_right = 5;
  for (bool causal : {true, false}) {
    c.options.causal = causal;
    run_case(c, seed++);
  }
}

// The kernel itself handles any head dim (the op only admits the contract's): D = 37 runs the
// blocked kernels one float wide, D = 72 eight wide (the widest power of two dividing it).
TEST(FlashDecodeCpu, KernelHandlesHeadDimsOutsideTheContract) {
  for (std::int64_t head_dim : {37, 72}) {
    Case c;
    c.batch = 2;
    c.num_qo_heads = 4;
    c.num_kv_heads = 1;
    c.head_dim = head_dim;
    c.q_len = 2;
    c.k_lens = {45, 9};
    c.capacity = 50;
    c.dtype = DType::f32;
    c.options.window_left = 30;
    SCOPED_TRACE(c.str());
    const Inputs in = make_inputs(c, 77);
    Tensor out = Tensor::empty({c.batch, c.num_qo_heads, c.q_len, c.head_dim}, c.dtype);
    Tensor lse = Tensor::empty({c.batch, c.num_qo_heads, c.q_len}, DType::f32);
    cpu::flash_decode(in.q, in.k, in.v, in.k_len, nullptr, c.options, out, &lse);
    Tensor ref_lse;
    const Tensor ref =
        reference_decode_attention(in.q, in.k, in.v, in.k_len, nullptr, c.options, &ref_lse);
    EXPECT_TRUE(close(out, ref, cpu_flash_decode_contract().tolerance(c.dtype)));
    EXPECT_TRUE(close(lse, ref_lse, cpu_flash_decode_contract().tolerance(DType::f32)));
  }
}

// The blocked kernels at every vector width, whatever this CPU's own is (its loader-picked clone
// sets the instructions; the width sets the blocks: 4 x 4, 2 x 8 and 1 x 16 rows x keys at 16
// lanes, down to one row and one key at 1): an eighth of the grid at each width.
TEST(FlashDecodeCpu, EveryVectorWidthMatchesTheReference) {
  std::map<std::string, int> coverage;
  const std::vector<Case> cases = grid_cases(coverage);
  struct NativeLanesAfter {
    ~NativeLanesAfter() { cpu::set_flash_decode_lanes_for_testing(0); }
  } restore;
  for (int lanes : {1, 2, 4, 8, 16}) {
    SCOPED_TRACE("lanes " + std::to_string(lanes));
    cpu::set_flash_decode_lanes_for_testing(lanes);
    for (std::size_t n = 0; n < cases.size(); n += 8) run_case(cases[n], kGridSeed + n);
  }
}

// ---- split counts ------------------------------------------------------------------------------

TEST(FlashDecodeCpu, SplitCountsAgreeWithinRounding) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    Case c;
    c.batch = 2;
    c.num_qo_heads = 12;
    c.num_kv_heads = 4;
    c.head_dim = 128;
    c.q_len = 4;
    c.k_lens = {4097, 1000};
    c.capacity = 4097;
    c.dtype = dtype;
    c.alibi = true;
    c.options.window_left = 2500;
    c.options.softcap = 10.0f;
    SCOPED_TRACE(c.str());
    const Inputs in = make_inputs(c, 99);
    Tensor lse_one;
    DecodeAttentionOptions options = c.options;
    options.num_splits = 1;
    const Tensor one =
        decode_attention(in.q, in.k, in.v, in.k_len, &in.alibi, options, {}, &lse_one);
    const Tolerance tol = cpu_flash_decode_contract().tolerance(dtype);
    const Tolerance lse_tol = cpu_flash_decode_contract().tolerance(DType::f32);
    for (std::int64_t splits : {2, 3, 7, 16, 0}) {
      options.num_splits = splits;
      Tensor lse;
      const Tensor many =
          decode_attention(in.q, in.k, in.v, in.k_len, &in.alibi, options, {}, &lse);
      EXPECT_TRUE(close(many, one, tol)) << "num_splits " << splits;
      EXPECT_TRUE(close(lse, lse_one, lse_tol)) << "num_splits " << splits;
    }
  }
}

// ---- rows with no visible key ------------------------------------------------------------------

TEST(FlashDecodeCpu, RowsWithoutVisibleKeysAreZeroWithLseMinusInfinity) {
  // Sequence 0 is empty; in sequence 1 (k_len 2) causal queries 0 and 1 sit at p = -2, -1.
  Case c;
  c.batch = 2;
  c.num_qo_heads = 4;
  c.num_kv_heads = 1;
  c.head_dim = 64;
  c.q_len = 4;
  c.k_lens = {0, 2};
  c.capacity = 8;
  c.dtype = DType::f32;
  c.lse = true;
  const Inputs in = make_inputs(c, 5);
  Tensor lse;
  const Tensor out = decode_attention(in.q, in.k, in.v, in.k_len, nullptr, c.options, {}, &lse);
  for (std::int64_t h = 0; h < c.num_qo_heads; ++h) {
    for (std::int64_t i = 0; i < c.q_len; ++i) {
      const bool empty = i < 2;
      EXPECT_EQ(lse.at({0, h, i}), -std::numeric_limits<double>::infinity());
      if (empty) {
        EXPECT_EQ(lse.at({1, h, i}), -std::numeric_limits<double>::infinity());
      } else {
        EXPECT_TRUE(std::isfinite(lse.at({1, h, i})));
      }
      for (std::int64_t d = 0; d < c.head_dim; ++d) {
        EXPECT_EQ(out.at({0, h, i, d}), 0.0);
        if (empty) {
          EXPECT_EQ(out.at({1, h, i, d}), 0.0);
        }
      }
    }
  }
  Tensor ref_lse;
  const Tensor ref =
      reference_decode_attention(in.q, in.k, in.v, in.k_len, nullptr, c.options, &ref_lse);
  EXPECT_TRUE(close(out, ref, cpu_flash_decode_contract().tolerance(DType::f32)));
  EXPECT_TRUE(close(lse, ref_lse, cpu_flash_decode_contract().tolerance(DType::f32)));
}

// ---- 16-bit storage conversions ----------------------------------------------------------------

// With one visible key the softmax weight is exactly 1, so o = v_0: every non-NaN 16-bit pattern
// placed in v must come back unchanged (signed zeros compare equal: 0 + (-0) = +0 in the sum).
TEST(FlashDecodeCpu, SixteenBitConversionsAreExactForEveryPattern) {
  constexpr std::int64_t kDim = 128, kPatterns = 65536;
  for (DType dtype : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor q = Tensor::empty({1, 1, 1, kDim}, dtype);
    q.fill(0.5);
    Tensor k = Tensor::empty({1, 1, 2, kDim}, dtype);
    k.fill(0.25);
    Tensor v = Tensor::empty({1, 1, 2, kDim}, dtype);
    Tensor k_len = Tensor::empty({1}, DType::i32);
    k_len.set({0}, 1);
    auto* v_bits = v.data<std::uint16_t>();
    for (std::int64_t d = 0; d < kDim; ++d) v_bits[kDim + d] = 0x7FC0;  // row 1: NaN, never read
    int mismatches = 0;
    for (std::int64_t first = 0; first < kPatterns; first += kDim) {
      for (std::int64_t d = 0; d < kDim; ++d) v_bits[d] = static_cast<std::uint16_t>(first + d);
      const Tensor out = decode_attention(q, k, v, k_len, nullptr, {}, {});
      for (std::int64_t d = 0; d < kDim; ++d) {
        const double expected = v.at({0, 0, 0, d}), actual = out.at({0, 0, 0, d});
        const bool ok = std::isnan(expected) ? std::isnan(actual) : actual == expected;
        if (!ok && ++mismatches <= 5)
          ADD_FAILURE() << "pattern 0x" << std::hex << (first + d) << std::dec << ": got " << actual
                        << ", expected " << expected;
      }
    }
    EXPECT_EQ(mismatches, 0);
  }
}

// A NaN in a visible K or V row reaches every output of the queries that see it (as in PyTorch's
// SDPA), whatever the tile it falls in; the other sequence's outputs stay finite. The verifier
// relies on this: a fused arm that reads NaN-poisoned memory past k_len must show NaN. (Session
// 51: the exponent arithmetic of the kernel's exp was undefined for a NaN score; UBSan found it.)
TEST(FlashDecodeCpu, ANanInAVisibleRowReachesTheOutput) {
  constexpr std::int64_t kDim = 64, kCapacity = 300, kLen = 257;
  for (const bool poison_k : {true, false})
    for (const std::int64_t row : {std::int64_t{0}, std::int64_t{130}, kLen - 1}) {
      SCOPED_TRACE(std::string(poison_k ? "k" : "v") + " row " + std::to_string(row));
      Tensor q = Tensor::empty({2, 4, 1, kDim}, DType::bf16);
      Tensor k = Tensor::empty({2, 2, kCapacity, kDim}, DType::bf16);
      Tensor v = Tensor::empty({2, 2, kCapacity, kDim}, DType::bf16);
      q.fill(0.125);
      k.fill(0.25);
      v.fill(-0.5);
      Tensor k_len = Tensor::empty({2}, DType::i32);
      k_len.set({0}, kLen);
      k_len.set({1}, kLen);
      (poison_k ? k : v).set({0, 1, row, 3}, std::numeric_limits<double>::quiet_NaN());
      const Tensor out = decode_attention(q, k, v, k_len, nullptr, {}, {});
      for (std::int64_t b = 0; b < 2; ++b)
        for (std::int64_t h = 0; h < 4; ++h)
          for (std::int64_t d = 0; d < kDim; ++d) {
            // KV head 1 of sequence 0 serves query heads 2 and 3; a NaN in K spoils every score
            // of its query, a NaN in V only its own column.
            const bool sees = b == 0 && h >= 2 && (poison_k || d == 3);
            const double o = out.at({b, h, 0, d});
            if (sees)
              ASSERT_TRUE(std::isnan(o)) << "b " << b << " h " << h << " d " << d << ": " << o;
            else
              ASSERT_FLOAT_EQ(o, -0.5) << "b " << b << " h " << h << " d " << d;
          }
    }
}

// ---- contracts ---------------------------------------------------------------------------------

TEST(FlashDecodeContract, RowsAndQueries) {
  const AttentionContract& cpu = cpu_flash_decode_contract();
  EXPECT_EQ(cpu.kernel, "flash_decode");
  EXPECT_EQ(cpu.backend, "cpu");
  EXPECT_EQ(cpu.revision, "cpu-fd-1");
  for (DType d : {DType::f32, DType::f16, DType::bf16}) EXPECT_TRUE(cpu.supports_dtype(d));
  EXPECT_FALSE(cpu.supports_dtype(DType::i32));
  for (std::int64_t d : {64, 80, 96, 128, 256}) EXPECT_TRUE(cpu.supports_head_dim(d));
  EXPECT_FALSE(cpu.supports_head_dim(48));
  EXPECT_EQ(cpu.max_sq, 64);
  const AttentionContract& cuda = cuda_flash_decode_contract();
  EXPECT_EQ(cuda.backend, "cuda");
  EXPECT_EQ(cuda.revision, "cuda-fd-1");
  EXPECT_FALSE(cuda.supports_dtype(DType::f32));
  EXPECT_TRUE(cuda.supports_dtype(DType::bf16));
  EXPECT_FALSE(cuda.supports_head_dim(80));
  EXPECT_EQ(cuda.max_sq, 8);
  const AttentionContract seed = seed_capacity_k_contract();
  EXPECT_EQ(seed.max_sq, 1);
  EXPECT_TRUE(seed.supports(AttentionFeature::causal));
  for (AttentionFeature f :
       {AttentionFeature::causal, AttentionFeature::window_left, AttentionFeature::window_right,
        AttentionFeature::softcap, AttentionFeature::alibi, AttentionFeature::per_seq_klen,
        AttentionFeature::lse}) {
    EXPECT_TRUE(cpu.supports(f)) << attention_feature_name(f);
    EXPECT_TRUE(cuda.supports(f)) << attention_feature_name(f);
    if (f != AttentionFeature::causal) {
      EXPECT_FALSE(seed.supports(f)) << attention_feature_name(f);
    }
    EXPECT_STRNE(attention_feature_name(f), "?");
  }
  EXPECT_STREQ(attention_feature_name(AttentionFeature::window_left), "window_left");
  for (DType d : {DType::f32, DType::f16, DType::bf16}) {
    const Tolerance t = cpu.tolerance(d), policy = default_tolerance(d);
    EXPECT_EQ(t.atol, policy.atol);
    EXPECT_EQ(t.rtol, policy.rtol);
  }
}

// ---- validation errors -------------------------------------------------------------------------

// A small valid call whose arguments each test breaks one at a time.
struct ValidCall {
  Tensor q = Tensor::empty({2, 4, 1, 64}, DType::bf16);
  Tensor k = Tensor::empty({2, 2, 16, 64}, DType::bf16);
  Tensor v = Tensor::empty({2, 2, 16, 64}, DType::bf16);
  Tensor k_len = Tensor::empty({2}, DType::i32);
  Tensor alibi = Tensor::empty({4}, DType::f32);
  Tensor out;
  Tensor lse;
  bool with_alibi = false, with_lse = false;
  DecodeAttentionOptions options;
  ValidCall() {
    Rng rng(3);
    rng.normal(q);
    rng.normal(k);
    rng.normal(v);
    k_len.set({0}, 16);
    k_len.set({1}, 5);
    alibi.fill(0.5);
  }
  Tensor run() {
    return decode_attention(q, k, v, k_len, with_alibi ? &alibi : nullptr, options, out,
                            with_lse ? &lse : nullptr);
  }
};

// Runs `mutate` on a fresh valid call, then expects `ErrorType` whose message contains `needle`.
template <typename ErrorType>
void expect_error(const std::function<void(ValidCall&)>& mutate, const std::string& needle) {
  ValidCall call;
  mutate(call);
  testing::expect_error_with<ErrorType>([&] { call.run(); }, needle);
}

// A view of `shape` whose last axis has stride 2.
Tensor last_axis_strided(const Dims& shape, DType dtype) {
  Dims big = shape;
  big.back() *= 2;
  Tensor base = Tensor::empty(big, dtype);
  base.fill(1.0);
  Dims strides = Tensor::contiguous_strides(big);
  strides.back() = 2;
  return Tensor::view_of(base.storage(), 0, shape, strides, dtype);
}

TEST(DecodeAttentionValidation, ValidCallRuns) {
  ValidCall call;
  call.with_alibi = true;
  call.with_lse = true;
  EXPECT_NO_THROW(call.run());
}

TEST(DecodeAttentionValidation, MissingTensors) {
  expect_error<ValueError>([](ValidCall& c) { c.q = Tensor(); }, "`q`");
  expect_error<ValueError>([](ValidCall& c) { c.k = Tensor(); }, "`k`");
  expect_error<ValueError>([](ValidCall& c) { c.v = Tensor(); }, "`v`");
  expect_error<ValueError>([](ValidCall& c) { c.k_len = Tensor(); }, "`k_len`");
  expect_error<ValueError>([](ValidCall& c) { c.alibi = Tensor(), c.with_alibi = true; },
                           "`alibi`");
}

TEST(DecodeAttentionValidation, Devices) {
  static std::uint16_t fake[8];
  expect_error<DeviceError>(
      [](ValidCall& c) {
        c.k = Tensor::borrow(fake, {2, 2, 16, 64}, DType::bf16, {}, Device::cuda());
      },
      "`k`");
  expect_error<DeviceError>(
      [](ValidCall& c) { c.k_len = Tensor::borrow(fake, {2}, DType::i32, {}, Device::cuda()); },
      "`k_len`");
  expect_error<DeviceError>(
      [](ValidCall& c) {
        c.alibi = Tensor::borrow(fake, {4}, DType::f32, {}, Device::cuda());
        c.with_alibi = true;
      },
      "`alibi`");
  expect_error<DeviceError>(
      [](ValidCall& c) {
        c.out = Tensor::borrow(fake, {2, 4, 1, 64}, DType::bf16, {}, Device::cuda());
      },
      "`out`");
  expect_error<DeviceError>(
      [](ValidCall& c) {
        c.lse = Tensor::borrow(fake, {2, 4, 1}, DType::f32, {}, Device::cuda());
        c.with_lse = true;
      },
      "`lse`");
#ifndef SPLICE_WITH_CUDA
  expect_error<DeviceError>(
      [](ValidCall& c) {
        c.q = Tensor::borrow(fake, {2, 4, 1, 64}, DType::bf16, {}, Device::cuda());
        c.k = Tensor::borrow(fake, {2, 2, 16, 64}, DType::bf16, {}, Device::cuda());
        c.v = Tensor::borrow(fake, {2, 2, 16, 64}, DType::bf16, {}, Device::cuda());
        c.k_len = Tensor::borrow(fake, {2}, DType::i32, {}, Device::cuda());
      },
      "CUDA");
#endif
}

TEST(DecodeAttentionValidation, RanksShapesAndHeads) {
  expect_error<ShapeError>(
      [](ValidCall& c) {
        c.q = Tensor::empty({2, 4, 64}, DType::bf16);
      },
      "`q`");
  expect_error<ShapeError>(
      [](ValidCall& c) {
        c.k = Tensor::empty({2, 16, 64}, DType::bf16);
      },
      "`k`");
  expect_error<ShapeError>(
      [](ValidCall& c) {
        c.v = Tensor::empty({2, 16, 64}, DType::bf16);
      },
      "`v`");
  expect_error<ShapeError>(
      [](ValidCall& c) {
        c.k = Tensor::empty({3, 2, 16, 64}, DType::bf16);
      },
      "`k`");
  expect_error<ShapeError>(
      [](ValidCall& c) {
        c.k = Tensor::empty({2, 2, 16, 128}, DType::bf16);
      },
      "`k`");
  expect_error<ShapeError>(
      [](ValidCall& c) {
        c.v = Tensor::empty({2, 2, 15, 64}, DType::bf16);
      },
      "`v`");
  expect_error<ShapeError>(
      [](ValidCall& c) {
        c.k = Tensor::empty({2, 3, 16, 64}, DType::bf16);
        c.v = Tensor::empty({2, 3, 16, 64}, DType::bf16);
      },
      "num_kv_heads");
  expect_error<ShapeError>(
      [](ValidCall& c) {
        c.q = Tensor::empty({2, 4, 0, 64}, DType::bf16);
      },
      "`q`");
}

TEST(DecodeAttentionValidation, ContractRowLimits) {
  expect_error<UnsupportedError>(
      [](ValidCall& c) {
        c.q = Tensor::empty({2, 4, 1, 48}, DType::bf16);
        c.k = Tensor::empty({2, 2, 16, 48}, DType::bf16);
        c.v = Tensor::empty({2, 2, 16, 48}, DType::bf16);
      },
      "head_dim");
  expect_error<UnsupportedError>(
      [](ValidCall& c) {
        c.q = Tensor::empty({2, 4, 65, 64}, DType::bf16);
      },
      "q_len");
}

TEST(DecodeAttentionValidation, DTypes) {
  expect_error<DTypeError>(
      [](ValidCall& c) {
        c.q = Tensor::empty({2, 4, 1, 64}, DType::i32);
      },
      "`q`");
  expect_error<DTypeError>(
      [](ValidCall& c) {
        c.k = Tensor::empty({2, 2, 16, 64}, DType::f16);
      },
      "`k`");
  expect_error<DTypeError>(
      [](ValidCall& c) {
        c.v = Tensor::empty({2, 2, 16, 64}, DType::f32);
      },
      "`v`");
  expect_error<DTypeError>([](ValidCall& c) { c.k_len = Tensor::zeros({2}, DType::i64); },
                           "`k_len`");
  expect_error<DTypeError>(
      [](ValidCall& c) { c.alibi = Tensor::empty({4}, DType::bf16), c.with_alibi = true; },
      "`alibi`");
  expect_error<DTypeError>(
      [](ValidCall& c) {
        c.out = Tensor::empty({2, 4, 1, 64}, DType::f32);
      },
      "`out`");
  expect_error<DTypeError>(
      [](ValidCall& c) {
        c.lse = Tensor::empty({2, 4, 1}, DType::bf16), c.with_lse = true;
      },
      "`lse`");
}

TEST(DecodeAttentionValidation, KLenShapeAndValues) {
  expect_error<ShapeError>(
      [](ValidCall& c) {
        c.k_len = Tensor::zeros({2, 1}, DType::i32);
      },
      "`k_len`");
  expect_error<ShapeError>([](ValidCall& c) { c.k_len = Tensor::zeros({3}, DType::i32); },
                           "`k_len`");
  expect_error<ValueError>([](ValidCall& c) { c.k_len.set({1}, -1); }, "`k_len[1]`");
  expect_error<ValueError>([](ValidCall& c) { c.k_len.set({0}, 17); }, "`k_len[0]`");
  // One value for the whole batch is fine; so is 0 (zeros) and the capacity itself.
  ValidCall one;
  one.k_len = Tensor::empty({1}, DType::i32);
  one.k_len.set({0}, 16);
  EXPECT_NO_THROW(one.run());
  one.k_len.set({0}, 0);
  EXPECT_NO_THROW(one.run());
}

TEST(DecodeAttentionValidation, OptionalTensorsShapes) {
  expect_error<ShapeError>(
      [](ValidCall& c) { c.alibi = Tensor::empty({5}, DType::f32), c.with_alibi = true; },
      "`alibi`");
  expect_error<ShapeError>(
      [](ValidCall& c) {
        c.out = Tensor::empty({2, 4, 2, 64}, DType::bf16);
      },
      "`out`");
  expect_error<ShapeError>(
      [](ValidCall& c) {
        c.lse = Tensor::empty({2, 4}, DType::f32), c.with_lse = true;
      },
      "`lse`");
}

TEST(DecodeAttentionValidation, LastAxisMustBeUnitStride) {
  expect_error<LayoutError>(
      [](ValidCall& c) {
        c.q = last_axis_strided({2, 4, 1, 64}, DType::bf16);
      },
      "`q`");
  expect_error<LayoutError>(
      [](ValidCall& c) {
        c.k = last_axis_strided({2, 2, 16, 64}, DType::bf16);
      },
      "`k`");
  expect_error<LayoutError>(
      [](ValidCall& c) {
        c.v = last_axis_strided({2, 2, 16, 64}, DType::bf16);
      },
      "`v`");
  expect_error<LayoutError>(
      [](ValidCall& c) {
        c.out = last_axis_strided({2, 4, 1, 64}, DType::bf16);
      },
      "`out`");
}

TEST(DecodeAttentionValidation, Options) {
  expect_error<ValueError>([](ValidCall& c) { c.options.window_left = -1; }, "window_left");
  expect_error<ValueError>([](ValidCall& c) { c.options.window_right = -2; }, "window_right");
  for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()})
    expect_error<ValueError>([bad](ValidCall& c) { c.options.softcap = bad; }, "softcap");
  for (float bad :
       {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()})
    expect_error<ValueError>([bad](ValidCall& c) { c.options.softmax_scale = bad; },
                             "softmax_scale");
  expect_error<ValueError>([](ValidCall& c) { c.options.num_splits = -1; }, "num_splits");
}

TEST(DecodeAttentionValidation, OutputsShareNoMemoryWithInputsOrEachOther) {
  // out [2, 4, 1, 64] bf16 (512 elements) as a view into another tensor's storage.
  const auto out_inside = [](const Tensor& t) {
    return Tensor::view_of(t.storage(), t.offset(), {2, 4, 1, 64}, {256, 64, 64, 1}, DType::bf16);
  };
  expect_error<LayoutError>([&](ValidCall& c) { c.out = c.q; }, "overlaps `q`");
  expect_error<LayoutError>([&](ValidCall& c) { c.out = out_inside(c.k); }, "overlaps `k`");
  expect_error<LayoutError>([&](ValidCall& c) { c.out = out_inside(c.v); }, "overlaps `v`");
  expect_error<LayoutError>(
      [](ValidCall& c) {
        c.with_alibi = true;
        c.out = Tensor::empty({2, 4, 1, 64}, DType::bf16);
        c.alibi = Tensor::view_of(c.out.storage(), 0, {4}, {1}, DType::f32);
      },
      "overlaps `alibi`");
  expect_error<LayoutError>(
      [](ValidCall& c) {
        c.with_lse = true;
        c.out = Tensor::empty({2, 4, 1, 64}, DType::bf16);
        c.lse = Tensor::view_of(c.out.storage(), 16, {2, 4, 1}, {4, 1, 1}, DType::f32);
      },
      "`out` and `lse` must not overlap");
  expect_error<LayoutError>(
      [](ValidCall& c) {
        c.out = Tensor::empty({1, 4, 1, 64}, DType::bf16).expand({2, 4, 1, 64});
      },
      "share an address");
  expect_error<LayoutError>(
      [](ValidCall& c) {
        c.with_lse = true;
        c.lse = Tensor::empty({2, 1, 1}, DType::f32).expand({2, 4, 1});
      },
      "`lse`");
  // A refused call writes nothing: the cache the output pointed into keeps its bytes.
  ValidCall call;
  const auto* k_bytes = static_cast<const unsigned char*>(call.k.raw_data());
  const std::vector<unsigned char> before(k_bytes, k_bytes + call.k.nbytes());
  call.out = out_inside(call.k);
  EXPECT_THROW(call.run(), LayoutError);
  EXPECT_TRUE(std::equal(before.begin(), before.end(), k_bytes));
}

TEST(DecodeAttentionValidation, AllocatesOutputsWhenUndefined) {
  ValidCall call;
  call.with_lse = true;
  const Tensor out = call.run();
  EXPECT_EQ(out.shape(), (Dims{2, 4, 1, 64}));
  EXPECT_EQ(out.dtype(), DType::bf16);
  EXPECT_EQ(call.lse.shape(), (Dims{2, 4, 1}));
  EXPECT_EQ(call.lse.dtype(), DType::f32);
}

}  // namespace
}  // namespace splice
