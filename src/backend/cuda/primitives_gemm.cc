// CUDA matmul: the decode GEMV kernel (gemv.h) for skinny products with a row-major weight,
// cuBLASLt for everything else (primitives.h).
//
// cuBLASLt is column-major, splice tensors are strided row-major views, so the product is taken
// transposed:  out^T [n, m] = b^T [n, k] . a^T [k, m],  fp32 compute (CUBLAS_COMPUTE_32F: true
// fp32, no TF32), alpha = 1, beta = 0 (1 with a residual epilogue, stage 1c).
//   1. Validate (ranks >= 2, inner dims agree, batch dims broadcast, out shape, float dtypes,
//      no overlap between out and an input); m or n == 0 is a no-op, k == 0 fills zeros.
//   1b. GEMV route: when a and b share a dtype, b is one matrix (its batch dims are all 1) read as
//      w [n, k] with unit stride along k, a has a unit inner stride, all of a's rows (batch dims
//      and m flattened) number at most gemv::kMaxRows and gemv::preferred(rows, n, k) holds (the
//      measured routing rule, documented in gemv.cu: one row always; 2 .. 4 rows for n k <=
//      2^21, 5 .. 8 rows for n k <= 2^20), the product is one launch of the weight-streaming
//      GEMV kernel: x rows are passed as pointers (any batch strides), y rows likewise with any
//      column stride, out in any float dtype. Everything else goes to cuBLASLt. The GEMV joins the
//      PDL chain (launch.cuh); with MatmulOptions::b_constant (b is a weight no kernel in flight
//      writes) it issues its first weight batch before waiting on its producers.
//   2. Dtypes: a and b of one dtype are read as they are; mixed dtypes are first cast to
//      contiguous f32 scratch. The result type cuBLASLt writes is out's dtype when allowed
//      (f32 inputs -> f32; bf16 -> bf16/f32; f16 -> f16/f32), else an f32 scratch cast into out.
//   3. Layouts: each matrix needs a unit stride along one of its two dims (either transpose
//      flag) and a leading dimension >= its row count; out needs a unit last stride. Anything
//      else is first copied into contiguous scratch.
//   4. Batch dims of a, b and out (broadcast ones with stride 0) are merged where they are
//      uniformly strided in all three; the innermost merged dim becomes one strided-batched call
//      and the outer ones, if any, loop on the host.
//   1c. Residual epilogue (MatmulOptions::residual): the GEMV adds c before its store; a product
//      that reaches cuBLASLt without staging, with c of out's dtype and strides, adds it in
//      cuBLASLt's epilogue (beta = 1, C = c, which may be out itself); every other route computes
//      the product into f32 scratch and adds c in one elementwise kernel (fp32 math, one rounding
//      into out every way).
//   5. One cuBLASLt handle and a 32 MiB workspace per device, created on first use (run a shape
//      once outside stream capture); the heuristic's algorithm is cached per problem key.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/gemv.h"
#include "backend/cuda/primitives_internal.h"
#include "splice/backend/cuda/primitives.h"
#include "splice/backend/cuda/runtime.h"
#include "splice/core/error.h"

#define SPLICE_CUBLAS_CHECK(call)                                                              \
  do {                                                                                         \
    const cublasStatus_t splice_status_ = (call);                                              \
    if (splice_status_ != CUBLAS_STATUS_SUCCESS)                                               \
      ::splice::fail<::splice::CudaError>(#call, " failed at ", __FILE__, ":", __LINE__, ": ", \
                                          cublasLtGetStatusString(splice_status_));            \
  } while (0)

namespace splice::cuda {
namespace {

constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;  // cuBLASLt's Hopper recommendation
constexpr std::uint64_t kMaxAlignment = 256;  // bytes cuBLASLt asks for by default

struct DeviceContext {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::map<std::vector<long long>, cublasLtMatmulAlgo_t> algos;
};

std::mutex& context_mutex() {
  static auto* m = new std::mutex();
  return *m;
}

DeviceContext& context(int device) {
  static auto* contexts = new std::map<int, DeviceContext>();  // lives for the process
  DeviceContext& c = (*contexts)[device];
  if (!c.handle) {
    if (is_capturing(current_stream()))
      fail<UnsupportedError>(
          "cuda matmul: the cuBLASLt handle is created on first use, which cannot happen during "
          "stream capture; run the step once before capturing");
    SPLICE_CUBLAS_CHECK(cublasLtCreate(&c.handle));
    SPLICE_CUDA_CHECK(cudaMalloc(&c.workspace, kWorkspaceBytes));
  }
  return c;
}

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::f16:
      return CUDA_R_16F;
    case DType::bf16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_32F;
  }
}

// A matrix of `rows` x `cols` (column-major terms) with element (r, c) at r * s_row + c * s_col.
struct MatrixLayout {
  bool ok = false;
  bool transposed = false;  // stored as cols x rows with unit stride along cols
  long long ld = 0;
};

MatrixLayout layout_of(long long rows, long long cols, long long s_row, long long s_col) {
  MatrixLayout l;
  const long long min_ld_n = std::max(rows, 1LL), min_ld_t = std::max(cols, 1LL);
  if (s_row == 1 || rows == 1) {
    const long long ld = cols == 1 ? min_ld_n : s_col;
    if (ld >= min_ld_n) return {true, false, ld};
  }
  if (s_col == 1 || cols == 1) {
    const long long ld = rows == 1 ? min_ld_t : s_row;
    if (ld >= min_ld_t) return {true, true, ld};
  }
  return l;
}

std::uint64_t alignment_of(const void* p, std::size_t elem) {
  auto address = reinterpret_cast<std::uintptr_t>(p);
  std::uint64_t a = kMaxAlignment;
  while (a > elem && address % a != 0) a /= 2;
  return a;
}

Tensor contiguous_copy(const Tensor& t, DType dtype) {
  Tensor c = detail::scratch(t.shape(), dtype, t.device());
  cast(t, c);
  return c;
}

struct LtDescriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtDescriptors() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

void set_layout(cublasLtMatrixLayout_t* layout, cudaDataType_t type, long long rows, long long cols,
                long long ld, int batch, long long batch_stride) {
  SPLICE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(layout, type, static_cast<std::uint64_t>(rows),
                                                 static_cast<std::uint64_t>(cols), ld));
  if (batch > 1) {
    SPLICE_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        *layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch));
    const std::int64_t stride = batch_stride;
    SPLICE_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        *layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
}

// One (strided-batched) product in column-major terms: D [mm, nn] = op(A) [mm, kk] . op(B) [kk,
// nn].
struct LtProblem {
  cudaDataType_t in_type = CUDA_R_32F, out_type = CUDA_R_32F;
  std::size_t in_size = 4, out_size = 4;
  long long mm = 0, nn = 0, kk = 0;
  MatrixLayout la, lb;
  long long ldd = 0;
  int batch = 1;
  long long stride_a = 0, stride_b = 0, stride_d = 0;  // elements
};

// Returns false when cuBLASLt offers no algorithm for this problem (nothing is launched).
// With `c` (D's type and layout; it may be d itself): D = op(A) . op(B) + C, beta = 1.
bool run_lt(const LtProblem& p, const void* a, const void* b, void* d, int device,
            const void* c = nullptr) {
  std::lock_guard<std::mutex> lock(context_mutex());
  DeviceContext& ctx = context(device);
  LtDescriptors desc;
  SPLICE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = p.la.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = p.lb.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  SPLICE_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  SPLICE_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  set_layout(&desc.a, p.in_type, p.la.transposed ? p.kk : p.mm, p.la.transposed ? p.mm : p.kk,
             p.la.ld, p.batch, p.stride_a);
  set_layout(&desc.b, p.in_type, p.lb.transposed ? p.nn : p.kk, p.lb.transposed ? p.kk : p.nn,
             p.lb.ld, p.batch, p.stride_b);
  set_layout(&desc.d, p.out_type, p.mm, p.nn, p.ldd, p.batch, p.stride_d);

  const std::uint64_t align_a = alignment_of(a, p.in_size), align_b = alignment_of(b, p.in_size),
                      align_d = alignment_of(d, p.out_size),
                      align_c = c ? std::min(alignment_of(c, p.out_size), align_d) : align_d;
  const std::vector<long long> key = {device,
                                      p.in_type,
                                      p.out_type,
                                      p.mm,
                                      p.nn,
                                      p.kk,
                                      p.la.transposed,
                                      p.la.ld,
                                      p.lb.transposed,
                                      p.lb.ld,
                                      p.ldd,
                                      p.batch,
                                      p.stride_a,
                                      p.stride_b,
                                      p.stride_d,
                                      static_cast<long long>(align_a),
                                      static_cast<long long>(align_b),
                                      static_cast<long long>(align_d),
                                      static_cast<long long>(align_c)};
  auto it = ctx.algos.find(key);
  if (it == ctx.algos.end()) {
    SPLICE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&desc.pref));
    const std::uint64_t workspace = kWorkspaceBytes;
    SPLICE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        desc.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace));
    // The alignment preferences are uint32_t attributes (cublasLt.h).
    const std::pair<cublasLtMatmulPreferenceAttributes_t, std::uint32_t> aligns[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<std::uint32_t>(align_a)},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<std::uint32_t>(align_b)},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<std::uint32_t>(align_c)},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<std::uint32_t>(align_d)}};
    for (const auto& [attr, value] : aligns)
      SPLICE_CUBLAS_CHECK(
          cublasLtMatmulPreferenceSetAttribute(desc.pref, attr, &value, sizeof value));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    SPLICE_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(ctx.handle, desc.op, desc.a, desc.b, desc.d,
                                                       desc.d, desc.pref, 1, &result, &found));
    if (found < 1) return false;
    it = ctx.algos.emplace(key, result.algo).first;
  }
  const float alpha = 1.0f, beta = c ? 1.0f : 0.0f;
  SPLICE_CUBLAS_CHECK(cublasLtMatmul(ctx.handle, desc.op, &alpha, a, desc.a, b, desc.b, &beta,
                                     c ? c : d, desc.d, d, desc.d, &it->second, ctx.workspace,
                                     kWorkspaceBytes, current_stream()));
  return true;
}

thread_local bool t_contiguous_retry = false;  // inside matmul's contiguous-copy retry
std::atomic<std::uint64_t> g_lt_residual_epilogues{0};

bool lt_output_allowed(DType in, DType out) {
  return out == DType::f32 || (in == out && (in == DType::bf16 || in == DType::f16));
}

void check_matmul_device(const Tensor& t, const char* name) {
  if (!t.defined()) fail<ValueError>("`", name, "` is required but was not given");
  if (!t.device().is_cuda())
    fail<DeviceError>("cuda matmul: `", name, "` must be on a CUDA device, got ", t.device().str());
}

// Stage 1b: one GEMV launch when the layout qualifies and gemv::preferred (the routing rule and
// its measurements, gemv.cu) picks the GEMV over cuBLASLt (see the file header); false otherwise.
// Called with a and b of one float dtype, m, n, k >= 1 and out validated against the shapes.
bool try_gemv(const Tensor& a, const Tensor& b, Tensor& out, bool transpose_b,
              const MatmulOptions& options) {
  const std::int64_t k = a.size(-1);
  const std::int64_t n = transpose_b ? b.size(-2) : b.size(-1);
  for (std::int64_t i = 0; i + 2 < b.dim(); ++i)
    if (b.shape()[static_cast<std::size_t>(i)] != 1) return false;
  const std::int64_t s_bk = transpose_b ? b.stride(-1) : b.stride(-2);
  const std::int64_t s_bn = transpose_b ? b.stride(-2) : b.stride(-1);
  if ((k > 1 && s_bk != 1) || (n > 1 && s_bn < 0)) return false;
  if (k > 1 && a.stride(-1) != 1) return false;
  // out [batch..., m, n] has a's batch dims (b's are all 1): rows = numel / n.
  const std::int64_t rows = out.numel() / n;
  if (rows > gemv::kMaxRows || !gemv::preferred(rows, n, k)) return false;

  gemv::Params p;
  p.w = b.raw_data();
  p.w_row_stride = n > 1 ? s_bn : 0;
  p.n = n;
  p.k = k;
  p.rows = static_cast<int>(rows);
  p.in_dtype = a.dtype();
  p.out_dtype = out.dtype();
  p.y_col_stride = out.stride(-1);
  p.w_constant = options.b_constant;
  const Tensor* c = options.residual;
  if (c != nullptr) {
    p.has_c = true;
    p.c_dtype = c->dtype();
    p.c_col_stride = c->stride(-1);
  }
  const std::size_t c_size = c != nullptr ? dtype_size(c->dtype()) : 0;
  const std::size_t in_size = dtype_size(a.dtype()), out_size = dtype_size(out.dtype());
  const auto* a_base = static_cast<const char*>(a.raw_data());
  auto* out_base = static_cast<char*>(out.raw_data());
  const std::int64_t lead = out.dim() - a.dim();  // out dims a lacks (b's extra unit dims)
  for (std::int64_t row = 0; row < rows; ++row) {
    // Row `row` of out's [batch..., m] dims in row-major order, and the same row of a.
    std::int64_t rest = row, off_a = 0, off_out = 0, off_c = 0;
    for (std::int64_t d = out.dim() - 2; d >= 0; --d) {
      const std::int64_t idx = rest % out.size(d);
      rest /= out.size(d);
      off_out += idx * out.stride(d);
      if (c != nullptr) off_c += idx * c->stride(d);
      if (d >= lead) off_a += idx * a.stride(d - lead);
    }
    p.x[row] = a_base + off_a * static_cast<std::int64_t>(in_size);
    p.y[row] = out_base + off_out * static_cast<std::int64_t>(out_size);
    if (c != nullptr)
      p.c[row] =
          static_cast<const char*>(c->raw_data()) + off_c * static_cast<std::int64_t>(c_size);
  }
  gemv::launch(p, current_stream());
  return true;
}

// Stages 3-4 and the launches: the product straight into `out` by cuBLASLt, for a and b of one
// dtype that cuBLASLt writes as out's dtype (lt_output_allowed) and out with a unit last stride
// and a valid layout. With `c` (out's dtype and strides; it may be out itself): out = a b + c in
// cuBLASLt's epilogue (beta = 1, one rounding of the fp32 sum). Returns false, having launched
// nothing, where a or b needs a contiguous copy or cuBLASLt offers no algorithm for the first
// product (the caller copies, or takes another route).
bool lt_direct(const Tensor& a, const Tensor& b, Tensor& out, bool transpose_b, const Dims& batch,
               const Tensor* c) {
  const long long m = a.size(-2), k = a.size(-1);
  const long long n = transpose_b ? b.size(-2) : b.size(-1);
  const std::size_t batch_rank = batch.size();
  const long long s_bk = transpose_b ? b.stride(-1) : b.stride(-2);
  const long long s_bn = transpose_b ? b.stride(-2) : b.stride(-1);
  const MatrixLayout lb = layout_of(n, k, s_bn, s_bk);
  const MatrixLayout la = layout_of(k, m, a.stride(-1), a.stride(-2));
  if (!lb.ok || !la.ok) return false;

  // Stage 4: batch dims, merged where uniformly strided.
  const auto batch_strides = [&](const Tensor& t) {
    std::vector<long long> s(batch_rank, 0);
    const std::size_t lead = batch_rank - static_cast<std::size_t>(t.dim() - 2);
    for (std::size_t i = lead; i < batch_rank; ++i)
      s[i] = t.shape()[i - lead] == 1 ? 0 : t.strides()[i - lead];
    return s;
  };
  const std::vector<long long> sa = batch_strides(a), sb = batch_strides(b),
                               so = batch_strides(out);
  std::vector<long long> dims;
  std::vector<std::array<long long, 3>> strides;  // [dim] -> {a, b, out}
  for (std::size_t i = 0; i < batch_rank; ++i) {
    if (batch[i] == 1) continue;
    const std::array<long long, 3> s = {sa[i], sb[i], so[i]};
    if (!dims.empty() && strides.back()[0] == s[0] * batch[i] &&
        strides.back()[1] == s[1] * batch[i] && strides.back()[2] == s[2] * batch[i]) {
      dims.back() *= batch[i];
      strides.back() = s;
      continue;
    }
    dims.push_back(batch[i]);
    strides.push_back(s);
  }
  LtProblem p;
  p.in_type = cuda_type(a.dtype());
  p.out_type = cuda_type(out.dtype());
  p.in_size = dtype_size(a.dtype());
  p.out_size = dtype_size(out.dtype());
  p.mm = n;
  p.nn = m;
  p.kk = k;
  p.la = lb;
  p.lb = la;
  p.ldd = m == 1 ? std::max(n, 1LL) : out.stride(-2);
  // A 2-D b under batched row-major a: fold the batch into m (one GEMM instead of a batch of
  // GEMVs that would re-read b), when a's and out's rows continue across batch entries.
  if (dims.size() == 1 && strides[0][1] == 0 && (k == 1 || a.stride(-1) == 1)) {
    const long long lda = m == 1 ? strides[0][0] : a.stride(-2);
    const long long ldd = m == 1 ? strides[0][2] : out.stride(-2);
    if (strides[0][0] == m * lda && strides[0][2] == m * ldd && lda >= std::max(k, 1LL) &&
        ldd >= std::max(n, 1LL)) {
      p.nn = m * dims[0];
      p.lb = {true, false, lda};
      p.ldd = ldd;
      dims.clear();
      strides.clear();
    }
  }
  if (!dims.empty()) {
    constexpr long long kMaxBatch = 1 << 30;
    if (dims.back() > kMaxBatch)
      fail<ShapeError>("matmul: a batch of ", dims.back(), " exceeds ", kMaxBatch);
    p.batch = static_cast<int>(dims.back());
    p.stride_a = strides.back()[1];  // Lt's A is b
    p.stride_b = strides.back()[0];
    p.stride_d = strides.back()[2];
  }
  long long outer = 1;
  for (std::size_t i = 0; i + 1 < dims.size(); ++i) outer *= dims[i];
  const auto* a_base = static_cast<const char*>(a.raw_data());
  const auto* b_base = static_cast<const char*>(b.raw_data());
  auto* d_base = static_cast<char*>(out.raw_data());
  const char* c_base = c ? static_cast<const char*>(c->raw_data()) : nullptr;
  for (long long o = 0; o < outer; ++o) {
    long long rest = o, off_a = 0, off_b = 0, off_d = 0;
    for (std::size_t i = dims.empty() ? 0 : dims.size() - 1; i-- > 0;) {
      const long long idx = rest % dims[i];
      rest /= dims[i];
      off_a += idx * strides[i][0];
      off_b += idx * strides[i][1];
      off_d += idx * strides[i][2];
    }
    const long long d_bytes = off_d * static_cast<long long>(p.out_size);
    if (run_lt(p, b_base + off_b * static_cast<long long>(p.in_size),
               a_base + off_a * static_cast<long long>(p.in_size), d_base + d_bytes,
               out.device().index, c_base ? c_base + d_bytes : nullptr))
      continue;
    // No algorithm for these leading dims / alignments: decided before anything launched.
    if (o != 0)
      fail<UnsupportedError>("cuda matmul: cuBLASLt has no algorithm for ", dims_str(a.shape()),
                             " x ", dims_str(b.shape()), transpose_b ? " (transposed)" : "",
                             " in ", dtype_name(a.dtype()), " -> ", dtype_name(out.dtype()));
    return false;
  }
  return true;
}

}  // namespace

std::uint64_t detail::lt_residual_epilogues() {
  return g_lt_residual_epilogues.load(std::memory_order_relaxed);
}

void matmul(const Tensor& a, const Tensor& b, Tensor& out, bool transpose_b) {
  matmul(a, b, out, transpose_b, MatmulOptions{});
}

void matmul(const Tensor& a, const Tensor& b, Tensor& out, bool transpose_b,
            const MatmulOptions& options) {
  // Stage 1: validation.
  check_matmul_device(a, "a");
  check_matmul_device(b, "b");
  check_matmul_device(out, "out");
  if (!(a.device() == out.device()) || !(b.device() == out.device()))
    fail<DeviceError>("cuda matmul: `a`, `b` and `out` must be on one device, got ",
                      a.device().str(), ", ", b.device().str(), " and ", out.device().str());
  check_dtype(a, "a", {DType::f32, DType::f16, DType::bf16});
  check_dtype(b, "b", {DType::f32, DType::f16, DType::bf16});
  check_dtype(out, "out", {DType::f32, DType::f16, DType::bf16});
  if (a.dim() < 2 || b.dim() < 2)
    fail<ShapeError>("matmul: `a` and `b` must have rank >= 2, got ", dims_str(a.shape()), " and ",
                     dims_str(b.shape()));
  const long long m = a.size(-2), k = a.size(-1);
  const long long bk = transpose_b ? b.size(-1) : b.size(-2);
  const long long n = transpose_b ? b.size(-2) : b.size(-1);
  if (bk != k)
    fail<ShapeError>("matmul: `a` ", dims_str(a.shape()), " and `b` ", dims_str(b.shape()),
                     transpose_b ? " (transposed)" : "", " disagree on the inner dim");
  const std::size_t batch_rank = static_cast<std::size_t>(std::max(a.dim(), b.dim()) - 2);
  Dims batch(batch_rank, 1);
  for (std::size_t i = 0; i < batch_rank; ++i) {
    const auto dim_of = [&](const Tensor& t) -> std::int64_t {
      const std::size_t lead = batch_rank - static_cast<std::size_t>(t.dim() - 2);
      return i < lead ? 1 : t.shape()[i - lead];
    };
    const std::int64_t x = dim_of(a), y = dim_of(b);
    if (x != y && x != 1 && y != 1)
      fail<ShapeError>("matmul: batch dims of `a` ", dims_str(a.shape()), " and `b` ",
                       dims_str(b.shape()), " do not broadcast");
    batch[i] = x == 1 ? y : x;
  }
  Dims want = batch;
  want.push_back(m);
  want.push_back(n);
  if (out.shape() != want)
    fail<ShapeError>("matmul: `out` must have shape ", dims_str(want), ", got ",
                     dims_str(out.shape()));
  check_no_self_overlap(out, "out");
  check_no_overlap(out, "out", a, "a", false);
  check_no_overlap(out, "out", b, "b", false);
  if (const Tensor* c = options.residual) {
    check_matmul_device(*c, "residual");
    if (!(c->device() == out.device()))
      fail<DeviceError>("cuda matmul: `residual` must be on `out`'s device ", out.device().str(),
                        ", got ", c->device().str());
    check_dtype(*c, "residual", {DType::f32, DType::f16, DType::bf16});
    if (c->shape() != out.shape())
      fail<ShapeError>("matmul: `residual` must have `out`'s shape ", dims_str(out.shape()),
                       ", got ", dims_str(c->shape()));
    check_no_overlap(out, "out", *c, "residual", true);
    if (m == 0 || n == 0) return;
    if (k == 0) return cast(*c, out);
    MatmulOptions plain = options;
    plain.residual = nullptr;
    if (a.dtype() == b.dtype() && try_gemv(a, b, out, transpose_b, options)) return;
    // cuBLASLt's own epilogue (beta = 1, C = the residual) where the product goes straight into
    // out and the residual has out's dtype and strides: one launch, the same fp32 sum.
    if (a.dtype() == b.dtype() && lt_output_allowed(a.dtype(), out.dtype()) &&
        c->dtype() == out.dtype() && c->strides() == out.strides() && out.stride(-1) == 1) {
      const MatrixLayout lo = layout_of(n, m, out.stride(-1), out.stride(-2));
      if (lo.ok && !lo.transposed && lt_direct(a, b, out, transpose_b, batch, c)) {
        g_lt_residual_epilogues.fetch_add(1, std::memory_order_relaxed);
        return;
      }
    }
    // Every other route: the product in f32 scratch, then one fp32 add rounded into out.
    Tensor product = detail::scratch(out.shape(), DType::f32, out.device());
    matmul(a, b, product, transpose_b, plain);
    return cuda::binary(BinaryKind::add, product, *c, out);
  }
  if (m == 0 || n == 0) return;
  if (k == 0) return fill(out, 0.0);

  // Stage 2: dtypes.
  if (a.dtype() != b.dtype()) {
    const Tensor a32 = contiguous_copy(a, DType::f32), b32 = contiguous_copy(b, DType::f32);
    return matmul(a32, b32, out, transpose_b);  // b32 is scratch the cast just wrote
  }
  if (try_gemv(a, b, out, transpose_b, options)) return;
  if (!lt_output_allowed(a.dtype(), out.dtype()) || out.stride(-1) != 1 ||
      layout_of(n, m, out.stride(-1), out.stride(-2)).transposed ||
      !layout_of(n, m, out.stride(-1), out.stride(-2)).ok) {
    Tensor staged = detail::scratch(
        out.shape(), lt_output_allowed(a.dtype(), out.dtype()) ? out.dtype() : DType::f32,
        out.device());
    matmul(a, b, staged, transpose_b, options);
    return cast(staged, out);
  }

  // Stage 3: layouts (Lt's A is b^T [n, k], Lt's B is a^T [k, m], D is out^T [n, m]).
  const long long s_bk = transpose_b ? b.stride(-1) : b.stride(-2);
  const long long s_bn = transpose_b ? b.stride(-2) : b.stride(-1);
  const MatrixLayout lb = layout_of(n, k, s_bn, s_bk);
  if (!lb.ok) return matmul(a, contiguous_copy(b, b.dtype()), out, transpose_b);
  const MatrixLayout la = layout_of(k, m, a.stride(-1), a.stride(-2));
  if (!la.ok) return matmul(contiguous_copy(a, a.dtype()), b, out, transpose_b, options);

  if (lt_direct(a, b, out, transpose_b, batch, nullptr)) return;
  // No algorithm for these leading dims / alignments: retry once on fresh contiguous copies,
  // which are 256-byte aligned.
  if (t_contiguous_retry)
    fail<UnsupportedError>("cuda matmul: cuBLASLt has no algorithm for ", dims_str(a.shape()),
                           " x ", dims_str(b.shape()), transpose_b ? " (transposed)" : "", " in ",
                           dtype_name(a.dtype()), " -> ", dtype_name(out.dtype()));
  t_contiguous_retry = true;
  try {
    Tensor staged = detail::scratch(out.shape(), out.dtype(), out.device());
    matmul(contiguous_copy(a, a.dtype()), contiguous_copy(b, b.dtype()), staged, transpose_b);
    cast(staged, out);
  } catch (...) {
    t_contiguous_retry = false;
    throw;
  }
  t_contiguous_retry = false;
}
}  // namespace splice::cuda
