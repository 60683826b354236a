// CPU batched matmul: out[..., m, n] = sum_k a[..., m, k] * b[..., k, n], fp32 accumulation.
//
// `transpose_b` reads b as [..., n, k]. Batch axes (all but the last two) broadcast NumPy-style.
// Every batch is one 2-D problem on strided views A [m, k], B [k, n] (the logical, possibly
// transposed b) and C [m, n]; the layout (and so the path) is the same for every batch:
//   1. k == 0: C = 0.
//   2. BLAS: A, B and C all f32, each row- or column-major with a usable leading dimension
//      (C row-major) -> one cblas_sgemm per batch (cblas_sgemv when m == 1). OpenBLAS threads
//      itself, so batches run one after another here.
//   3. Direct loop, for small m (m <= kDirectMaxRows: decode) with any dtypes or strides: the m
//      rows of A are staged in fp32 once, and B is streamed exactly once, in column chunks split
//      over the pool (or in batches, when there are several small problems):
//        B unit-stride along k (transposed weights [n, k]):  C[i, j] = dot(A[i, :], B[:, j]),
//          kLanes interleaved partial sums per (i, j);
//        otherwise (weights [k, n]):  C[i, j0:j1] += A[i, kk] * B[kk, j0:j1] for kk = 0..k-1,
//          fp32 accumulator tiles of kAxpyAccFloats / m columns per row.
//      B is read in its storage type inside the inner loop (bf16 -> f32 is a 16-bit shift), so
//      a 16-bit weight is never expanded to an fp32 copy.
//   4. Otherwise (larger m with 16-bit operands, or layouts BLAS cannot read): each operand BLAS
//      cannot read as it is (not f32, or strides it cannot express; C also when column-major) is
//      converted into a contiguous f32 matrix, sgemm runs, and a staged C is converted back.
// No path rounds anything before the final store into C's dtype.
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <vector>

#include "backend/cpu/kernel_util.h"
#include "backend/cpu/parallel.h"
#include "splice/backend/cpu/primitives.h"

namespace splice::cpu {
namespace {

using detail::kTile;
using detail::Operand;

constexpr std::int64_t kDirectMaxRows = 8;  // the direct loop streams B once for up to 8 rows
constexpr int kLanes = 8;  // partial sums per dot product (two SSE / one AVX register of floats)
constexpr std::int64_t kMinChunkCols = 16;  // smallest column chunk worth a thread
// fp32 accumulators of the [k, n]-weight direct loop: 16 KiB, half of L1, so B streams past them.
constexpr std::int64_t kAxpyAccFloats = 4096;

// One 2-D operand of one batch: element (r, c) is at base[offset + r*rs + c*cs].
struct Matrix {
  const Tensor* tensor;  // the full tensor (for storage, dtype)
  std::int64_t offset;   // element offset of (0, 0) from tensor->raw_data()
  std::int64_t rows, cols, rs, cs;
};

// How BLAS can read a matrix: row-major (NoTrans) or column-major (Trans), with its leading
// dimension; `ok` false when neither layout fits (e.g. stride 0 or overlapping rows).
struct BlasLayout {
  bool ok = false;
  bool trans = false;
  std::int64_t ld = 0;
};

BlasLayout blas_layout(std::int64_t rows, std::int64_t cols, std::int64_t rs, std::int64_t cs) {
  BlasLayout layout;
  if ((cs == 1 || cols == 1) && (rows == 1 || rs >= std::max<std::int64_t>(cols, 1))) {
    layout.ok = true;
    layout.ld = rows == 1 ? std::max<std::int64_t>(cols, 1) : rs;
  } else if ((rs == 1 || rows == 1) && (cols == 1 || cs >= std::max<std::int64_t>(rows, 1))) {
    layout.ok = true;
    layout.trans = true;
    layout.ld = cols == 1 ? std::max<std::int64_t>(rows, 1) : cs;
  }
  if (layout.ld > INT_MAX) layout.ok = false;
  return layout;
}

// The path for every batch of one call (the layout is the same for each batch).
enum class Path { zeros, blas, direct, packed };

struct Problem {
  std::int64_t m, k, n;
  // Strides (elements) of A [m, k], B [k, n] (logical) and C [m, n].
  std::int64_t a_rs, a_cs, b_rs, b_cs, c_rs, c_cs;
};

Path choose_path(const Problem& p, const Tensor& a, const Tensor& b, const Tensor& out) {
  if (p.k == 0) return Path::zeros;
  if (p.m > INT_MAX || p.n > INT_MAX || p.k > INT_MAX)
    fail<UnsupportedError>("matmul dims must fit in int for BLAS, got m=", p.m, " k=", p.k,
                           " n=", p.n);
  const bool all_f32 =
      a.dtype() == DType::f32 && b.dtype() == DType::f32 && out.dtype() == DType::f32;
  if (all_f32) {
    const BlasLayout la = blas_layout(p.m, p.k, p.a_rs, p.a_cs);
    const BlasLayout lb = blas_layout(p.k, p.n, p.b_rs, p.b_cs);
    const BlasLayout lc = blas_layout(p.m, p.n, p.c_rs, p.c_cs);
    if (la.ok && lb.ok && lc.ok && !lc.trans) return Path::blas;
  }
  return p.m <= kDirectMaxRows ? Path::direct : Path::packed;
}

void store_zeros(const Matrix& c) {
  const Operand o(*c.tensor);
  std::vector<float> zeros(static_cast<std::size_t>(c.cols), 0.0f);
  for (std::int64_t i = 0; i < c.rows; ++i)
    detail::store_tile<float>(o, c.offset + i * c.rs, c.cs, c.cols, zeros.data());
}

// C = A @ B through cblas (all f32, layouts checked by choose_path).
void blas_gemm(const Matrix& a, const Matrix& b, const Matrix& c) {
  const BlasLayout la = blas_layout(a.rows, a.cols, a.rs, a.cs);
  const BlasLayout lb = blas_layout(b.rows, b.cols, b.rs, b.cs);
  const BlasLayout lc = blas_layout(c.rows, c.cols, c.rs, c.cs);
  const float* pa = a.tensor->data<float>() + a.offset;
  const float* pb = b.tensor->data<float>() + b.offset;
  float* pc = c.tensor->data<float>() + c.offset;
  const int m = static_cast<int>(a.rows), k = static_cast<int>(a.cols),
            n = static_cast<int>(b.cols);
  if (m == 1) {
    // c[j] = sum_kk a[kk] * B[kk, j]: gemv on B^T (B row-major) or on B's [n, k] storage.
    const int inc_a = static_cast<int>(k == 1 ? 1 : a.cs);
    const int inc_c = static_cast<int>(n == 1 ? 1 : c.cs);
    if (inc_a > 0 && inc_c > 0) {
      if (!lb.trans)
        cblas_sgemv(CblasRowMajor, CblasTrans, k, n, 1.0f, pb, static_cast<int>(lb.ld), pa, inc_a,
                    0.0f, pc, inc_c);
      else
        cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.0f, pb, static_cast<int>(lb.ld), pa, inc_a,
                    0.0f, pc, inc_c);
      return;
    }
  }
  cblas_sgemm(CblasRowMajor, la.trans ? CblasTrans : CblasNoTrans,
              lb.trans ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, pa, static_cast<int>(la.ld), pb,
              static_cast<int>(lb.ld), 0.0f, pc, static_cast<int>(lc.ld));
}

// A view tensor over one batch's matrix (for packing through copy_broadcast).
Tensor matrix_view(const Matrix& x) {
  return Tensor::view_of(x.tensor->storage(), x.tensor->offset() + x.offset, {x.rows, x.cols},
                         {x.rs, x.cs}, x.tensor->dtype());
}

// True when BLAS reads `x` in place: f32 in a row- or column-major layout (row-major only for
// an output).
bool blas_readable(const Matrix& x, bool output) {
  if (x.tensor->dtype() != DType::f32) return false;
  const BlasLayout layout = blas_layout(x.rows, x.cols, x.rs, x.cs);
  return layout.ok && !(output && layout.trans);
}

// `x` itself when BLAS can read it, else a contiguous f32 copy held by `holder`.
Matrix blas_operand(const Matrix& x, Tensor& holder, bool copy_in) {
  if (blas_readable(x, /*output=*/!copy_in)) return x;
  holder = Tensor::empty({x.rows, x.cols}, DType::f32);  // [rows, cols]
  if (copy_in) detail::copy_broadcast(matrix_view(x), holder, "matmul operand");
  return {&holder, 0, x.rows, x.cols, x.cols, 1};
}

// Path 4: stage what BLAS cannot read into contiguous f32, sgemm, convert a staged C back.
void packed_gemm(const Matrix& a, const Matrix& b, const Matrix& c) {
  Tensor a32, b32, c32;
  const Matrix pc = blas_operand(c, c32, /*copy_in=*/false);
  blas_gemm(blas_operand(a, a32, true), blas_operand(b, b32, true), pc);
  if (pc.tensor == &c32) {
    Tensor c_view = matrix_view(c);
    detail::copy_broadcast(c32, c_view, "matmul result");
  }
}

// B's element (as fp32) for the typed direct loops: a shift for bf16, identity for f32.
template <typename TB>
inline float b_value(TB v) {
  return detail::load_value<float>(v);
}

// Sum of kLanes partials, pairwise: ((p0+p4)+(p2+p6)) + ((p1+p5)+(p3+p7)).
inline float lane_total(const float* partial) {
  float v[kLanes];
  std::copy(partial, partial + kLanes, v);
  for (int width = kLanes / 2; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) v[l] += v[l + width];
  return v[0];
}

// dot(a[0:k], b[0:k]) in kLanes interleaved fp32 partial sums; b read in its storage type.
template <typename TB>
float dot(const float* a, const TB* b, std::int64_t k) {
  float partial[kLanes] = {};
  std::int64_t q = 0;
  for (; q + kLanes <= k; q += kLanes)
    for (int l = 0; l < kLanes; ++l) partial[l] += a[q + l] * b_value(b[q + l]);
  for (; q < k; ++q) partial[q % kLanes] += a[q] * b_value(b[q]);
  return lane_total(partial);
}

// Path 3 over columns [j0, j1) of C; `a_rows` holds A in fp32, [m, k] row-major; `b` points at
// B(0, 0) in its storage type TB.
template <typename TB>
void direct_columns(const float* a_rows, const TB* b, const Matrix& bm, const Matrix& c,
                    std::int64_t j0, std::int64_t j1) {
  const std::int64_t m = c.rows, k = bm.rows;
  const Operand oc(*c.tensor);
  if (bm.rs == 1 && k > 1) {
    float out_tile[kDirectMaxRows][kTile];  // C rows of the current column tile, fp32
    // C[i, j] = dot(A[i, :], B[:, j]): B's columns are contiguous in k (weights stored [n, k]).
    for (std::int64_t jt = j0; jt < j1; jt += kTile) {
      const std::int64_t w = std::min(kTile, j1 - jt);
      for (std::int64_t j = 0; j < w; ++j)
        for (std::int64_t i = 0; i < m; ++i)
          out_tile[i][j] = dot(a_rows + i * k, b + (jt + j) * bm.cs, k);
      for (std::int64_t i = 0; i < m; ++i)
        detail::store_tile<float>(oc, c.offset + i * c.rs + jt * c.cs, c.cs, w, out_tile[i]);
    }
    return;
  }
  // C[i, jt:jt+w] += A[i, kk] * B[kk, jt:jt+w] for kk = 0..k-1 (weights stored [k, n]). The
  // tile is as wide as the accumulators allow (kAxpyAccFloats in all), so each B row is read in
  // long contiguous pieces; rows with a non-unit column stride are staged into fp32 first.
  const std::int64_t tile = std::clamp<std::int64_t>(kAxpyAccFloats / m, 1, kAxpyAccFloats);
  std::vector<float> acc_storage(static_cast<std::size_t>(m * tile));  // [m, tile]
  std::vector<float> staged(static_cast<std::size_t>(bm.cs == 1 ? 0 : tile));
  for (std::int64_t jt = j0; jt < j1; jt += tile) {
    const std::int64_t w = std::min(tile, j1 - jt);
    std::fill(acc_storage.begin(), acc_storage.end(), 0.0f);
    for (std::int64_t kk = 0; kk < k; ++kk) {
      const TB* brow = b + kk * bm.rs + jt * bm.cs;
      if (bm.cs == 1 || w == 1) {
        for (std::int64_t i = 0; i < m; ++i) {
          const float aik = a_rows[i * k + kk];
          float* acc = acc_storage.data() + i * tile;
          for (std::int64_t j = 0; j < w; ++j) acc[j] += aik * b_value(brow[j]);
        }
      } else {
        for (std::int64_t j = 0; j < w; ++j) staged[j] = b_value(brow[j * bm.cs]);
        for (std::int64_t i = 0; i < m; ++i) {
          const float aik = a_rows[i * k + kk];
          float* acc = acc_storage.data() + i * tile;
          for (std::int64_t j = 0; j < w; ++j) acc[j] += aik * staged[j];
        }
      }
    }
    for (std::int64_t i = 0; i < m; ++i)
      detail::store_tile<float>(oc, c.offset + i * c.rs + jt * c.cs, c.cs, w,
                                acc_storage.data() + i * tile);
  }
}

// Path 3 for one batch; `split_columns` lets it use the pool across C's columns.
void direct_gemm(const Matrix& a, const Matrix& b, const Matrix& c, bool split_columns) {
  const std::int64_t m = a.rows, k = a.cols, n = b.cols;
  std::vector<float> a_rows(static_cast<std::size_t>(m * k));  // [m, k] A in fp32
  const Operand oa(*a.tensor);
  for (std::int64_t i = 0; i < m; ++i)
    detail::load_tile<float>(oa, a.offset + i * a.rs, a.cs, k, a_rows.data() + i * k);
  const std::int64_t grain =
      split_columns ? std::max(kMinChunkCols, kParallelGrain / std::max<std::int64_t>(m * k, 1))
                    : n;
  detail::dispatch_dtype(b.tensor->dtype(), [&](auto tag) {
    using TB = decltype(tag);
    if constexpr (std::is_same_v<TB, float> || detail::kIsHalfType<TB>) {
      const TB* pb = b.tensor->data<TB>() + b.offset;
      parallel_for(0, n, grain, [&](std::int64_t j0, std::int64_t j1) {
        direct_columns<TB>(a_rows.data(), pb, b, c, j0, j1);
      });
    } else {
      SPLICE_INTERNAL_CHECK(false, "matmul `b` dtype ", dtype_name(b.tensor->dtype()));
    }
  });
}

}  // namespace

void matmul(const Tensor& a, const Tensor& b, Tensor& out, bool transpose_b) {
  detail::check_cpu(a, "a");
  detail::check_cpu(b, "b");
  detail::check_cpu(out, "out");
  check_dtype(a, "a", {DType::f32, DType::f16, DType::bf16});
  check_dtype(b, "b", {DType::f32, DType::f16, DType::bf16});
  check_dtype(out, "out", {DType::f32, DType::f16, DType::bf16});
  if (a.dim() < 2) fail<ShapeError>("matmul `a` must have rank >= 2, got ", dims_str(a.shape()));
  if (b.dim() < 2) fail<ShapeError>("matmul `b` must have rank >= 2, got ", dims_str(b.shape()));
  const std::int64_t ra = a.dim(), rb = b.dim();
  const std::int64_t m = a.shape()[ra - 2], k = a.shape()[ra - 1];
  // Logical B [k, n] and its strides.
  const std::int64_t bk_axis = transpose_b ? rb - 1 : rb - 2;
  const std::int64_t bn_axis = transpose_b ? rb - 2 : rb - 1;
  const std::int64_t kb = b.shape()[bk_axis], n = b.shape()[bn_axis];
  if (kb != k)
    fail<ShapeError>("matmul inner dims differ: `a` ", dims_str(a.shape()), " has k=", k,
                     " but `b` ", dims_str(b.shape()),
                     (transpose_b ? " (read as [..., n, k])" : ""), " has k=", kb);
  const Dims a_batch(a.shape().begin(), a.shape().end() - 2);
  const Dims b_batch(b.shape().begin(), b.shape().end() - 2);
  Dims batch = detail::broadcast_shapes({&a_batch, &b_batch}, {"a", "b"});
  Dims expected = batch;
  expected.push_back(m);
  expected.push_back(n);
  detail::check_out_shape_lazy(out, expected, [&] {
    return "`a` " + dims_str(a.shape()) + " @ `b` " + dims_str(b.shape()) +
           (transpose_b ? " transposed" : "");
  });
  check_no_overlap(out, "out", a, "a", false);
  check_no_overlap(out, "out", b, "b", false);
  const std::int64_t rc = out.dim();
  const Problem p{m,
                  k,
                  n,
                  a.strides()[ra - 2],
                  a.strides()[ra - 1],
                  b.strides()[bk_axis],
                  b.strides()[bn_axis],
                  out.strides()[rc - 2],
                  out.strides()[rc - 1]};
  if (m == 0 || n == 0) return;

  // Offsets of every batch's (0, 0) in a, b, out: [num_batches][3].
  const Dims a_bs = detail::broadcast_strides(
      a_batch, Dims(a.strides().begin(), a.strides().end() - 2), batch, "a");
  const Dims b_bs = detail::broadcast_strides(
      b_batch, Dims(b.strides().begin(), b.strides().end() - 2), batch, "b");
  const Dims c_bs(out.strides().begin(), out.strides().end() - 2);
  const detail::Loop<3> loop = detail::make_loop<3>(batch, {a_bs, b_bs, c_bs});
  std::vector<std::array<std::int64_t, 3>> offsets;
  offsets.reserve(static_cast<std::size_t>(loop.numel));
  loop.for_each_run(0, loop.numel, [&](const std::array<std::int64_t, 3>& off, std::int64_t cnt) {
    for (std::int64_t i = 0; i < cnt; ++i)
      offsets.push_back({off[0] + i * loop.inner_stride(0), off[1] + i * loop.inner_stride(1),
                         off[2] + i * loop.inner_stride(2)});
  });

  auto batch_matrices = [&](std::size_t i) {
    return std::array<Matrix, 3>{Matrix{&a, offsets[i][0], m, k, p.a_rs, p.a_cs},
                                 Matrix{&b, offsets[i][1], k, n, p.b_rs, p.b_cs},
                                 Matrix{&out, offsets[i][2], m, n, p.c_rs, p.c_cs}};
  };
  const std::int64_t num_batches = static_cast<std::int64_t>(offsets.size());
  switch (choose_path(p, a, b, out)) {
    case Path::zeros:
      for (std::int64_t i = 0; i < num_batches; ++i) store_zeros(batch_matrices(i)[2]);
      return;
    case Path::blas:
      for (std::int64_t i = 0; i < num_batches; ++i) {
        const auto mats = batch_matrices(i);
        blas_gemm(mats[0], mats[1], mats[2]);
      }
      return;
    case Path::packed:
      for (std::int64_t i = 0; i < num_batches; ++i) {
        const auto mats = batch_matrices(i);
        packed_gemm(mats[0], mats[1], mats[2]);
      }
      return;
    case Path::direct: {
      if (num_batches == 1) {
        const auto mats = batch_matrices(0);
        direct_gemm(mats[0], mats[1], mats[2], /*split_columns=*/true);
        return;
      }
      const std::int64_t work = std::max<std::int64_t>(m * k * n, 1);
      const std::int64_t grain = std::max<std::int64_t>(1, kParallelGrain / work);
      parallel_for(0, num_batches, grain, [&](std::int64_t lo, std::int64_t hi) {
        for (std::int64_t i = lo; i < hi; ++i) {
          const auto mats = batch_matrices(i);
          direct_gemm(mats[0], mats[1], mats[2], /*split_columns=*/false);
        }
      });
      return;
    }
  }
}

}  // namespace splice::cpu
