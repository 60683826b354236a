// The fused KDA decode op: host-side validation, value contracts, contract rows and device
// dispatch (spec kda_decode.md §4; API in splice/ops/kda_decode.h).
//
// Stages of a call:
//   1. Structural checks, in argument order: every tensor's presence, dtype, rank, shape, strides
//      and device; the scalars (lower_bound finite and < 0, norm_eps finite and >= 0); the mode
//      (t1_state_indices only with T == 1); the caches and the output share no memory with each
//      other or an input. Each failure is a typed error naming the argument, the value seen and
//      what is allowed.
//   2. Normalized views into one KdaDecodeArgs: raw_gate [1,R,H,D] -> [R,H,D], raw_beta
//      [1,R,H] -> [R,H], output_gate [1,R,H,D] -> [R,H,D], output [1,R,H,D] -> [R,H,D],
//      A_log/dt_bias/norm_weight -> 1-D.
//   3. Value contracts on host copies of the metadata (always for CPU tensors; for CUDA only in
//      validate mode), before any cache is written, so a failing call changes nothing.
//   4. Dispatch: splice::cpu::kda_decode or splice::cuda::kda_decode.
#include "splice/ops/kda_decode.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "splice/backend/cpu/kda_decode.h"
#include "splice/core/error.h"

#if defined(SPLICE_WITH_CUDA) && __has_include("splice/backend/cuda/kda_decode.h")
#include "splice/backend/cuda/kda_decode.h"
#define SPLICE_KDA_HAS_CUDA_BACKEND 1
#endif

namespace splice {

namespace {

// Measured against the float64 reference over the test grid (tests/kernels/kda_decode_test.cc,
// docs/perf-cpu-kda.md): output worst 1.95e-3 abs (one bf16 ulp), state worst 1.07e-4 (f32) and
// 2.44e-4 (bf16) abs, dominated by conv outputs whose bf16 rounding flips by one ulp between the
// fp32 kernel and the float64 reference. FlashInfer accepts output 2e-2/3e-2, state 2e-3/3e-2.
constexpr Tolerance kCpuOutputTolerance{2e-3, 8e-3};
constexpr Tolerance kCpuStateTolerance{4e-4, 1e-2};
// The CUDA kernel's bounds, as asserted by tests/cuda/kda_decode_test.cc against the float64
// reference on the H200 (measured worst: output 9.8e-4 abs, state 1.0e-4 f32 / 2.4e-4 bf16).
constexpr Tolerance kCudaOutputTolerance{2e-3, 8e-3};
constexpr Tolerance kCudaStateTolerance{5e-4, 1e-2};

void check_same_device(const Tensor& t, const char* name, const Tensor& x) {
  if (t.device() != x.device())
    fail<DeviceError>("`", name, "` must be on the device of `x` (", x.device().str(), "), got ",
                      t.device().str());
}

// A 1-D f32 parameter of `count` elements at unit stride (spec §1: A_log [H], dt_bias [C],
// norm_weight [D]; `shape_text` names the dims in the message).
Tensor vector_param(const Tensor& t, const char* name, std::int64_t count, const char* shape_text) {
  check_defined(t, name);
  check_dtype(t, name, {DType::f32});
  if (t.shape() != Dims{count})
    fail<ShapeError>("`", name, "` must have shape ", shape_text, " = [", count, "], got ",
                     dims_str(t.shape()));
  check_contiguous(t, name);
  return t;
}

// Checks a rank-3 [R, H, D] bf16 logits tensor given as [1, R, H, D] (or also [R, H, D] when
// `allow_rank3`); returns the [R, H, D] view.
Tensor rows_heads_dim(const Tensor& t, const char* name, std::int64_t R, std::int64_t H,
                      bool allow_rank3) {
  check_defined(t, name);
  check_dtype(t, name, {DType::bf16});
  const Dims four{1, R, H, kKdaHeadDim};
  const Dims three{R, H, kKdaHeadDim};
  Tensor view;
  if (t.shape() == four) {
    view = t.select(0, 0);
  } else if (allow_rank3 && t.shape() == three) {
    view = t;
  } else {
    fail<ShapeError>("`", name, "` must have shape ", dims_str(four),
                     allow_rank3 ? std::string(" or ") + dims_str(three) : std::string(),
                     " (head dim 128), got ", dims_str(t.shape()));
  }
  if (view.stride(2) != 1)
    fail<LayoutError>("`", name,
                      "` must have a unit stride on its last (head_dim) axis, got strides ",
                      dims_str(t.strides()));
  return view;
}

void check_slot_stride(const Tensor& t, const char* name, std::int64_t slot_elems) {
  if (t.size(0) > 1 && t.stride(0) < slot_elems)
    fail<LayoutError>("`", name, "` slot stride must be >= ", slot_elems,
                      " elements (one whole slot; larger, padded strides are allowed), got ",
                      t.stride(0), " (strides ", dims_str(t.strides()), ")");
}

struct ArgInputs {
  const Tensor& x;
  const Tensor& weight;
  Tensor& conv_state;
  const Tensor& raw_gate;
  const Tensor& raw_beta;
  const Tensor& A_log;
  const Tensor& dt_bias;
  const Tensor& state_indices;
  Tensor& state;
  const Tensor& output_gate;
  const Tensor& norm_weight;
  const KdaDecodeOptions& options;
  Tensor& output;
  const Tensor* query_start_loc;      // null in plain mode
  const Tensor* num_accepted_tokens;  // null in plain mode
  const Tensor* t1_state_indices;     // optional, packed mode only
};

// Stage 1 and 2: every structural check of spec §4; returns the normalized arguments.
KdaDecodeArgs build_args(const ArgInputs& in, bool plain) {
  KdaDecodeArgs a;
  // x [R, 3C] bf16: fixes R, H and C.
  check_defined(in.x, "x");
  check_dtype(in.x, "x", {DType::bf16});
  check_rank(in.x, "x", 2);
  const std::int64_t R = in.x.size(0);
  const std::int64_t width = in.x.size(1);
  const std::int64_t block = kKdaNumProjections * kKdaHeadDim;  // 384 channels per head
  if (R <= 0)
    fail<ShapeError>("`x` must have at least one row (R > 0), got shape ", dims_str(in.x.shape()));
  if (width <= 0 || width % block != 0)
    fail<ShapeError>("`x`.shape[1] must be a positive multiple of ", block,
                     " (3 * H * 128, head dim 128), got ", width);
  const std::int64_t H = width / block;
  const std::int64_t C = H * kKdaHeadDim;
  if (in.x.stride(1) != 1)
    fail<LayoutError>("`x` must have channel stride 1, got strides ", dims_str(in.x.strides()));
  if (R > 1 && in.x.stride(0) < width)
    fail<LayoutError>("`x` row stride must be >= ", width, ", got ", in.x.stride(0));
  a.num_rows = R;
  a.num_heads = H;
  a.channels = C;
  a.head_dim = kKdaHeadDim;
  a.x = in.x;

  // weight [3, 4, C] f32 contiguous.
  check_defined(in.weight, "weight");
  check_dtype(in.weight, "weight", {DType::f32});
  check_shape(in.weight, "weight", {kKdaNumProjections, kKdaConvWidth, C});
  check_contiguous(in.weight, "weight");
  check_same_device(in.weight, "weight", in.x);
  a.weight = in.weight;

  // state_indices: [N, T] (packed) or [R] (plain) int32 contiguous.
  check_defined(in.state_indices, "state_indices");
  check_dtype(in.state_indices, "state_indices", {DType::i32});
  if (plain) {
    check_shape(in.state_indices, "state_indices", {R});
    a.mode = KdaMode::plain;
    a.num_seqs = R;
    a.max_t = 1;
  } else {
    check_rank(in.state_indices, "state_indices", 2);
    a.num_seqs = in.state_indices.size(0);
    a.max_t = in.state_indices.size(1);
    if (a.num_seqs < 1)
      fail<ShapeError>("`state_indices` must have N >= 1 sequences (shape [N, T]), got ",
                       dims_str(in.state_indices.shape()));
    if (a.max_t < 1)
      fail<ShapeError>("`state_indices` must have T >= 1 columns (shape [N, T]), got ",
                       dims_str(in.state_indices.shape()));
    a.mode = KdaMode::packed;
  }
  check_contiguous(in.state_indices, "state_indices");
  check_same_device(in.state_indices, "state_indices", in.x);
  a.state_indices = in.state_indices;
  const std::int64_t T = a.max_t;
  a.hist_len = T + kKdaConvWidth - 2;  // rolling window: the W-1 = 3 taps' history plus T-1

  // conv_state [slots, 3C, T+2] bf16, strides [slot_stride, 1, 3C].
  check_defined(in.conv_state, "conv_state");
  check_dtype(in.conv_state, "conv_state", {DType::bf16});
  check_rank(in.conv_state, "conv_state", 3);
  const std::int64_t slots = in.conv_state.size(0);
  if (slots < 1 || in.conv_state.size(1) != width || in.conv_state.size(2) != a.hist_len)
    fail<ShapeError>("`conv_state` must have shape [slots >= 1, ", width, ", ", a.hist_len,
                     "] (3C channels, T + 2 history positions), got ",
                     dims_str(in.conv_state.shape()));
  if (in.conv_state.stride(1) != 1 || (a.hist_len > 1 && in.conv_state.stride(2) != width))
    fail<LayoutError>("`conv_state` must have strides [slot_stride, 1, ", width,
                      "] (each history position one contiguous 3C vector), got ",
                      dims_str(in.conv_state.strides()));
  check_slot_stride(in.conv_state, "conv_state", width * a.hist_len);
  check_same_device(in.conv_state, "conv_state", in.x);
  a.conv_state = in.conv_state;
  a.num_slots = slots;

  // raw_gate [1, R, H, D], raw_beta [1, R, H].
  a.raw_gate = rows_heads_dim(in.raw_gate, "raw_gate", R, H, /*allow_rank3=*/false);
  check_same_device(in.raw_gate, "raw_gate", in.x);
  check_defined(in.raw_beta, "raw_beta");
  check_dtype(in.raw_beta, "raw_beta", {DType::bf16});
  check_shape(in.raw_beta, "raw_beta", {1, R, H});
  check_same_device(in.raw_beta, "raw_beta", in.x);
  a.raw_beta = in.raw_beta.select(0, 0);

  // Per-head and per-channel parameters.
  a.A_log = vector_param(in.A_log, "A_log", H, "[H]");
  check_same_device(in.A_log, "A_log", in.x);
  a.dt_bias = vector_param(in.dt_bias, "dt_bias", C, "[H * 128]");
  check_same_device(in.dt_bias, "dt_bias", in.x);

  // state [slots, H, D, D] f32 | bf16, strides [slot_stride, D*D, D, 1].
  check_defined(in.state, "state");
  check_dtype(in.state, "state", {DType::f32, DType::bf16});
  check_rank(in.state, "state", 4);
  if (in.state.size(1) != H || in.state.size(2) != kKdaHeadDim || in.state.size(3) != kKdaHeadDim)
    fail<ShapeError>("`state` must have shape [slots, ", H, ", 128, 128], got ",
                     dims_str(in.state.shape()));
  if (in.state.size(0) != slots)
    fail<ShapeError>("`state`.shape[0] (", in.state.size(0),
                     " slots) must equal `conv_state`.shape[0] (", slots, " slots)");
  const std::int64_t dd = kKdaHeadDim * kKdaHeadDim;
  if (in.state.stride(1) != dd || in.state.stride(2) != kKdaHeadDim || in.state.stride(3) != 1)
    fail<LayoutError>("`state` must have inner strides (", dd, ", ", kKdaHeadDim,
                      ", 1) (only the slot stride may be padded), got strides ",
                      dims_str(in.state.strides()));
  check_slot_stride(in.state, "state", H * dd);
  check_same_device(in.state, "state", in.x);
  a.state = in.state;
  a.state_dtype = in.state.dtype();

  a.output_gate = rows_heads_dim(in.output_gate, "output_gate", R, H, /*allow_rank3=*/true);
  check_same_device(in.output_gate, "output_gate", in.x);
  a.norm_weight = vector_param(in.norm_weight, "norm_weight", kKdaHeadDim, "[128]");
  check_same_device(in.norm_weight, "norm_weight", in.x);

  // Scalars.
  const KdaDecodeOptions& o = in.options;
  if (o.lower_bound.has_value() && !(std::isfinite(*o.lower_bound) && *o.lower_bound < 0.0f))
    fail<ValueError>("`lower_bound` must be a finite negative float or none, got ", *o.lower_bound);
  if (!(std::isfinite(o.norm_eps) && o.norm_eps >= 0.0f))
    fail<ValueError>("`norm_eps` must be finite and >= 0, got ", o.norm_eps);
  a.lower_bound = o.lower_bound;
  a.norm_eps = o.norm_eps;
  a.validate = o.validate;
  a.stable_state = o.stable_state;

  // Sequence metadata.
  if (!plain) {
    const Tensor& qsl = *in.query_start_loc;
    check_defined(qsl, "query_start_loc");
    check_dtype(qsl, "query_start_loc", {DType::i32});
    if (qsl.shape() != Dims{a.num_seqs + 1})
      fail<ShapeError>("`query_start_loc` must have shape [N + 1] = [", a.num_seqs + 1,
                       "] (N = state_indices.shape[0]), got ", dims_str(qsl.shape()));
    check_contiguous(qsl, "query_start_loc");
    check_same_device(qsl, "query_start_loc", in.x);
    const Tensor& nat = *in.num_accepted_tokens;
    check_defined(nat, "num_accepted_tokens");
    check_dtype(nat, "num_accepted_tokens", {DType::i32});
    if (nat.shape() != Dims{a.num_seqs})
      fail<ShapeError>("`num_accepted_tokens` must have shape [N] = [", a.num_seqs,
                       "] (N = state_indices.shape[0]), got ", dims_str(nat.shape()));
    check_contiguous(nat, "num_accepted_tokens");
    check_same_device(nat, "num_accepted_tokens", in.x);
    a.query_start_loc = qsl;
    a.num_accepted_tokens = nat;
    if (in.t1_state_indices != nullptr && in.t1_state_indices->defined()) {
      const Tensor& t1 = *in.t1_state_indices;
      if (T != 1)
        fail<ValueError>("`t1_state_indices` is allowed only when T == 1, got T = ", T,
                         " (state_indices shape ", dims_str(in.state_indices.shape()), ")");
      check_dtype(t1, "t1_state_indices", {DType::i32});
      check_shape(t1, "t1_state_indices", {R});
      check_contiguous(t1, "t1_state_indices");
      check_same_device(t1, "t1_state_indices", in.x);
      a.row_slots = t1;
      a.mode = KdaMode::t1;
    }
  } else {
    a.row_slots = in.state_indices;
  }

  // output [1, R, H, D] bf16 contiguous (allocated when not given).
  const Dims out_shape{1, R, H, kKdaHeadDim};
  if (in.output.defined()) {
    check_dtype(in.output, "output", {DType::bf16});
    check_shape(in.output, "output", out_shape);
    check_contiguous(in.output, "output");
    check_same_device(in.output, "output", in.x);
  } else {
    in.output = Tensor::empty(out_shape, DType::bf16, in.x.device());
  }
  a.output = in.output.select(0, 0);

  // Aliasing: the caches and the output are written (the caches in place, slot by slot), so
  // they share no memory with each other or with any input.
  static const Tensor kNone;  // an absent optional tensor: skipped
  const auto given = [](const Tensor* t) -> const Tensor& { return t ? *t : kNone; };
  check_output_aliasing({{in.conv_state, "conv_state"}, {in.state, "state"}, {in.output, "output"}},
                        {{in.x, "x"},
                         {in.weight, "weight"},
                         {in.raw_gate, "raw_gate"},
                         {in.raw_beta, "raw_beta"},
                         {in.A_log, "A_log"},
                         {in.dt_bias, "dt_bias"},
                         {in.state_indices, "state_indices"},
                         {in.output_gate, "output_gate"},
                         {in.norm_weight, "norm_weight"},
                         {given(in.query_start_loc), "query_start_loc"},
                         {given(in.num_accepted_tokens), "num_accepted_tokens"},
                         {given(in.t1_state_indices), "t1_state_indices"}});
  return a;
}

std::vector<std::int32_t> host_ints(const Tensor& t) {
  const Tensor host = t.device().is_cpu() ? t : t.to_device(Device::cpu());
  const std::int32_t* p = host.data<std::int32_t>();
  return std::vector<std::int32_t>(p, p + host.numel());
}

// One use of a slot by a live sequence (or a live row in plain/t1 mode).
struct SlotUse {
  std::int32_t slot;
  std::int64_t seq;
  bool write;
  const char* role;  // "conv slot", "source checkpoint", "checkpoint destination"
};

void check_slot_range(std::int32_t slot, std::int64_t num_slots, const char* where_name,
                      const std::string& where) {
  if (slot >= num_slots)
    fail<ValueError>("`", where_name, "`", where, " = ", slot, " must be < num_slots = ", num_slots,
                     " (a live slot)");
}

// No slot written by one live sequence is read or written by another (spec §4).
void check_aliasing(std::vector<SlotUse>& uses, const char* unit) {
  std::sort(uses.begin(), uses.end(), [](const SlotUse& l, const SlotUse& r) {
    return std::tie(l.slot, l.seq) < std::tie(r.slot, r.seq);
  });
  for (std::size_t begin = 0; begin < uses.size();) {
    std::size_t end = begin;
    const SlotUse* writer = nullptr;
    while (end < uses.size() && uses[end].slot == uses[begin].slot) {
      if (uses[end].write && writer == nullptr) writer = &uses[end];
      ++end;
    }
    if (writer != nullptr) {
      for (std::size_t i = begin; i < end; ++i) {
        if (uses[i].seq != writer->seq)
          fail<ValueError>("slot ", writer->slot, " is written by ", unit, " ", writer->seq, " (",
                           writer->role, ") and ", uses[i].write ? "written" : "read", " by ", unit,
                           " ", uses[i].seq, " (", uses[i].role, "); live ", unit,
                           "s must not share a slot that one of them writes");
      }
    }
    begin = end;
  }
}

}  // namespace

void check_kda_value_contracts(const KdaDecodeArgs& a) {
  std::vector<SlotUse> uses;
  if (a.mode == KdaMode::plain || a.mode == KdaMode::t1) {
    const char* name = a.mode == KdaMode::plain ? "state_indices" : "t1_state_indices";
    const std::vector<std::int32_t> slots = host_ints(a.row_slots);
    for (std::int64_t r = 0; r < a.num_rows; ++r) {
      const std::int32_t s = slots[static_cast<std::size_t>(r)];
      if (s <= 0) continue;  // null row
      check_slot_range(s, a.num_slots, name,
                       "[" + std::to_string(r) + "] (row " + std::to_string(r) + ")");
      uses.push_back({s, r, true, "its slot"});
    }
    check_aliasing(uses, "row");
    return;
  }

  const std::int64_t N = a.num_seqs, T = a.max_t;
  const std::vector<std::int32_t> qsl = host_ints(a.query_start_loc);
  const std::vector<std::int32_t> nat = host_ints(a.num_accepted_tokens);
  const std::vector<std::int32_t> si = host_ints(a.state_indices);
  if (qsl[0] != 0) fail<ValueError>("`query_start_loc`[0] must be 0, got ", qsl[0]);
  for (std::int64_t n = 0; n < N; ++n) {
    const std::int64_t len = static_cast<std::int64_t>(qsl[n + 1]) - qsl[n];
    if (len < 0)
      fail<ValueError>("`query_start_loc` must be non-decreasing, got [", n, "] = ", qsl[n], " > [",
                       n + 1, "] = ", qsl[n + 1], " (sequence ", n, ")");
    if (len > T)
      fail<ValueError>("sequence ", n, " has length ", len, " (`query_start_loc`[", n + 1, "] - [",
                       n, "]), must be <= T = ", T);
  }
  if (qsl[N] > a.num_rows)
    fail<ValueError>("`query_start_loc`[N = ", N, "] = ", qsl[N],
                     " must be <= num_rows R = ", a.num_rows);
  for (std::int64_t n = 0; n < N; ++n) {
    if (nat[n] < 1 || nat[n] > T)
      fail<ValueError>("`num_accepted_tokens`[", n, "] (sequence ", n, ") must be in [1, T = ", T,
                       "], got ", nat[n]);
  }
  for (std::int64_t n = 0; n < N; ++n) {
    const std::int64_t len = static_cast<std::int64_t>(qsl[n + 1]) - qsl[n];
    const std::int64_t acc = nat[n] - 1;
    const std::int32_t cs = si[n * T];
    const std::int32_t ss = si[n * T + acc];
    if (len == 0 || cs <= 0 || ss <= 0) continue;  // not live: touches nothing
    const auto where = [&](std::int64_t t, const char* role) {
      return "[" + std::to_string(n) + ", " + std::to_string(t) + "] (sequence " +
             std::to_string(n) + ", " + role + ")";
    };
    check_slot_range(cs, a.num_slots, "state_indices", where(0, "conv slot"));
    check_slot_range(ss, a.num_slots, "state_indices", where(acc, "source checkpoint"));
    uses.push_back({cs, n, true, "conv slot"});
    uses.push_back({ss, n, false, "source checkpoint"});
    for (std::int64_t t = 0; t < len; ++t) {
      const std::int32_t dst = si[n * T + t];
      if (dst <= 0) continue;
      check_slot_range(dst, a.num_slots, "state_indices", where(t, "checkpoint destination"));
      uses.push_back({dst, n, true, "checkpoint destination"});
    }
  }
  check_aliasing(uses, "sequence");
}

namespace {

void dispatch(const KdaDecodeArgs& args) {
  const Device device = args.x.device();
  if (device.is_cpu()) {
    check_kda_value_contracts(args);
    cpu::kda_decode(args);
    return;
  }
#ifdef SPLICE_KDA_HAS_CUDA_BACKEND
  if (args.validate) check_kda_value_contracts(args);
  cuda::kda_decode(args);
#else
  fail<DeviceError>("kda_decode: tensors are on ", device.str(),
                    " but this build has no CUDA KDA backend (allowed: cpu)");
#endif
}

}  // namespace

Tensor packed_fused_kda_decode(const Tensor& x, const Tensor& weight, Tensor& conv_state,
                               const Tensor& raw_gate, const Tensor& raw_beta, const Tensor& A_log,
                               const Tensor& dt_bias, const Tensor& state_indices, Tensor& state,
                               const Tensor& output_gate, const Tensor& norm_weight,
                               const KdaDecodeOptions& options, Tensor output,
                               const Tensor& query_start_loc, const Tensor& num_accepted_tokens,
                               const Tensor* t1_state_indices) {
  const ArgInputs in{x,
                     weight,
                     conv_state,
                     raw_gate,
                     raw_beta,
                     A_log,
                     dt_bias,
                     state_indices,
                     state,
                     output_gate,
                     norm_weight,
                     options,
                     output,
                     &query_start_loc,
                     &num_accepted_tokens,
                     t1_state_indices};
  const KdaDecodeArgs args = build_args(in, /*plain=*/false);
  dispatch(args);
  return output;
}

Tensor fused_kda_decode(const Tensor& x, const Tensor& weight, Tensor& conv_state,
                        const Tensor& raw_gate, const Tensor& raw_beta, const Tensor& A_log,
                        const Tensor& dt_bias, const Tensor& state_indices, Tensor& state,
                        const Tensor& output_gate, const Tensor& norm_weight,
                        const KdaDecodeOptions& options, Tensor output) {
  const ArgInputs in{x,       weight,        conv_state, raw_gate,    raw_beta,    A_log,
                     dt_bias, state_indices, state,      output_gate, norm_weight, options,
                     output,  nullptr,       nullptr,    nullptr};
  const KdaDecodeArgs args = build_args(in, /*plain=*/true);
  dispatch(args);
  return output;
}

const KdaContract& cpu_kda_contract() {
  static const KdaContract row{"kda_decode",      "cpu", "cpu-kda-1", {DType::f32, DType::bf16},
                               {kKdaHeadDim},     0,     true,        kCpuOutputTolerance,
                               kCpuStateTolerance};
  return row;
}

const KdaContract& cuda_kda_contract() {
  static const KdaContract row{"kda_decode",       "cuda", "cuda-kda-1", {DType::f32, DType::bf16},
                               {kKdaHeadDim},      0,      true,         kCudaOutputTolerance,
                               kCudaStateTolerance};
  return row;
}

}  // namespace splice
