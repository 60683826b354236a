// Thread-block-cluster and mbarrier primitives shared by the kernels that exchange data through
// distributed shared memory (DSMEM): the KDA split kernels' RMSNorm partials and bulk-copy ring
// (kda_decode.cuh), and flash decode's cluster split merge (flash_decode_kernel.cuh); beside them
// the asynchronous copies' L2 cache policies. sm_90+.
//
// The pattern both use, and why: a CTA that hands data to another CTA stores it with st.async
// into the receiver's shared memory, which completes those bytes on the receiver's mbarrier; the
// receiver waits on its own mbarrier (acquire at cluster scope) and reads its own shared memory.
// No cluster barrier and no fence sits on that path: a barrier.cluster.arrive with release
// semantics compiles to a GPU-scope fence (MEMBAR.ALL.GPU on sm_90a), which waits for the acks of
// every global store the CTA has in flight (dev/kda-n1-sass.md, docs/perf.md run 51).
// The only cluster barrier is the split one at entry: every CTA initializes its mbarriers and
// arrives (relaxed); a CTA waits on it before its first access to another CTA's shared memory,
// which needs that CTA running and its barriers initialized.
#pragma once

#include <cstdint>

namespace splice::cuda::detail {

__device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// The shared::cluster address of `local`'s copy in cluster CTA `rank` (mapa).
__device__ __forceinline__ std::uint32_t cluster_addr(const void* local, int rank) {
  std::uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(remote)
               : "r"(smem_addr(local)), "r"(rank));
  return remote;
}

// The split halves of a cluster barrier (see the header): arrive at entry, wait before the first
// access to another CTA's shared memory.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait;" ::: "memory");
}

// `count` consecutive barriers, `arrivals` arrivals per phase each, made visible to the cluster
// (one fence for all of them).
template <int kCount = 1>
__device__ __forceinline__ void mbar_init(std::uint64_t* bars, std::uint32_t arrivals = 1) {
#pragma unroll
  for (int i = 0; i < kCount; ++i)
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bars + i)),
                 "r"(arrivals));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(std::uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
// A relaxed arrival on cluster CTA `rank`'s copy of *bar: a signal that orders no data (a
// release arrival compiles to MEMBAR.ALL.GPU on sm_90a). Use it where what it announces is that
// earlier shared-memory reads, whose values this thread's CTA has already consumed, are done.
__device__ __forceinline__ void mbar_arrive_remote_relaxed(std::uint64_t* bar, int rank) {
  asm volatile(
      "mbarrier.arrive.relaxed.cluster.shared::cluster.b64 _, [%0];" ::"r"(cluster_addr(bar, rank))
      : "memory");
}
// The single arrival of a phase that also expects `bytes` from bulk copies or st.async stores.
__device__ __forceinline__ void mbar_arrive_expect(std::uint64_t* bar, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, std::uint32_t bytes,
                                          std::uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}
// bulk_copy with an L2 cache policy (createpolicy) on its global reads.
__device__ __forceinline__ void bulk_copy_hinted(void* dst, const void* src, std::uint32_t bytes,
                                                 std::uint64_t* bar, std::uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1], %2, [%3], %4;" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(policy)
      : "memory");
}
// An L2 eviction policy for every access that carries it (createpolicy, fraction 1): the lines
// those accesses bring into the L2 are the last (kEvictLast) or the first to be evicted.
template <bool kEvictLast>
__device__ __forceinline__ std::uint64_t l2_evict_policy() {
  std::uint64_t policy;
  if constexpr (kEvictLast)
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  else
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
// An L2 prefetch of `bytes` (a multiple of 16) at `src`: nothing waits for it, and a later read
// of those bytes finds them in L2.
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, std::uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}
// Whether the phase of parity `phase` has completed (no waiting).
__device__ __forceinline__ bool mbar_test(std::uint64_t* bar, std::uint32_t phase) {
  std::uint32_t done = 0;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      " selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(phase)
      : "memory");
  return done != 0;
}
// Until the phase of parity `phase` of *bar has completed. kCluster: acquire at cluster scope,
// so the bytes other CTAs' st.async completed on `bar` (and their accesses before a release
// arrival) are visible after it (the default is the CTA scope of the bulk copies' completions).
template <bool kCluster = false>
__device__ __forceinline__ void mbar_wait(std::uint64_t* bar, std::uint32_t phase) {
  std::uint32_t done = 0;
  while (!done) {
    if constexpr (kCluster)
      asm volatile(
          "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], "
          "%2;\n selp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(smem_addr(bar)), "r"(phase)
          : "memory");
    else
      asm volatile(
          "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
          " selp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(smem_addr(bar)), "r"(phase)
          : "memory");
  }
}
// mbar_wait for a whole warp: its lanes can leave the try_wait loop at different turns, so the
// warp converges before it goes on (an aligned barrier, bar.sync, or a full-mask shuffle after it
// needs every lane).
template <bool kCluster = false>
__device__ __forceinline__ void mbar_wait_warp(std::uint64_t* bar, std::uint32_t phase) {
  mbar_wait<kCluster>(bar, phase);
  __syncwarp();
}
// v into cluster CTA `rank`'s copy of *dst, completing 4 bytes on that CTA's copy of *bar.
__device__ __forceinline__ void st_async_cluster(float* dst, float v, std::uint64_t* bar,
                                                 int rank) {
  const std::uint32_t remote_dst = cluster_addr(dst, rank);
  const std::uint32_t remote_bar = cluster_addr(bar, rank);
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(remote_dst),
      "r"(__float_as_uint(v)), "r"(remote_bar)
      : "memory");
}
// v (16 bytes, `dst` 16-byte aligned) into cluster CTA `rank`'s copy of *dst, completing 16 bytes
// on that CTA's copy of *bar.
__device__ __forceinline__ void st_async_cluster(float4* dst, float4 v, std::uint64_t* bar,
                                                 int rank) {
  const std::uint32_t remote_dst = cluster_addr(dst, rank);
  const std::uint32_t remote_bar = cluster_addr(bar, rank);
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, "
      "[%5];" ::"r"(remote_dst),
      "r"(__float_as_uint(v.x)), "r"(__float_as_uint(v.y)), "r"(__float_as_uint(v.z)),
      "r"(__float_as_uint(v.w)), "r"(remote_bar)
      : "memory");
}

}  // namespace splice::cuda::detail
