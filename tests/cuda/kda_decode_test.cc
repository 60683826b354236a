// GPU tests of the CUDA fused KDA decode kernel (spec kda_decode.md) against the CPU kernel (the
// oracle) and the float64 reference (tests/support/reference_kda.h).
//
// Per case:
//   1. One random problem in CPU memory (spec §6 distributions; caches, padding and unread slots
//      poisoned with NaN bit patterns, only what live sequences read filled with random values).
//   2. A byte-for-byte device mirror of every storage (same offsets and strides), the op run on
//      both (CPU kernel, CUDA kernel of each variant), the device storages copied back.
//   3. conv_state: the whole storage bit-identical to the CPU kernel's (history, untouched slots
//      and positions, padding). state: written checkpoints within kStateTol* of the CPU kernel's
//      and of the float64 reference, every other byte of the storage bit-identical.
//      output: within kOutputTol of the reference and of the CPU kernel; unowned rows exact zeros.
// Plus: CUDA-graph replay with query_start_loc, num_accepted_tokens and slots changed between
// replays equals per-call results bit for bit; repeated runs bitwise identical; the plain T = 1
// call equals the packed T = 1 call bit for bit; metadata a predecessor rewrites while the
// launch's pre-wait reads run changes nothing. The worst errors are printed at the end.
// Skips without a GPU.
#include "splice/backend/cuda/kda_decode.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "splice/backend/cuda/runtime.h"
#include "splice/core/error.h"
#include "splice/core/random.h"
#include "splice/core/tolerance.h"
#include "splice/ops/kda_decode.h"
#include "support/cuda_test_util.h"
#include "support/late_copy.h"
#include "support/reference_kda.h"
#include "support/test_util.h"

namespace splice {
namespace {

constexpr std::int64_t kD = 128;
// Stated, measured bounds (docs/perf-gpu-kda.md), tighter than FlashInfer's output rtol 3e-2 /
// atol 2e-2 and state rtol 3e-2 / atol 2e-3. Against the float64 reference:
constexpr Tolerance kOutputTol{2e-3, 8e-3};
// State checkpoints, two tiers. Every element within kStateTolAll; at most
// kMaxFractionStateBeyondTight of a slot's elements outside the tight per-dtype bound. The tail
// comes from a bf16 rounding point: a conv output v (or q, k) that rounds to the other bf16
// neighbour on one backend (fp32 sums in another order) moves a whole state row by
// beta * ulp(v) * k^, about 1e-4.
constexpr Tolerance kStateTolF32{2e-6, 1e-4};
constexpr Tolerance kStateTolBf16{1e-5, 8e-3};  // one bf16 rounding of the state (2^-8 relative)
constexpr Tolerance kStateTolAll{5e-4, 1e-2};   // FlashInfer: atol 2e-3, rtol 3e-2
constexpr double kMaxFractionStateBeyondTight = 1e-2;
// At most this fraction of bf16 outputs may be more than one bf16 ulp from the reference's.
constexpr double kMaxFractionBeyondOneUlp = 1e-3;
constexpr std::uint8_t kPoisonByte = 0xFF;

struct Stats {
  double out_abs = 0, out_rel = 0;
  std::int64_t out_count = 0, out_beyond_ulp = 0;
  double state_abs[2] = {0, 0}, state_rel[2] = {0, 0};
};
Stats g_stats;

class StatsPrinter : public ::testing::Environment {
 public:
  void TearDown() override {
    std::printf(
        "[kda cuda stats] output vs f64 reference: max abs %.3g, max rel %.3g; %lld of %lld "
        "(%.2e) bf16 outputs > 1 ulp off\n",
        g_stats.out_abs, g_stats.out_rel, static_cast<long long>(g_stats.out_beyond_ulp),
        static_cast<long long>(g_stats.out_count),
        g_stats.out_count ? double(g_stats.out_beyond_ulp) / g_stats.out_count : 0.0);
    std::printf(
        "[kda cuda stats] state checkpoints vs f64 reference: f32 max abs %.3g rel %.3g; "
        "bf16 max abs %.3g rel %.3g\n",
        g_stats.state_abs[0], g_stats.state_rel[0], g_stats.state_abs[1], g_stats.state_rel[1]);
  }
};
[[maybe_unused]] const auto* const g_env = ::testing::AddGlobalTestEnvironment(new StatsPrinter);

bool have_gpu() {
  if (!cuda::device_available()) return false;
  cuda::ensure_registered();
  return true;
}

// ---------------------------------------------------------------------------------------------
// Problems.

struct Meta {
  std::int64_t T = 1;
  std::vector<int> lens, nat;
  std::vector<std::vector<int>> si;  // [N][T]
  std::int64_t trailing = 0;
  std::int64_t slots = 1;
  std::int64_t rows() const {
    std::int64_t r = trailing;
    for (int l : lens) r += l;
    return r;
  }
};

struct Layout {
  std::int64_t row_pad = 0;
  std::int64_t slot_pad = 0;
  bool shared_page = false;
};

struct Problem {
  std::int64_t H = 1, T = 1, R = 1, slots = 1;
  DType state_dtype = DType::f32;
  Meta meta;
  Tensor x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state,
      output_gate, norm_weight, qsl, nat, output;
};

std::shared_ptr<Storage> poisoned_storage(std::size_t bytes) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>((bytes + 3) / 4)}, DType::f32);
  std::memset(t.raw_data(), kPoisonByte, t.nbytes());
  return t.storage();
}

Tensor row_padded(const Dims& shape, DType dtype, std::int64_t pad) {
  Dims base_shape = shape;
  base_shape.back() += pad;
  Tensor base = Tensor::empty(base_shape, dtype);
  std::memset(base.raw_data(), kPoisonByte, base.nbytes());
  return pad ? base.slice(static_cast<std::int64_t>(shape.size()) - 1, 0, shape.back()) : base;
}

Tensor int_tensor(const std::vector<int>& values, const Dims& shape) {
  Tensor t = Tensor::empty(shape, DType::i32);
  std::copy(values.begin(), values.end(), t.data<std::int32_t>());
  return t;
}

Problem make_problem(std::uint64_t seed, std::int64_t H, const Meta& meta, DType state_dtype,
                     std::optional<float> /*unused*/ = std::nullopt, const Layout& layout = {}) {
  Rng rng(seed);
  Problem p;
  p.H = H;
  p.T = meta.T;
  p.meta = meta;
  p.R = meta.rows();
  p.slots = meta.slots;
  p.state_dtype = state_dtype;
  const std::int64_t C = H * kD, N = static_cast<std::int64_t>(meta.lens.size()), T = meta.T;
  p.x = row_padded({p.R, 3 * C}, DType::bf16, layout.row_pad);
  rng.normal(p.x, 0.0, 1.0);
  p.weight = testing::random_tensor(rng, {3, 4, C}, DType::f32, 0.1);
  p.raw_gate = row_padded({1, p.R, H, kD}, DType::bf16, layout.row_pad);
  rng.normal(p.raw_gate);
  p.raw_beta = row_padded({1, p.R, H}, DType::bf16, layout.row_pad);
  rng.normal(p.raw_beta);
  p.A_log = testing::random_tensor(rng, {H}, DType::f32, 0.5);
  p.dt_bias = testing::random_tensor(rng, {C}, DType::f32, 0.1);
  p.output_gate = row_padded({1, p.R, H, kD}, DType::bf16, layout.row_pad);
  rng.normal(p.output_gate);
  p.norm_weight = testing::random_tensor(rng, {kD}, DType::f32, 1.0);
  std::vector<int> flat, qsl{0};
  for (const auto& row : meta.si) flat.insert(flat.end(), row.begin(), row.end());
  for (int l : meta.lens) qsl.push_back(qsl.back() + l);
  p.state_indices = int_tensor(flat, {N, T});
  p.qsl = int_tensor(qsl, {N + 1});
  p.nat = int_tensor(meta.nat, {N});

  const std::int64_t C3 = 3 * C, hist = T + 2;
  const std::int64_t conv_elems = C3 * hist, state_elems = H * kD * kD;
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(state_dtype));
  const Dims conv_shape{p.slots, C3, hist}, state_shape{p.slots, H, kD, kD};
  if (layout.shared_page) {
    const std::int64_t page = conv_elems * 2 + state_elems * es + layout.slot_pad * 16;
    auto storage = poisoned_storage(static_cast<std::size_t>(page * p.slots));
    p.conv_state = Tensor::view_of(storage, 0, conv_shape, {page / 2, 1, C3}, DType::bf16);
    p.state = Tensor::view_of(storage, conv_elems * 2 / es, state_shape,
                              {page / es, kD * kD, kD, 1}, state_dtype);
  } else {
    const std::int64_t conv_stride = conv_elems + layout.slot_pad;
    const std::int64_t state_stride = state_elems + layout.slot_pad;
    auto cs = poisoned_storage(static_cast<std::size_t>(conv_stride * p.slots * 2));
    auto ss = poisoned_storage(static_cast<std::size_t>(state_stride * p.slots * es));
    p.conv_state = Tensor::view_of(cs, 0, conv_shape, {conv_stride, 1, C3}, DType::bf16);
    p.state = Tensor::view_of(ss, 0, state_shape, {state_stride, kD * kD, kD, 1}, state_dtype);
  }
  for (std::int64_t n = 0; n < N; ++n) {
    const int a = std::clamp(meta.nat[n] - 1, 0, static_cast<int>(T) - 1);
    const int cs = meta.si[n][0], ss = meta.si[n][a];
    if (meta.lens[n] == 0 || cs <= 0 || ss <= 0) continue;
    Tensor window = p.conv_state.select(0, cs).slice(1, a, a + 3);
    rng.normal(window, 0.0, 0.1);
    Tensor source = p.state.select(0, ss);
    rng.normal(source, 0.0, 0.01);
  }
  // Untouched slots: random too (they must come back bit-identical).
  for (std::int64_t s = 1; s < p.slots; ++s) {
    Tensor st = p.state.select(0, s);
    if (std::isnan(st.at({0, 0, 0}))) rng.normal(st, 0.0, 0.01);
  }
  p.output = Tensor::empty({1, p.R, H, kD}, DType::bf16);
  std::memset(p.output.raw_data(), kPoisonByte, p.output.nbytes());
  return p;
}

// Random metadata: N sequences, ragged lengths in [0, T], every accepted offset, optional null
// conv / source / destination slots; every live slot distinct across sequences.
Meta random_meta(Rng& rng, int N, int T, int trailing, bool nulls) {
  Meta m;
  m.T = T;
  m.trailing = trailing;
  int next = 1;
  for (int n = 0; n < N; ++n) {
    m.lens.push_back(static_cast<int>(rng.integer(n % 3 == 0 ? T : 0, T)));
    m.nat.push_back(static_cast<int>(rng.integer(1, T)));
    std::vector<int> row(T);
    for (int t = 0; t < T; ++t) row[t] = next++;
    if (nulls && n % 5 == 1) row[0] = 0;                                        // null conv slot
    if (nulls && n % 5 == 2) row[std::clamp(m.nat.back() - 1, 0, T - 1)] = -1;  // null source
    if (nulls && n % 5 == 3 && T > 1) row[T - 1 - (n % T == T - 1)] = 0;        // null dest
    m.si.push_back(std::move(row));
  }
  m.slots = next + 2;  // two untouched slots at the end
  return m;
}

// Metadata of N full sequences (L = T, accepted offsets cycling over 1 .. T) where every token of
// sequence n checkpoints into the slot it reads (n + 1): a chain of calls updates each state in
// place, so each call reads what the previous one wrote.
Meta in_place_meta(int N, int T) {
  Meta m;
  m.T = T;
  for (int n = 0; n < N; ++n) {
    m.lens.push_back(T);
    m.nat.push_back(1 + n % T);
    m.si.push_back(std::vector<int>(T, n + 1));
  }
  m.slots = N + 2;
  return m;
}

// Metadata of R one-token rows (T = 1): row r in slot r + 1, null (slot 0) where r % period == 3.
Meta per_row_meta(int R, int period) {
  Meta m;
  for (int r = 0; r < R; ++r) {
    m.lens.push_back(1);
    m.nat.push_back(1);
    m.si.push_back({r % period == 3 ? 0 : r + 1});
  }
  m.slots = R + 2;
  return m;
}

// The slot of each row of a one-token Meta (the per-row modes' slot table).
std::vector<int> row_slots_of(const Meta& m) {
  std::vector<int> slots;
  for (const auto& row : m.si) slots.push_back(row[0]);
  return slots;
}

// ---------------------------------------------------------------------------------------------
// Device mirrors.

// A tensor with the same storage bytes, offset, shape and strides on `device`.
Tensor mirror(const Tensor& t, Device device) {
  const auto& st = t.storage();
  Tensor flat = Tensor::empty({static_cast<std::int64_t>((st->bytes + 3) / 4)}, DType::f32, device);
  device_copy(flat.raw_data(), device, st->data, st->device, st->bytes);
  return Tensor::view_of(flat.storage(), t.offset(), t.shape(), t.strides(), t.dtype());
}

Problem to_device(const Problem& p, Device d) {
  Problem q = p;
  q.x = mirror(p.x, d);
  q.weight = mirror(p.weight, d);
  q.raw_gate = mirror(p.raw_gate, d);
  q.raw_beta = mirror(p.raw_beta, d);
  q.A_log = mirror(p.A_log, d);
  q.dt_bias = mirror(p.dt_bias, d);
  q.state_indices = mirror(p.state_indices, d);
  q.output_gate = mirror(p.output_gate, d);
  q.norm_weight = mirror(p.norm_weight, d);
  q.qsl = mirror(p.qsl, d);
  q.nat = mirror(p.nat, d);
  q.output = mirror(p.output, d);
  if (p.conv_state.storage() == p.state.storage()) {
    q.conv_state = mirror(p.conv_state, d);
    q.state = Tensor::view_of(q.conv_state.storage(), p.state.offset(), p.state.shape(),
                              p.state.strides(), p.state.dtype());
  } else {
    q.conv_state = mirror(p.conv_state, d);
    q.state = mirror(p.state, d);
  }
  return q;
}

KdaDecodeOptions options_for(std::optional<float> lb) {
  KdaDecodeOptions o;
  o.lower_bound = lb;
  o.norm_eps = 1e-5f;
  return o;
}

void run_packed(Problem& p, std::optional<float> lb) {
  packed_fused_kda_decode(p.x, p.weight, p.conv_state, p.raw_gate, p.raw_beta, p.A_log, p.dt_bias,
                          p.state_indices, p.state, p.output_gate, p.norm_weight, options_for(lb),
                          p.output, p.qsl, p.nat);
}

// The KdaDecodeArgs the op layer would build for a packed call on `p` (device tensors).
KdaDecodeArgs packed_args(Problem& p, std::optional<float> lb) {
  KdaDecodeArgs a;
  a.x = p.x;
  a.weight = p.weight;
  a.conv_state = p.conv_state;
  a.raw_gate = p.raw_gate.select(0, 0);
  a.raw_beta = p.raw_beta.select(0, 0);
  a.A_log = p.A_log;
  a.dt_bias = p.dt_bias;
  a.state_indices = p.state_indices;
  a.state = p.state;
  a.output_gate = p.output_gate.select(0, 0);
  a.norm_weight = p.norm_weight;
  a.output = p.output.select(0, 0);
  a.query_start_loc = p.qsl;
  a.num_accepted_tokens = p.nat;
  a.mode = KdaMode::packed;
  a.num_rows = p.R;
  a.num_heads = p.H;
  a.head_dim = kD;
  a.channels = p.H * kD;
  a.num_seqs = static_cast<std::int64_t>(p.meta.lens.size());
  a.max_t = p.T;
  a.hist_len = p.T + 2;
  a.num_slots = p.slots;
  a.state_dtype = p.state_dtype;
  a.lower_bound = lb;
  a.norm_eps = 1e-5f;
  return a;
}

// The KdaDecodeArgs of a plain (per-row) call on `p`'s rows with the slot table `row_slots`
// (device tensors).
KdaDecodeArgs plain_args(Problem& p, const Tensor& row_slots, std::optional<float> lb) {
  KdaDecodeArgs a = packed_args(p, lb);
  a.mode = KdaMode::plain;
  a.state_indices = row_slots;
  a.row_slots = row_slots;
  a.query_start_loc = Tensor();
  a.num_accepted_tokens = Tensor();
  a.num_seqs = p.R;
  return a;
}

// Raw bytes of a tensor's whole storage.
std::vector<std::uint8_t> storage_bytes(const Tensor& t) {
  const auto& st = t.storage();
  std::vector<std::uint8_t> out(st->bytes);
  device_copy(out.data(), Device::cpu(), st->data, st->device, st->bytes);
  return out;
}

// Slots holding a checkpoint written by a live sequence.
std::set<int> written_slots(const Meta& m) {
  std::set<int> out;
  for (std::size_t n = 0; n < m.lens.size(); ++n) {
    const int a = std::clamp(m.nat[n] - 1, 0, static_cast<int>(m.T) - 1);
    if (m.lens[n] == 0 || m.si[n][0] <= 0 || m.si[n][a] <= 0) continue;
    for (int t = 0; t < m.lens[n]; ++t)
      if (m.si[n][t] > 0) out.insert(m.si[n][t]);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The comparison of one case.

// What a case is checked against: the float64 reference and the CPU kernel, each run once on a
// copy of the host problem (a problem checked under several variants reuses them: on the largest
// problems they take most of a case's time).
struct Oracle {
  Problem cpu;                      // the CPU kernel's results
  testing::KdaReferenceResult ref;  // the float64 reference's
};
Oracle oracle_of(const Problem& host, std::optional<float> lb) {
  Oracle o{to_device(host, Device::cpu()),
           testing::reference_packed_kda_decode(
               host.x, host.weight, host.conv_state, host.raw_gate, host.raw_beta, host.A_log,
               host.dt_bias, host.state_indices, host.state, host.output_gate, host.norm_weight,
               lb ? std::optional<double>(*lb) : std::nullopt, 1e-5, host.qsl, host.nat)};
  run_packed(o.cpu, lb);
  return o;
}

// One variant's run of `host` against its oracle.
void check_variant(const Problem& host, const Oracle& oracle, std::optional<float> lb,
                   cuda::KdaVariant variant, const std::string& what) {
  SCOPED_TRACE(what + " variant=" + cuda::kda_variant_name(variant));
  const Problem& cpu = oracle.cpu;
  const testing::KdaReferenceResult& ref = oracle.ref;

  Problem gpu = to_device(host, Device::cuda());
  KdaDecodeArgs args = packed_args(gpu, lb);
  cuda::kda_decode(args, nullptr, variant);
  cuda::synchronize();

  // conv_state: the whole storage bit for bit (shared-page layouts compare the cache elsewhere).
  const Tensor gpu_conv = mirror(gpu.conv_state, Device::cpu());
  const Tensor gpu_state = mirror(gpu.state, Device::cpu());
  const Tensor gpu_out = mirror(gpu.output, Device::cpu());
  EXPECT_TRUE(testing::bit_equal(gpu_conv, cpu.conv_state)) << "conv_state";
  EXPECT_TRUE(testing::bit_equal(gpu_conv, ref.conv_state)) << "conv_state vs reference";

  // Output against the reference and the oracle.
  const Tolerance state_tol = host.state_dtype == DType::f32 ? kStateTolF32 : kStateTolBf16;
  EXPECT_TRUE(testing::close(gpu_out, ref.output, kOutputTol)) << "output vs reference";
  EXPECT_TRUE(testing::close(gpu_out, cpu.output, kOutputTol)) << "output vs CPU kernel";
  {
    const CompareReport r = compare_tensors(gpu_out, ref.output, kOutputTol);
    g_stats.out_abs = std::max(g_stats.out_abs, r.max_abs_error);
    g_stats.out_rel = std::max(g_stats.out_rel, r.max_rel_error);
    std::int64_t beyond = 0;
    const std::int64_t count = gpu_out.numel();
    for_each_offset(
        [&](std::int64_t at_gpu, std::int64_t at_ref) {
          const double g = load_as_double(gpu_out.storage()->data, gpu_out.dtype(), at_gpu);
          const double e = load_as_double(ref.output.storage()->data, ref.output.dtype(), at_ref);
          const double ulp = std::ldexp(1.0, std::ilogb(std::max(std::fabs(e), 1e-30)) - 7);
          if (std::fabs(g - e) > ulp * 1.0001) ++beyond;
        },
        gpu_out, ref.output);
    g_stats.out_count += count;
    g_stats.out_beyond_ulp += beyond;
    EXPECT_LE(static_cast<double>(beyond), kMaxFractionBeyondOneUlp * count + 1) << "ulp budget";
  }
  // Unowned rows: exact zeros (the oracle's rows are zeros there; compare bits to it).
  {
    std::vector<char> live(static_cast<std::size_t>(host.R), 0);
    std::int64_t b = 0;
    for (std::size_t n = 0; n < host.meta.lens.size(); ++n) {
      const int a = std::clamp(host.meta.nat[n] - 1, 0, static_cast<int>(host.T) - 1);
      const bool ok = host.meta.si[n][0] > 0 && host.meta.si[n][a] > 0;
      for (int t = 0; t < host.meta.lens[n]; ++t) live[b + t] = ok;
      b += host.meta.lens[n];
    }
    for (std::int64_t r = 0; r < host.R; ++r) {
      if (live[r]) continue;
      const Tensor row = gpu_out.select(1, r);
      for (std::int64_t i = 0; i < row.numel(); ++i)
        if (row.at_linear(i) != 0.0 || std::signbit(row.at_linear(i))) {
          ADD_FAILURE() << "unowned row " << r << " not zero at " << i;
          break;
        }
    }
  }
  // State: checkpoints within tolerance, every other slot bit-identical.
  const std::set<int> written = written_slots(host.meta);
  for (std::int64_t s = 0; s < host.slots; ++s) {
    const Tensor g = gpu_state.select(0, s), c = cpu.state.select(0, s), e = ref.state.select(0, s);
    if (written.count(static_cast<int>(s))) {
      for (const Tensor* other : {&e, &c}) {
        const char* name = other == &e ? "reference" : "CPU kernel";
        EXPECT_TRUE(testing::close(g, *other, kStateTolAll))
            << "state slot " << s << " vs " << name;
        const CompareReport tight = compare_tensors(g, *other, state_tol);
        EXPECT_LE(static_cast<double>(tight.mismatches),
                  kMaxFractionStateBeyondTight * static_cast<double>(tight.count))
            << "state slot " << s << " vs " << name << ": " << tight.str();
      }
      const CompareReport r = compare_tensors(g, e, state_tol);
      const int k = host.state_dtype == DType::f32 ? 0 : 1;
      g_stats.state_abs[k] = std::max(g_stats.state_abs[k], r.max_abs_error);
      g_stats.state_rel[k] = std::max(g_stats.state_rel[k], r.max_rel_error);
    } else {
      EXPECT_TRUE(testing::bit_equal(g, c)) << "untouched state slot " << s;
    }
  }
  // Bytes outside every logical element (slot padding, shared pages): unchanged.
  if (host.conv_state.storage() != host.state.storage()) {
    EXPECT_EQ(storage_bytes(gpu.conv_state), storage_bytes(cpu.conv_state)) << "conv storage";
  }
}

void check_case(const Problem& host, std::optional<float> lb, cuda::KdaVariant variant,
                const std::string& what) {
  check_variant(host, oracle_of(host, lb), lb, variant, what);
}
// Each of `variants` against one oracle.
template <typename Variants>
void check_variants(const Problem& host, std::optional<float> lb, const Variants& variants,
                    const std::string& what) {
  const Oracle oracle = oracle_of(host, lb);
  for (cuda::KdaVariant v : variants) check_variant(host, oracle, lb, v, what);
}

const cuda::KdaVariant kVariants[] = {cuda::KdaVariant::stream, cuda::KdaVariant::stream_plain,
                                      cuda::KdaVariant::wide,   cuda::KdaVariant::wide512,
                                      cuda::KdaVariant::rows,   cuda::KdaVariant::split2,
                                      cuda::KdaVariant::split4};

// Every forced variant, then the automatic choice.
std::vector<cuda::KdaVariant> variants_and_automatic() {
  std::vector<cuda::KdaVariant> variants(std::begin(kVariants), std::end(kVariants));
  variants.push_back(cuda::KdaVariant::automatic);
  return variants;
}

// The output, conv_state and state storages of `got` equal `want`'s, byte for byte (EXPECT_TRUE:
// a failing EXPECT_EQ would print both storages).
void expect_bitwise_equal(const Problem& got, const Problem& want) {
  EXPECT_TRUE(storage_bytes(got.output) == storage_bytes(want.output)) << "output";
  EXPECT_TRUE(storage_bytes(got.conv_state) == storage_bytes(want.conv_state)) << "conv_state";
  EXPECT_TRUE(storage_bytes(got.state) == storage_bytes(want.state)) << "state";
}

using testing::PdlStream;

// ---------------------------------------------------------------------------------------------

// The compiled `stream` kernel can be placed on an SM with the block it is launched with: its
// registers x threads fit a sub-partition (the driver's maxThreadsPerBlock admits the block), its
// shared memory the opt-in limit, and it does not spill. A kernel that fails this would fall back
// to `wide` silently (or, before that check, fail to launch).
TEST(KdaCuda, StreamKernelAdmitsItsBlock) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  using cuda::KdaStreamKernel;
  struct Kernel {
    DType dtype;
    KdaStreamKernel kind;
    const char* name;
  };
  for (const Kernel kernel :
       {Kernel{DType::f32, KdaStreamKernel::eight_warps, "8 warps"},
        Kernel{DType::bf16, KdaStreamKernel::eight_warps, "8 warps"},
        Kernel{DType::f32, KdaStreamKernel::precompute_group, "precompute group"},
        Kernel{DType::bf16, KdaStreamKernel::precompute_group, "precompute group"},
        Kernel{DType::f32, KdaStreamKernel::precompute_group_one_token, "one-token"}}) {
    for (bool staged : {true, false}) {
      const cuda::KdaKernelInfo info =
          cuda::kda_stream_kernel_info(kernel.dtype, staged, kernel.kind);
      SCOPED_TRACE(std::string(dtype_name(kernel.dtype)) + " " + kernel.name +
                   (staged ? " staged" : " plain") + ": " + std::to_string(info.num_regs) +
                   " registers, " + std::to_string(info.smem_bytes) + " B shared");
      EXPECT_GE(info.max_threads_per_block, info.block);
      EXPECT_LE(info.smem_bytes, info.smem_optin);
      EXPECT_EQ(info.local_bytes, 0) << "the kernel spills";
      EXPECT_TRUE(info.launchable) << info.reason;
    }
  }
}

// Where the rule's choice changed with run 7's and dev/kda_b's tables (N = 8, H = 32; N = 1 at
// T >= 4; N = 48 at T = 1, bf16 past rows' band: rows on an H100, stream on an H200), the
// automatic variant against the CPU kernel and the reference, every sequence at full length.
TEST(KdaCuda, RuleBoundaryCases) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(19);
  int device = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  const std::int64_t H = 32;
  struct Case {
    int n, t;
  };
  for (const Case c :
       {Case{8, 1}, Case{8, 2}, Case{8, 4}, Case{4, 2}, Case{1, 4}, Case{1, 8}, Case{48, 1}})
    for (DType sdt : {DType::f32, DType::bf16}) {
      Meta m = random_meta(rng, c.n, c.t, 1, false);
      for (int& l : m.lens) l = c.t;
      const Problem p = make_problem(rng.integer(0, 1 << 30), H, m, sdt);
      const cuda::KdaVariant chosen = cuda::choose_kda_variant(
          c.n, H, c.t, sdt, sms, cuda::current_device_facts().dram_bytes_per_s);
      check_case(p, -5.0f, cuda::KdaVariant::automatic,
                 "rule N=" + std::to_string(c.n) + " T=" + std::to_string(c.t) + " " +
                     dtype_name(sdt) + " picks " + cuda::kda_variant_name(chosen));
    }
}

TEST(KdaCuda, T1Grid) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(11);
  for (DType sdt : {DType::f32, DType::bf16})
    for (std::optional<float> lb : {std::optional<float>(-5.0f), std::optional<float>()})
      for (int H : {1, 3, 32}) {
        const Meta m = random_meta(rng, 7, 1, 2, true);
        const Problem p = make_problem(rng.integer(0, 1 << 30), H, m, sdt);
        check_variants(
            p, lb, kVariants,
            "T=1 H=" + std::to_string(H) + " " + dtype_name(sdt) + (lb ? " lb" : " softplus"));
      }
}

TEST(KdaCuda, PackedGrid) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(12);
  for (int T : {2, 3, 4, 5, 8, 9, 40})
    for (DType sdt : {DType::f32, DType::bf16}) {
      const std::optional<float> lb =
          (T % 2) ? std::optional<float>() : std::optional<float>(-3.0f);
      const Meta m = random_meta(rng, T == 40 ? 3 : 9, T, T % 3, true);
      const Problem p = make_problem(rng.integer(0, 1 << 30), T == 40 ? 2 : 5, m, sdt);
      check_variants(p, lb, kVariants, "T=" + std::to_string(T) + " " + dtype_name(sdt));
    }
}

// The persistent `stream` kernel with many items per CTA: its stage ring wraps many times and
// it resolves three batches of 32 items per CTA (N * H = 8960 > 64 * 132 SMs at T = 1). One test
// a state dtype (the largest GPU tests: separate tests spread over gtest shards and ctest jobs).
void check_many_items_per_cta(DType sdt, std::uint64_t seed) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(seed);
  const cuda::KdaVariant stream_variants[] = {cuda::KdaVariant::stream,
                                              cuda::KdaVariant::stream_plain};
  const Meta m1 = random_meta(rng, 280, 1, 3, true);
  const Problem p1 = make_problem(rng.integer(0, 1 << 30), 32, m1, sdt);
  check_variants(p1, -5.0f, stream_variants, std::string("many items T=1 ") + dtype_name(sdt));
  const Meta m3 = random_meta(rng, 48, 3, 2, true);
  const Problem p3 = make_problem(rng.integer(0, 1 << 30), 32, m3, sdt);
  check_variants(p3, std::nullopt, stream_variants,
                 std::string("many items T=3 ") + dtype_name(sdt));
}
TEST(KdaCuda, StreamManyItemsPerCtaF32) { check_many_items_per_cta(DType::f32, 17); }
TEST(KdaCuda, StreamManyItemsPerCtaBf16) { check_many_items_per_cta(DType::bf16, 18); }

// The `stream` variant on `units` x `heads` items, its grid capped at `grid_cap` CTAs (0: one per
// SM; cuda::set_kda_stream_grid_cap), so that each CTA walks several items.
void check_stream_items(DType sdt, int T, std::uint64_t seed, int units, std::int64_t heads,
                        int grid_cap, const std::string& what) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  struct Cap {
    explicit Cap(int ctas) { cuda::set_kda_stream_grid_cap(ctas); }
    ~Cap() { cuda::set_kda_stream_grid_cap(0); }
  } cap(grid_cap);
  Rng rng(seed);
  const Meta m = random_meta(rng, units, T, 1, true);
  const Problem p = make_problem(rng.integer(0, 1 << 30), heads, m, sdt);
  check_case(p, -5.0f, cuda::KdaVariant::stream,
             what + " T=" + std::to_string(T) + " " + dtype_name(sdt));
}

// The precompute-group `stream` kernel (bf16 T <= 8, fp32 T = 1) with 4 items on every CTA of a
// 132-SM GPU (N * H = 528): its stage ring and both hand-off barrier pairs wrap twice. One test
// per case, 1.5-2.6 s each (the large ring tests take 20-45 s, mostly the CPU reference), so
// gpu-check's memcheck covers them; its racecheck takes the one-CTA tests below.
void check_precompute_group_ring(DType sdt, int T, std::uint64_t seed) {
  check_stream_items(sdt, T, seed, 132, 4, 0, "ring");
}
TEST(KdaCuda, PrecomputeGroupRingF32T1) { check_precompute_group_ring(DType::f32, 1, 37); }
TEST(KdaCuda, PrecomputeGroupRingBf16T1) { check_precompute_group_ring(DType::bf16, 1, 38); }
TEST(KdaCuda, PrecomputeGroupRingBf16T2) { check_precompute_group_ring(DType::bf16, 2, 39); }

// One `stream` CTA walking 24 items: its stage ring and both hand-off barrier pairs wrap several
// times, from a problem small enough for compute-sanitizer racecheck (gpu-check): T <= 8 runs
// the precompute-group kernel (24 items on the one CTA: fp32 too), T = 9 the 8-warp kernel's
// item loop; 0 hazards in 4-5 s each (perf.md runs 160, 166). (Metadata batches, 32 items each,
// wrap in StreamManyItemsPerCta*.)
void check_one_stream_cta(DType sdt, int T, std::uint64_t seed) {
  check_stream_items(sdt, T, seed, 12, 2, 1, "one CTA");
}
TEST(KdaCuda, OneStreamCtaF32T1) { check_one_stream_cta(DType::f32, 1, 41); }
TEST(KdaCuda, OneStreamCtaF32T2) { check_one_stream_cta(DType::f32, 2, 42); }
TEST(KdaCuda, OneStreamCtaF32T8) { check_one_stream_cta(DType::f32, 8, 45); }
TEST(KdaCuda, OneStreamCtaF32T9) { check_one_stream_cta(DType::f32, 9, 46); }
TEST(KdaCuda, OneStreamCtaBf16T1) { check_one_stream_cta(DType::bf16, 1, 43); }
TEST(KdaCuda, OneStreamCtaBf16T2) { check_one_stream_cta(DType::bf16, 2, 44); }

// Dynamic items (kda_decode_stream.cuh, StreamItems: each CTA of the fp32 precompute-group kernel
// walks a quarter of its share statically, at least kStages + 5 items, and claims the rest from a
// pool whose counters the launch's last CTA resets): 4 CTAs x 20 items (N = 20, H = 4), every
// sequence updating its own slot in place, so each launch reads what the previous one wrote.
// Launches back to back on one PDL stream (the counters reused at once) and a captured graph of two
// launches replayed three times equal the same launches made serially with static items
// (kKdaTuneStaticItems), bit for bit; T = 1 (the one-token kernel), 2 and 4. bf16 state keeps
// static items (the same launches count none).
TEST(KdaCuda, DynamicItemsChainAndGraphReplay) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  struct Scope {
    unsigned saved = cuda::kda_tune();
    Scope() { cuda::set_kda_stream_grid_cap(4); }
    ~Scope() {
      cuda::set_kda_tune(saved);
      cuda::set_kda_stream_grid_cap(0);
    }
  } scope;
  const PdlStream stream;
  Rng rng(47);
  constexpr int kLaunches = 6;
  for (int T : {1, 2, 4})
    for (DType sdt : {DType::f32, DType::bf16}) {
      if (sdt == DType::bf16 && T > 1) continue;
      SCOPED_TRACE("T=" + std::to_string(T) + " " + dtype_name(sdt));
      const Problem p = make_problem(rng.integer(0, 1 << 30), 4, in_place_meta(20, T), sdt);
      Problem chained = to_device(p, Device::cuda()), replayed = to_device(p, Device::cuda());
      Problem serial = to_device(p, Device::cuda());
      cuda::synchronize();
      cuda::set_kda_tune(0);
      const std::uint64_t dynamic0 = cuda::kda_dynamic_item_launches();
      for (int k = 0; k < kLaunches; ++k)
        cuda::kda_decode(packed_args(chained, -5.0f), stream.get(), cuda::KdaVariant::stream);
      ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      ASSERT_EQ(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeGlobal), cudaSuccess);
      for (int k = 0; k < 2; ++k)
        cuda::kda_decode(packed_args(replayed, -5.0f), stream.get(), cuda::KdaVariant::stream);
      ASSERT_EQ(cudaStreamEndCapture(stream.get(), &graph), cudaSuccess);
      ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
      for (int r = 0; r < kLaunches / 2; ++r)
        ASSERT_EQ(cudaGraphLaunch(exec, stream.get()), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      EXPECT_EQ(cuda::kda_dynamic_item_launches() - dynamic0,
                sdt == DType::f32 ? kLaunches + 2u : 0u);
      cuda::set_kda_tune(cuda::kKdaTuneStaticItems);
      for (int k = 0; k < kLaunches; ++k)
        cuda::kda_decode(packed_args(serial, -5.0f), nullptr, cuda::KdaVariant::stream);
      cuda::synchronize();
      expect_bitwise_equal(chained, serial);
      expect_bitwise_equal(replayed, serial);
    }
}

TEST(KdaCuda, OneTokenKernelInfoRejectsBf16) {
  EXPECT_THROW(cuda::kda_stream_kernel_info(DType::bf16, true,
                                            cuda::KdaStreamKernel::precompute_group_one_token),
               ValueError);
}

TEST(KdaCuda, StreamGridCapRejectsNegative) {
  EXPECT_THROW(cuda::set_kda_stream_grid_cap(-1), ValueError);
}

TEST(KdaCuda, EveryAcceptedOffset) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(13);
  const int T = 4;
  Meta m = random_meta(rng, 8, T, 1, false);
  for (int n = 0; n < 8; ++n) {
    m.nat[n] = n % T + 1;
    m.lens[n] = (n / T) ? T : 1 + n % T;
  }
  for (DType sdt : {DType::f32, DType::bf16}) {
    const Problem p = make_problem(rng.integer(0, 1 << 30), 2, m, sdt);
    check_case(p, -5.0f, cuda::KdaVariant::automatic, "accepted offsets");
  }
}

// Spec §4 [beyond]: the opt-in `validate` mode checks the value contracts on CUDA as the CPU
// backend always does (the metadata read back to the host) and raises before any cache or the
// output is written. Without it nothing is read on the host (a captured launch never syncs): an
// out-of-range num_accepted_tokens then takes §3's clamp, bit for bit the in-range value's.
TEST(KdaCuda, ValidateModeChecksTheValueContracts) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Meta m;
  m.T = 3;
  m.lens = {3, 2};
  m.nat = {3, 3};
  m.si = {{1, 2, 3}, {4, 5, 6}};
  m.trailing = 1;
  m.slots = 7;
  const Problem host = make_problem(61, 2, m, DType::f32);
  struct Case {
    const char* what;
    std::vector<std::string> needles;
    void (*edit)(Problem&);
  };
  const Case cases[] = {
      {"num_accepted_tokens above T",
       {"`num_accepted_tokens`[1]", "got 4"},
       [](Problem& p) {
         p.nat = int_tensor({3, 4}, {2});
       }},
      {"query_start_loc decreasing",
       {"`query_start_loc` must be non-decreasing"},
       [](Problem& p) {
         p.qsl = int_tensor({0, 3, 2}, {3});
       }},
      {"a destination past the slots",
       {"`state_indices`[1, 1]", "= 7 must be < num_slots = 7"},
       [](Problem& p) {
         p.state_indices = int_tensor({1, 2, 3, 4, 7, 6}, {2, 3});
       }},
      {"two sequences write one slot",
       {"slot 2 is written by sequence 0"},
       [](Problem& p) {
         p.state_indices = int_tensor({1, 2, 3, 4, 2, 6}, {2, 3});
       }},
  };
  KdaDecodeOptions validated = options_for(-5.0f);
  validated.validate = true;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Problem edited = host;
    c.edit(edited);
    Problem dev = to_device(edited, Device::cuda());
    const auto conv = storage_bytes(dev.conv_state), state = storage_bytes(dev.state),
               out = storage_bytes(dev.output);
    try {
      packed_fused_kda_decode(dev.x, dev.weight, dev.conv_state, dev.raw_gate, dev.raw_beta,
                              dev.A_log, dev.dt_bias, dev.state_indices, dev.state, dev.output_gate,
                              dev.norm_weight, validated, dev.output, dev.qsl, dev.nat);
      ADD_FAILURE() << "validate: no error";
    } catch (const ValueError& e) {
      for (const std::string& needle : c.needles)
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    cuda::synchronize();
    EXPECT_TRUE(storage_bytes(dev.conv_state) == conv) << "a refused call wrote conv_state";
    EXPECT_TRUE(storage_bytes(dev.state) == state) << "a refused call wrote state";
    EXPECT_TRUE(storage_bytes(dev.output) == out) << "a refused call wrote the output";
  }
  Problem clamped_host = host;
  clamped_host.nat = int_tensor({3, 4}, {2});
  Problem clamped = to_device(clamped_host, Device::cuda());
  Problem in_range = to_device(host, Device::cuda());
  EXPECT_NO_THROW(run_packed(clamped, -5.0f));
  run_packed(in_range, -5.0f);
  cuda::synchronize();
  expect_bitwise_equal(clamped, in_range);
}

TEST(KdaCuda, PaddedAndSharedLayouts) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(14);
  const Meta m = random_meta(rng, 6, 3, 2, true);
  for (DType sdt : {DType::f32, DType::bf16}) {
    // Odd paddings: the state is then not 16-byte aligned per slot (element-wise path).
    for (std::int64_t slot_pad : {0, 3, 8}) {
      Layout layout;
      layout.row_pad = 5;
      layout.slot_pad = slot_pad;
      const Problem p = make_problem(rng.integer(0, 1 << 30), 3, m, sdt, std::nullopt, layout);
      check_variants(p, -5.0f, kVariants, "padded " + std::to_string(slot_pad));
    }
    Layout shared;
    shared.shared_page = true;
    shared.slot_pad = 1;
    const Problem p = make_problem(rng.integer(0, 1 << 30), 2, m, sdt, std::nullopt, shared);
    check_case(p, std::nullopt, cuda::KdaVariant::automatic, "shared page");
  }
}

// The plain T = 1 call, the packed T = 1 call and the t1_state_indices call agree bit for bit.
TEST(KdaCuda, PlainPackedT1Agree) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(15);
  const int R = 9;
  const Meta m = per_row_meta(R, 4);
  const std::vector<int> slots = row_slots_of(m);
  for (DType sdt : {DType::f32, DType::bf16}) {
    const Problem p = make_problem(rng.integer(0, 1 << 30), 4, m, sdt);
    Problem a = to_device(p, Device::cuda()), b = to_device(p, Device::cuda()),
            c = to_device(p, Device::cuda());
    run_packed(a, -5.0f);
    const Tensor plain_idx = mirror(int_tensor(slots, {R}), Device::cuda());
    fused_kda_decode(b.x, b.weight, b.conv_state, b.raw_gate, b.raw_beta, b.A_log, b.dt_bias,
                     plain_idx, b.state, b.output_gate, b.norm_weight, options_for(-5.0f),
                     b.output);
    // t1: structural qsl (garbage values are not read) and per-row slots.
    const Tensor junk_qsl =
        mirror(int_tensor(std::vector<int>(R + 1, 12345), {R + 1}), Device::cuda());
    packed_fused_kda_decode(c.x, c.weight, c.conv_state, c.raw_gate, c.raw_beta, c.A_log, c.dt_bias,
                            c.state_indices, c.state, c.output_gate, c.norm_weight,
                            options_for(-5.0f), c.output, junk_qsl, c.nat, &plain_idx);
    cuda::synchronize();
    for (Problem* q : {&b, &c}) expect_bitwise_equal(*q, a);
  }
}

// Per-row modes (plain and t1) with every variant forced, on enough rows that `stream` runs many
// items per CTA: bit-identical to the same variant's packed T = 1 run on equivalent rows (which
// the grids above check against the reference).
TEST(KdaCuda, PerRowModesEveryVariant) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(18);
  const int R = 300;
  const Meta m = per_row_meta(R, 7);
  const std::vector<int> slots = row_slots_of(m);
  for (DType sdt : {DType::f32, DType::bf16}) {
    const Problem p = make_problem(rng.integer(0, 1 << 30), 4, m, sdt);
    const Tensor row_slots = mirror(int_tensor(slots, {R}), Device::cuda());
    const Tensor junk_qsl =
        mirror(int_tensor(std::vector<int>(R + 1, 12345), {R + 1}), Device::cuda());
    for (auto v : kVariants) {
      SCOPED_TRACE(std::string(dtype_name(sdt)) + " variant=" + cuda::kda_variant_name(v));
      Problem a = to_device(p, Device::cuda()), b = to_device(p, Device::cuda()),
              c = to_device(p, Device::cuda());
      cuda::kda_decode(packed_args(a, -5.0f), nullptr, v);
      cuda::kda_decode(plain_args(b, row_slots, -5.0f), nullptr, v);
      KdaDecodeArgs t1 = packed_args(c, -5.0f);
      t1.mode = KdaMode::t1;
      t1.row_slots = row_slots;
      t1.query_start_loc = junk_qsl;
      cuda::kda_decode(t1, nullptr, v);
      cuda::synchronize();
      for (Problem* q : {&b, &c}) expect_bitwise_equal(*q, a);
    }
  }
}

// Repeated runs are bitwise identical; every variant agrees with the others within tolerance.
TEST(KdaCuda, Deterministic) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(16);
  const Meta m = random_meta(rng, 20, 4, 3, true);
  const Problem p = make_problem(rng.integer(0, 1 << 30), 8, m, DType::f32);
  for (auto v : kVariants) {
    std::vector<std::uint8_t> first_out, first_state;
    for (int rep = 0; rep < 3; ++rep) {
      Problem g = to_device(p, Device::cuda());
      KdaDecodeArgs args = packed_args(g, -5.0f);
      cuda::kda_decode(args, nullptr, v);
      cuda::synchronize();
      if (rep == 0) {
        first_out = storage_bytes(g.output);
        first_state = storage_bytes(g.state);
      } else {
        EXPECT_EQ(storage_bytes(g.output), first_out) << cuda::kda_variant_name(v);
        EXPECT_EQ(storage_bytes(g.state), first_state) << cuda::kda_variant_name(v);
      }
    }
  }
}

// The dev-only schedule knob of `stream` (cuda::KdaTuneBits, dev/kda_b/) changes the order of
// work, never the arithmetic: with kKdaTuneNoOverlap (bf16 T <= 8: the 8-warp kernel's item loop;
// at T = 1 with the deferred norm, late copies and the stagger) each stream kernel (staged and
// plain inputs) leaves output, state and conv_state bit-identical to the mainline (bf16 T <= 8:
// the kernel with the precompute warp group), on T = 1 with many items per CTA (token slots
// rotating over many items, null and trailing rows between them, the metadata batches) and with
// one or two items per CTA (the ring's edge: fewer items than stages, the f32 stagger), on
// T = 2, 3, 4, 5, 8 (ragged sequences, several tokens' slots per item, their norms on several
// warps, two per warp at T = 8) and T = 9 (the knob inactive: the same item loop twice); f32
// runs the item loop with and without the knob. The mainline is also checked against the CPU
// kernel and the reference on the small cases (as in every other test), so the knob's schedule
// is.
// One test a state dtype (among the largest GPU tests: they spread over shards and ctest jobs).
void check_tune_switches(DType sdt, std::uint64_t seed) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  struct TuneScope {
    unsigned saved = cuda::kda_tune();
    ~TuneScope() { cuda::set_kda_tune(saved); }
  } restore_tune;
  Rng rng(seed);
  struct Shape {
    int n, t, h;
  };
  // The precompute-group kernel runs bf16 T <= 8 (many items per CTA at N = 280, 72 and 48, one
  // or two at N = 6), fp32 T = 1 and fp32 T <= 8 with >= 16 items a CTA (N = 72 x 32 heads on
  // <= 144 SMs: T = 4 and 8); T = 9 runs the item loop under both masks.
  for (const Shape sh :
       {Shape{280, 1, 32}, Shape{6, 1, 32}, Shape{1, 1, 8}, Shape{48, 3, 32}, Shape{72, 4, 32},
        Shape{6, 4, 32}, Shape{6, 2, 32}, Shape{6, 5, 8}, Shape{72, 8, 32}, Shape{6, 9, 8}}) {
    const Meta m = random_meta(rng, sh.n, sh.t, 2, true);
    const Problem p = make_problem(rng.integer(0, 1 << 30), sh.h, m, sdt);
    for (auto v : {cuda::KdaVariant::stream, cuda::KdaVariant::stream_plain}) {
      std::vector<std::uint8_t> want_out, want_state, want_conv;
      // Every subset of the tune bits, ascending (0 first: the reference).
      for (unsigned bits = 0;; bits = ((bits | ~cuda::kKdaTuneAll) + 1u) & cuda::kKdaTuneAll) {
        SCOPED_TRACE("N=" + std::to_string(sh.n) + " T=" + std::to_string(sh.t) + " " +
                     dtype_name(sdt) + " variant=" + cuda::kda_variant_name(v) +
                     " tune=" + std::to_string(bits));
        cuda::set_kda_tune(bits);
        Problem g = to_device(p, Device::cuda());
        cuda::kda_decode(packed_args(g, -5.0f), nullptr, v);
        cuda::synchronize();
        if (bits == 0) {
          want_out = storage_bytes(g.output);
          want_state = storage_bytes(g.state);
          want_conv = storage_bytes(g.conv_state);
          continue;
        }
        // (EXPECT_TRUE: a failing EXPECT_EQ would print both storages, up to ~0.6 GB)
        EXPECT_TRUE(storage_bytes(g.output) == want_out) << "output";
        EXPECT_TRUE(storage_bytes(g.state) == want_state) << "state";
        EXPECT_TRUE(storage_bytes(g.conv_state) == want_conv) << "conv_state";
        if (bits == cuda::kKdaTuneAll) break;
      }
    }
    if (sh.n * sh.h < 1000) {  // every mask equals this bit for bit (above)
      cuda::set_kda_tune(0);
      check_case(p, -5.0f, cuda::KdaVariant::stream,
                 "default schedule N=" + std::to_string(sh.n) + " " + dtype_name(sdt));
    }
  }
}
TEST(KdaCuda, TuneSwitchesBitIdenticalF32) { check_tune_switches(DType::f32, 23); }
TEST(KdaCuda, TuneSwitchesBitIdenticalBf16) { check_tune_switches(DType::bf16, 24); }

// PDL: a chain of calls on one stream (the PDL attribute set, every kernel waiting before its first
// global access) where each call reads the state and conv history the previous call wrote (every
// sequence updates its own slot in place) equals the same calls on the legacy default stream
// (never PDL), bit for bit, for every variant.
TEST(KdaCuda, PdlChainMatchesSerial) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const PdlStream stream;
  Rng rng(21);
  constexpr int kCalls = 3;
  for (int T : {1, 3})
    for (DType sdt : {DType::f32, DType::bf16}) {
      const Problem p = make_problem(rng.integer(0, 1 << 30), 4, in_place_meta(5, T), sdt);
      for (auto v : variants_and_automatic()) {
        SCOPED_TRACE("T=" + std::to_string(T) + " " + dtype_name(sdt) +
                     " variant=" + cuda::kda_variant_name(v));
        Problem chained = to_device(p, Device::cuda()), serial = to_device(p, Device::cuda());
        cuda::synchronize();
        for (int k = 0; k < kCalls; ++k)
          cuda::kda_decode(packed_args(chained, -5.0f), stream.get(), v);
        ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
        for (int k = 0; k < kCalls; ++k) cuda::kda_decode(packed_args(serial, -5.0f), nullptr, v);
        cuda::synchronize();
        expect_bitwise_equal(chained, serial);
      }
    }
}

// The stable-state promise (KdaDecodeArgs::stable_state: the kernels read the metadata and
// source state before their PDL wait): calls alternating over two problems with disjoint buffers
// on one PDL stream, so each call's state was written two calls before it and nothing in flight
// writes it (the promise holds, as in a decode step), equal the same calls made serially without
// the promise, bit for bit.
void expect_stable_state_matches_serial(Rng& rng, int N, std::int64_t H, int T, DType sdt,
                                        const std::vector<cuda::KdaVariant>& variants) {
  constexpr int kRounds = 3;
  const PdlStream stream;
  const Meta m = random_meta(rng, N, T, 1, true);
  const Problem a = make_problem(rng.integer(0, 1 << 30), H, m, sdt);
  const Problem b = make_problem(rng.integer(0, 1 << 30), H, m, sdt);
  for (auto v : variants) {
    SCOPED_TRACE("N=" + std::to_string(N) + " H=" + std::to_string(H) + " T=" + std::to_string(T) +
                 " " + dtype_name(sdt) + " variant=" + cuda::kda_variant_name(v));
    Problem pa = to_device(a, Device::cuda()), pb = to_device(b, Device::cuda());
    Problem sa = to_device(a, Device::cuda()), sb = to_device(b, Device::cuda());
    cuda::synchronize();
    for (int k = 0; k < kRounds; ++k)
      for (Problem* p : {&pa, &pb}) {
        KdaDecodeArgs args = packed_args(*p, -5.0f);
        args.stable_state = true;
        cuda::kda_decode(args, stream.get(), v);
      }
    ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
    for (int k = 0; k < kRounds; ++k)
      for (Problem* p : {&sa, &sb}) cuda::kda_decode(packed_args(*p, -5.0f), nullptr, v);
    cuda::synchronize();
    expect_bitwise_equal(pa, sa);
    expect_bitwise_equal(pb, sb);
  }
}

TEST(KdaCuda, StableStatePromiseBitIdentical) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(29);
  for (int T : {1, 3})
    for (DType sdt : {DType::f32, DType::bf16})
      expect_stable_state_matches_serial(rng, 3, 8, T, sdt, variants_and_automatic());
}

// The same for the stream kernels with several items per CTA (24 x 32 items over <= 132 CTAs):
// the prologue stages the sources of a whole ring (kStages items) before the wait and their inputs
// after it, at the top of item 0 where the prefill is staggered (the 8-warp kernel: fp32 T = 3 at
// this size, and T = 9) and in the prologue on the precompute-group kernel (bf16 T <= 8, fp32
// T = 1).
// One test a state dtype.
void check_stable_state_stream_ring(DType sdt, std::uint64_t seed) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(seed);
  for (int T : {1, 3, 9})
    expect_stable_state_matches_serial(rng, 24, 32, T, sdt,
                                       {cuda::KdaVariant::stream, cuda::KdaVariant::stream_plain});
}
TEST(KdaCuda, StableStatePromiseStreamRingF32) { check_stable_state_stream_ring(DType::f32, 31); }
TEST(KdaCuda, StableStatePromiseStreamRingBf16) { check_stable_state_stream_ring(DType::bf16, 32); }

// Without the promise the kernels read their first items' slots (state_indices or the per-row
// slots, num_accepted_tokens) before their PDL wait, with L2-only loads whose values only choose
// L2 prefetches (kda_decode.cuh's prefetch_sources_before_wait, launch.cuh's second kind of
// pre-wait read): a stale value may cost bandwidth, never a result. Here the predecessor
// (testing::launch_late_copies) lets the KDA launch start, then rewrites its metadata
// testing::kLateCopyDelayUs (50 us) later, so those reads see the stale bytes: other slots in range
// (a prefetch of the wrong state and history), or garbage (slots far out of range and negative,
// offsets past T). The output, conv_state and state equal a serial call on the new metadata, bit
// for bit.
enum class Stale { other_slots, garbage };

// Stale bytes for an int32 metadata tensor whose new values are `fresh`, `num_slots` slots.
std::vector<int> stale_values(const std::vector<int>& fresh, Stale kind, std::int64_t num_slots) {
  const int garbage[] = {std::numeric_limits<int>::max(), std::numeric_limits<int>::min(), -1,
                         static_cast<int>(num_slots), 1 << 30};
  std::vector<int> out(fresh.size());
  for (std::size_t i = 0; i < fresh.size(); ++i)
    out[i] = kind == Stale::garbage
                 ? garbage[i % std::size(garbage)]
                 : static_cast<int>((fresh[i] + 1 + static_cast<std::int64_t>(i)) % num_slots);
  return out;
}

// The int32 values of a host tensor (contiguous).
std::vector<int> host_ints(const Tensor& t) {
  const std::int32_t* v = t.data<std::int32_t>();
  return std::vector<int>(v, v + t.numel());
}

// Runs `args` (on `launched`'s device tensors, whose int32 metadata `live` holds `fresh`'s
// values) after a late copy on a PDL stream, with `live` first overwritten by stale bytes, and
// `same_args` (on `serial`) serially; expects the two bit-identical.
void expect_late_metadata_matches_serial(const KdaDecodeArgs& args, Problem& launched,
                                         const KdaDecodeArgs& same_args, Problem& serial,
                                         const std::vector<Tensor*>& live,
                                         const std::vector<Tensor>& fresh, Stale kind,
                                         std::int64_t num_slots, cuda::KdaVariant v) {
  const PdlStream stream;
  std::vector<Tensor> kept;  // the new metadata, on the device, until the late copy
  std::vector<testing::DeviceCopy> copies;
  for (std::size_t i = 0; i < live.size(); ++i) {
    kept.push_back(mirror(fresh[i], Device::cuda()));
    const std::vector<int> stale = stale_values(host_ints(fresh[i]), kind, num_slots);
    device_copy(live[i]->raw_data(), Device::cuda(), stale.data(), Device::cpu(),
                stale.size() * sizeof(int));
    copies.push_back({live[i]->raw_data(), kept.back().raw_data(), stale.size() * sizeof(int)});
  }
  cuda::synchronize();
  testing::launch_late_copies(copies, testing::kLateCopyDelayUs, stream.get());
  cuda::kda_decode(args, stream.get(), v);
  ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
  cuda::kda_decode(same_args, nullptr, v);
  cuda::synchronize();
  expect_bitwise_equal(launched, serial);
}

void check_late_packed_metadata(Rng& rng, int N, std::int64_t H, int T, DType sdt,
                                const std::vector<cuda::KdaVariant>& variants) {
  const Problem p = make_problem(rng.integer(0, 1 << 30), H, random_meta(rng, N, T, 1, true), sdt);
  for (Stale kind : {Stale::other_slots, Stale::garbage})
    for (auto v : variants) {
      SCOPED_TRACE("N=" + std::to_string(N) + " H=" + std::to_string(H) +
                   " T=" + std::to_string(T) + " " + dtype_name(sdt) +
                   (kind == Stale::garbage ? " garbage" : " other slots") +
                   " variant=" + cuda::kda_variant_name(v));
      Problem launched = to_device(p, Device::cuda()), serial = to_device(p, Device::cuda());
      expect_late_metadata_matches_serial(packed_args(launched, -5.0f), launched,
                                          packed_args(serial, -5.0f), serial,
                                          {&launched.state_indices, &launched.qsl, &launched.nat},
                                          {p.state_indices, p.qsl, p.nat}, kind, p.slots, v);
    }
}

TEST(KdaCuda, PreWaitReadsOfRewrittenMetadata) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(33);
  for (DType sdt : {DType::f32, DType::bf16}) {
    for (int T : {1, 3, 9}) check_late_packed_metadata(rng, 3, 8, T, sdt, variants_and_automatic());
    // The stream kernels with several items per CTA (the ring's first items prefetched).
    for (int T : {1, 3})
      check_late_packed_metadata(rng, 24, 32, T, sdt,
                                 {cuda::KdaVariant::stream, cuda::KdaVariant::stream_plain});
  }
  // Per-row slots (plain mode): the pre-wait read is row_slots[u].
  const int R = 40;
  const Meta m = per_row_meta(R, 7);
  const Tensor host_slots = int_tensor(row_slots_of(m), {R});
  for (DType sdt : {DType::f32, DType::bf16}) {
    const Problem p = make_problem(rng.integer(0, 1 << 30), 8, m, sdt);
    for (Stale kind : {Stale::other_slots, Stale::garbage})
      for (auto v : kVariants) {
        SCOPED_TRACE(std::string("plain ") + dtype_name(sdt) +
                     (kind == Stale::garbage ? " garbage" : " other slots") +
                     " variant=" + cuda::kda_variant_name(v));
        Problem launched = to_device(p, Device::cuda()), serial = to_device(p, Device::cuda());
        Tensor launched_slots = mirror(host_slots, Device::cuda());
        const Tensor serial_slots = mirror(host_slots, Device::cuda());
        expect_late_metadata_matches_serial(plain_args(launched, launched_slots, -5.0f), launched,
                                            plain_args(serial, serial_slots, -5.0f), serial,
                                            {&launched_slots}, {host_slots}, kind, p.slots, v);
      }
  }
}

// One captured launch replayed with new query_start_loc, num_accepted_tokens and slot tables
// equals a direct call on the same inputs, bit for bit.
TEST(KdaCuda, GraphReplayWithChangingMetadata) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(17);
  const int N = 6, T = 4, H = 4;
  // Slot pool large enough for every metadata set; rows = N * T + 2 trailing.
  const Meta base = random_meta(rng, N, T, 2, true);
  Meta pool = base;
  pool.slots = N * T * 2 + 3;
  pool.trailing = N * T + 2 - base.rows() + base.trailing;
  const Problem p = make_problem(rng.integer(0, 1 << 30), H, pool, DType::f32);
  // All slots filled (any set may read any).
  Problem host = p;
  {
    Rng fill(99);
    for (std::int64_t s = 1; s < host.slots; ++s) {
      Tensor st = host.state.select(0, s);
      fill.normal(st, 0.0, 0.01);
      Tensor cv = host.conv_state.select(0, s);
      fill.normal(cv, 0.0, 0.1);
    }
  }
  for (DType sdt : {DType::f32}) {
    (void)sdt;
    Problem g = to_device(host, Device::cuda());
    KdaDecodeArgs args = packed_args(g, -5.0f);
    const std::vector<std::uint8_t> conv0 = storage_bytes(g.conv_state),
                                    state0 = storage_bytes(g.state);
    auto restore = [&] {
      device_copy(g.conv_state.storage()->data, Device::cuda(), conv0.data(), Device::cpu(),
                  conv0.size());
      device_copy(g.state.storage()->data, Device::cuda(), state0.data(), Device::cpu(),
                  state0.size());
    };
    auto set_meta = [&](const Meta& m) {
      std::vector<int> flat, qsl{0};
      for (const auto& row : m.si) flat.insert(flat.end(), row.begin(), row.end());
      for (int l : m.lens) qsl.push_back(qsl.back() + l);
      device_copy(g.state_indices.raw_data(), Device::cuda(), flat.data(), Device::cpu(),
                  flat.size() * 4);
      device_copy(g.qsl.raw_data(), Device::cuda(), qsl.data(), Device::cpu(), qsl.size() * 4);
      device_copy(g.nat.raw_data(), Device::cuda(), m.nat.data(), Device::cpu(), m.nat.size() * 4);
    };
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    cuda::kda_decode(args, stream);  // warm-up outside capture
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    cuda::kda_decode(args, stream);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int round = 0; round < 4; ++round) {
      Meta m = random_meta(rng, N, T, 0, round % 2 == 1);
      // Shift the slots so each round uses different ones.
      for (auto& row : m.si)
        for (int& s : row)
          if (s > 0) s += round * 3 % (N * T);
      restore();
      set_meta(m);
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      const auto out_g = storage_bytes(g.output), conv_g = storage_bytes(g.conv_state),
                 state_g = storage_bytes(g.state);
      restore();
      set_meta(m);
      cuda::kda_decode(args, stream);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      EXPECT_EQ(storage_bytes(g.output), out_g) << "round " << round;
      EXPECT_EQ(storage_bytes(g.conv_state), conv_g) << "round " << round;
      EXPECT_EQ(storage_bytes(g.state), state_g) << "round " << round;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

}  // namespace
}  // namespace splice
