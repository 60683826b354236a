// backend/cpu/kernel_util.h: the machinery shared by the CPU primitive kernels (internal).
//
// Every kernel walks one or more strided tensors in lockstep:
//   1. Shapes are broadcast NumPy-style; each operand gets strides aligned to the iteration shape
//      (stride 0 on a stretched axis).
//   2. The iteration space is coalesced: size-1 axes are dropped and adjacent axes merge when
//      stride[i] == stride[i+1] * shape[i+1] for every operand, so contiguous tensors become one
//      flat axis whatever their rank.
//   3. A linear range [begin, end) of the space is visited as runs along the innermost axis:
//      fn(offsets, count), one element offset per operand; the run's stride is the operand's
//      innermost stride. Only the carry into outer axes costs index arithmetic.
//   4. Runs are processed in tiles of at most kTile elements: each operand tile is loaded into a
//      compute-type buffer (float, double, int64 or uint8) by a loop typed on the storage dtype
//      (one dtype switch per tile, none per element), the op runs on plain arrays, and the result
//      is stored back with one typed loop. An f32 operand with unit stride is read in place and an
//      f32 unit-stride output is written in place (no staging): the contiguous f32 fast path.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "splice/core/dtype.h"
#include "splice/core/error.h"
#include "splice/core/tensor.h"

namespace splice::cpu::detail {

// Elements per staged tile: 4 operands * 512 * 8 bytes = 16 KiB, inside L1.
inline constexpr std::int64_t kTile = 512;

// Storage type of the bool dtype (one byte, 0 or 1; read as "nonzero").
struct Bool8 {
  std::uint8_t bits;
};

// ---------------------------------------------------------------------------------------------
// Dtype dispatch: calls fn(T{}) with T the storage type of `dtype`.
template <typename Fn>
decltype(auto) dispatch_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f32:
      return fn(float{});
    case DType::f16:
      return fn(Half{});
    case DType::bf16:
      return fn(BFloat16{});
    case DType::i32:
      return fn(std::int32_t{});
    case DType::i64:
      return fn(std::int64_t{});
    case DType::boolean:
      return fn(Bool8{});
  }
  SPLICE_INTERNAL_CHECK(false, "unknown dtype ", static_cast<int>(dtype));
}

template <typename T>
inline constexpr bool kIsHalfType = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// Storage value -> compute value C (float, double, int64_t or uint8_t used as bool).
template <typename C, typename T>
inline C load_value(T v) {
  if constexpr (std::is_same_v<T, Bool8>) {
    return static_cast<C>(v.bits != 0);
  } else if constexpr (std::is_same_v<C, std::uint8_t>) {  // truthiness
    if constexpr (kIsHalfType<T>)
      return static_cast<float>(v) != 0.0f;
    else
      return v != 0;
  } else if constexpr (kIsHalfType<T>) {
    const float f = static_cast<float>(v);
    if constexpr (std::is_integral_v<C>)
      return saturate_cast<C>(f);
    else
      return static_cast<C>(f);
  } else if constexpr (std::is_floating_point_v<T> && std::is_integral_v<C>) {
    return saturate_cast<C>(v);
  } else {
    return static_cast<C>(v);
  }
}

// Compute value C -> storage value (RNE for the 16-bit floats; saturating float -> int).
template <typename T, typename C>
inline T store_value(C v) {
  if constexpr (std::is_same_v<T, Bool8>) {
    return Bool8{static_cast<std::uint8_t>(v != 0)};
  } else if constexpr (kIsHalfType<T>) {
    return T(static_cast<float>(v));
  } else if constexpr (std::is_integral_v<T> && std::is_floating_point_v<C>) {
    return saturate_cast<T>(v);
  } else {
    return static_cast<T>(v);
  }
}

// The DType whose storage is C, if any (float -> f32, int64 -> i64); used to read in place.
template <typename C>
inline bool is_native(DType dtype) {
  if constexpr (std::is_same_v<C, float>)
    return dtype == DType::f32;
  else if constexpr (std::is_same_v<C, std::int64_t>)
    return dtype == DType::i64;
  else if constexpr (std::is_same_v<C, std::uint8_t>)
    return dtype == DType::boolean;
  else
    return false;
}

// A tensor's data as seen by a kernel: element offsets are relative to `base`.
struct Operand {
  char* base = nullptr;  // the view's first element
  DType dtype = DType::f32;
  explicit Operand(const Tensor& t) : base(static_cast<char*>(t.raw_data())), dtype(t.dtype()) {}
  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(base);
  }
};

// dst[i] = load(src[offset + i*stride]) for i < n.
template <typename C>
inline void load_tile(const Operand& src, std::int64_t offset, std::int64_t stride, std::int64_t n,
                      C* dst) {
  dispatch_dtype(src.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* p = src.as<const T>() + offset;
    if (stride == 1) {
      for (std::int64_t i = 0; i < n; ++i) dst[i] = load_value<C>(p[i]);
    } else if (stride == 0) {
      const C v = load_value<C>(p[0]);
      for (std::int64_t i = 0; i < n; ++i) dst[i] = v;
    } else {
      for (std::int64_t i = 0; i < n; ++i) dst[i] = load_value<C>(p[i * stride]);
    }
  });
}

// dst[offset + i*stride] = store(src[i]) for i < n.
template <typename C>
inline void store_tile(const Operand& dst, std::int64_t offset, std::int64_t stride, std::int64_t n,
                       const C* src) {
  dispatch_dtype(dst.dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = dst.as<T>() + offset;
    if (stride == 1) {
      for (std::int64_t i = 0; i < n; ++i) p[i] = store_value<T>(src[i]);
    } else {
      for (std::int64_t i = 0; i < n; ++i) p[i * stride] = store_value<T>(src[i]);
    }
  });
}

// A tile of `src` as a C array: in place when the storage is C with unit stride, else staged
// into `scratch`.
template <typename C>
inline const C* tile_in(const Operand& src, std::int64_t offset, std::int64_t stride,
                        std::int64_t n, C* scratch) {
  if (stride == 1 && is_native<C>(src.dtype)) return src.as<const C>() + offset;
  load_tile<C>(src, offset, stride, n, scratch);
  return scratch;
}

// Where to compute an output tile: in place when possible, else `scratch` (then call tile_out).
template <typename C>
inline C* tile_out_ptr(const Operand& dst, std::int64_t offset, std::int64_t stride, C* scratch) {
  if (stride == 1 && is_native<C>(dst.dtype)) return dst.as<C>() + offset;
  return scratch;
}
template <typename C>
inline void tile_out(const Operand& dst, std::int64_t offset, std::int64_t stride, std::int64_t n,
                     const C* result) {
  if (stride == 1 && is_native<C>(dst.dtype)) return;  // written in place
  store_tile<C>(dst, offset, stride, n, result);
}

// ---------------------------------------------------------------------------------------------
// Shapes and strided iteration.

// Wraps a possibly negative axis into [0, rank); ShapeError naming `what` otherwise.
std::int64_t wrap_axis(std::int64_t axis, std::int64_t rank, const char* what);

// The NumPy broadcast of `shapes` (named by `names` for the error message).
Dims broadcast_shapes(const std::vector<const Dims*>& shapes,
                      const std::vector<const char*>& names);

// Strides of `t` aligned to `shape` (t's shape must broadcast to it): 0 on stretched and on
// missing leading axes.
Dims broadcast_strides(const Tensor& t, const Dims& shape, const char* name);
// The same for a (shape, strides) pair, e.g. a tensor's leading batch axes.
Dims broadcast_strides(const Dims& from_shape, const Dims& from_strides, const Dims& shape,
                       const char* name);

// Throws ShapeError unless `out` has `expected` shape (`why` explains where `expected` came from),
// and LayoutError when elements of `out` share an address (splice::check_no_self_overlap): every
// kernel output.
[[noreturn]] void fail_out_shape(const Tensor& out, const Dims& expected, const std::string& why);
inline void check_out_shape(const Tensor& out, const Dims& expected, const char* why) {
  if (out.shape() != expected) fail_out_shape(out, expected, why);
  check_no_self_overlap(out, "out");
}
// The same with the explanation built only on failure (decode loops call kernels every token).
template <typename WhyFn>
void check_out_shape_lazy(const Tensor& out, const Dims& expected, WhyFn&& why) {
  if (out.shape() != expected) fail_out_shape(out, expected, why());
  check_no_self_overlap(out, "out");
}

// Throws DeviceError unless `t` lives on the CPU (and ValueError when it is undefined).
void check_cpu(const Tensor& t, const char* name);

// Aliasing between an output and an input: splice::check_no_overlap (core/tensor.h).

// An iteration space over N operands after coalescing (stage 2 above). Rank >= 1 always.
template <int N>
struct Loop {
  Dims shape;
  std::array<Dims, N> strides;
  std::int64_t numel = 0;

  std::int64_t inner_stride(int operand) const { return strides[operand].back(); }

  // Visits [begin, end) in row-major order: fn(offsets, count) per run on the innermost axis.
  template <typename Fn>
  void for_each_run(std::int64_t begin, std::int64_t end, Fn&& fn) const {
    if (begin >= end) return;
    const std::int64_t rank = static_cast<std::int64_t>(shape.size());
    // Multi-index and offsets of `begin`.
    Dims index(rank, 0);
    std::array<std::int64_t, N> offsets{};
    std::int64_t rest = begin;
    for (std::int64_t d = rank - 1; d >= 0; --d) {
      index[d] = rest % shape[d];
      rest /= shape[d];
      for (int k = 0; k < N; ++k) offsets[k] += index[d] * strides[k][d];
    }
    const std::int64_t inner = shape[rank - 1];
    std::int64_t pos = begin;
    while (pos < end) {
      const std::int64_t count = std::min(inner - index[rank - 1], end - pos);
      fn(offsets, count);
      pos += count;
      if (pos >= end) break;
      // Advance: the run ended at the innermost axis's end; carry into outer axes.
      for (int k = 0; k < N; ++k) offsets[k] -= index[rank - 1] * strides[k][rank - 1];
      index[rank - 1] = 0;
      for (std::int64_t d = rank - 2; d >= 0; --d) {
        ++index[d];
        for (int k = 0; k < N; ++k) offsets[k] += strides[k][d];
        if (index[d] < shape[d]) break;
        for (int k = 0; k < N; ++k) offsets[k] -= index[d] * strides[k][d];
        index[d] = 0;
      }
    }
  }
};

// Builds a coalesced Loop over `shape` with per-operand strides aligned to it.
template <int N>
Loop<N> make_loop(const Dims& shape, const std::array<Dims, N>& strides) {
  Loop<N> loop;
  loop.numel = 1;
  for (auto d : shape) loop.numel *= d;
  // Drop size-1 axes (their stride never matters), then merge contiguous neighbours.
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    const bool can_merge = [&] {
      if (loop.shape.empty()) return false;
      for (int k = 0; k < N; ++k)
        if (loop.strides[k].back() != strides[k][d] * shape[d]) return false;
      return true;
    }();
    if (can_merge) {
      loop.shape.back() *= shape[d];
      for (int k = 0; k < N; ++k) loop.strides[k].back() = strides[k][d];
    } else {
      loop.shape.push_back(shape[d]);
      for (int k = 0; k < N; ++k) loop.strides[k].push_back(strides[k][d]);
    }
  }
  if (loop.shape.empty()) {  // a scalar (or all-ones shape)
    loop.shape.push_back(1);
    for (int k = 0; k < N; ++k) loop.strides[k].push_back(1);
  }
  return loop;
}

// Copies the runs of `loop` (operand 0: dst, operand 1: src) that lie in [begin, end), with the
// operands' element offsets starting at dst_base / src_base; conversion rules as copy_broadcast.
void copy_runs(const Loop<2>& loop, const Operand& dst, std::int64_t dst_base, const Operand& src,
               std::int64_t src_base, std::int64_t begin, std::int64_t end);

// Copies `src` into `dst` element by element, broadcasting src to dst's shape; same-dtype copies
// move raw bits (exact, NaN payloads included), others convert (RNE to 16-bit floats, saturating
// float -> int, nonzero -> true). Parallel over the pool for large tensors.
void copy_broadcast(const Tensor& src, Tensor& dst, const char* src_name);

}  // namespace splice::cpu::detail
