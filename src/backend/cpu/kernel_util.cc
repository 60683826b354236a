// Shape helpers, argument checks and the broadcasting copy shared by the CPU kernels (see
// kernel_util.h).
//
// copy_broadcast:
//   1. Align src's strides to dst's shape (stride 0 on stretched axes) and coalesce both.
//   2. Same dtype: move raw bits per run (memmove for unit-stride runs), so copies are exact.
//   3. Different dtypes: stage tiles through a compute type: uint8 truthiness into bool, float when
//      either side is a float dtype (float -> int saturates straight into the target range), int64
//      between integers (i64 -> i32 wraps modulo 2^32, as in C++ and torch).
#include "backend/cpu/kernel_util.h"

#include <utility>

#include "backend/cpu/parallel.h"

namespace splice::cpu::detail {

std::int64_t wrap_axis(std::int64_t axis, std::int64_t rank, const char* what) {
  const std::int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank)
    fail<ShapeError>("`", what, "` ", axis, " is out of range for rank ", rank);
  return a;
}

Dims broadcast_shapes(const std::vector<const Dims*>& shapes,
                      const std::vector<const char*>& names) {
  std::size_t rank = 0;
  for (const Dims* s : shapes) rank = std::max(rank, s->size());
  Dims out(rank, 1);
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const Dims& s = *shapes[i];
    for (std::size_t d = 0; d < s.size(); ++d) {
      const std::size_t o = rank - s.size() + d;
      if (s[d] == out[o] || s[d] == 1) continue;
      if (out[o] == 1) {
        out[o] = s[d];
        continue;
      }
      std::string all;
      for (std::size_t j = 0; j < shapes.size(); ++j)
        all += std::string(j ? ", " : "") + "`" + names[j] + "` " + dims_str(*shapes[j]);
      fail<ShapeError>("cannot broadcast ", all, ": `", names[i], "` has ", s[d], " at axis ", d,
                       " where another operand has ", out[o]);
    }
  }
  return out;
}

Dims broadcast_strides(const Dims& from_shape, const Dims& from_strides, const Dims& shape,
                       const char* name) {
  if (from_shape.size() > shape.size())
    fail<ShapeError>("`", name, "` ", dims_str(from_shape), " has more axes than the result ",
                     dims_str(shape));
  Dims strides(shape.size(), 0);
  const std::size_t lead = shape.size() - from_shape.size();
  for (std::size_t d = 0; d < from_shape.size(); ++d) {
    if (from_shape[d] == shape[lead + d]) {
      strides[lead + d] = from_strides[d];
    } else if (from_shape[d] != 1) {
      fail<ShapeError>("`", name, "` ", dims_str(from_shape), " does not broadcast to ",
                       dims_str(shape));
    }
  }
  return strides;
}

Dims broadcast_strides(const Tensor& t, const Dims& shape, const char* name) {
  return broadcast_strides(t.shape(), t.strides(), shape, name);
}

void fail_out_shape(const Tensor& out, const Dims& expected, const std::string& why) {
  fail<ShapeError>("`out` must have shape ", dims_str(expected), " (", why, "), got ",
                   dims_str(out.shape()));
}

void check_cpu(const Tensor& t, const char* name) {
  check_defined(t, name);
  if (!t.device().is_cpu())
    fail<DeviceError>("`", name, "` must be a cpu tensor, got ", t.describe());
}

namespace {

template <typename Word>
void copy_bits_run(const Operand& dst, const Operand& src, std::int64_t dst_off,
                   std::int64_t dst_stride, std::int64_t src_off, std::int64_t src_stride,
                   std::int64_t n) {
  Word* d = dst.as<Word>() + dst_off;
  const Word* s = src.as<const Word>() + src_off;
  if (dst_stride == 1 && src_stride == 1) {
    std::memmove(d, s, static_cast<std::size_t>(n) * sizeof(Word));
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) d[i * dst_stride] = s[i * src_stride];
}

template <typename C>
void convert_run(const Operand& dst, const Operand& src, std::int64_t dst_off,
                 std::int64_t dst_stride, std::int64_t src_off, std::int64_t src_stride,
                 std::int64_t n) {
  C scratch[kTile];
  for (std::int64_t t = 0; t < n; t += kTile) {
    const std::int64_t m = std::min(kTile, n - t);
    load_tile<C>(src, src_off + t * src_stride, src_stride, m, scratch);
    store_tile<C>(dst, dst_off + t * dst_stride, dst_stride, m, scratch);
  }
}

}  // namespace

void copy_runs(const Loop<2>& loop, const Operand& dst, std::int64_t dst_base, const Operand& src,
               std::int64_t src_base, std::int64_t begin, std::int64_t end) {
  const std::int64_t ds = loop.inner_stride(0), ss = loop.inner_stride(1);
  const bool same = dst.dtype == src.dtype;
  const std::size_t width = dtype_size(dst.dtype);
  loop.for_each_run(begin, end, [&](const std::array<std::int64_t, 2>& off, std::int64_t n) {
    const std::int64_t d0 = dst_base + off[0], s0 = src_base + off[1];
    if (same) {
      switch (width) {
        case 1:
          return copy_bits_run<std::uint8_t>(dst, src, d0, ds, s0, ss, n);
        case 2:
          return copy_bits_run<std::uint16_t>(dst, src, d0, ds, s0, ss, n);
        case 4:
          return copy_bits_run<std::uint32_t>(dst, src, d0, ds, s0, ss, n);
        default:
          return copy_bits_run<std::uint64_t>(dst, src, d0, ds, s0, ss, n);
      }
    }
    if (dst.dtype == DType::boolean) return convert_run<std::uint8_t>(dst, src, d0, ds, s0, ss, n);
    if (is_floating(dst.dtype) || is_floating(src.dtype))
      return convert_run<float>(dst, src, d0, ds, s0, ss, n);
    return convert_run<std::int64_t>(dst, src, d0, ds, s0, ss, n);
  });
}

void copy_broadcast(const Tensor& src, Tensor& dst, const char* src_name) {
  check_cpu(src, src_name);
  check_cpu(dst, "out");
  const Loop<2> loop =
      make_loop<2>(dst.shape(), {dst.strides(), broadcast_strides(src, dst.shape(), src_name)});
  if (loop.numel == 0) return;
  const Operand d(dst), s(src);
  parallel_for(0, loop.numel, kParallelGrain,
               [&](std::int64_t lo, std::int64_t hi) { copy_runs(loop, d, 0, s, 0, lo, hi); });
}

}  // namespace splice::cpu::detail
