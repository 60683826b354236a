// Benchmark of the decode GEMV route of the CUDA matmul (src/backend/cuda/gemv.cu) against
// cuBLASLt on the same shapes, in one process (a plain main; prints a table and writes JSON).
//
//   1. Shapes: y [M, N] = x [M, K] . w [N, K]^T, bf16, M in {1, 2, 4, 8}, (N, K) from SmolLM2-135M
//      (576x576 q/o, 192x576 k/v, 1536x576 gate/up, 576x1536 down, 3072x576 fused gate+up,
//      960x576 fused qkv, 49152x576 lm_head), Llama-8B-like (4096x4096, 14336x4096) and the
//      embedded default model's (1026x256: a KDA layer's six stacked input projections, just
//      over the routing rule's 1024 columns for 2-8 rows; 1024x256 gate+up, 256x512 down).
//   2. Bytes first: the floor is the weight read, N * K * 2 bytes / 4.48 TB/s (design.md §4's
//      measured read ceiling); x and y are negligible and stay in L2 as they do in decode.
//   3. Timing: `copies` weight copies rotate so at least kRotateBytes of weights are read per
//      replay and the 50 MB L2 cannot flatter the small matrices; one CUDA graph holds one call
//      per copy; after warm-up each of --reps replays is timed with events; time per call =
//      median replay / copies. The GEMV arm launches the kernel directly (gemv::launch, whatever
//      the routing rule says, so both arms are timed on every shape); the cuBLASLt arm calls
//      cublasLtMatmul directly with the settings the primitive uses (fp32 compute, top heuristic
//      algorithm, 32 MiB workspace).
//   3b. Kernel variants, timed the same way (for retuning the launcher): a warp per column group
//      (no persistent loop, the previous kernel's grid) and 1, 2 and 4 columns per warp forced;
//      and the programmatic-dependent-launch A/B: the GEMV graphs chain their calls with PDL
//      (launch.cuh; each call waits on the one before, as in a decode step), so the default arm
//      is timed with PDL on; variant `pf` adds the constant-weight prefetch (Params::w_constant:
//      the first weight batch is issued before the wait) and `nopdl` captures with PDL off;
//      `ep` is `pf` plus the residual epilogue (Params::has_c: y = x w^T + c, the MatMulAdd layer
//      op's GEMV), whose cost over `pf` is the c read; `c2pf` is `c2` with the prefetch
//      (gemv_kernel forced, against `pf`'s routing: norm_rows_kernel at 2-4 rows).
//   3c. Cold code (--cold; three more graphs a shape, so off by default: with it the whole table
//      outlasts a 240 s device phase): both default arms again with splice::bench::flush_code
//      (256 KB of straight-line code on every SM) before every call and the flushes' own graph
//      subtracted, so each call starts with its code out of the instruction caches, as in a
//      decode step (docs/perf.md run 343: a kernel that wins warm can lose cold); the "cold us"
//      columns ("-" and JSON null without --cold). Read them at small shapes only: beside a
//      data-heavy call the flush's own time changes and the subtraction fails (runs 376-377).
//   4. Check: both arms' outputs of the last copy agree (max |gemv - lt| / max |lt| printed), and
//      splice::cuda::matmul (the routed primitive) once more on copy 0 agrees with them.
//   5. Output (--m M: that M only): one row per shape (us, GB/s of weight reads, % of 4.48
//      TB/s, cuBLASLt us, ratio cuBLASLt / GEMV, the path gemv::preferred routes the shape to and
//      whether that is the faster arm) and JSON at argv[1] (default gemv_cuda_bench.json). A
//      "no" in the `ok` column means the routing rule's thresholds (gemv.cu, `preferred`) need
//      retuning.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "../../src/backend/cuda/gemv.h"  // internal: the kernel is timed directly
#include "bench_util.cuh"
#include "splice/backend/cuda/primitives.h"
#include "splice/backend/cuda/runtime.h"
#include "splice/core/tensor.h"

namespace splice::cuda {
bool pdl_enabled();                  // src/backend/cuda/launch.cuh (defined in primitives.cu)
void set_pdl_enabled(bool enabled);  // overrides SPLICE_PDL for later launches
}  // namespace splice::cuda

namespace {

constexpr double kCeilingBytesPerSecond = 4.48e12;  // measured read ceiling (design.md §4)
constexpr std::size_t kRotateBytes = std::size_t{256} << 20;
constexpr std::size_t kCopyAlign = 256;  // bytes: each weight copy starts 256-byte aligned
constexpr int kMaxCopies = 1024;
constexpr int kWarmupReplays = 3;
constexpr int kDefaultReps = 30;
constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;  // as primitives_gemm.cc

#define LT_CHECK(call)                                                                  \
  do {                                                                                  \
    const cublasStatus_t status_ = (call);                                              \
    if (status_ != CUBLAS_STATUS_SUCCESS) {                                             \
      std::fprintf(stderr, "%s failed: %s\n", #call, cublasLtGetStatusString(status_)); \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

struct Shape {
  const char* name;
  std::int64_t n, k;
};

struct Result {
  Shape shape;
  std::int64_t m = 0;
  int copies = 0;
  double gemv_us = 0.0, lt_us = 0.0;
  double gemv_spread_us = 0.0, lt_spread_us = 0.0;
  double rel_diff = 0.0;         // max |gemv - lt| / max |lt| (last copy); -1: non-finite output
  double routed_rel_diff = 0.0;  // the same for matmul's output on copy 0 against cuBLASLt's
  bool routed_gemv = false;      // gemv::preferred(m, n, k)
  // Stage 3b's variants, us: a warp per group, then 1, 2 and 4 columns per warp.
  static constexpr int kVariants = 8;  // 1wpg, c1, c2, c4, pf, nopdl, ep, c2pf
  double variant_us[kVariants] = {};
  // Stage 3c (--cold): each call with its code cold (bench::flush_code before it, the flushes'
  // own time subtracted), the default GEMV and cuBLASLt, us; negative when not measured.
  double gemv_cold_us = -1.0, lt_cold_us = -1.0;
  std::int64_t weight_bytes() const { return shape.n * shape.k * 2; }
};

std::size_t copy_stride_bytes(const Shape& s) {
  const std::size_t bytes = static_cast<std::size_t>(s.n * s.k * 2);
  return (bytes + kCopyAlign - 1) / kCopyAlign * kCopyAlign;
}

int copies_for(const Shape& s) {
  const std::size_t bytes = static_cast<std::size_t>(s.n * s.k * 2);
  return static_cast<int>(
      std::clamp<std::size_t>((kRotateBytes + bytes - 1) / bytes, 1, kMaxCopies));
}

// Median and spread (max - min) of `reps` replays of `exec`, per call (/ copies), in us.
std::pair<double, double> time_graph(cudaGraphExec_t exec, int reps, int copies,
                                     cudaStream_t stream) {
  const splice::bench::ReplayTimes t =
      splice::bench::time_replays(exec, stream, kWarmupReplays, reps, copies);
  return {t.median_us, t.spread_us};
}

// cuBLASLt for out^T [n, m] = w [n, k] (Lt's A, stored as k x n column-major, transposed) .
// x^T [k, m] (Lt's B, k x m column-major), the layout primitives_gemm.cc builds for this case.
struct LtArm {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};

  LtArm(cublasLtHandle_t h, void* ws, std::int64_t m, std::int64_t n, std::int64_t k)
      : handle(h), workspace(ws) {
    LT_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    LT_CHECK(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, k, n, k));
    LT_CHECK(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, k, m, k));
    LT_CHECK(cublasLtMatrixLayoutCreate(&d, CUDA_R_16BF, n, m, n));
    cublasLtMatmulPreference_t pref = nullptr;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const std::uint64_t workspace_bytes = kWorkspaceBytes;
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &workspace_bytes, sizeof workspace_bytes));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    LT_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, op, a, b, d, d, pref, 1, &result, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    if (found < 1) {
      std::fprintf(stderr, "cuBLASLt has no algorithm for m %lld n %lld k %lld\n",
                   static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k));
      std::exit(1);
    }
    algo = result.algo;
  }
  ~LtArm() {
    cublasLtMatrixLayoutDestroy(d);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatmulDescDestroy(op);
  }
  LtArm(const LtArm&) = delete;
  LtArm& operator=(const LtArm&) = delete;

  void run(const void* w, const void* x, void* y, cudaStream_t stream) const {
    const float alpha = 1.0f, beta = 0.0f;
    LT_CHECK(cublasLtMatmul(handle, op, &alpha, w, a, x, b, &beta, y, d, y, d, &algo, workspace,
                            kWorkspaceBytes, stream));
  }
};

std::vector<float> to_host(const splice::Tensor& t) {
  std::vector<__nv_bfloat16> raw(static_cast<std::size_t>(t.numel()));
  BENCH_CHECK(cudaMemcpy(raw.data(), t.raw_data(), raw.size() * sizeof(__nv_bfloat16),
                         cudaMemcpyDeviceToHost));
  std::vector<float> out(raw.size());
  for (std::size_t i = 0; i < raw.size(); ++i) out[i] = __bfloat162float(raw[i]);
  return out;
}

// A cold column's text and JSON value: "-" and null when --cold was not given.
std::string cold_text(double us) {
  if (us < 0.0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", us);
  return buf;
}
std::string cold_json(double us) { return us < 0.0 ? "null" : std::to_string(us); }

Result run_shape(const Shape& s, std::int64_t m, const splice::Tensor& pool, cublasLtHandle_t lt,
                 void* workspace, int reps, bool cold_code, cudaStream_t stream) {
  Result r;
  r.shape = s;
  r.m = m;
  r.copies = copies_for(s);
  const std::int64_t stride_elems = static_cast<std::int64_t>(copy_stride_bytes(s) / 2);
  std::vector<splice::Tensor> w;  // each [n, k]
  for (int i = 0; i < r.copies; ++i)
    w.push_back(splice::Tensor::view_of(pool.storage(), i * stride_elems, {s.n, s.k},
                                        splice::Tensor::contiguous_strides({s.n, s.k}),
                                        splice::DType::bf16));
  splice::Tensor x = splice::Tensor::empty({m, s.k}, splice::DType::bf16, splice::Device::cuda());
  splice::bench::fill_random<<<256, 256, 0, stream>>>(x.data<__nv_bfloat16>(), x.numel(), 99u);
  BENCH_CHECK(cudaGetLastError());
  splice::Tensor y_gemv =
      splice::Tensor::empty({m, s.n}, splice::DType::bf16, splice::Device::cuda());
  splice::Tensor y_lt =
      splice::Tensor::empty({m, s.n}, splice::DType::bf16, splice::Device::cuda());
  // [m, n]: the residual of the `ep` variant
  splice::Tensor residual =
      splice::Tensor::empty({m, s.n}, splice::DType::bf16, splice::Device::cuda());
  splice::bench::fill_random<<<256, 256, 0, stream>>>(residual.data<__nv_bfloat16>(),
                                                      residual.numel(), 7u);
  BENCH_CHECK(cudaGetLastError());
  const LtArm arm(lt, workspace, m, s.n, s.k);
  r.routed_gemv = splice::cuda::gemv::preferred(m, s.n, s.k);

  // The GEMV arm: y_gemv [m, n] = x [m, k] . w[i]^T through the kernel's own launcher.
  splice::cuda::gemv::Params params;
  params.w_row_stride = s.k;
  params.n = s.n;
  params.k = s.k;
  params.rows = static_cast<int>(m);
  params.in_dtype = splice::DType::bf16;
  params.out_dtype = splice::DType::bf16;
  for (std::int64_t row = 0; row < m; ++row) {
    params.x[row] = x.data<__nv_bfloat16>() + row * s.k;
    params.y[row] = y_gemv.data<__nv_bfloat16>() + row * s.n;
  }
  const auto run_gemv = [&](const splice::Tensor& weight, int variant) {
    splice::cuda::gemv::Params call = params;
    call.w = weight.raw_data();
    // variant -1: the launcher's choices; 0: a warp per group; 1, 2, 3: 1, 2, 4 columns a warp;
    // 4: the constant-weight prefetch; 5: the launcher's choices with PDL off; 6: 4 plus the
    // residual epilogue; 7: 2 columns a warp with the prefetch (gemv_kernel against 4's choice,
    // norm_rows_kernel at 2-4 rows, both as a model launches them).
    call.one_warp_per_group = variant == 0;
    call.cols = variant > 0 && variant < 4 ? 1 << (variant - 1) : variant == 7 ? 2 : 0;
    call.w_constant = variant == 4 || variant == 6 || variant == 7;
    if (variant == 6) {
      call.has_c = true;
      call.c_dtype = splice::DType::bf16;
      for (std::int64_t row = 0; row < m; ++row)
        call.c[row] = residual.data<__nv_bfloat16>() + row * s.n;
    }
    const bool pdl = splice::cuda::pdl_enabled();
    if (variant == 5) splice::cuda::set_pdl_enabled(false);
    splice::cuda::gemv::launch(call, stream);
    splice::cuda::set_pdl_enabled(pdl);
  };

  splice::cuda::StreamGuard guard(stream);
  // Warm-up outside capture, then one graph per arm with a call per weight copy.
  for (int variant = -1; variant < Result::kVariants; ++variant) run_gemv(w[0], variant);
  arm.run(w[0].raw_data(), x.raw_data(), y_lt.raw_data(), stream);
  BENCH_CHECK(cudaStreamSynchronize(stream));
  // execs[0]: the GEMV as launched by default, [1]: cuBLASLt, [2 + v]: variant v.
  constexpr int kExecs = 2 + Result::kVariants;
  cudaGraphExec_t execs[kExecs];
  for (int which = 0; which < kExecs; ++which) {
    cudaGraph_t graph;
    BENCH_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < r.copies; ++i) {
      if (which == 1)
        arm.run(w[static_cast<std::size_t>(i)].raw_data(), x.raw_data(), y_lt.raw_data(), stream);
      else
        run_gemv(w[static_cast<std::size_t>(i)], which == 0 ? -1 : which - 2);
    }
    BENCH_CHECK(cudaStreamEndCapture(stream, &graph));
    BENCH_CHECK(cudaGraphInstantiate(&execs[which], graph, 0));
    BENCH_CHECK(cudaGraphDestroy(graph));
  }
  // Alternate the arms' timing runs so drift in clocks affects both alike.
  std::tie(r.gemv_us, r.gemv_spread_us) = time_graph(execs[0], reps, r.copies, stream);
  std::tie(r.lt_us, r.lt_spread_us) = time_graph(execs[1], reps, r.copies, stream);
  const auto [gemv_us2, gemv_spread2] = time_graph(execs[0], reps, r.copies, stream);
  const auto [lt_us2, lt_spread2] = time_graph(execs[1], reps, r.copies, stream);
  r.gemv_us = std::min(r.gemv_us, gemv_us2);
  r.lt_us = std::min(r.lt_us, lt_us2);
  r.gemv_spread_us = std::max(r.gemv_spread_us, gemv_spread2);
  r.lt_spread_us = std::max(r.lt_spread_us, lt_spread2);
  for (int v = 0; v < Result::kVariants; ++v)
    r.variant_us[v] = time_graph(execs[2 + v], reps, r.copies, stream).first;
  // Stage 3c: graphs of (flush, call) per copy for both arms and of the flushes alone.
  int sms = 0;
  BENCH_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  double cold[3] = {0.0, -1.0, -1.0};  // flushes alone, flush + GEMV, flush + cuBLASLt
  for (int which = 0; cold_code && which < 3; ++which) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    BENCH_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < r.copies; ++i) {
      splice::bench::flush_code(sms, stream);
      if (which == 1) run_gemv(w[static_cast<std::size_t>(i)], -1);
      if (which == 2)
        arm.run(w[static_cast<std::size_t>(i)].raw_data(), x.raw_data(), y_lt.raw_data(), stream);
    }
    BENCH_CHECK(cudaStreamEndCapture(stream, &graph));
    BENCH_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    BENCH_CHECK(cudaGraphDestroy(graph));
    cold[which] = time_graph(exec, reps, r.copies, stream).first;
    BENCH_CHECK(cudaGraphExecDestroy(exec));
  }
  if (cold_code) {
    r.gemv_cold_us = cold[1] - cold[0];
    r.lt_cold_us = cold[2] - cold[0];
  }
  // The default GEMV graph last, so y_gemv holds its output for the check below.
  BENCH_CHECK(cudaGraphLaunch(execs[0], stream));
  BENCH_CHECK(cudaStreamSynchronize(stream));
  for (cudaGraphExec_t e : execs) BENCH_CHECK(cudaGraphExecDestroy(e));

  const std::vector<float> g = to_host(y_gemv), l = to_host(y_lt);
  double max_diff = 0.0, max_ref = 0.0;
  bool finite = true;
  for (std::size_t i = 0; i < g.size(); ++i) {
    finite = finite && std::isfinite(g[i]) && std::isfinite(l[i]);
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(g[i] - l[i])));
    max_ref = std::max(max_ref, static_cast<double>(std::fabs(l[i])));
  }
  r.rel_diff = !finite ? -1.0 : max_ref > 0.0 ? max_diff / max_ref : max_diff;

  // The routed primitive on copy 0 against cuBLASLt on copy 0.
  splice::Tensor y_routed =
      splice::Tensor::empty({m, s.n}, splice::DType::bf16, splice::Device::cuda());
  splice::cuda::matmul(x, w[0], y_routed, true);
  arm.run(w[0].raw_data(), x.raw_data(), y_lt.raw_data(), stream);
  BENCH_CHECK(cudaStreamSynchronize(stream));
  const std::vector<float> routed = to_host(y_routed), l0 = to_host(y_lt);
  double routed_diff = 0.0, ref0 = 0.0;
  bool routed_finite = true;
  for (std::size_t i = 0; i < routed.size(); ++i) {
    routed_finite = routed_finite && std::isfinite(routed[i]) && std::isfinite(l0[i]);
    routed_diff = std::max(routed_diff, static_cast<double>(std::fabs(routed[i] - l0[i])));
    ref0 = std::max(ref0, static_cast<double>(std::fabs(l0[i])));
  }
  r.routed_rel_diff = !routed_finite ? -1.0 : ref0 > 0.0 ? routed_diff / ref0 : routed_diff;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path = "gemv_cuda_bench.json";
  int reps = kDefaultReps;
  std::int64_t only_m = 0;  // --m M: only that M (0: 1, 2, 4 and 8)
  bool cold_code = false;   // --cold: stage 3c
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--reps" && i + 1 < argc)
      reps = std::max(1, std::atoi(argv[++i]));
    else if (arg == "--m" && i + 1 < argc)
      only_m = std::atoll(argv[++i]);
    else if (arg == "--cold")
      cold_code = true;
    else if (!arg.empty() && arg[0] != '-')
      json_path = arg;
    else {
      std::fprintf(stderr, "usage: %s [JSON_PATH] [--reps N] [--m M] [--cold]\n", argv[0]);
      return 2;
    }
  }
  if (!splice::cuda::device_available()) {
    std::printf("gemv_cuda_bench: no CUDA device, skipped\n");
    return 0;
  }
  splice::cuda::ensure_registered();

  const Shape shapes[] = {
      {"smollm2 q/o", 576, 576},        {"smollm2 k/v", 192, 576},
      {"smollm2 gate/up", 1536, 576},   {"smollm2 down", 576, 1536},
      {"smollm2 gate+up", 3072, 576},   {"smollm2 qkv", 960, 576},
      {"smollm2 lm_head", 49152, 576},  {"llama8b q/o", 4096, 4096},
      {"llama8b gate/up", 14336, 4096}, {"default kda in", 1026, 256},
      {"default gate+up", 1024, 256},   {"default down", 256, 512},
  };
  std::size_t pool_bytes = 0;
  for (const Shape& s : shapes)
    pool_bytes =
        std::max(pool_bytes, static_cast<std::size_t>(copies_for(s)) * copy_stride_bytes(s));
  splice::Tensor pool = splice::Tensor::empty({static_cast<std::int64_t>(pool_bytes / 2)},
                                              splice::DType::bf16, splice::Device::cuda());
  cudaStream_t stream;
  BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  splice::bench::fill_random<<<4096, 256, 0, stream>>>(pool.data<__nv_bfloat16>(), pool.numel(),
                                                       1u);
  BENCH_CHECK(cudaGetLastError());
  BENCH_CHECK(cudaStreamSynchronize(stream));
  cublasLtHandle_t lt = nullptr;
  LT_CHECK(cublasLtCreate(&lt));
  void* workspace = nullptr;
  BENCH_CHECK(cudaMalloc(&workspace, kWorkspaceBytes));
  std::printf("device: %s; weight pool %.2f GB, >= %zu MB of weights per replay\n",
              splice::cuda::device_name().c_str(), pool_bytes / 1e9, kRotateBytes >> 20);

  std::vector<Result> results;
  for (std::int64_t m : {1, 2, 4, 8})
    for (const Shape& s : shapes) {
      if (only_m > 0 && m != only_m) continue;
      results.push_back(run_shape(s, m, pool, lt, workspace, reps, cold_code, stream));
      const Result& r = results.back();
      std::printf("  M=%lld %-16s N=%-6lld K=%-5lld copies=%-4d gemv %8.2f us  lt %8.2f us\n",
                  static_cast<long long>(m), s.name, static_cast<long long>(s.n),
                  static_cast<long long>(s.k), r.copies, r.gemv_us, r.lt_us);
      std::fflush(stdout);
    }

  std::ofstream json(json_path);
  json << "{\n  \"device\": \"" << splice::cuda::device_name()
       << "\",\n  \"ceiling_tbps\": 4.48,\n  \"dtype\": \"bf16\",\n"
       << "  \"method\": \"graph of `copies` rotating weight copies (>= " << (kRotateBytes >> 20)
       << " MB), min over 2 rounds of the median of " << reps
       << " replays / copies\",\n  \"rows\": [\n";
  std::printf("\n%-3s %-16s %6s %5s %9s %8s %7s %9s %8s %7s %9s %6s %3s %9s  %s\n", "M", "shape",
              "N", "K", "gemv us", "GB/s", "%4.48", "cublas us", "GB/s", "ratio", "rel diff",
              "route", "ok", "routed d",
              "variants us: 1wpg  c1  c2  c4  pf  nopdl  ep  c2pf | cold us: gemv  lt");
  for (std::size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    const double bytes = static_cast<double>(r.weight_bytes());
    const double gemv_gbps = bytes / (r.gemv_us * 1e-6) / 1e9;
    const double lt_gbps = bytes / (r.lt_us * 1e-6) / 1e9;
    const double floor_us = bytes / kCeilingBytesPerSecond * 1e6;
    const double pct = 100.0 * floor_us / r.gemv_us;
    const double ratio = r.lt_us / r.gemv_us;  // > 1: the GEMV kernel is faster
    // The route is right when it picks the faster arm (a tie within 2% either way counts).
    constexpr double kTie = 0.02;
    const bool route_ok = r.routed_gemv ? ratio >= 1.0 - kTie : ratio <= 1.0 + kTie;
    std::printf(
        "%-3lld %-16s %6lld %5lld %9.2f %8.0f %6.1f%% %9.2f %8.0f %6.2fx %9.2e %6s %3s %9.2e  "
        "%.2f %.2f %.2f %.2f %.2f %.2f %.2f %.2f | %s %s\n",
        static_cast<long long>(r.m), r.shape.name, static_cast<long long>(r.shape.n),
        static_cast<long long>(r.shape.k), r.gemv_us, gemv_gbps, pct, r.lt_us, lt_gbps, ratio,
        r.rel_diff, r.routed_gemv ? "gemv" : "lt", route_ok ? "yes" : "no", r.routed_rel_diff,
        r.variant_us[0], r.variant_us[1], r.variant_us[2], r.variant_us[3], r.variant_us[4],
        r.variant_us[5], r.variant_us[6], r.variant_us[7], cold_text(r.gemv_cold_us).c_str(),
        cold_text(r.lt_cold_us).c_str());
    json << "    {\"m\": " << r.m << ", \"name\": \"" << r.shape.name << "\", \"n\": " << r.shape.n
         << ", \"k\": " << r.shape.k << ", \"weight_bytes\": " << r.weight_bytes()
         << ", \"copies\": " << r.copies << ", \"gemv_us\": " << r.gemv_us
         << ", \"gemv_spread_us\": " << r.gemv_spread_us << ", \"gemv_gbps\": " << gemv_gbps
         << ", \"gemv_pct_of_ceiling\": " << pct << ", \"cublaslt_us\": " << r.lt_us
         << ", \"cublaslt_spread_us\": " << r.lt_spread_us << ", \"cublaslt_gbps\": " << lt_gbps
         << ", \"floor_us\": " << floor_us << ", \"ratio_cublaslt_over_gemv\": " << ratio
         << ", \"max_rel_diff\": " << r.rel_diff << ", \"route\": \""
         << (r.routed_gemv ? "gemv" : "cublaslt")
         << "\", \"route_ok\": " << (route_ok ? "true" : "false")
         << ", \"routed_max_rel_diff\": " << r.routed_rel_diff
         << ", \"one_warp_per_group_us\": " << r.variant_us[0]
         << ", \"cols1_us\": " << r.variant_us[1] << ", \"cols2_us\": " << r.variant_us[2]
         << ", \"cols4_us\": " << r.variant_us[3] << ", \"prefetch_us\": " << r.variant_us[4]
         << ", \"pdl_off_us\": " << r.variant_us[5] << ", \"epilogue_us\": " << r.variant_us[6]
         << ", \"cols2_prefetch_us\": " << r.variant_us[7]
         << ", \"gemv_cold_us\": " << cold_json(r.gemv_cold_us)
         << ", \"cublaslt_cold_us\": " << cold_json(r.lt_cold_us) << "}"
         << (i + 1 < results.size() ? "," : "") << "\n";
  }
  json << "  ]\n}\n";
  BENCH_CHECK(cudaFree(workspace));
  cublasLtDestroy(lt);
  BENCH_CHECK(cudaStreamDestroy(stream));
  return 0;
}
