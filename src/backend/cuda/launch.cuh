// Programmatic dependent launch (PDL) for the small kernels of a decode step: device-side waits
// and triggers, and one host launcher that sets the stream-serialization attribute.
//
// Why: a decode step is one CUDA graph of hundreds of tiny dependent kernels; without PDL each
// kernel's launch (CTA scheduling, parameter load, ramp-up) starts only after the previous kernel
// has fully drained. With the attribute the next kernel may start while its predecessor still
// runs, so its launch overlaps the predecessor's work; the kernel then blocks in
// griddepcontrol.wait until the predecessor has completed and its writes are visible.
//
// SAFETY RULE (a violation is a silent race, not an error):
//   EVERY kernel launched through launch_kernel (that is, possibly with the attribute) must call
//   wait_for_producers() in every thread before that thread's first global-memory access, read
//   OR write (a dependent that writes early may overwrite a buffer its predecessor still reads),
//   and before any early return (so the grid cannot complete before its producers have).
//   Waiting at the very top is always safe: griddepcontrol.wait returns only once all
//   prerequisite grids have completed and their memory operations are visible. The guarantee is
//   transitive along the stream because every kernel in the chain waits: kernel i completes only
//   after its wait returned, i.e. after kernel i-1 completed, which completed after i-2, ...
//   Kernel parameters (the POD params struct) are not global memory written by a predecessor;
//   index math on them may run before the wait. The one exception to "no global access before
//   the wait" is a read of memory the CALLER promises no kernel in flight writes: gemv's
//   Params::w_constant (model weights), rope_kv_append's position_stable (a session's step
//   scalar and constant tables) and flash_decode's stable_prefix (k_len, and the cache rows below
//   k_len - q_len, which only earlier steps wrote). The promise is made at plan time
//   (exec/node_kernels.h's NodeHints) from the graph; a false promise is a silent race.
//   A second kind needs no promise, because nothing it reads becomes a result: L2 prefetch
//   hints. A kernel may read, before the wait, memory a predecessor may still write, if the
//   loads are L2-only (ld.global.cg: no L1 line outlives the wait for a later load to hit) and
//   their values only choose the addresses of L2 prefetches bounded to a tensor; a prefetch
//   changes nothing any load reads (L2 is the point of coherence), so a stale value costs
//   bandwidth, never a result. KDA decode launched without its stable-state promise prefetches
//   its first items' source states and conv history this way (kda_decode.cuh's
//   prefetch_sources_before_wait).
//   Tests of both kinds make the stale read happen: a predecessor of their own
//   (tests/support/late_copy.h) lets the launch start and writes 50 us later
//   (KdaCuda.PreWaitReadsOfRewrittenMetadata, FlashDecodeCuda.PlainKernelReadsKLenAfterItsWait and
//   .StablePrefixReadsTheRowsItsProducerWrites; builds that break a rule fail them, dev/*mutant*).
//   A kernel launched WITHOUT the attribute (cuBLASLt, a kernel of another file launched with
//   <<<>>>) is fully serialized behind its predecessor and needs no wait; a kernel launched WITH
//   the attribute that does not wait breaks the chain for everything after it.
//
// Triggers: allow_dependents() (griddepcontrol.launch_dependents) lets the NEXT kernel's CTAs be
// scheduled once every CTA of this grid has triggered or exited; they then sit in their own wait.
// Correctness never depends on it (without it the trigger is implicit at exit). The kernels here
// trigger right after their own wait, and only when the grid fits in one wave
// (allow_dependents_if_single_wave): then every CTA is resident at once and the next kernel is
// resident and waiting by the time this one ends, while at most one kernel ahead is in flight
// (triggering before the wait let a chain of tiny kernels cascade: each launched the next before
// its own producer finished: on the SmolLM2-shaped model PDL then cost 10% over no PDL at all;
// triggering after the wait it saves 11%, docs/perf.md runs 10 and 12). A multi-wave grid does
// not trigger, so waiting dependents never occupy SM slots while its later waves are still
// queued. Two exceptions trigger first thing: rope_kv_append (and the fused q|k|v kernel) when
// its dependent is flash decode under the stable-prefix promise (a plan-time hint, NodeHints::
// trigger_dependents_first), whose K/V loads before its wait then overlap the q|k|v projection;
// and gemv's row_kernel (always one wave), whose dependents then issue their constant weights
// while it works. The cascade that lost in run 10 stops at the next kernel that triggers after
// its wait (flash decode); with today's pre-wait weight loads the row kernels' early trigger
// wins 11-20 us per SmolLM2-shaped token (docs/perf.md run 35). One exception triggers late:
// flash decode's long-range cluster grid (FlashDecodePlan::trigger), where a next cluster grid
// launched early finds room for all but one of its clusters (docs/perf.md runs 77, 98-100): up
// to 16K keys its split 0 triggers once every peer's partial has landed (the peers have
// exited), beyond that every CTA at exit.

// Host switch: SPLICE_PDL=0 in the environment (read once, at the first launch) launches every
// kernel here without the attribute; set_pdl_enabled() overrides it (tests, A/B benchmarks). The
// attribute is never set on the legacy default stream (nullptr), whose implicit synchronization
// with other streams PDL would only muddle. Stream capture records the attribute as a
// programmatic edge, so captured graphs keep the overlap; the state is read when a launch is
// issued (or captured), not when a graph replays.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstring>
#include <utility>

#include "backend/cuda/check.h"
#include "splice/backend/cuda/kernel_stamps.h"
#include "splice/backend/cuda/runtime.h"

namespace splice::cuda {

// pdl_enabled() / set_pdl_enabled() (runtime.h, defined in primitives.cu) decide whether
// launch_kernel sets the PDL attribute.

#ifdef SPLICE_KERNEL_STAMPS
// kernel_stamps.h: this translation unit's pointer to the stamp ring. Each .cu is a module of its
// own (no relocatable device code), so each has its own copy; kernel_stamps::start() sets them
// all through the setter each unit registers at static initialization.
namespace kernel_stamps {
namespace {
struct Ring {
  Stamp* slots;
  std::uint64_t mask;  // capacity - 1
};
// A dev tool may build with SPLICE_KERNEL_STAMPS_CYCLES as well (dev/tile_cycles): a stamp then
// holds the multiprocessor's %clock64 instead of %globaltimer (exact cycles, comparable only
// within one CTA), stored with st.global.
#ifdef SPLICE_KERNEL_STAMPS_CYCLES
#define SPLICE_STAMP_TIMER "%%clock64"
#else
#define SPLICE_STAMP_TIMER "%%globaltimer"
#endif
__device__ Ring g_ring = {nullptr, 0};
void set_ring(Stamp* slots, std::uint64_t mask) {
  const Ring ring{slots, mask};
  SPLICE_CUDA_CHECK(cudaMemcpyToSymbol(g_ring, &ring, sizeof ring));
}
[[maybe_unused]] const bool g_unit_registered = (register_unit(&set_ring), true);

// The ring as thread 0 of CTA (0, 0, 0) sees it, read before the wait (the host wrote it before
// any launch: no predecessor writes it); nullptr elsewhere. A dev tool may build with
// SPLICE_KERNEL_STAMPS_EVERY_CTA as well (dev/flash_timeline): thread 0 of every CTA then stamps,
// into slot ((grid_id * kEveryCtaSlots + cta) * kMarks + mark) mod capacity, and the stamp's mark
// field carries the CTA's linear index (bits 8-19) and SM id (bits 20-27) above the mark.
#ifdef SPLICE_KERNEL_STAMPS_EVERY_CTA
inline constexpr std::uint64_t kEveryCtaSlots = 4096;
__device__ __forceinline__ std::uint32_t linear_cta() {
  return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
}
#endif
__device__ __forceinline__ Ring ring_if_first_thread() {
#ifdef SPLICE_KERNEL_STAMPS_EVERY_CTA
  const bool first = (threadIdx.x | threadIdx.y | threadIdx.z) == 0;
#else
  const bool first =
      (threadIdx.x | threadIdx.y | threadIdx.z | blockIdx.x | blockIdx.y | blockIdx.z) == 0;
#endif
  return first ? g_ring : Ring{nullptr, 0};
}
// One stamp into its slot, with global stores (st.global.cg): a generic store would also have to
// be ordered against the thread's later shared-memory accesses.
__device__ __forceinline__ void put(const Ring& ring, std::uint64_t grid_id, std::uint64_t ns,
                                    std::uint32_t mark) {
#ifdef SPLICE_KERNEL_STAMPS_EVERY_CTA
  const std::uint32_t cta = linear_cta();
  std::uint32_t sm = 0;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  Stamp* slot = ring.slots + (((grid_id * kEveryCtaSlots + cta) * kMarks + mark) & ring.mask);
  mark |= (cta & 0xfffu) << 8 | (sm & 0xffu) << 20;
#else
  Stamp* slot = ring.slots + ((grid_id * kMarks + mark) & ring.mask);
#endif
  __stcg(reinterpret_cast<unsigned long long*>(&slot->grid_id), grid_id);
  __stcg(reinterpret_cast<unsigned long long*>(&slot->ns), ns);
  __stcg(&slot->mark, mark);
}
// A stamps-build-only exception to launch.cuh's rule: the arrival stamp is a store before the
// wait, into a slot of this grid's own (no predecessor reads or writes it).
__device__ __forceinline__ void stamp(const Ring& ring, std::uint32_t mark) {
  if (ring.slots == nullptr) return;
  std::uint64_t grid_id = 0, ns = 0;
  asm volatile("mov.u64 %0, %%gridid;" : "=l"(grid_id));
  asm volatile("mov.u64 %0, " SPLICE_STAMP_TIMER ";" : "=l"(ns));
  put(ring, grid_id, ns, mark);
}
// stamp(), with the timer read predicated on `value`, so it waits until `value` exists (an mma
// or load result the mark times; a plain timer read would issue before it lands).
__device__ __forceinline__ void stamp_after(const Ring& ring, std::uint32_t mark, float value) {
  if (ring.slots == nullptr) return;
  std::uint64_t grid_id = 0, ns = 0;
  asm volatile("mov.u64 %0, %%gridid;" : "=l"(grid_id));
  asm volatile(
      "{\n.reg .pred nan;\nsetp.nan.f32 nan, %1, %1;\n@nan mov.u64 %0, 0;\n"
      "@!nan mov.u64 %0, " SPLICE_STAMP_TIMER ";\n}\n"
      : "=l"(ns)
      : "f"(value));
  put(ring, grid_id, ns, mark);
}
}  // namespace
}  // namespace kernel_stamps
#endif

namespace detail {

// griddepcontrol.wait: blocks until every prerequisite grid has completed and its memory is
// visible; returns at once when this grid was launched without the PDL attribute. In a
// SPLICE_KERNEL_STAMPS build, CTA 0's thread 0 then stamps the grid (kernel_stamps.h).
__device__ __forceinline__ void wait_for_producers() {
#ifdef SPLICE_KERNEL_STAMPS
  const kernel_stamps::Ring ring = kernel_stamps::ring_if_first_thread();
  kernel_stamps::stamp(ring, kernel_stamps::kArrival);
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
#ifdef SPLICE_KERNEL_STAMPS
  kernel_stamps::stamp(ring, kernel_stamps::kWaitReturn);
#endif
}

// Kernel-specific stage stamps (kernel_stamps.h: kFirstKernelMark <= mark < kMarks): create one
// at the kernel's start (it reads the ring pointer then, so a mark costs no round trip later) and
// call mark() after the wait; in a build without SPLICE_KERNEL_STAMPS both are empty.
struct StageStamps {
#ifdef SPLICE_KERNEL_STAMPS
  kernel_stamps::Ring ring = kernel_stamps::ring_if_first_thread();
  __device__ __forceinline__ void mark(unsigned m) const { kernel_stamps::stamp(ring, m); }
  // The mark once `value` exists (a NaN value records 0: no stamp).
  __device__ __forceinline__ void mark_after(float value, unsigned m) const {
    kernel_stamps::stamp_after(ring, m, value);
  }
#else
  __device__ __forceinline__ void mark(unsigned) const {}
  __device__ __forceinline__ void mark_after(float, unsigned) const {}
#endif
};

// griddepcontrol.launch_dependents: this CTA no longer holds back the next kernel's launch.
__device__ __forceinline__ void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// allow_dependents() when the grid has at most one CTA per SM identifier (%nsmid, an upper bound
// on the SM count): every kernel here uses <= 1024 threads and no large shared memory, so such a
// grid is resident in one wave.
__device__ __forceinline__ void allow_dependents_if_single_wave() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned sm_ids = 0;
  asm("mov.u32 %0, %%nsmid;" : "=r"(sm_ids));
  const unsigned long long ctas =
      static_cast<unsigned long long>(gridDim.x) * gridDim.y * gridDim.z;
  if (ctas <= sm_ids) allow_dependents();
#endif
}

// The first statement of every kernel here: wait for the producer, then trigger (single-wave grids
// only); both are no-ops for a launch without the attribute.
__device__ __forceinline__ void pdl_prologue() {
  wait_for_producers();
  allow_dependents_if_single_wave();
}

// A plain 2- or 4-byte global load issued where it stands (volatile asm keeps program order):
// after the wait, loads that do not depend on each other go out together, even where the compiler
// would otherwise issue one only after another load's first use (seen in SASS: rope and
// rope_kv_append's x pair waited for the position's round trip).
template <typename T>
__device__ __forceinline__ T load_in_order(const T* ptr) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4);
  T value;
  if constexpr (sizeof(T) == 2) {
    unsigned short bits;
    asm volatile("ld.global.b16 %0, [%1];" : "=h"(bits) : "l"(ptr));
    memcpy(&value, &bits, sizeof(T));
  } else {
    unsigned bits;
    asm volatile("ld.global.b32 %0, [%1];" : "=r"(bits) : "l"(ptr));
    memcpy(&value, &bits, sizeof(T));
  }
  return value;
}

// The shape of one launch: grid x block, dynamic shared memory, and thread-block clusters of
// `cluster` CTAs when that holds more than one (an unsigned n is (n, 1, 1)).
struct LaunchShape {
  dim3 grid;
  dim3 block;
  std::size_t smem = 0;
  dim3 cluster{1, 1, 1};
  // Ask the scheduler to spread a cluster's CTAs over the SMs of its GPC instead of packing them
  // (cudaClusterSchedulingPolicySpread).
  bool cluster_spread = false;
  // The kernel's shared-memory carveout preference in percent, where it departs from the
  // carveout rule below (-1: the rule's). One value per kernel: set at its first launch.
  int carveout = -1;
};

// The one launcher every kernel here goes through: launches `kernel` on `stream` with `shape`,
// with the PDL attribute when pdl_enabled() and the stream is not the legacy default stream;
// every runtime error is raised as a CudaError (check.h). The kernel must obey the safety rule
// above.
// The carveout rule: every kernel launched here prefers the largest shared-memory carveout
// (cudaFuncAttributePreferredSharedMemoryCarveout, set once per kernel; primitives.cu). An SM
// runs its resident CTAs under one L1 / shared-memory split, and a CTA that needs more shared
// memory than an SM's current split allows waits until that SM drains to be reconfigured; with
// one preference for every kernel of a step, flash decode's CTAs (66-196 KB) become resident
// while their producer still runs, as PDL intends. The GEMVs give up L1 they barely use (weights
// bypass it). SPLICE_SMEM_CARVEOUT=<percent> overrides the preference, -1 leaves the driver's
// default (A/B tests: docs/perf.md runs 43-44). A kernel whose LaunchShape names a carveout
// departs from the rule (`rows` with bf16 state: perf.md runs 312, 315).
void prefer_smem_carveout(const void* kernel, int percent = -1);

template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), const LaunchShape& shape, Stream stream,
                   Args&&... args) {
  prefer_smem_carveout(reinterpret_cast<const void*>(kernel), shape.carveout);
  cudaLaunchConfig_t config{};
  config.gridDim = shape.grid;
  config.blockDim = shape.block;
  config.dynamicSmemBytes = shape.smem;
  config.stream = stream;
  cudaLaunchAttribute attributes[3]{};
  unsigned count = 0;
  if (shape.cluster.x * shape.cluster.y * shape.cluster.z > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count].val.clusterDim.x = shape.cluster.x;
    attributes[count].val.clusterDim.y = shape.cluster.y;
    attributes[count].val.clusterDim.z = shape.cluster.z;
    ++count;
    if (shape.cluster_spread) {
      attributes[count].id = cudaLaunchAttributeClusterSchedulingPolicyPreference;
      attributes[count].val.clusterSchedulingPolicyPreference = cudaClusterSchedulingPolicySpread;
      ++count;
    }
  }
  if (stream != nullptr && pdl_enabled()) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  config.attrs = count > 0 ? attributes : nullptr;
  config.numAttrs = count;
  SPLICE_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
  SPLICE_CUDA_CHECK(cudaGetLastError());
#ifdef SPLICE_KERNEL_STAMPS
  kernel_stamps::note_launch(reinterpret_cast<const void*>(kernel), stream);
#endif
}

// The common case: grid x block, no dynamic shared memory, no clusters.
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, Stream stream,
                   Args&&... args) {
  launch_kernel(kernel, LaunchShape{grid, block}, stream, std::forward<Args>(args)...);
}

}  // namespace detail
}  // namespace splice::cuda
