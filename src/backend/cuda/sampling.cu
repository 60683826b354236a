// CUDA greedy sampling (splice/backend/cuda/sampling.h): argmax over rows of logits, one launch.
//
//   1. Host: validate with the CPU's checks and wording (backend/sampling_checks.h); pick n CTAs
//      per row (argmax_launch: one 16-byte load per thread of each CTA, at most 8 CTAs) and
//      launch a grid (n, min(rows, kMaxGridY)) of kThreads-thread CTAs in clusters of (n, 1, 1):
//      one cluster per row, rows beyond the grid's y extent looped over.
//   2. Key: element x_j (read as f32, exact for f16 / bf16) becomes the 64-bit key
//        key_j = (order(x_j) << 32) | (2^32 - 1 - j)
//      order() maps a float to a uint32 that sorts like its value (u = bits(x): u | 2^31 for
//      x >= 0, ~u for x < 0), with -0.0 read as +0.0 (they tie under `<`), a NaN at j > 0 mapped
//      to 0 (below -inf's 0x007FFFFF: it never wins) and a NaN at j = 0 mapped to 0xFFFFFFFF
//      (above +inf's 0xFF800000: nothing replaces it). The largest key is then exactly the greedy
//      rule's pick (cpu/sampling.h): the largest value, ties to the lowest index (the largest low
//      word). max is associative and commutative, so every reduction order and CTA count gives
//      the same id.
//   3. Loads: a row splits into a head (the elements before its first 16-byte boundary), a body
//      of 16-byte vectors and a tail (less than one vector). Thread g of the cluster's
//      G = n * kThreads threads takes head element g, tail element g and body vectors
//      g, g + G, g + 2G, ..., issuing kUnroll vector loads before consuming any of them.
//   4. Reduce: per thread max -> warp butterfly (shfl_xor) -> CTA through shared memory ->
//      cluster: between two cluster barriers rank 0 reads every CTA's key through distributed
//      shared memory (the second barrier keeps the peers' shared memory alive until it has been
//      read), and writes id = 2^32 - 1 - low32(key) to ids[row] and to the optional pinned host
//      mirror (then a system-scope fence, so the host sees it once the stream has synchronized).
//   5. PDL (launch.cuh): pdl_prologue() is every thread's first statement, before any global
//      load or store.
//   6. An automatic launch halves the cluster while the device reports that no such cluster can be
//      resident (cudaOccupancyMaxActiveClusters, asked once per size, outside stream captures); a
//      forced size is launched as asked.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "backend/cuda/check.h"
#include "backend/cuda/launch.cuh"
#include "backend/sampling_checks.h"
#include "splice/backend/cuda/runtime.h"
#include "splice/backend/cuda/sampling.h"
#include "splice/core/error.h"

namespace splice::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 512;             // threads per CTA
constexpr int kWarp = 32;                 // lanes per warp
constexpr int kWarps = kThreads / kWarp;  // warps per CTA (<= kWarp: one warp reduces them)
constexpr int kUnroll = 4;                // 16-byte loads in flight per thread
constexpr int kVectorBytes = 16;          // one vector load
constexpr int kWordBytes = 4;             // one 32-bit word of a vector
constexpr int kMaxClusterCtas = 8;        // the portable thread block cluster size
constexpr long long kMaxGridY = 65535;    // gridDim.y limit; more rows are looped over
constexpr unsigned kSignBit = 0x80000000u;
constexpr unsigned kNanOrder = 0u;                // a NaN after index 0: below every number
constexpr unsigned kNanFirstOrder = 0xFFFFFFFFu;  // a NaN at index 0: above every number
constexpr unsigned kLowMax = 0xFFFFFFFFu;         // low word = kLowMax - j
constexpr unsigned kFullMask = 0xFFFFFFFFu;

static_assert(kWarps <= kWarp, "one warp must be able to reduce the CTA's warp keys");
static_assert(kMaxClusterCtas <= kWarp, "one warp must be able to reduce the cluster's keys");

struct ArgmaxParams {
  const void* logits = nullptr;  // [rows, vocab], unit stride on vocab
  long long rows = 0;
  long long vocab = 0;
  long long row_stride = 0;  // elements between rows
  int* ids = nullptr;        // [rows], stride ids_stride
  long long ids_stride = 0;
  int* host_mirror = nullptr;          // [rows] (or [mirror_slots] with a counter) pinned, or null
  unsigned* mirror_counter = nullptr;  // [1] device: this launch writes slot *counter % slots
  int mirror_slots = 1;
};

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

// Element `part` of a 32-bit word holding 4 / sizeof(T) elements (little-endian: part 0 is the
// low bits).
template <typename T>
__device__ __forceinline__ float unpack(unsigned word, int part);
template <>
__device__ __forceinline__ float unpack<float>(unsigned word, int) {
  return __uint_as_float(word);
}
template <>
__device__ __forceinline__ float unpack<__nv_bfloat16>(unsigned word, int part) {
  return __uint_as_float(part ? (word & 0xFFFF0000u) : (word << 16));
}
template <>
__device__ __forceinline__ float unpack<__half>(unsigned word, int part) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(part ? word >> 16 : word)));
}

// key_j (stage 2 above).
__device__ __forceinline__ unsigned long long make_key(float x, long long j) {
  unsigned order;
  if (x != x) {
    order = j == 0 ? kNanFirstOrder : kNanOrder;
  } else {
    const unsigned u = __float_as_uint(x == 0.0f ? 0.0f : x);
    order = (u & kSignBit) ? ~u : (u | kSignBit);
  }
  return (static_cast<unsigned long long>(order) << 32) | (kLowMax - static_cast<unsigned>(j));
}

__device__ __forceinline__ unsigned long long larger(unsigned long long a, unsigned long long b) {
  return a > b ? a : b;
}

__device__ __forceinline__ unsigned long long warp_max(unsigned long long key) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    key = larger(key, __shfl_xor_sync(kFullMask, key, offset));
  return key;
}

// `launch` is the mirror counter's value (read at the kernel's start; 0 without a counter).
__device__ __forceinline__ void write_id(const ArgmaxParams& p, long long row,
                                         unsigned long long key, unsigned launch) {
  const int id = static_cast<int>(kLowMax - static_cast<unsigned>(key & kLowMax));
  p.ids[row * p.ids_stride] = id;
  if (p.host_mirror != nullptr) {
    if (p.mirror_counter != nullptr) {  // one row (the launcher checks it)
      p.host_mirror[launch % static_cast<unsigned>(p.mirror_slots)] = id;
      *p.mirror_counter = launch + 1;
    } else {
      p.host_mirror[row] = id;
    }
    __threadfence_system();
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) argmax_kernel(const ArgmaxParams p) {
  detail::pdl_prologue();
  // The mirror ring's launch number, loaded first thing by the thread that writes the id (thread 0
  // of rank 0; only the previous launch, complete after the wait, wrote it) so its round trip
  // overlaps the row's.
  const unsigned launch =
      p.mirror_counter != nullptr && blockIdx.x == 0 && threadIdx.x == 0 ? *p.mirror_counter : 0u;
  constexpr int kPerVector = kVectorBytes / static_cast<int>(sizeof(T));
  constexpr int kPerWord = kWordBytes / static_cast<int>(sizeof(T));
  __shared__ unsigned long long warp_keys[kWarps];
  __shared__ unsigned long long cta_key;
  const unsigned ctas = gridDim.x;  // the cluster spans the grid's x extent
  const unsigned rank = blockIdx.x;
  const int warp = static_cast<int>(threadIdx.x) / kWarp;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const long long g = static_cast<long long>(rank) * kThreads + threadIdx.x;
  const long long stride = static_cast<long long>(ctas) * kThreads;
  for (long long row = blockIdx.y; row < p.rows; row += gridDim.y) {
    const T* x = static_cast<const T*>(p.logits) + row * p.row_stride;
    const auto address = reinterpret_cast<unsigned long long>(x);
    const long long to_boundary =
        static_cast<long long>((kVectorBytes - address % kVectorBytes) % kVectorBytes) /
        static_cast<long long>(sizeof(T));
    const long long head = to_boundary < p.vocab ? to_boundary : p.vocab;
    const long long body = (p.vocab - head) / kPerVector;
    const long long tail_start = head + body * kPerVector;
    const long long tail = p.vocab - tail_start;
    unsigned long long best = 0;  // below every element's key (their low words are > 0)
    if (g < head) best = larger(best, make_key(to_f32(x[g]), g));
    if (g < tail) best = larger(best, make_key(to_f32(x[tail_start + g]), tail_start + g));
    const uint4* vectors = reinterpret_cast<const uint4*>(x + head);
    for (long long base = g; base < body; base += kUnroll * stride) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const long long i = base + u * stride;
        v[u] = i < body ? vectors[i] : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const long long i = base + u * stride;
        if (i >= body) continue;
        const unsigned words[kVectorBytes / kWordBytes] = {v[u].x, v[u].y, v[u].z, v[u].w};
        const long long j0 = head + i * kPerVector;
#pragma unroll
        for (int e = 0; e < kPerVector; ++e)
          best = larger(best, make_key(unpack<T>(words[e / kPerWord], e % kPerWord), j0 + e));
      }
    }
    best = warp_max(best);
    if (lane == 0) warp_keys[warp] = best;
    __syncthreads();
    if (warp == 0) {
      best = warp_max(lane < kWarps ? warp_keys[lane] : 0ull);
      if (lane == 0) {
        if (ctas == 1)
          write_id(p, row, best, launch);
        else
          cta_key = best;
      }
    }
    if (ctas > 1) {
      cg::cluster_group cluster = cg::this_cluster();
      cluster.sync();  // every CTA's cta_key is written and visible to the cluster
      if (rank == 0 && warp == 0) {
        best = warp_max(lane < static_cast<int>(ctas) ? *cluster.map_shared_rank(&cta_key, lane)
                                                      : 0ull);
        if (lane == 0) write_id(p, row, best, launch);
      }
      cluster.sync();  // the peers' cta_key stays alive and unchanged until rank 0 has read it
    } else {
      __syncthreads();  // warp 0 has read warp_keys before the next row overwrites them
    }
  }
}

template <typename T>
void launch(const ArgmaxParams& params, int ctas, Stream stream) {
  // launch.cuh's launcher: a cluster of `ctas` CTAs per row when > 1, the PDL attribute (the
  // kernel waits for its producers before any global access).
  const detail::LaunchShape shape{
      dim3(static_cast<unsigned>(ctas), static_cast<unsigned>(std::min(params.rows, kMaxGridY)), 1),
      dim3(kThreads, 1, 1), 0, static_cast<unsigned>(ctas)};
  detail::launch_kernel(argmax_kernel<T>, shape, stream, params);
}

// Whether a cluster of `ctas` CTAs of kernel<T> can be resident on this device: 1 yes, 2 no,
// 0 unknown. Asked once per instantiation and size, never while `stream` is being captured (the
// first launch of a decode step is an eager warm-up); a query the runtime cannot answer, or one
// not asked, counts as a yes and the launch reports any real problem.
template <typename T>
bool cluster_fits(int ctas, Stream stream) {
  static std::atomic<int> known[kMaxClusterCtas + 1] = {};
  if (ctas <= 1) return true;
  std::atomic<int>& slot = known[ctas];
  if (const int k = slot.load(std::memory_order_relaxed); k != 0) return k == 1;
  if (stream != nullptr && is_capturing(stream)) return true;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(ctas), 1, 1);
  config.blockDim = dim3(kThreads, 1, 1);
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = static_cast<unsigned>(ctas);
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  int clusters = 0;
  const cudaError_t status = cudaOccupancyMaxActiveClusters(&clusters, argmax_kernel<T>, &config);
  if (status != cudaSuccess) (void)cudaGetLastError();  // clear it: the answer is "unknown"
  const bool fits = status != cudaSuccess || clusters >= 1;
  slot.store(fits ? 1 : 2, std::memory_order_relaxed);
  return fits;
}

// The CTAs per row for an automatic launch: argmax_launch's choice, halved while the device
// cannot hold such a cluster.
template <typename T>
int fitting_ctas(int ctas, Stream stream) {
  while (ctas > 1 && !cluster_fits<T>(ctas, stream)) ctas /= 2;
  return ctas;
}

}  // namespace

ArgmaxLaunch argmax_launch(std::int64_t vocab, DType dtype) {
  // One 16-byte vector per thread before another CTA joins: the row is a latency-bound read,
  // so more CTAs (up to the cluster's 8) always won on the H200 (docs/perf.md run 13: 49152 bf16
  // 3.31 us at 8 CTAs vs 4.39 at the 3 a four-vectors-per-thread rule chose; 32768: 2.79 vs 4.36).
  constexpr std::int64_t kBytesPerCta = std::int64_t{kThreads} * kVectorBytes;
  const std::int64_t bytes =
      std::max<std::int64_t>(vocab, 1) * static_cast<std::int64_t>(dtype_size(dtype));
  ArgmaxLaunch l;
  l.threads = kThreads;
  l.ctas_per_row = static_cast<int>(
      std::clamp<std::int64_t>((bytes + kBytesPerCta - 1) / kBytesPerCta, 1, kMaxClusterCtas));
  return l;
}

void argmax(const Tensor& logits, Tensor& ids, const ArgmaxOptions& options) {
  ensure_registered();
  const sampling_checks::ArgmaxShape s = sampling_checks::check_argmax(
      logits, ids, logits.device().is_cuda() ? logits.device() : Device::cuda(), "cuda::argmax");
  if (options.ctas_per_row < 0 || options.ctas_per_row > kMaxClusterCtas)
    fail<ValueError>("cuda::argmax: `ctas_per_row` must be in [0, ", kMaxClusterCtas,
                     "] (0: automatic), got ", options.ctas_per_row);
  if (s.rows == 0) return;
  ArgmaxParams p;
  p.logits = logits.raw_data();
  p.rows = s.rows;
  p.vocab = s.vocab;
  p.row_stride = s.row_stride;
  p.ids = ids.data<int>();
  p.ids_stride = ids.stride(0);
  p.host_mirror = options.host_mirror;
  if (options.mirror_counter != nullptr) {
    if (options.host_mirror == nullptr)
      fail<ValueError>("cuda::argmax: `mirror_counter` needs a `host_mirror` ring");
    if (options.mirror_slots < 1)
      fail<ValueError>("cuda::argmax: `mirror_slots` must be >= 1, got ", options.mirror_slots);
    if (s.rows != 1)
      fail<ValueError>("cuda::argmax: a mirror ring (`mirror_counter`) takes one row, got ", s.rows,
                       " rows");
  }
  p.mirror_counter = options.mirror_counter;
  p.mirror_slots = options.mirror_slots;
  const bool automatic = options.ctas_per_row == 0;
  const int ctas =
      automatic ? argmax_launch(s.vocab, logits.dtype()).ctas_per_row : options.ctas_per_row;
  const Stream stream = current_stream();
  switch (logits.dtype()) {
    case DType::f32:
      return launch<float>(p, automatic ? fitting_ctas<float>(ctas, stream) : ctas, stream);
    case DType::f16:
      return launch<__half>(p, automatic ? fitting_ctas<__half>(ctas, stream) : ctas, stream);
    case DType::bf16:
      return launch<__nv_bfloat16>(p, automatic ? fitting_ctas<__nv_bfloat16>(ctas, stream) : ctas,
                                   stream);
    default:
      SPLICE_INTERNAL_CHECK(false, "argmax of ", dtype_name(logits.dtype()));
  }
}

}  // namespace splice::cuda
