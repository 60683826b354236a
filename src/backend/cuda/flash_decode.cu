// Launcher of the CUDA flash-decode kernel (device code in flash_decode_kernel.cuh).
//
//   1. Check every argument (devices, dtypes, ranks, shapes, strides and alignment), naming it.
//   2. Plan the grid at the capacity bound (plan_flash_decode), so the launch is graph-safe; the
//      kernel re-plans the live split count from k_len on the device.
//   3. Group the splits of one (batch, kv head, row block) into thread-block clusters of C CTAs
//      (a power of two <= 16; 16 needs the non-portable size attribute), choosing C and the
//      grid's split count so that every cluster of the grid is resident at once (the device's
//      resident-cluster counts are queried once per instantiation). Splits that fit in one
//      cluster merge through distributed shared memory (kernel stage 6c). Where the plain plan
//      wants >= 32 splits (small batches) and head_dim <= 128, the wide variant runs instead:
//      one cluster of 16 eight-warp CTAs per unit (one per SM), cluster-merged at every length.
//   4. Make sure the module-owned fp32 split workspace and the zeroed merge counters are large
//      enough (growth is refused during stream capture), fill the POD params and launch the
//      instantiation for (dtype, head_dim) with cudaLaunchKernelEx: the cluster dimension and,
//      on a created stream, programmatic dependent launch (the kernel waits for the previous
//      kernel's writes before its first access, so only the launch itself overlaps).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "backend/cuda/check.h"
#include "backend/cuda/flash_decode_kernel.cuh"
#include "backend/cuda/launch.cuh"
#include "splice/backend/cuda/flash_decode.h"

// The planner's constants (public header) and the kernel's must agree.
static_assert(splice::cuda::kFlashDecodeMaxSplits == splice::cuda::detail::kMaxSplits);
static_assert(splice::cuda::kFlashDecodeRowsPerCta == splice::cuda::detail::kRows);
static_assert(splice::cuda::kFlashDecodeTileKeys == splice::cuda::detail::kTileKeys);
static_assert(splice::cuda::kFlashDecodeWarps == splice::cuda::detail::kWarps);

namespace splice::cuda {
namespace {

using detail::FlashDecodeConfig;
using detail::FlashDecodeParams;

constexpr std::int64_t kMaxLength = std::int64_t{1} << 30;  // int32 position arithmetic headroom
constexpr std::int64_t kMaxGridYZ = 65535;
constexpr int kMaxCtasPerSm = 4;
constexpr std::size_t kSmemPerSm = 228 * 1024;  // Hopper: shared memory per SM
constexpr std::size_t kSmemReservedPerCta = 1024;
constexpr std::int64_t kVecElems = 8;      // 16 bytes of 16-bit elements
constexpr std::int64_t kHalfVecElems = 4;  // 8 bytes of 16-bit elements

int smem_bytes(std::int64_t head_dim) {
  switch (head_dim) {
    case 64:
      return FlashDecodeConfig<64>::kSmemBytes;
    case 128:
      return FlashDecodeConfig<128>::kSmemBytes;
    default:
      return FlashDecodeConfig<256>::kSmemBytes;
  }
}

// Resident CTAs per SM for a CTA of `smem` dynamic shared-memory bytes.
int ctas_per_sm(int smem) {
  const std::size_t per_cta = static_cast<std::size_t>(smem) + kSmemReservedPerCta;
  return std::clamp(static_cast<int>(kSmemPerSm / per_cta), 1, kMaxCtasPerSm);
}

// Module-owned workspace: merge counters (zero between launches) and fp32 partials.
struct Workspace {
  std::mutex mutex;
  unsigned* counters = nullptr;
  std::size_t counter_count = 0;
  float* partials = nullptr;
  std::size_t partial_bytes = 0;
};

Workspace& workspace() {
  static auto* instance = new Workspace();  // lives for the process (kernels may still run)
  return *instance;
}

// Launch features. Defaults from the H200 A/B of 2026-11-30 (docs/perf.md, run 8): the cluster
// (DSMEM) merge and the wide 8-warp variant never beat the global merge at B <= 8 (1K: 8.25-8.61
// vs 8.31 us; 16K: 26.6-29.1 vs 24.5 us; 64K: 82-86 vs 71.3 us at (32,8)), so both are off; PDL
// is on. The switches stay for A/B timing (the benchmark) and the tests of both merge paths.
struct Features {
  bool cluster = false;
  bool pdl = true;
  bool wide = false;
  std::string last_launch;  // the latest launch's shape (benchmark log)
};

Features& features() {
  static Features instance;
  return instance;
}

// Resident clusters of each power-of-two size (active[i] for size 2^i; 0: cannot launch).
struct ClusterCapacity {
  static constexpr int kSizes = 5;  // 1, 2, 4, 8, 16 = kMaxClusterSplits
  int active[kSizes] = {};
  std::string summary;  // for the benchmark's log
};
static_assert(1 << (ClusterCapacity::kSizes - 1) == detail::kMaxClusterSplits);

std::mutex& summary_mutex() {
  static auto* instance = new std::mutex();
  return *instance;
}
std::string& summaries() {
  static auto* instance = new std::string();
  return *instance;
}

// Queries how many clusters of each size the device holds at once for this instantiation.
template <typename T, int kHeadDim, int kNumWarps>
ClusterCapacity cluster_capacity(int smem, const char* name) {
  ClusterCapacity capacity;
  const auto kernel = detail::flash_decode_kernel<T, kHeadDim, kNumWarps>;
  int device = 0;
  SPLICE_CUDA_CHECK(cudaGetDevice(&device));
  int major = 0;
  SPLICE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  constexpr int kClusterMajor = 9;  // thread-block clusters need compute capability 9.0
  if (major >= kClusterMajor) {
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) !=
        cudaSuccess)
      (void)cudaGetLastError();  // then only portable sizes (<= 8) pass the query below
    // One CTA of a cluster per SM where possible: the splits then stream K/V through as many
    // SMs as there are CTAs, as in a plain launch (a preference; the query below includes it).
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeClusterSchedulingPolicyPreference,
                             cudaClusterSchedulingPolicySpread) != cudaSuccess)
      (void)cudaGetLastError();
    for (int i = 1; i < ClusterCapacity::kSizes; ++i) {
      cudaLaunchConfig_t config{};
      config.gridDim = dim3(1, 1u << i, 1);
      config.blockDim = dim3(kNumWarps * 32, 1, 1);
      config.dynamicSmemBytes = static_cast<std::size_t>(smem);
      cudaLaunchAttribute attribute{};
      attribute.id = cudaLaunchAttributeClusterDimension;
      attribute.val.clusterDim.x = 1;
      attribute.val.clusterDim.y = 1u << i;
      attribute.val.clusterDim.z = 1;
      config.attrs = &attribute;
      config.numAttrs = 1;
      int clusters = 0;
      if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) {
        (void)cudaGetLastError();  // an unsupported size is an answer here, not an error
        clusters = 0;
      }
      capacity.active[i] = clusters;
    }
  }
  char line[160];
  std::snprintf(line, sizeof line,
                "%s head_dim %d, %d warps: %d CTA slots; resident clusters of 2/4/8/16: %d %d %d "
                "%d\n",
                name, kHeadDim, kNumWarps, sm_count() * ctas_per_sm(smem), capacity.active[1],
                capacity.active[2], capacity.active[3], capacity.active[4]);
  capacity.summary = line;
  std::lock_guard<std::mutex> lock(summary_mutex());
  summaries() += capacity.summary;
  return capacity;
}

bool capturing(Stream stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  SPLICE_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

void ensure_workspace(std::size_t counters, std::size_t partial_bytes, Stream stream) {
  Workspace& ws = workspace();
  std::lock_guard<std::mutex> lock(ws.mutex);
  if (ws.counter_count >= counters && ws.partial_bytes >= partial_bytes) return;
  if (capturing(stream))
    fail<UnsupportedError>("flash_decode: the split workspace must grow to ", partial_bytes,
                           " bytes during stream capture; run the same shapes once before "
                           "capturing");
  if (ws.counter_count < counters) {
    if (ws.counters) SPLICE_CUDA_CHECK(cudaFree(ws.counters));  // synchronizes the device
    ws.counters = nullptr;
    SPLICE_CUDA_CHECK(cudaMalloc(&ws.counters, counters * sizeof(unsigned)));
    SPLICE_CUDA_CHECK(cudaMemset(ws.counters, 0, counters * sizeof(unsigned)));
    ws.counter_count = counters;
  }
  if (ws.partial_bytes < partial_bytes) {
    if (ws.partials) SPLICE_CUDA_CHECK(cudaFree(ws.partials));
    ws.partials = nullptr;
    SPLICE_CUDA_CHECK(cudaMalloc(&ws.partials, partial_bytes));
    ws.partial_bytes = partial_bytes;
  }
}

void check_cuda_tensor(const Tensor& t, const char* name) {
  check_defined(t, name);
  if (!t.device().is_cuda())
    fail<DeviceError>("flash_decode: `", name, "` must be on a CUDA device, got ",
                      t.device().str());
}

bool aligned(const Tensor& t, std::int64_t elems) {
  const auto address = reinterpret_cast<std::uintptr_t>(t.raw_data());
  if (address % (elems * 2) != 0) return false;
  for (std::int64_t axis = 0; axis + 1 < t.dim(); ++axis)
    if (t.stride(axis) % elems != 0) return false;
  return true;
}

// One-time setup of an instantiation: its shared-memory limit and its cluster capacity.
template <typename T, int kHeadDim, int kNumWarps>
const ClusterCapacity& prepare() {
  constexpr int kSmem = FlashDecodeConfig<kHeadDim, kNumWarps>::kSmemBytes;
  static ClusterCapacity capacity;
  static std::once_flag once;
  std::call_once(once, [] {
    SPLICE_CUDA_CHECK(cudaFuncSetAttribute(detail::flash_decode_kernel<T, kHeadDim, kNumWarps>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    capacity =
        cluster_capacity<T, kHeadDim, kNumWarps>(kSmem, std::is_same_v<T, __half> ? "f16" : "bf16");
  });
  return capacity;
}

template <typename T>
const ClusterCapacity& prepare_head_dim(std::int64_t head_dim, bool wide) {
  if (wide)
    return head_dim == 64 ? prepare<T, 64, detail::kWideWarps>()
                          : prepare<T, 128, detail::kWideWarps>();
  switch (head_dim) {
    case 64:
      return prepare<T, 64, detail::kWarps>();
    case 128:
      return prepare<T, 128, detail::kWarps>();
    default:
      return prepare<T, 256, detail::kWarps>();
  }
}

template <typename T, int kHeadDim, int kNumWarps>
void launch(const FlashDecodeParams& params, const dim3& grid, Stream stream) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(kNumWarps * 32, 1, 1);
  config.dynamicSmemBytes = FlashDecodeConfig<kHeadDim, kNumWarps>::kSmemBytes;
  config.stream = stream;
  cudaLaunchAttribute attributes[2] = {};
  unsigned count = 0;
  if (params.cluster_splits > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count].val.clusterDim.x = 1;
    attributes[count].val.clusterDim.y = static_cast<unsigned>(params.cluster_splits);
    attributes[count].val.clusterDim.z = 1;
    ++count;
  }
  // As every PDL launch here (launch.cuh): honours SPLICE_PDL / set_pdl_enabled, and never on the
  // legacy default stream, whose implicit synchronization PDL would only muddle. The kernel obeys
  // launch.cuh's safety rule (stage 0 waits before any global access or early return).
  if (features().pdl && pdl_enabled() && stream != nullptr) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  config.attrs = attributes;
  config.numAttrs = count;
  SPLICE_CUDA_CHECK(
      cudaLaunchKernelEx(&config, detail::flash_decode_kernel<T, kHeadDim, kNumWarps>, params));
  SPLICE_CUDA_CHECK_LAUNCH("flash_decode_kernel");
}

template <typename T>
void launch_head_dim(std::int64_t head_dim, bool wide, const FlashDecodeParams& params,
                     const dim3& grid, Stream stream) {
  if (wide) {
    if (head_dim == 64) return launch<T, 64, detail::kWideWarps>(params, grid, stream);
    return launch<T, 128, detail::kWideWarps>(params, grid, stream);
  }
  switch (head_dim) {
    case 64:
      return launch<T, 64, detail::kWarps>(params, grid, stream);
    case 128:
      return launch<T, 128, detail::kWarps>(params, grid, stream);
    default:
      return launch<T, 256, detail::kWarps>(params, grid, stream);
  }
}

// Stage 3: the cluster size C and the grid's split count S (a multiple of C, at least `forced`).
// Every cluster of the grid must be resident at once: a cluster waits for C free CTA slots in
// one GPC, so a grid with more clusters than fit would run a second wave at long lengths, where
// all splits are live. The largest power of two C <= the split count is taken for which
//   S = C * min(floor(splits / C), floor(resident clusters / units))
// is at least `forced` and at least half the split count rounded down to a multiple of C (33
// planned splits may become 16); otherwise no cluster.
std::pair<int, std::int64_t> cluster_and_splits(const ClusterCapacity& capacity, std::int64_t units,
                                                std::int64_t planned, std::int64_t forced) {
  const std::int64_t splits = std::max(planned, forced);
  for (int i = ClusterCapacity::kSizes - 1; i >= 1; --i) {
    const int cluster = 1 << i;
    if (cluster > splits) continue;
    const std::int64_t per_unit =
        std::min<std::int64_t>(splits / cluster, capacity.active[i] / units);
    const std::int64_t grid_y = cluster * per_unit;
    if (per_unit >= 1 && grid_y >= forced && 2 * grid_y >= splits / cluster * cluster)
      return {cluster, grid_y};
  }
  return {1, splits};
}

}  // namespace

FlashDecodePlan plan_flash_decode(std::int64_t batch, std::int64_t num_qo_heads,
                                  std::int64_t num_kv_heads, std::int64_t q_len,
                                  std::int64_t head_dim, std::int64_t capacity,
                                  std::int64_t max_live_k_len, int sm_count) {
  SPLICE_INTERNAL_CHECK(batch > 0 && num_kv_heads > 0 && num_qo_heads % num_kv_heads == 0 &&
                            q_len > 0 && sm_count > 0,
                        "plan_flash_decode needs validated shapes");
  FlashDecodePlan plan;
  const std::int64_t rows = (num_qo_heads / num_kv_heads) * q_len;
  plan.row_blocks = static_cast<int>((rows + kFlashDecodeRowsPerCta - 1) / kFlashDecodeRowsPerCta);
  plan.ctas_per_sm = ctas_per_sm(smem_bytes(head_dim));
  const std::int64_t units = batch * num_kv_heads * plan.row_blocks;
  const std::int64_t bound =
      std::clamp<std::int64_t>(max_live_k_len, 1, std::max<std::int64_t>(capacity, 1));
  const std::int64_t max_useful = (bound + plan.min_chunk - 1) / plan.min_chunk;
  const std::int64_t slots = static_cast<std::int64_t>(sm_count) * plan.ctas_per_sm;
  const std::int64_t fill = std::max<std::int64_t>(1, slots / units);
  plan.num_splits = static_cast<int>(
      std::clamp<std::int64_t>(fill, 1, std::min<std::int64_t>(max_useful, kFlashDecodeMaxSplits)));
  plan.grid_x = plan.row_blocks;
  plan.grid_y = plan.num_splits;
  plan.grid_z = batch * num_kv_heads;
  plan.workspace_bytes = plan.num_splits > 1
                             ? static_cast<std::size_t>(units * plan.num_splits *
                                                        kFlashDecodeRowsPerCta * (head_dim + 1)) *
                                   sizeof(float)
                             : 0;
  return plan;
}

int sm_count() {
  static int counts[64] = {};
  int device = 0;
  SPLICE_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 64 && counts[device] > 0) return counts[device];
  int count = 0;
  SPLICE_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  if (device < 64) counts[device] = count;
  return count;
}

void flash_decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_len,
                  const Tensor* alibi, const DecodeAttentionOptions& options, Tensor& out,
                  Tensor* lse, Stream stream) {
  // Stage 1: argument checks.
  check_cuda_tensor(q, "q");
  check_cuda_tensor(k, "k");
  check_cuda_tensor(v, "v");
  check_cuda_tensor(k_len, "k_len");
  check_cuda_tensor(out, "out");
  check_dtype(q, "q", {DType::bf16, DType::f16});
  check_dtype(k, "k", {q.dtype()});
  check_dtype(v, "v", {q.dtype()});
  check_dtype(out, "out", {q.dtype()});
  check_dtype(k_len, "k_len", {DType::i32});
  check_rank(q, "q", 4);
  check_rank(k, "k", 4);
  const std::int64_t batch = q.size(0);
  const std::int64_t num_qo_heads = q.size(1);
  const std::int64_t q_len = q.size(2);
  const std::int64_t head_dim = q.size(3);
  const std::int64_t num_kv_heads = k.size(1);
  const std::int64_t capacity = k.size(2);
  if (head_dim != 64 && head_dim != 128 && head_dim != 256)
    fail<ShapeError>("flash_decode: head_dim must be one of {64, 128, 256}, got ", head_dim);
  if (batch < 1 || q_len < 1 || num_kv_heads < 1)
    fail<ShapeError>("flash_decode: `q` and `k` must be non-empty, got q ", dims_str(q.shape()),
                     " and k ", dims_str(k.shape()));
  if (num_qo_heads % num_kv_heads != 0)
    fail<ShapeError>("flash_decode: num_qo_heads (", num_qo_heads,
                     ") must be a multiple of num_kv_heads (", num_kv_heads, ")");
  check_shape(k, "k", {batch, num_kv_heads, capacity, head_dim});
  check_shape(v, "v", {batch, num_kv_heads, capacity, head_dim});
  check_shape(out, "out", {batch, num_qo_heads, q_len, head_dim});
  if (capacity >= kMaxLength)
    fail<ShapeError>("flash_decode: capacity must be below 2^30, got ", capacity);
  if (batch * num_kv_heads > kMaxGridYZ)
    fail<ShapeError>("flash_decode: batch * num_kv_heads must be at most ", kMaxGridYZ, ", got ",
                     batch * num_kv_heads);
  check_rank(k_len, "k_len", 1);
  if (k_len.size(0) != batch && k_len.size(0) != 1)
    fail<ShapeError>("flash_decode: `k_len` must have shape [", batch, "] or [1], got ",
                     dims_str(k_len.shape()));
  for (const auto& [t, name] :
       {std::pair<const Tensor*, const char*>{&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}})
    if (t->stride(3) != 1)
      fail<LayoutError>("flash_decode: `", name, "` must have a unit head_dim stride, got ",
                        t->stride(3));
  if (!aligned(k, kVecElems) || !aligned(v, kVecElems))
    fail<LayoutError>(
        "flash_decode: `k` and `v` need 16-byte aligned rows (base address and "
        "strides multiples of 8 elements), got k strides ",
        dims_str(k.strides()), " and v strides ", dims_str(v.strides()));
  if (alibi) {
    check_cuda_tensor(*alibi, "alibi");
    check_dtype(*alibi, "alibi", {DType::f32});
    check_shape(*alibi, "alibi", {num_qo_heads});
    check_contiguous(*alibi, "alibi");
  }
  if (lse) {
    check_cuda_tensor(*lse, "lse");
    check_dtype(*lse, "lse", {DType::f32});
    check_shape(*lse, "lse", {batch, num_qo_heads, q_len});
  }
  if (options.window_left && *options.window_left < 0)
    fail<ValueError>("flash_decode: `window_left` must be >= 0, got ", *options.window_left);
  if (options.window_right && *options.window_right < 0)
    fail<ValueError>("flash_decode: `window_right` must be >= 0, got ", *options.window_right);
  if (options.softcap && !(*options.softcap > 0.0f))
    fail<ValueError>("flash_decode: `softcap` must be > 0, got ", *options.softcap);
  if (options.num_splits < 0)
    fail<ValueError>("flash_decode: `num_splits` must be >= 0, got ", options.num_splits);

  // Stage 2: the plan at the capacity bound.
  const FlashDecodePlan plan = plan_flash_decode(batch, num_qo_heads, num_kv_heads, q_len, head_dim,
                                                 capacity, capacity, sm_count());
  const std::int64_t max_splits =
      std::max<std::int64_t>(1, (capacity + kFlashDecodeTileKeys - 1) / kFlashDecodeTileKeys);
  const std::int64_t forced =
      std::min<std::int64_t>({options.num_splits, max_splits, kFlashDecodeMaxSplits});
  // Stage 3: the cluster size and the grid's split count.
  const std::int64_t units = plan.grid_x * plan.grid_z;
  const bool bf16 = q.dtype() == DType::bf16;
  const ClusterCapacity& clusters = bf16 ? prepare_head_dim<__nv_bfloat16>(head_dim, false)
                                         : prepare_head_dim<__half>(head_dim, false);
  // The wide variant: one cluster of 16 eight-warp splits per unit, every split count merged in
  // the cluster, where the plain plan wants >= 32 splits and every such cluster is resident.
  bool wide = false;
  if (features().cluster && features().wide && head_dim <= detail::kWideMaxHeadDim &&
      forced <= detail::kMaxClusterSplits && plan.grid_y >= 2 * detail::kMaxClusterSplits) {
    const ClusterCapacity& wide_clusters = bf16 ? prepare_head_dim<__nv_bfloat16>(head_dim, true)
                                                : prepare_head_dim<__half>(head_dim, true);
    wide = wide_clusters.active[ClusterCapacity::kSizes - 1] >= units;
  }
  int cluster = 1;
  std::int64_t grid_y = std::max<std::int64_t>(plan.grid_y, forced);
  if (wide) {
    cluster = detail::kMaxClusterSplits;
    grid_y = detail::kMaxClusterSplits;
  } else if (features().cluster) {
    std::tie(cluster, grid_y) = cluster_and_splits(clusters, units, plan.grid_y, forced);
  }
  char shape[64];
  std::snprintf(shape, sizeof shape, "%dx%lld%s", cluster, static_cast<long long>(grid_y),
                wide ? "w" : "");
  features().last_launch = shape;

  // Stage 4: workspace, params, launch.
  const std::size_t partial_rows =
      static_cast<std::size_t>(units * grid_y * kFlashDecodeRowsPerCta);
  const std::size_t partial_bytes =
      grid_y > 1 ? partial_rows * static_cast<std::size_t>(head_dim + 1) * sizeof(float) : 0;
  ensure_workspace(static_cast<std::size_t>(units), partial_bytes, stream);
  Workspace& ws = workspace();

  FlashDecodeParams p{};
  p.q = q.raw_data();
  p.k = k.raw_data();
  p.v = v.raw_data();
  p.out = out.raw_data();
  p.lse = lse ? lse->data<float>() : nullptr;
  p.k_len = k_len.data<std::int32_t>();
  p.alibi = alibi ? alibi->data<float>() : nullptr;
  p.counters = ws.counters;
  p.partial_lse = ws.partials;
  p.partial_o = ws.partials ? ws.partials + partial_rows : nullptr;
  p.q_stride_b = q.stride(0);
  p.q_stride_h = q.stride(1);
  p.q_stride_s = q.stride(2);
  p.k_stride_b = k.stride(0);
  p.k_stride_h = k.stride(1);
  p.k_stride_s = k.stride(2);
  p.v_stride_b = v.stride(0);
  p.v_stride_h = v.stride(1);
  p.v_stride_s = v.stride(2);
  p.o_stride_b = out.stride(0);
  p.o_stride_h = out.stride(1);
  p.o_stride_s = out.stride(2);
  if (lse) {
    p.lse_stride_b = lse->stride(0);
    p.lse_stride_h = lse->stride(1);
    p.lse_stride_s = lse->stride(2);
  }
  p.k_len_stride = k_len.size(0) == 1 ? 0 : static_cast<int>(k_len.stride(0));
  p.num_kv_heads = static_cast<int>(num_kv_heads);
  p.group = static_cast<int>(num_qo_heads / num_kv_heads);
  p.q_len = static_cast<int>(q_len);
  p.rows = static_cast<int>(p.group * q_len);
  p.capacity = static_cast<int>(capacity);
  p.forced_splits = static_cast<int>(forced);
  p.cluster_splits = cluster;
  p.min_chunk = plan.min_chunk;
  const auto clamp_window = [&](const std::optional<std::int64_t>& w) {
    return w ? static_cast<int>(std::min<std::int64_t>(*w, kMaxLength)) : -1;
  };
  p.window_left = clamp_window(options.window_left);
  p.window_right = clamp_window(options.window_right);
  p.causal = options.causal ? 1 : 0;
  p.q_vec16 = aligned(q, kVecElems) ? 1 : 0;
  p.o_vec8 = aligned(out, kHalfVecElems) ? 1 : 0;
  p.softmax_scale = options.softmax_scale != 0.0f
                        ? options.softmax_scale
                        : static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  p.scale_log2 = p.softmax_scale * detail::kLog2e;
  p.softcap = options.softcap ? *options.softcap : 0.0f;

  const dim3 grid(static_cast<unsigned>(plan.grid_x), static_cast<unsigned>(grid_y),
                  static_cast<unsigned>(plan.grid_z));
  if (bf16)
    launch_head_dim<__nv_bfloat16>(head_dim, wide, p, grid, stream);
  else
    launch_head_dim<__half>(head_dim, wide, p, grid, stream);
}

namespace detail {

void set_flash_decode_features(bool cluster, bool pdl, bool wide) {
  features().cluster = cluster;
  features().pdl = pdl;
  features().wide = wide;
}

std::string flash_decode_last_launch() { return features().last_launch; }

std::string flash_decode_cluster_summary() {
  std::lock_guard<std::mutex> lock(summary_mutex());
  return summaries();
}

}  // namespace detail

}  // namespace splice::cuda
