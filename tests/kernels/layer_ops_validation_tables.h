// The tables of the public fused layer ops' negative tests (splice/ops/layer_ops.h): every
// argument check in ops/layer_ops.cc, the backends' layer-op kernels and backend/layer_op_checks.h,
// seen from the caller's side (design.md §3: bad input is a typed error whose message names the
// argument and the value seen, and a failed call leaves every output and cache as it was). Run on
// CPU tensors by kernels/layer_ops_validation_test.cc and on host memory posing as cuda:0 by
// cuda/layer_ops_validation_host_test.cc (the CUDA launchers' host checks, without a GPU).
//
//  1. One table per public op: a valid call, then mutations of one argument each: a wrong dtype,
//     rank or shape, a non-unit last stride (a select of a wider buffer), an out that overlaps an
//     input, eps negative / NaN / +inf, a position out of range or of the wrong dtype or shape, an
//     odd head dim, an undefined tensor, and a tensor on the other device (a borrowed host buffer:
//     never dereferenced, its bytes checked).
//  2. Each mutated call must throw the expected splice::Error subclass, its message must hold the
//     argument's name in backticks and, where the message has it, the value seen; the raw storage
//     bytes of every output (and both KV caches) must be unchanged after the failed call.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "splice/core/error.h"
#include "splice/core/random.h"
#include "splice/ops/layer_ops.h"
#include "support/test_util.h"

namespace splice::layer_op_tables {

constexpr float kEps = 1e-5f;
constexpr std::uint64_t kSeed = 1234;
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

// ---- the expected error -------------------------------------------------------------------------

enum class Want { shape, dtype, layout, value, device, unsupported };

inline const char* want_name(Want w) {
  switch (w) {
    case Want::shape:
      return "ShapeError";
    case Want::dtype:
      return "DTypeError";
    case Want::layout:
      return "LayoutError";
    case Want::value:
      return "ValueError";
    case Want::device:
      return "DeviceError";
    case Want::unsupported:
      return "UnsupportedError";
  }
  return "?";
}

inline bool is_wanted(const Error& e, Want w) {
  switch (w) {
    case Want::shape:
      return dynamic_cast<const ShapeError*>(&e) != nullptr;
    case Want::dtype:
      return dynamic_cast<const DTypeError*>(&e) != nullptr;
    case Want::layout:
      return dynamic_cast<const LayoutError*>(&e) != nullptr;
    case Want::value:
      return dynamic_cast<const ValueError*>(&e) != nullptr;
    case Want::device:
      return dynamic_cast<const DeviceError*>(&e) != nullptr;
    case Want::unsupported:
      return dynamic_cast<const UnsupportedError*>(&e) != nullptr;
  }
  return false;
}

inline std::string type_name(const Error& e) {
  if (dynamic_cast<const ShapeError*>(&e)) return "ShapeError";
  if (dynamic_cast<const DTypeError*>(&e)) return "DTypeError";
  if (dynamic_cast<const LayoutError*>(&e)) return "LayoutError";
  if (dynamic_cast<const ValueError*>(&e)) return "ValueError";
  if (dynamic_cast<const DeviceError*>(&e)) return "DeviceError";
  if (dynamic_cast<const UnsupportedError*>(&e)) return "UnsupportedError";
  if (dynamic_cast<const InternalError*>(&e)) return "InternalError";
  return "splice::Error";
}

// ---- tables -------------------------------------------------------------------------------------

// One argument changed from the valid call: the call must throw `want` with every needle in its
// message.
// Where a mutation is refused: `host` on every backend before any write; `device` only where the
// host reads the value (the CPU): a value contract the CUDA kernels read on the device, where an
// out-of-range position writes zeros (tests/cuda/layer_ops_test.cc), so no CUDA host check sees it.
enum class Where { host, device };

template <typename Args>
struct Mutation {
  std::string what;
  Want want;
  std::vector<std::string> needles;
  std::function<void(Args&)> mutate;
  Where where = Where::host;
};

using Named = std::vector<std::pair<std::string, Tensor>>;

template <typename Args>
struct OpTable {
  std::string op;
  std::function<Args()> make;                 // the valid call's arguments, fresh each time
  std::function<void(Args&)> call;            // the public op
  std::function<Named(const Args&)> written;  // what the op writes (out, caches)
  std::vector<Mutation<Args>> mutations;
};

// The bytes a tensor's storage holds: the whole allocation when owned, the view's extent when
// borrowed (a fake CUDA tensor's host buffer).
inline std::vector<unsigned char> bytes_of(const Tensor& t) {
  if (!t.defined() || t.numel() == 0) return {};
  const Storage& s = *t.storage();
  const auto* base = static_cast<const unsigned char*>(s.data);
  if (s.bytes > 0) return {base, base + s.bytes};
  std::int64_t last = 0;  // the view's last element (non-negative strides)
  for (std::int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  const auto* first = static_cast<const unsigned char*>(t.raw_data());
  return {first, first + (last + 1) * static_cast<std::int64_t>(dtype_size(t.dtype()))};
}

// "" when the mutated call throws as `m` expects and writes nothing, else what happened.
// `prepare` runs on the mutated arguments before the call (the CUDA host run moves them to a
// fake device there).
template <typename Args>
inline std::string verdict(const OpTable<Args>& table, const Mutation<Args>& m,
                           const std::function<void(Args&)>& prepare = {}) {
  Args args = table.make();
  m.mutate(args);
  if (prepare) prepare(args);
  const Named outputs = table.written(args);
  std::vector<std::vector<unsigned char>> before;
  for (const auto& [name, t] : outputs) before.push_back(bytes_of(t));
  std::string problem;
  const auto note = [&](const std::string& s) { problem += (problem.empty() ? "" : "; ") + s; };
  try {
    table.call(args);
    return "accepted (no error)";
  } catch (const Error& e) {
    const std::string what = e.what();
    if (!is_wanted(e, m.want)) note(type_name(e) + " instead of " + want_name(m.want));
    for (const std::string& needle : m.needles)
      if (what.find(needle) == std::string::npos) note("message lacks '" + needle + "'");
    if (!problem.empty()) note("message: \"" + what + "\"");
  } catch (const std::exception& e) {
    note(std::string("not a splice::Error: ") + e.what());
  }
  for (std::size_t i = 0; i < outputs.size(); ++i)
    if (bytes_of(outputs[i].second) != before[i])
      note("the failed call changed `" + outputs[i].first + "`");
  return problem;
}

// The valid call succeeds, then every mutation is rejected as expected.
// Returns the number of mutations checked.
template <typename Args>
int run_strict(const OpTable<Args>& table) {
  {
    // The valid call succeeds and writes every output (so "unchanged" below means something).
    Args args = table.make();
    const Named outputs = table.written(args);
    std::vector<std::vector<unsigned char>> before;
    for (const auto& [name, t] : outputs) before.push_back(bytes_of(t));
    EXPECT_NO_THROW(table.call(args)) << table.op << ": the valid call";
    for (std::size_t i = 0; i < outputs.size(); ++i)
      EXPECT_NE(bytes_of(outputs[i].second), before[i])
          << table.op << ": the valid call left `" << outputs[i].first << "` as it was";
  }
  int count = 0;
  for (const Mutation<Args>& m : table.mutations) {
    ++count;
    const std::string v = verdict(table, m);
    EXPECT_TRUE(v.empty()) << table.op << " / " << m.what << ": " << v;
  }
  std::printf("[ cases    ] %s: 1 valid call, %d rejected mutations\n", table.op.c_str(), count);
  return count;
}

// ---- argument builders --------------------------------------------------------------------------

inline Tensor random(Rng& rng, const Dims& shape, DType dtype = DType::bf16) {
  return testing::random_tensor(rng, shape, dtype);
}

// A fresh random tensor of `shape` in t's dtype (a wrong shape for t's argument).
inline Tensor random_like_shape(const Tensor& t, const Dims& shape) {
  Rng rng(kSeed + 4);
  return testing::random_tensor(rng, shape, t.dtype());
}

// A [1] i32 position holding `p`; `shape` and `dtype` for the wrong ones.
inline Tensor position_of(std::int64_t p, const Dims& shape = {1}, DType dtype = DType::i32) {
  Tensor t = Tensor::zeros(shape, dtype);
  if (t.numel() > 0) t.set_linear(0, static_cast<double>(p));
  return t;
}

// t's values in a view whose last axis has stride 2: element 0 of a trailing pair axis of a wider
// buffer (the wider buffer's other half random, not NaN, so a stray read does not matter here).
inline Tensor every_other(const Tensor& t) {
  Dims shape = t.shape();
  shape.push_back(2);
  Rng rng(kSeed + 1);
  Tensor wide = testing::random_tensor(rng, shape, t.dtype());
  Tensor view = wide.select(t.dim(), 0);
  view.copy_from(t);
  return view;
}

// t in another dtype (integers through a zero tensor: the values do not matter).
inline Tensor as(const Tensor& t, DType dtype) {
  if (!is_floating(dtype)) return Tensor::zeros(t.shape(), dtype);
  return t.to(dtype);
}

// A tensor that claims to live on cuda:0 but borrows a host copy of `t` (kept alive to the end of
// the process): the device checks must reject it before anything reads or writes it.
inline Tensor fake_cuda(const Tensor& t) {
  static std::deque<Tensor> host_buffers;
  host_buffers.push_back(t.contiguous());
  return Tensor::borrow(host_buffers.back().raw_data(), t.shape(), t.dtype(), {}, Device::cuda());
}

// A [shape] view at element `offset` of `base`'s storage, contiguous in `shape` (an out placed on
// top of an input).
inline Tensor view_into(const Tensor& base, std::int64_t offset, const Dims& shape) {
  return Tensor::view_of(base.storage(), base.offset() + offset, shape,
                         Tensor::contiguous_strides(shape), base.dtype());
}

// ---- fused_rms_norm -----------------------------------------------------------------------------

struct RmsNormArgs {
  Tensor x, weight;  // [2, 3, 8], [8]
  float eps = kEps;
  Tensor out;                                                     // [2, 3, 8]
  std::vector<Tensor*> tensors() { return {&x, &weight, &out}; }  // every tensor argument
};

inline OpTable<RmsNormArgs> rms_norm_table() {
  using A = RmsNormArgs;
  OpTable<A> t;
  t.op = "fused_rms_norm";
  t.make = [] {
    Rng rng(kSeed);
    A a;
    a.x = random(rng, {2, 3, 8});
    a.weight = random(rng, {8});
    a.out = random(rng, {2, 3, 8});
    return a;
  };
  t.call = [](A& a) { fused_rms_norm(a.x, a.weight, a.eps, a.out); };
  t.written = [](const A& a) { return Named{{"out", a.out}}; };
  t.mutations = {
      {"x dtype i32", Want::unsupported, {"`x`", "i32"}, [](A& a) { a.x = as(a.x, DType::i32); }},
      {"weight dtype i32",
       Want::dtype,
       {"`weight`", "i32"},
       [](A& a) { a.weight = as(a.weight, DType::i32); }},
      {"out dtype i32", Want::dtype, {"`out`", "i32"}, [](A& a) { a.out = as(a.out, DType::i32); }},
      {"x a scalar",
       Want::shape,
       {"`x`", "scalar"},
       [](A& a) { a.x = Tensor::zeros({}, DType::bf16); }},
      {"weight rank 2",
       Want::shape,
       {"`weight`", "[1, 8]"},
       [](A& a) {
         a.weight = a.weight.reshape({1, 8});
       }},
      {"weight length 7",
       Want::shape,
       {"`weight`", "[7]"},
       [](A& a) { a.weight = a.weight.slice(0, 0, 7); }},
      {"out last axis 9",
       Want::shape,
       {"`out`", "[2, 3, 9]"},
       [](A& a) {
         a.out = Tensor::zeros({2, 3, 9}, DType::bf16);
       }},
      {"out leading axes swapped",
       Want::shape,
       {"`out`", "[3, 2, 8]"},
       [](A& a) {
         a.out = a.out.reshape({3, 2, 8});
       }},
      {"out a scalar",
       Want::shape,
       {"`out`"},
       [](A& a) { a.out = Tensor::zeros({}, DType::bf16); }},
      {"x last stride 2",
       Want::layout,
       {"`x`", "[48, 16, 2]"},
       [](A& a) { a.x = every_other(a.x); }},
      {"out last stride 2",
       Want::layout,
       {"`out`", "[48, 16, 2]"},
       [](A& a) { a.out = every_other(a.out); }},
      {"out with a stride-0 axis",
       Want::layout,
       {"`out`"},
       [](A& a) {
         a.out = a.out.slice(0, 0, 1).expand({2, 3, 8});
       }},
      {"out overlaps x",
       Want::layout,
       {"`out`", "`x`"},
       [](A& a) {
         Tensor buffer = Tensor::zeros({2, 3, 12}, DType::bf16);  // x in columns 0..7
         Tensor x = buffer.slice(2, 0, 8);
         x.copy_from(a.x);
         a.x = x;
         a.out = buffer.slice(2, 4, 12);
       }},
      {"out overlaps weight",
       Want::layout,
       {"`out`", "`weight`"},
       [](A& a) {
         Tensor w = view_into(a.out, 0, {8});
         w.copy_from(a.weight);
         a.weight = w;
       }},
      {"eps -1", Want::value, {"`eps`", "-1"}, [](A& a) { a.eps = -1.0f; }},
      {"eps NaN", Want::value, {"`eps`", "nan"}, [](A& a) { a.eps = kNaN; }},
      {"eps +inf", Want::value, {"`eps`", "inf"}, [](A& a) { a.eps = kInf; }},
      {"weight undefined",
       Want::value,
       {"`weight`", "not given"},
       [](A& a) { a.weight = Tensor(); }},
      {"x on cuda", Want::device, {"`x`", "cuda:0"}, [](A& a) { a.x = fake_cuda(a.x); }},
      {"weight on cuda",
       Want::device,
       {"`weight`", "cuda:0"},
       [](A& a) { a.weight = fake_cuda(a.weight); }},
      {"out on cuda", Want::device, {"`out`", "cuda:0"}, [](A& a) { a.out = fake_cuda(a.out); }},
  };
  return t;
}

// ---- fused_silu_mul -----------------------------------------------------------------------------

struct SiluMulArgs {
  Tensor a, b, out;                                          // [2, 3, 16] each
  std::vector<Tensor*> tensors() { return {&a, &b, &out}; }  // every tensor argument
};

inline OpTable<SiluMulArgs> silu_mul_table() {
  using A = SiluMulArgs;
  OpTable<A> t;
  t.op = "fused_silu_mul";
  t.make = [] {
    Rng rng(kSeed);
    A a;
    a.a = random(rng, {2, 3, 16});
    a.b = random(rng, {2, 3, 16});
    a.out = random(rng, {2, 3, 16});
    return a;
  };
  t.call = [](A& a) { fused_silu_mul(a.a, a.b, a.out); };
  t.written = [](const A& a) { return Named{{"out", a.out}}; };
  // An out placed over columns 8.. of a [2, 3, 24] buffer whose columns 0..15 hold `in`.
  static const auto overlap = [](Tensor& in, Tensor& out) {
    Tensor buffer = Tensor::zeros({2, 3, 24}, DType::bf16);
    Tensor v = buffer.slice(2, 0, 16);
    v.copy_from(in);
    in = v;
    out = buffer.slice(2, 8, 24);
  };
  t.mutations = {
      {"a dtype i32", Want::unsupported, {"`a`", "i32"}, [](A& a) { a.a = as(a.a, DType::i32); }},
      {"b dtype i32", Want::dtype, {"`b`", "i32"}, [](A& a) { a.b = as(a.b, DType::i32); }},
      {"out dtype i32", Want::dtype, {"`out`", "i32"}, [](A& a) { a.out = as(a.out, DType::i32); }},
      {"b dtype f16 (a bf16)",
       Want::dtype,
       {"`b`", "f16"},
       [](A& a) { a.b = as(a.b, DType::f16); }},
      {"out dtype f32 (a bf16)",
       Want::dtype,
       {"`out`", "f32"},
       [](A& a) { a.out = as(a.out, DType::f32); }},
      {"a a scalar",
       Want::shape,
       {"`a`", "scalar"},
       [](A& a) { a.a = Tensor::zeros({}, DType::bf16); }},
      {"b last axis 8", Want::shape, {"`b`", "[2, 3, 8]"}, [](A& a) { a.b = a.b.slice(2, 0, 8); }},
      {"b rank 2",
       Want::shape,
       {"`b`", "[6, 16]"},
       [](A& a) {
         a.b = a.b.reshape({6, 16});
       }},
      {"out last axis 8",
       Want::shape,
       {"`out`", "[2, 3, 8]"},
       [](A& a) { a.out = a.out.slice(2, 0, 8); }},
      {"a last stride 2",
       Want::layout,
       {"`a`", "[96, 32, 2]"},
       [](A& a) { a.a = every_other(a.a); }},
      {"b last stride 2",
       Want::layout,
       {"`b`", "[96, 32, 2]"},
       [](A& a) { a.b = every_other(a.b); }},
      {"out last stride 2",
       Want::layout,
       {"`out`", "[96, 32, 2]"},
       [](A& a) { a.out = every_other(a.out); }},
      {"out with a stride-0 axis",
       Want::layout,
       {"`out`"},
       [](A& a) {
         a.out = a.out.slice(0, 0, 1).expand({2, 3, 16});
       }},
      {"out overlaps a", Want::layout, {"`out`", "`a`"}, [](A& a) { overlap(a.a, a.out); }},
      {"out overlaps b", Want::layout, {"`out`", "`b`"}, [](A& a) { overlap(a.b, a.out); }},
      {"b undefined", Want::value, {"`b`", "not given"}, [](A& a) { a.b = Tensor(); }},
      {"a on cuda", Want::device, {"`a`", "cuda:0"}, [](A& a) { a.a = fake_cuda(a.a); }},
      {"b on cuda", Want::device, {"`b`", "cuda:0"}, [](A& a) { a.b = fake_cuda(a.b); }},
      {"out on cuda", Want::device, {"`out`", "cuda:0"}, [](A& a) { a.out = fake_cuda(a.out); }},
  };
  return t;
}

// ---- fused_rope ---------------------------------------------------------------------------------

constexpr std::int64_t kTableRows = 5;  // max_seq_len of every cos / sin table here

struct RopeArgs {
  Tensor x, cos, sin, position, out;  // [2, 3, 8] bf16, [5, 8] f32 twice, [1] i32, [2, 3, 8] bf16
  std::vector<Tensor*> tensors() {
    return {&x, &cos, &sin, &position, &out};
  }  // every tensor argument
};

inline OpTable<RopeArgs> rope_table() {
  using A = RopeArgs;
  OpTable<A> t;
  t.op = "fused_rope";
  t.make = [] {
    Rng rng(kSeed);
    A a;
    a.x = random(rng, {2, 3, 8});
    a.cos = random(rng, {kTableRows, 8}, DType::f32);
    a.sin = random(rng, {kTableRows, 8}, DType::f32);
    a.position = position_of(2);
    a.out = random(rng, {2, 3, 8});
    return a;
  };
  t.call = [](A& a) { fused_rope(a.x, a.cos, a.sin, a.position, a.out); };
  t.written = [](const A& a) { return Named{{"out", a.out}}; };
  t.mutations = {
      {"x dtype i32", Want::unsupported, {"`x`", "i32"}, [](A& a) { a.x = as(a.x, DType::i32); }},
      {"cos dtype i32", Want::dtype, {"`cos`", "i32"}, [](A& a) { a.cos = as(a.cos, DType::i32); }},
      {"sin dtype i32", Want::dtype, {"`sin`", "i32"}, [](A& a) { a.sin = as(a.sin, DType::i32); }},
      {"sin dtype f16 (cos f32)",
       Want::dtype,
       {"`sin`", "f16"},
       [](A& a) { a.sin = as(a.sin, DType::f16); }},
      {"out dtype i32", Want::dtype, {"`out`", "i32"}, [](A& a) { a.out = as(a.out, DType::i32); }},
      {"out dtype f16 (x bf16)",
       Want::dtype,
       {"`out`", "f16"},
       [](A& a) { a.out = as(a.out, DType::f16); }},
      {"out over the cos table",
       Want::layout,
       {"`out`", "overlaps `cos`"},
       [](A& a) {
         a.out = Tensor::view_of(a.cos.storage(), 0, {2, 3, 8}, {24, 8, 1}, DType::bf16);
       }},
      {"x a scalar",
       Want::shape,
       {"`x`", "scalar"},
       [](A& a) { a.x = Tensor::zeros({}, DType::bf16); }},
      {"odd head dim 7",
       Want::shape,
       {"`x`", "7"},
       [](A& a) {
         a.x = a.x.slice(2, 0, 7);
         a.out = a.out.slice(2, 0, 7);
       }},
      {"cos last axis 6",
       Want::shape,
       {"`cos`", "[5, 6]"},
       [](A& a) { a.cos = a.cos.slice(1, 0, 6); }},
      {"cos rank 1", Want::shape, {"`cos`", "[8]"}, [](A& a) { a.cos = a.cos.select(0, 0); }},
      {"sin last axis 6",
       Want::shape,
       {"`sin`", "[5, 6]"},
       [](A& a) { a.sin = a.sin.slice(1, 0, 6); }},
      {"out last axis 6",
       Want::shape,
       {"`out`", "[2, 3, 6]"},
       [](A& a) { a.out = a.out.slice(2, 0, 6); }},
      {"position dtype i64",
       Want::dtype,
       {"`position`", "i64"},
       [](A& a) { a.position = position_of(2, {1}, DType::i64); }},
      {"position shape [2]",
       Want::shape,
       {"`position`", "[2]"},
       [](A& a) { a.position = position_of(2, {2}); }},
      {"position a scalar",
       Want::shape,
       {"`position`", "[]"},
       [](A& a) { a.position = position_of(2, {}); }},
      {"position 5 (the tables' rows)",
       Want::value,
       {"`position` 5", "[0, 5)"},
       [](A& a) { a.position = position_of(kTableRows); },
       Where::device},
      {"position -1",
       Want::value,
       {"`position` -1"},
       [](A& a) { a.position = position_of(-1); },
       Where::device},
      {"position INT32_MAX",
       Want::value,
       {"`position` 2147483647"},
       [](A& a) { a.position = position_of(std::numeric_limits<std::int32_t>::max()); },
       Where::device},
      {"x last stride 2",
       Want::layout,
       {"`x`", "[48, 16, 2]"},
       [](A& a) { a.x = every_other(a.x); }},
      {"out last stride 2",
       Want::layout,
       {"`out`", "[48, 16, 2]"},
       [](A& a) { a.out = every_other(a.out); }},
      {"out with a stride-0 axis",
       Want::layout,
       {"`out`"},
       [](A& a) {
         a.out = a.out.slice(0, 0, 1).expand({2, 3, 8});
       }},
      {"out overlaps x",
       Want::layout,
       {"`out`", "`x`"},
       [](A& a) {
         Tensor buffer = Tensor::zeros({2, 3, 12}, DType::bf16);
         Tensor x = buffer.slice(2, 0, 8);
         x.copy_from(a.x);
         a.x = x;
         a.out = buffer.slice(2, 4, 12);
       }},
      {"position undefined",
       Want::value,
       {"`position`", "not given"},
       [](A& a) { a.position = Tensor(); }},
      {"x on cuda", Want::device, {"`x`", "cuda:0"}, [](A& a) { a.x = fake_cuda(a.x); }},
      {"cos on cuda", Want::device, {"`cos`", "cuda:0"}, [](A& a) { a.cos = fake_cuda(a.cos); }},
      {"sin on cuda", Want::device, {"`sin`", "cuda:0"}, [](A& a) { a.sin = fake_cuda(a.sin); }},
      {"position on cuda",
       Want::device,
       {"`position`", "cuda:0"},
       [](A& a) { a.position = fake_cuda(a.position); }},
      {"out on cuda", Want::device, {"`out`", "cuda:0"}, [](A& a) { a.out = fake_cuda(a.out); }},
  };
  return t;
}

// ---- fused_rope_kv_append -----------------------------------------------------------------------

// B = 2, Hq = 2, Hkv = 1, D = 8: a q|k|v row of (2 + 2 * 1) * 8 = 32; caches of kCapacity rows,
// more than the tables' kTableRows, so the two position bounds are told apart.
constexpr std::int64_t kCapacity = 7;

struct RopeKvAppendArgs {
  Tensor qkv;               // [2, 1, 32] bf16
  Tensor cos, sin;          // [5, 8] f32
  Tensor position;          // [1] i32 = 3
  Tensor k_cache, v_cache;  // [2, 1, 7, 8] bf16
  Tensor out;               // [2, 2, 1, 8] bf16
  std::vector<Tensor*> tensors() {
    return {&qkv, &cos, &sin, &position, &k_cache, &v_cache, &out};
  }  // every tensor argument
};

inline OpTable<RopeKvAppendArgs> rope_kv_append_table() {
  using A = RopeKvAppendArgs;
  OpTable<A> t;
  t.op = "fused_rope_kv_append";
  t.make = [] {
    Rng rng(kSeed);
    A a;
    a.qkv = random(rng, {2, 1, 32});
    a.cos = random(rng, {kTableRows, 8}, DType::f32);
    a.sin = random(rng, {kTableRows, 8}, DType::f32);
    a.position = position_of(3);
    a.k_cache = random(rng, {2, 1, kCapacity, 8});
    a.v_cache = random(rng, {2, 1, kCapacity, 8});
    a.out = random(rng, {2, 2, 1, 8});
    return a;
  };
  t.call = [](A& a) {
    fused_rope_kv_append(a.qkv, a.cos, a.sin, a.position, a.k_cache, a.v_cache, a.out);
  };
  t.written = [](const A& a) {
    return Named{{"k_cache", a.k_cache}, {"v_cache", a.v_cache}, {"out", a.out}};
  };
  t.mutations = {
      {"qkv dtype i32",
       Want::unsupported,
       {"`qkv`", "i32"},
       [](A& a) { a.qkv = as(a.qkv, DType::i32); }},
      {"cos dtype i32", Want::dtype, {"`cos`", "i32"}, [](A& a) { a.cos = as(a.cos, DType::i32); }},
      {"sin dtype i32", Want::dtype, {"`sin`", "i32"}, [](A& a) { a.sin = as(a.sin, DType::i32); }},
      {"sin dtype f16 (cos f32)",
       Want::dtype,
       {"`sin`", "f16"},
       [](A& a) { a.sin = as(a.sin, DType::f16); }},
      {"k_cache dtype f16 (qkv bf16)",
       Want::dtype,
       {"`k_cache`", "f16"},
       [](A& a) { a.k_cache = as(a.k_cache, DType::f16); }},
      {"v_cache dtype f16 (qkv bf16)",
       Want::dtype,
       {"`v_cache`", "f16"},
       [](A& a) { a.v_cache = as(a.v_cache, DType::f16); }},
      {"out dtype f32 (qkv bf16)",
       Want::dtype,
       {"`out`", "f32"},
       [](A& a) { a.out = as(a.out, DType::f32); }},
      {"qkv rank 2",
       Want::shape,
       {"`qkv`", "[2, 32]"},
       [](A& a) {
         a.qkv = a.qkv.reshape({2, 32});
       }},
      {"qkv 2 tokens",
       Want::shape,
       {"`qkv`", "[2, 2, 32]"},
       [](A& a) {
         a.qkv = random_like_shape(a.qkv, {2, 2, 32});
       }},
      {"qkv row 36 (not (Hq + 2 Hkv) D)",
       Want::shape,
       {"`qkv`", "[2, 1, 36]"},
       [](A& a) {
         a.qkv = random_like_shape(a.qkv, {2, 1, 36});
       }},
      {"k_cache rank 3",
       Want::shape,
       {"`k_cache`", "[2, 7, 8]"},
       [](A& a) { a.k_cache = a.k_cache.select(1, 0); }},
      {"v_cache capacity 6",
       Want::shape,
       {"`v_cache`", "[2, 1, 6, 8]"},
       [](A& a) { a.v_cache = a.v_cache.slice(2, 0, 6); }},
      {"caches batch 3 (qkv 2)",
       Want::shape,
       {"`k_cache`", "[3, 1, 7, 8]"},
       [](A& a) {
         a.k_cache = random_like_shape(a.k_cache, {3, 1, kCapacity, 8});
         a.v_cache = random_like_shape(a.v_cache, {3, 1, kCapacity, 8});
       }},
      {"out 3 heads",
       Want::shape,
       {"`out`", "[2, 3, 1, 8]"},
       [](A& a) {
         a.out = random_like_shape(a.out, {2, 3, 1, 8});
       }},
      {"out rank 3", Want::shape, {"`out`", "[2, 2, 8]"}, [](A& a) { a.out = a.out.select(2, 0); }},
      {"cos last axis 6",
       Want::shape,
       {"`cos`", "[5, 6]"},
       [](A& a) { a.cos = a.cos.slice(1, 0, 6); }},
      {"sin last axis 6",
       Want::shape,
       {"`sin`", "[5, 6]"},
       [](A& a) { a.sin = a.sin.slice(1, 0, 6); }},
      {"odd head dim 7",
       Want::shape,
       {"`k_cache`", "7"},
       [](A& a) {
         Rng rng(kSeed + 2);
         a.qkv = random(rng, {2, 1, 28});
         a.cos = random(rng, {kTableRows, 7}, DType::f32);
         a.sin = random(rng, {kTableRows, 7}, DType::f32);
         a.k_cache = random(rng, {2, 1, kCapacity, 7});
         a.v_cache = random(rng, {2, 1, kCapacity, 7});
         a.out = random(rng, {2, 2, 1, 7});
       }},
      {"position dtype i64",
       Want::dtype,
       {"`position`", "i64"},
       [](A& a) { a.position = position_of(3, {1}, DType::i64); }},
      {"position shape [2]",
       Want::shape,
       {"`position`", "[2]"},
       [](A& a) { a.position = position_of(3, {2}); }},
      {"position 7 (the caches' capacity)",
       Want::value,
       {"`position` 7", "[0, 7)"},
       [](A& a) { a.position = position_of(kCapacity); },
       Where::device},
      {"position 5 (the tables' rows)",
       Want::value,
       {"`position` 5", "[0, 5)"},
       [](A& a) { a.position = position_of(kTableRows); },
       Where::device},
      {"position -1",
       Want::value,
       {"`position` -1"},
       [](A& a) { a.position = position_of(-1); },
       Where::device},
      {"qkv last stride 2",
       Want::layout,
       {"`qkv`", "[64, 64, 2]"},
       [](A& a) { a.qkv = every_other(a.qkv); }},
      {"out last stride 2",
       Want::layout,
       {"`out`", "[32, 16, 16, 2]"},
       [](A& a) { a.out = every_other(a.out); }},
      {"k_cache last stride 2",
       Want::layout,
       {"`k_cache`", "[112, 112, 16, 2]"},
       [](A& a) { a.k_cache = every_other(a.k_cache); }},
      {"v_cache last stride 2",
       Want::layout,
       {"`v_cache`", "[112, 112, 16, 2]"},
       [](A& a) { a.v_cache = every_other(a.v_cache); }},
      {"k_cache with a stride-0 batch axis",
       Want::layout,
       {"`k_cache`"},
       [](A& a) {
         a.k_cache = a.k_cache.slice(0, 0, 1).expand({2, 1, kCapacity, 8});
       }},
      {"out overlaps qkv's q heads",
       Want::layout,
       {"`out`", "`qkv`"},
       [](A& a) {
         a.out = view_into(a.qkv, 4, {2, 2, 1, 8});  // elements 4..35 of qkv's 64
       }},
      {"out overlaps qkv's v heads only",
       Want::layout,
       {"`out`", "`qkv`"},
       [](A& a) {
         // qkv rows at a batch stride of 48 in a [200] buffer; out from element 72: batch 1's v
         // head (72..79) and beyond, clear of every q head (0..15, 48..63).
         Rng rng(kSeed + 3);
         Tensor buffer = random(rng, {200});
         a.qkv = Tensor::view_of(buffer.storage(), 0, {2, 1, 32}, {48, 32, 1}, DType::bf16);
         a.out = Tensor::view_of(buffer.storage(), 72, {2, 2, 1, 8}, {48, 8, 8, 1}, DType::bf16);
       }},
      {"out overlaps k_cache",
       Want::layout,
       {"`out`", "`k_cache`"},
       [](A& a) {
         a.out = view_into(a.k_cache, 0, {2, 2, 1, 8});
       }},
      {"v_cache is k_cache",
       Want::layout,
       {"`k_cache`", "`v_cache`"},
       [](A& a) { a.v_cache = a.k_cache; }},
      {"k_cache undefined",
       Want::value,
       {"`k_cache`", "not given"},
       [](A& a) { a.k_cache = Tensor(); }},
      {"qkv on cuda", Want::device, {"`qkv`", "cuda:0"}, [](A& a) { a.qkv = fake_cuda(a.qkv); }},
      {"cos on cuda", Want::device, {"`cos`", "cuda:0"}, [](A& a) { a.cos = fake_cuda(a.cos); }},
      {"sin on cuda", Want::device, {"`sin`", "cuda:0"}, [](A& a) { a.sin = fake_cuda(a.sin); }},
      {"position on cuda",
       Want::device,
       {"`position`", "cuda:0"},
       [](A& a) { a.position = fake_cuda(a.position); }},
      {"k_cache on cuda",
       Want::device,
       {"`k_cache`", "cuda:0"},
       [](A& a) { a.k_cache = fake_cuda(a.k_cache); }},
      {"v_cache on cuda",
       Want::device,
       {"`v_cache`", "cuda:0"},
       [](A& a) { a.v_cache = fake_cuda(a.v_cache); }},
      {"out on cuda", Want::device, {"`out`", "cuda:0"}, [](A& a) { a.out = fake_cuda(a.out); }},
  };
  return t;
}

// ---- fused_rms_norm_matmul_rope_kv_append -------------------------------------------------------

// B = 2, K = 16, Hq = 2, Hkv = 1, D = 8: w [32, 16]; caches and tables as for rope_kv_append.
struct QkvRopeArgs {
  Tensor x, norm_weight;  // [2, 1, 16], [16] bf16
  float eps = kEps;
  Tensor w;                 // [32, 16] bf16
  Tensor cos, sin;          // [5, 8] f32
  Tensor position;          // [1] i32 = 3
  Tensor k_cache, v_cache;  // [2, 1, 7, 8] bf16
  Tensor out;               // [2, 2, 1, 8] bf16
  std::vector<Tensor*> tensors() {
    return {&x, &norm_weight, &w, &cos, &sin, &position, &k_cache, &v_cache, &out};
  }  // every tensor argument
};

inline OpTable<QkvRopeArgs> qkv_rope_table() {
  using A = QkvRopeArgs;
  OpTable<A> t;
  t.op = "fused_rms_norm_matmul_rope_kv_append";
  t.make = [] {
    Rng rng(kSeed);
    A a;
    a.x = random(rng, {2, 1, 16});
    a.norm_weight = random(rng, {16});
    a.w = random(rng, {32, 16});
    a.cos = random(rng, {kTableRows, 8}, DType::f32);
    a.sin = random(rng, {kTableRows, 8}, DType::f32);
    a.position = position_of(3);
    a.k_cache = random(rng, {2, 1, kCapacity, 8});
    a.v_cache = random(rng, {2, 1, kCapacity, 8});
    a.out = random(rng, {2, 2, 1, 8});
    return a;
  };
  t.call = [](A& a) {
    fused_rms_norm_matmul_rope_kv_append(a.x, a.norm_weight, a.eps, a.w, a.cos, a.sin, a.position,
                                         a.k_cache, a.v_cache, a.out);
  };
  t.written = [](const A& a) {
    return Named{{"k_cache", a.k_cache}, {"v_cache", a.v_cache}, {"out", a.out}};
  };
  t.mutations = {
      {"x dtype i32", Want::unsupported, {"`x`", "i32"}, [](A& a) { a.x = as(a.x, DType::i32); }},
      {"norm_weight dtype i32",
       Want::unsupported,
       {"`norm_weight`", "i32"},
       [](A& a) { a.norm_weight = as(a.norm_weight, DType::i32); }},
      {"w dtype i32", Want::unsupported, {"`w`", "i32"}, [](A& a) { a.w = as(a.w, DType::i32); }},
      {"cos dtype i32", Want::dtype, {"`cos`", "i32"}, [](A& a) { a.cos = as(a.cos, DType::i32); }},
      {"sin dtype i32", Want::dtype, {"`sin`", "i32"}, [](A& a) { a.sin = as(a.sin, DType::i32); }},
      {"k_cache dtype i32",
       Want::unsupported,
       {"`k_cache`", "i32"},
       [](A& a) { a.k_cache = as(a.k_cache, DType::i32); }},
      {"v_cache dtype i32",
       Want::dtype,
       {"`v_cache`", "i32"},
       [](A& a) { a.v_cache = as(a.v_cache, DType::i32); }},
      {"out dtype i32", Want::dtype, {"`out`", "i32"}, [](A& a) { a.out = as(a.out, DType::i32); }},
      {"k_cache dtype f16 (v_cache, out bf16)",
       Want::dtype,
       {"`k_cache`", "f16"},
       [](A& a) { a.k_cache = as(a.k_cache, DType::f16); }},
      {"v_cache dtype f16 (k_cache bf16)",
       Want::dtype,
       {"`v_cache`", "f16"},
       [](A& a) { a.v_cache = as(a.v_cache, DType::f16); }},
      {"out dtype f32 (k_cache bf16)",
       Want::dtype,
       {"`out`", "f32"},
       [](A& a) { a.out = as(a.out, DType::f32); }},
      {"sin dtype f16 (cos f32)",
       Want::dtype,
       {"`sin`", "f16"},
       [](A& a) { a.sin = as(a.sin, DType::f16); }},
      {"eps -1", Want::value, {"`eps`", "-1"}, [](A& a) { a.eps = -1.0f; }},
      {"eps NaN", Want::value, {"`eps`", "nan"}, [](A& a) { a.eps = kNaN; }},
      {"eps +inf", Want::value, {"`eps`", "inf"}, [](A& a) { a.eps = kInf; }},
      {"x rank 2",
       Want::shape,
       {"`x`", "[2, 16]"},
       [](A& a) {
         a.x = a.x.reshape({2, 16});
       }},
      {"x 2 tokens",
       Want::shape,
       {"`x`", "[2, 2, 16]"},
       [](A& a) {
         a.x = random_like_shape(a.x, {2, 2, 16});
       }},
      {"norm_weight length 8",
       Want::shape,
       {"`norm_weight`", "[8]"},
       [](A& a) { a.norm_weight = a.norm_weight.slice(0, 0, 8); }},
      {"norm_weight rank 2",
       Want::shape,
       {"`norm_weight`", "[1, 16]"},
       [](A& a) {
         a.norm_weight = a.norm_weight.reshape({1, 16});
       }},
      {"w K 8", Want::shape, {"`w`", "[32, 8]"}, [](A& a) { a.w = a.w.slice(1, 0, 8); }},
      {"w 31 rows", Want::shape, {"`w`", "31"}, [](A& a) { a.w = a.w.slice(0, 0, 31); }},
      {"w rank 1", Want::shape, {"`w`", "[16]"}, [](A& a) { a.w = a.w.select(0, 0); }},
      {"k_cache rank 3",
       Want::shape,
       {"`k_cache`", "[2, 7, 8]"},
       [](A& a) { a.k_cache = a.k_cache.select(1, 0); }},
      {"v_cache capacity 6",
       Want::shape,
       {"`v_cache`", "[2, 1, 6, 8]"},
       [](A& a) { a.v_cache = a.v_cache.slice(2, 0, 6); }},
      {"caches batch 3 (x 2)",
       Want::shape,
       {"`k_cache`", "[3, 1, 7, 8]"},
       [](A& a) {
         a.k_cache = random_like_shape(a.k_cache, {3, 1, kCapacity, 8});
         a.v_cache = random_like_shape(a.v_cache, {3, 1, kCapacity, 8});
       }},
      {"out 3 heads",
       Want::shape,
       {"`out`", "[2, 3, 1, 8]"},
       [](A& a) {
         a.out = random_like_shape(a.out, {2, 3, 1, 8});
       }},
      {"cos last axis 6",
       Want::shape,
       {"`cos`", "[5, 6]"},
       [](A& a) { a.cos = a.cos.slice(1, 0, 6); }},
      {"cos rank 1", Want::shape, {"`cos`", "[8]"}, [](A& a) { a.cos = a.cos.select(0, 0); }},
      {"odd head dim 7",
       Want::shape,
       {"`k_cache`", "7"},
       [](A& a) {
         Rng rng(kSeed + 2);
         a.w = random(rng, {28, 16});
         a.cos = random(rng, {kTableRows, 7}, DType::f32);
         a.sin = random(rng, {kTableRows, 7}, DType::f32);
         a.k_cache = random(rng, {2, 1, kCapacity, 7});
         a.v_cache = random(rng, {2, 1, kCapacity, 7});
         a.out = random(rng, {2, 2, 1, 7});
       }},
      {"position dtype i64",
       Want::dtype,
       {"`position`", "i64"},
       [](A& a) { a.position = position_of(3, {1}, DType::i64); }},
      {"position shape [2]",
       Want::shape,
       {"`position`", "[2]"},
       [](A& a) { a.position = position_of(3, {2}); }},
      {"position 7 (the caches' capacity)",
       Want::value,
       {"`position` 7"},
       [](A& a) { a.position = position_of(kCapacity); },
       Where::device},
      {"position 5 (the tables' rows)",
       Want::value,
       {"`position` 5", "[0, 5)"},
       [](A& a) { a.position = position_of(kTableRows); },
       Where::device},
      {"position -1",
       Want::value,
       {"`position` -1"},
       [](A& a) { a.position = position_of(-1); },
       Where::device},
      {"x last stride 2",
       Want::layout,
       {"`x`", "[32, 32, 2]"},
       [](A& a) { a.x = every_other(a.x); }},
      {"w last stride 2", Want::layout, {"`w`", "[32, 2]"}, [](A& a) { a.w = every_other(a.w); }},
      {"k_cache last stride 2",
       Want::layout,
       {"`k_cache`", "[112, 112, 16, 2]"},
       [](A& a) { a.k_cache = every_other(a.k_cache); }},
      {"out last stride 2",
       Want::layout,
       {"`out`", "[32, 16, 16, 2]"},
       [](A& a) { a.out = every_other(a.out); }},
      {"out overlaps x",
       Want::layout,
       {"`out`", "`x`"},
       [](A& a) {
         a.out = view_into(a.x, 0, {2, 2, 1, 8});
       }},
      {"out overlaps w",
       Want::layout,
       {"`out`", "`w`"},
       [](A& a) {
         a.out = view_into(a.w, 0, {2, 2, 1, 8});
       }},
      {"out overlaps k_cache",
       Want::layout,
       {"`out`", "`k_cache`"},
       [](A& a) {
         a.out = view_into(a.k_cache, 0, {2, 2, 1, 8});
       }},
      {"v_cache is k_cache",
       Want::layout,
       {"`k_cache`", "`v_cache`"},
       [](A& a) { a.v_cache = a.k_cache; }},
      {"x inside k_cache",
       Want::layout,
       {"`k_cache`", "overlaps `x`"},
       [](A& a) {
         a.x = view_into(a.k_cache, 0, {2, 1, 16});
       }},
      {"norm_weight inside v_cache",
       Want::layout,
       {"`v_cache`", "overlaps `norm_weight`"},
       [](A& a) { a.norm_weight = view_into(a.v_cache, 0, {16}); }},
      {"norm_weight undefined",
       Want::value,
       {"`norm_weight`", "not given"},
       [](A& a) { a.norm_weight = Tensor(); }},
      {"x on cuda", Want::device, {"`x`", "cuda:0"}, [](A& a) { a.x = fake_cuda(a.x); }},
      {"norm_weight on cuda",
       Want::device,
       {"`norm_weight`", "cuda:0"},
       [](A& a) { a.norm_weight = fake_cuda(a.norm_weight); }},
      {"w on cuda", Want::device, {"`w`", "cuda:0"}, [](A& a) { a.w = fake_cuda(a.w); }},
      {"cos on cuda", Want::device, {"`cos`", "cuda:0"}, [](A& a) { a.cos = fake_cuda(a.cos); }},
      {"sin on cuda", Want::device, {"`sin`", "cuda:0"}, [](A& a) { a.sin = fake_cuda(a.sin); }},
      {"position on cuda",
       Want::device,
       {"`position`", "cuda:0"},
       [](A& a) { a.position = fake_cuda(a.position); }},
      {"k_cache on cuda",
       Want::device,
       {"`k_cache`", "cuda:0"},
       [](A& a) { a.k_cache = fake_cuda(a.k_cache); }},
      {"v_cache on cuda",
       Want::device,
       {"`v_cache`", "cuda:0"},
       [](A& a) { a.v_cache = fake_cuda(a.v_cache); }},
      {"out on cuda", Want::device, {"`out`", "cuda:0"}, [](A& a) { a.out = fake_cuda(a.out); }},
  };
  return t;
}

// ---- fused_matmul_add ---------------------------------------------------------------------------

struct MatMulAddArgs {
  Tensor a, b, c, out;  // [2, 3, 16], [8, 16], [2, 3, 8], [2, 3, 8] bf16
  std::vector<Tensor*> tensors() { return {&a, &b, &c, &out}; }  // every tensor argument
};

inline OpTable<MatMulAddArgs> matmul_add_table() {
  using A = MatMulAddArgs;
  OpTable<A> t;
  t.op = "fused_matmul_add";
  t.make = [] {
    Rng rng(kSeed);
    A a;
    a.a = random(rng, {2, 3, 16});
    a.b = random(rng, {8, 16});
    a.c = random(rng, {2, 3, 8});
    a.out = random(rng, {2, 3, 8});
    return a;
  };
  t.call = [](A& a) { fused_matmul_add(a.a, a.b, a.c, a.out); };
  t.written = [](const A& a) { return Named{{"out", a.out}}; };
  t.mutations = {
      {"a dtype i32", Want::unsupported, {"`a`", "i32"}, [](A& a) { a.a = as(a.a, DType::i32); }},
      {"b dtype i32", Want::dtype, {"`b`", "i32"}, [](A& a) { a.b = as(a.b, DType::i32); }},
      {"b dtype f16 (a bf16)",
       Want::dtype,
       {"`b`", "f16"},
       [](A& a) { a.b = as(a.b, DType::f16); }},
      {"c dtype i32", Want::dtype, {"`c`", "i32"}, [](A& a) { a.c = as(a.c, DType::i32); }},
      {"out dtype i32", Want::dtype, {"`out`", "i32"}, [](A& a) { a.out = as(a.out, DType::i32); }},
      {"a rank 1", Want::shape, {"`a`", "[16]"}, [](A& a) { a.a = a.a.select(0, 0).select(0, 0); }},
      {"b rank 3",
       Want::shape,
       {"`b`", "[1, 8, 16]"},
       [](A& a) {
         a.b = a.b.reshape({1, 8, 16});
       }},
      {"b K 15", Want::shape, {"`b`", "[8, 15]"}, [](A& a) { a.b = a.b.slice(1, 0, 15); }},
      {"c last axis 9",
       Want::shape,
       {"`c`", "[2, 3, 9]"},
       [](A& a) {
         a.c = random_like_shape(a.c, {2, 3, 9});
       }},
      {"c a bias of 7",
       Want::shape,
       {"`c`", "[7]"},
       [](A& a) { a.c = random_like_shape(a.c, {7}); }},
      {"out last axis 9",
       Want::shape,
       {"`out`", "[2, 3, 9]"},
       [](A& a) {
         a.out = random_like_shape(a.out, {2, 3, 9});
       }},
      {"out an extra leading axis",
       Want::shape,
       {"`out`", "[2, 2, 3, 8]"},
       [](A& a) {
         a.out = random_like_shape(a.out, {2, 2, 3, 8});
       }},
      {"a last stride 2",
       Want::layout,
       {"`a`", "[96, 32, 2]"},
       [](A& a) { a.a = every_other(a.a); }},
      {"b last stride 2", Want::layout, {"`b`", "[32, 2]"}, [](A& a) { a.b = every_other(a.b); }},
      {"out last stride 2",
       Want::layout,
       {"`out`", "[48, 16, 2]"},
       [](A& a) { a.out = every_other(a.out); }},
      {"out with a stride-0 axis",
       Want::layout,
       {"`out`"},
       [](A& a) {
         a.out = a.out.slice(0, 0, 1).expand({2, 3, 8});
       }},
      {"out overlaps a", Want::layout, {"`out`", "`a`"}, [](A& a) { a.out = a.a.slice(2, 0, 8); }},
      {"out overlaps b",
       Want::layout,
       {"`out`", "`b`"},
       [](A& a) {
         a.out = view_into(a.b, 0, {2, 3, 8});
       }},
      {"out overlaps c (shifted)",
       Want::layout,
       {"`out`", "`c`"},
       [](A& a) {
         Tensor buffer = Tensor::zeros({2, 3, 12}, DType::bf16);
         Tensor c = buffer.slice(2, 0, 8);
         c.copy_from(a.c);
         a.c = c;
         a.out = buffer.slice(2, 4, 12);
       }},
      {"c undefined", Want::value, {"`c`", "not given"}, [](A& a) { a.c = Tensor(); }},
      {"a on cuda", Want::device, {"`a`", "cuda:0"}, [](A& a) { a.a = fake_cuda(a.a); }},
      {"b on cuda", Want::device, {"`b`", "cuda:0"}, [](A& a) { a.b = fake_cuda(a.b); }},
      {"c on cuda", Want::device, {"`c`", "cuda:0"}, [](A& a) { a.c = fake_cuda(a.c); }},
      {"out on cuda", Want::device, {"`out`", "cuda:0"}, [](A& a) { a.out = fake_cuda(a.out); }},
  };
  return t;
}

// ---- fused_rms_norm_matmul ----------------------------------------------------------------------

struct RmsNormMatMulArgs {
  Tensor x, weight;  // [2, 3, 16], [16] bf16
  float eps = kEps;
  Tensor w, out;                                                      // [8, 16], [2, 3, 8] bf16
  std::vector<Tensor*> tensors() { return {&x, &weight, &w, &out}; }  // every tensor argument
};

inline OpTable<RmsNormMatMulArgs> rms_norm_matmul_table() {
  using A = RmsNormMatMulArgs;
  OpTable<A> t;
  t.op = "fused_rms_norm_matmul";
  t.make = [] {
    Rng rng(kSeed);
    A a;
    a.x = random(rng, {2, 3, 16});
    a.weight = random(rng, {16});
    a.w = random(rng, {8, 16});
    a.out = random(rng, {2, 3, 8});
    return a;
  };
  t.call = [](A& a) { fused_rms_norm_matmul(a.x, a.weight, a.eps, a.w, a.out); };
  t.written = [](const A& a) { return Named{{"out", a.out}}; };
  t.mutations = {
      {"x dtype i32", Want::unsupported, {"`x`", "i32"}, [](A& a) { a.x = as(a.x, DType::i32); }},
      {"weight dtype i32",
       Want::dtype,
       {"`weight`", "i32"},
       [](A& a) { a.weight = as(a.weight, DType::i32); }},
      {"w dtype i32", Want::dtype, {"`w`", "i32"}, [](A& a) { a.w = as(a.w, DType::i32); }},
      {"out dtype i32", Want::dtype, {"`out`", "i32"}, [](A& a) { a.out = as(a.out, DType::i32); }},
      {"x a scalar",
       Want::shape,
       {"`x`", "scalar"},
       [](A& a) { a.x = Tensor::zeros({}, DType::bf16); }},
      {"x rank 1", Want::shape, {"`x`", "[16]"}, [](A& a) { a.x = a.x.select(0, 0).select(0, 0); }},
      {"weight length 8",
       Want::shape,
       {"`weight`", "[8]"},
       [](A& a) { a.weight = a.weight.slice(0, 0, 8); }},
      {"w K 8", Want::shape, {"`w`", "[8, 8]"}, [](A& a) { a.w = a.w.slice(1, 0, 8); }},
      {"w rank 1", Want::shape, {"`w`", "[16]"}, [](A& a) { a.w = a.w.select(0, 0); }},
      {"out last axis 9",
       Want::shape,
       {"`out`", "[2, 3, 9]"},
       [](A& a) {
         a.out = random_like_shape(a.out, {2, 3, 9});
       }},
      {"x last stride 2",
       Want::layout,
       {"`x`", "[96, 32, 2]"},
       [](A& a) { a.x = every_other(a.x); }},
      {"out with a stride-0 axis",
       Want::layout,
       {"`out`"},
       [](A& a) {
         a.out = a.out.slice(0, 0, 1).expand({2, 3, 8});
       }},
      {"out overlaps x", Want::layout, {"`out`", "`x`"}, [](A& a) { a.out = a.x.slice(2, 0, 8); }},
      {"out overlaps w",
       Want::layout,
       {"`out`", "`w`"},
       [](A& a) {
         a.out = view_into(a.w, 0, {2, 3, 8});
       }},
      {"eps -1", Want::value, {"`eps`", "-1"}, [](A& a) { a.eps = -1.0f; }},
      {"eps NaN", Want::value, {"`eps`", "nan"}, [](A& a) { a.eps = kNaN; }},
      {"eps +inf", Want::value, {"`eps`", "inf"}, [](A& a) { a.eps = kInf; }},
      {"w undefined", Want::value, {"`w`", "not given"}, [](A& a) { a.w = Tensor(); }},
      {"x on cuda", Want::device, {"`x`", "cuda:0"}, [](A& a) { a.x = fake_cuda(a.x); }},
      {"weight on cuda",
       Want::device,
       {"`weight`", "cuda:0"},
       [](A& a) { a.weight = fake_cuda(a.weight); }},
      {"w on cuda", Want::device, {"`w`", "cuda:0"}, [](A& a) { a.w = fake_cuda(a.w); }},
      {"out on cuda", Want::device, {"`out`", "cuda:0"}, [](A& a) { a.out = fake_cuda(a.out); }},
  };
  return t;
}

// ---- fused_rms_norm_matmul_swiglu ---------------------------------------------------------------

struct SwigluArgs {
  Tensor x, norm_weight;  // [2, 3, 16], [16] bf16
  float eps = kEps;
  Tensor w, out;  // [16, 16] (I = 8), [2, 3, 8] bf16
  std::vector<Tensor*> tensors() { return {&x, &norm_weight, &w, &out}; }  // every tensor argument
};

inline OpTable<SwigluArgs> swiglu_table() {
  using A = SwigluArgs;
  OpTable<A> t;
  t.op = "fused_rms_norm_matmul_swiglu";
  t.make = [] {
    Rng rng(kSeed);
    A a;
    a.x = random(rng, {2, 3, 16});
    a.norm_weight = random(rng, {16});
    a.w = random(rng, {16, 16});
    a.out = random(rng, {2, 3, 8});
    return a;
  };
  t.call = [](A& a) { fused_rms_norm_matmul_swiglu(a.x, a.norm_weight, a.eps, a.w, a.out); };
  t.written = [](const A& a) { return Named{{"out", a.out}}; };
  t.mutations = {
      {"x dtype i32", Want::unsupported, {"`x`", "i32"}, [](A& a) { a.x = as(a.x, DType::i32); }},
      {"norm_weight dtype i32",
       Want::dtype,
       {"`norm_weight`", "i32"},
       [](A& a) { a.norm_weight = as(a.norm_weight, DType::i32); }},
      {"w dtype i32", Want::dtype, {"`w`", "i32"}, [](A& a) { a.w = as(a.w, DType::i32); }},
      {"out dtype i32", Want::dtype, {"`out`", "i32"}, [](A& a) { a.out = as(a.out, DType::i32); }},
      {"x a scalar",
       Want::shape,
       {"`x`", "scalar"},
       [](A& a) { a.x = Tensor::zeros({}, DType::bf16); }},
      {"x rank 1", Want::shape, {"`x`", "[16]"}, [](A& a) { a.x = a.x.select(0, 0).select(0, 0); }},
      {"norm_weight length 8",
       Want::shape,
       {"`norm_weight`", "[8]"},
       [](A& a) { a.norm_weight = a.norm_weight.slice(0, 0, 8); }},
      {"w 15 rows (odd)",
       Want::shape,
       {"`w`", "[15, 16]"},
       [](A& a) { a.w = a.w.slice(0, 0, 15); }},
      {"w K 8", Want::shape, {"`w`", "[16, 8]"}, [](A& a) { a.w = a.w.slice(1, 0, 8); }},
      {"w rank 1", Want::shape, {"`w`", "[16]"}, [](A& a) { a.w = a.w.select(0, 0); }},
      {"out the product's width 16",
       Want::shape,
       {"`out`", "[2, 3, 16]"},
       [](A& a) {
         a.out = random_like_shape(a.out, {2, 3, 16});
       }},
      {"x last stride 2",
       Want::layout,
       {"`x`", "[96, 32, 2]"},
       [](A& a) { a.x = every_other(a.x); }},
      {"w last stride 2", Want::layout, {"`w`", "[32, 2]"}, [](A& a) { a.w = every_other(a.w); }},
      {"out last stride 2",
       Want::layout,
       {"`out`", "[48, 16, 2]"},
       [](A& a) { a.out = every_other(a.out); }},
      {"out with a stride-0 axis",
       Want::layout,
       {"`out`"},
       [](A& a) {
         a.out = a.out.slice(0, 0, 1).expand({2, 3, 8});
       }},
      {"out overlaps x", Want::layout, {"`out`", "`x`"}, [](A& a) { a.out = a.x.slice(2, 0, 8); }},
      {"out overlaps w",
       Want::layout,
       {"`out`", "`w`"},
       [](A& a) {
         a.out = view_into(a.w, 0, {2, 3, 8});
       }},
      {"eps -1", Want::value, {"`eps`", "-1"}, [](A& a) { a.eps = -1.0f; }},
      {"eps NaN", Want::value, {"`eps`", "nan"}, [](A& a) { a.eps = kNaN; }},
      {"eps +inf", Want::value, {"`eps`", "inf"}, [](A& a) { a.eps = kInf; }},
      {"norm_weight undefined",
       Want::value,
       {"`norm_weight`", "not given"},
       [](A& a) { a.norm_weight = Tensor(); }},
      {"x on cuda", Want::device, {"`x`", "cuda:0"}, [](A& a) { a.x = fake_cuda(a.x); }},
      {"norm_weight on cuda",
       Want::device,
       {"`norm_weight`", "cuda:0"},
       [](A& a) { a.norm_weight = fake_cuda(a.norm_weight); }},
      {"w on cuda", Want::device, {"`w`", "cuda:0"}, [](A& a) { a.w = fake_cuda(a.w); }},
      {"out on cuda", Want::device, {"`out`", "cuda:0"}, [](A& a) { a.out = fake_cuda(a.out); }},
  };
  return t;
}

// ---- fused_silu_mul_matmul_add ------------------------------------------------------------------

struct SiluMulMatMulAddArgs {
  Tensor a, b, w, c, out;  // [2, 3, 16] twice, [8, 16], [2, 3, 8] twice, bf16
  std::vector<Tensor*> tensors() { return {&a, &b, &w, &c, &out}; }  // every tensor argument
};

inline OpTable<SiluMulMatMulAddArgs> silu_mul_matmul_add_table() {
  using A = SiluMulMatMulAddArgs;
  OpTable<A> t;
  t.op = "fused_silu_mul_matmul_add";
  t.make = [] {
    Rng rng(kSeed);
    A a;
    a.a = random(rng, {2, 3, 16});
    a.b = random(rng, {2, 3, 16});
    a.w = random(rng, {8, 16});
    a.c = random(rng, {2, 3, 8});
    a.out = random(rng, {2, 3, 8});
    return a;
  };
  t.call = [](A& a) { fused_silu_mul_matmul_add(a.a, a.b, a.w, a.c, a.out); };
  t.written = [](const A& a) { return Named{{"out", a.out}}; };
  t.mutations = {
      {"a dtype i32", Want::unsupported, {"`a`", "i32"}, [](A& a) { a.a = as(a.a, DType::i32); }},
      {"b dtype i32", Want::dtype, {"`b`", "i32"}, [](A& a) { a.b = as(a.b, DType::i32); }},
      {"b dtype f16 (a bf16)",
       Want::dtype,
       {"`b`", "f16"},
       [](A& a) { a.b = as(a.b, DType::f16); }},
      {"w dtype i32", Want::dtype, {"`w`", "i32"}, [](A& a) { a.w = as(a.w, DType::i32); }},
      {"w dtype f32 (a bf16)",
       Want::dtype,
       {"`w`", "f32"},
       [](A& a) { a.w = as(a.w, DType::f32); }},
      {"c dtype i32", Want::dtype, {"`c`", "i32"}, [](A& a) { a.c = as(a.c, DType::i32); }},
      {"out dtype i32", Want::dtype, {"`out`", "i32"}, [](A& a) { a.out = as(a.out, DType::i32); }},
      {"a rank 1", Want::shape, {"`a`", "[16]"}, [](A& a) { a.a = a.a.select(0, 0).select(0, 0); }},
      {"b last axis 8", Want::shape, {"`b`", "[2, 3, 8]"}, [](A& a) { a.b = a.b.slice(2, 0, 8); }},
      {"w K 8", Want::shape, {"`w`", "[8, 8]"}, [](A& a) { a.w = a.w.slice(1, 0, 8); }},
      {"w rank 1", Want::shape, {"`w`", "[16]"}, [](A& a) { a.w = a.w.select(0, 0); }},
      {"c last axis 9",
       Want::shape,
       {"`c`", "[2, 3, 9]"},
       [](A& a) {
         a.c = random_like_shape(a.c, {2, 3, 9});
       }},
      {"out last axis 9",
       Want::shape,
       {"`out`", "[2, 3, 9]"},
       [](A& a) {
         a.out = random_like_shape(a.out, {2, 3, 9});
       }},
      {"a last stride 2",
       Want::layout,
       {"`a`", "[96, 32, 2]"},
       [](A& a) { a.a = every_other(a.a); }},
      {"b last stride 2",
       Want::layout,
       {"`b`", "[96, 32, 2]"},
       [](A& a) { a.b = every_other(a.b); }},
      {"out with a stride-0 axis",
       Want::layout,
       {"`out`"},
       [](A& a) {
         a.out = a.out.slice(0, 0, 1).expand({2, 3, 8});
       }},
      {"out overlaps a", Want::layout, {"`out`", "`a`"}, [](A& a) { a.out = a.a.slice(2, 0, 8); }},
      {"out overlaps b", Want::layout, {"`out`", "`b`"}, [](A& a) { a.out = a.b.slice(2, 0, 8); }},
      {"out overlaps w",
       Want::layout,
       {"`out`", "`w`"},
       [](A& a) {
         a.out = view_into(a.w, 0, {2, 3, 8});
       }},
      {"out overlaps c (shifted)",
       Want::layout,
       {"`out`", "`c`"},
       [](A& a) {
         Tensor buffer = Tensor::zeros({2, 3, 12}, DType::bf16);
         Tensor c = buffer.slice(2, 0, 8);
         c.copy_from(a.c);
         a.c = c;
         a.out = buffer.slice(2, 4, 12);
       }},
      {"c undefined", Want::value, {"`c`", "not given"}, [](A& a) { a.c = Tensor(); }},
      {"a on cuda", Want::device, {"`a`", "cuda:0"}, [](A& a) { a.a = fake_cuda(a.a); }},
      {"b on cuda", Want::device, {"`b`", "cuda:0"}, [](A& a) { a.b = fake_cuda(a.b); }},
      {"w on cuda", Want::device, {"`w`", "cuda:0"}, [](A& a) { a.w = fake_cuda(a.w); }},
      {"c on cuda", Want::device, {"`c`", "cuda:0"}, [](A& a) { a.c = fake_cuda(a.c); }},
      {"out on cuda", Want::device, {"`out`", "cuda:0"}, [](A& a) { a.out = fake_cuda(a.out); }},
  };
  return t;
}

}  // namespace splice::layer_op_tables
