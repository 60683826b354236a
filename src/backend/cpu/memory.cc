// CPU data-movement primitives: concat, gather (embedding lookup), write_at (KV append).
//
// All three are copies: same-dtype elements move as raw bits (exact), different dtypes convert as
// in `cast` (RNE into 16-bit floats). Every argument, and for gather every index, is validated
// before the first byte is written, so a failed call leaves `out` / `state` untouched.
//   concat:   out.slice(axis, o_i, o_i + n_i) = inputs[i], o_i = n_0 + ... + n_{i-1}.
//   gather:   1. read every index (i32/i64, any strides) into an int64 list and range-check it;
//             2. out[p, :] = table[idx[p], :] per index position p, split over the pool; a row
//                that is contiguous in both tensors with one dtype is a single memcpy.
//   write_at: state.slice(axis, offset, offset + n) = value, n = value.size(axis).
// Aliasing: out / state must not overlap any input (LayoutError); write_at's value may be the
// window itself (a no-op).
#include <cstring>

#include "backend/cpu/kernel_util.h"
#include "backend/cpu/parallel.h"
#include "splice/backend/cpu/primitives.h"

namespace splice::cpu {

using detail::Loop;
using detail::make_loop;
using detail::Operand;

void concat(const std::vector<Tensor>& inputs, std::int64_t axis, Tensor& out) {
  detail::check_cpu(out, "out");
  if (inputs.empty()) fail<ValueError>("concat `inputs` must not be empty");
  const std::int64_t a = detail::wrap_axis(axis, out.dim(), "axis");
  std::int64_t total = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    const std::string name = "inputs[" + std::to_string(i) + "]";
    detail::check_cpu(t, name.c_str());
    check_no_overlap(out, "out", t, name.c_str(), false);
    bool ok = t.dim() == out.dim();
    for (std::int64_t d = 0; ok && d < out.dim(); ++d)
      ok = d == a || t.shape()[d] == out.shape()[d];
    if (!ok)
      fail<ShapeError>("concat `", name, "` ", dims_str(t.shape()), " must match `out` ",
                       dims_str(out.shape()), " on every axis but ", a);
    total += t.shape()[a];
  }
  if (total != out.shape()[a])
    fail<ShapeError>("concat inputs sum to ", total, " on axis ", a, " but `out` ",
                     dims_str(out.shape()), " has ", out.shape()[a]);
  std::int64_t start = 0;
  for (const Tensor& t : inputs) {
    const std::int64_t n = t.shape()[a];
    Tensor window = out.slice(a, start, start + n);
    detail::copy_broadcast(t, window, "inputs[i]");
    start += n;
  }
}

void gather(const Tensor& table, const Tensor& indices, Tensor& out) {
  detail::check_cpu(table, "table");
  detail::check_cpu(indices, "indices");
  detail::check_cpu(out, "out");
  check_dtype(indices, "indices", {DType::i32, DType::i64});
  check_no_overlap(out, "out", table, "table", false);
  check_no_overlap(out, "out", indices, "indices", false);
  if (table.dim() < 1) fail<ShapeError>("gather `table` must have rank >= 1, got []");
  const std::int64_t rows = table.shape()[0];
  const Dims rest(table.shape().begin() + 1, table.shape().end());
  Dims expected = indices.shape();
  expected.insert(expected.end(), rest.begin(), rest.end());
  detail::check_out_shape_lazy(out, expected, [&] {
    return "`indices` " + dims_str(indices.shape()) + " followed by `table` " +
           dims_str(table.shape()) + " without its first axis";
  });

  // 1. Indices -> int64 list in row-major order, with out's offset of each position.
  const std::int64_t positions = indices.numel();
  if (positions == 0) return;
  const std::int64_t lead = indices.dim();
  const Dims out_lead_strides(out.strides().begin(), out.strides().begin() + lead);
  const Loop<2> index_loop = make_loop<2>(indices.shape(), {indices.strides(), out_lead_strides});
  std::vector<std::int64_t> row_of(static_cast<std::size_t>(positions));
  std::vector<std::int64_t> out_offset(static_cast<std::size_t>(positions));
  {
    const Operand ix(indices);
    std::int64_t p = 0;
    index_loop.for_each_run(0, positions,
                            [&](const std::array<std::int64_t, 2>& off, std::int64_t n) {
                              detail::load_tile<std::int64_t>(
                                  ix, off[0], index_loop.inner_stride(0), n, row_of.data() + p);
                              for (std::int64_t i = 0; i < n; ++i)
                                out_offset[p + i] = off[1] + i * index_loop.inner_stride(1);
                              p += n;
                            });
  }
  for (std::int64_t p = 0; p < positions; ++p) {
    if (row_of[p] >= 0 && row_of[p] < rows) continue;
    Dims where(lead);
    for (std::int64_t d = lead - 1, rest_p = p; d >= 0; --d) {
      where[d] = rest_p % indices.shape()[d];
      rest_p /= indices.shape()[d];
    }
    fail<ValueError>("gather `indices`", dims_str(where), " is ", row_of[p], ", outside [0, ", rows,
                     ") (the rows of `table` ", dims_str(table.shape()), ")");
  }

  // 2. Row copies out[p, :] = table[row_of[p], :].
  const Dims table_rest_strides(table.strides().begin() + 1, table.strides().end());
  const Dims out_rest_strides(out.strides().begin() + lead, out.strides().end());
  const Loop<2> row_loop = make_loop<2>(rest, {out_rest_strides, table_rest_strides});
  const std::int64_t row_elems = row_loop.numel;
  if (row_elems == 0) return;
  const Operand o(out), t(table);
  const std::int64_t table_row_stride = table.strides()[0];
  const bool memcpy_rows =
      table.dtype() == out.dtype() && row_loop.shape.size() == 1 &&
      (row_elems == 1 || (row_loop.inner_stride(0) == 1 && row_loop.inner_stride(1) == 1));
  const std::size_t width = dtype_size(out.dtype());
  const std::int64_t grain = std::max<std::int64_t>(1, kParallelGrain / row_elems);
  parallel_for(0, positions, grain, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t p = lo; p < hi; ++p) {
      const std::int64_t src = row_of[p] * table_row_stride;
      if (memcpy_rows) {
        std::memcpy(o.base + out_offset[p] * static_cast<std::int64_t>(width),
                    t.base + src * static_cast<std::int64_t>(width),
                    static_cast<std::size_t>(row_elems) * width);
      } else {
        detail::copy_runs(row_loop, o, out_offset[p], t, src, 0, row_elems);
      }
    }
  });
}

void write_at(Tensor& state, const Tensor& value, std::int64_t axis, std::int64_t offset) {
  detail::check_cpu(state, "state");
  detail::check_cpu(value, "value");
  if (value.dim() != state.dim())
    fail<ShapeError>("write_at `value` ", dims_str(value.shape()),
                     " must have the rank of `state` ", dims_str(state.shape()));
  const std::int64_t a = detail::wrap_axis(axis, state.dim(), "axis");
  for (std::int64_t d = 0; d < state.dim(); ++d)
    if (d != a && value.shape()[d] != state.shape()[d])
      fail<ShapeError>("write_at `value` ", dims_str(value.shape()), " must match `state` ",
                       dims_str(state.shape()), " on every axis but ", a);
  const std::int64_t n = value.shape()[a], capacity = state.shape()[a];
  if (offset < 0 || offset > capacity - n)
    fail<ValueError>("write_at window [", offset, ", ", offset + n, ") on axis ", a,
                     " does not fit in `state` ", dims_str(state.shape()), " (capacity ", capacity,
                     ")");
  Tensor window = state.slice(a, offset, offset + n);
  check_no_overlap(window, "state window", value, "value", true);
  detail::copy_broadcast(value, window, "value");
}

}  // namespace splice::cpu
