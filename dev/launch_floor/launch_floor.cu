// dev/launch_floor/launch_floor.cu: what a kernel that only moves bytes reaches at the sizes of
// the open decode targets, under CUDA-graph replay of back-to-back launches (issues 5 and 6).
//
// The floors of both issues divide bytes by a large-transfer ceiling (copy 4.24 TB/s, read
// 4.48 TB/s; design.md §4). A launch of a few hundred MB also pays a ramp (launch hand-off, the
// first requests' latency) and a drain (the last CTA's bytes), which that ceiling does not see.
// This measures them with nothing else in the kernel:
//   memcpy   cudaMemcpyAsync device to device (the driver's copy kernel);
//   grid     a copy of 16-byte streaming loads / stores, 4 x SMs CTAs of 256 threads, 4 vectors
//            in flight per thread, grid stride (dev/mem_mix's copy);
//   items    KDA's stream-kernel structure with no math: one persistent CTA of 256 threads per SM
//            walks items w = blockIdx.x + k * gridDim.x (a bf16 state: 32 KB, fp32: 64 KB) through
//            a ring of 3 shared-memory stages filled by one bulk copy each (mbarrier), and writes
//            each item back with 16-byte stores from shared memory (the checkpoint);
//            `items early` issues the ring's first copies before the PDL wait (KDA's stable-state
//            promise), `items` after it;
//   read     16-byte loads only (8 in flight per thread), G CTAs of 256 threads, each a
//            contiguous share: flash decode's B = 1 K/V stream on 64 SMs (its plan) or more.
// Every kernel waits for its predecessor (griddepcontrol.wait) and lets its successor launch at
// entry (PDL). Each case is one graph of `launches` launches over rotating buffer sets (>= 512 MB
// touched per replay, so the 50 MB L2 does not flatter), warmed for 50 ms, then 20 timed
// replays: time per launch = median replay / launches.
// Other modes: `variants` (copy kernels' load / store kinds, grid stride or contiguous shares,
// CTAs per SM; item_copy's write-back as plain, .cs, evict_first or one bulk store, rings of 3
// or 4), `mix` (item_copy writing each item 1, 2, 4 or 8 times: KDA's T checkpoints a state
// read), `reads` (flash decode's B = 1 K/V stream as bulk copies, up to 192 KB a CTA in flight)
// and `ncu` (each copy once, eagerly, for Nsight Compute: it showed the graph's
// cudaMemcpyAsync to run on the copy engines, not as a kernel). Results: docs/perf.md runs 247-253.
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -Isrc \
//        -o .gpubin/launch_floor dev/launch_floor/launch_floor.cu
//   .gpubin/launch_floor [floor | variants | mix | reads | ncu]      (a few seconds each)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "../../bench/cuda/bench_util.cuh"  // time_replays: the benches' graph timer
#include "../experiment_util.cuh"           // CHECK, pdl_wait / pdl_trigger, launch_pdl
#include "backend/cuda/cluster.cuh"         // mbarrier and bulk-copy primitives

namespace {

using experiment::launch_pdl;
using experiment::pdl_trigger;
using experiment::pdl_wait;
using splice::cuda::detail::bulk_copy;
using splice::cuda::detail::mbar_arrive_expect;
using splice::cuda::detail::mbar_init;
using splice::cuda::detail::mbar_wait;

constexpr int kThreads = 256;
constexpr int kStages = 3;

// copy: vectors [0, n) of src to dst, 4 independent vectors per thread and step.
__global__ void __launch_bounds__(kThreads)
    grid_copy(const uint4* __restrict__ src, uint4* __restrict__ dst, std::size_t n) {
  pdl_trigger();
  pdl_wait();
  constexpr int kUnroll = 4;
  const std::size_t step = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i0 = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i0 < n;
       i0 += step * kUnroll) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::size_t i = i0 + u * step;
      v[u] = i < n ? __ldcs(src + i) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::size_t i = i0 + u * step;
      if (i < n) __stcs(dst + i, v[u]);
    }
  }
}

// The items kernels' ring: this CTA's k-th item w = blockIdx.x + k gridDim.x (of n_items, each
// item_bytes, a multiple of 16 * kThreads) in stage k % kRing, copied by one bulk copy that
// completes on full[k % kRing] (issued by thread 0).
// A 16-byte global store under an L2 cache policy (createpolicy), as KDA's checkpoint stores.
__device__ __forceinline__ void store_hinted(uint4* dst, uint4 v, std::uint64_t policy) {
  asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(dst), "r"(v.x),
               "r"(v.y), "r"(v.z), "r"(v.w), "l"(policy)
               : "memory");
}

template <int kRing>
struct ItemRing {
  unsigned char* ring;  // [kRing][item_bytes], shared memory
  std::uint64_t* full;  // [kRing] mbarriers, initialized
  const unsigned char* src;
  int n_items, item_bytes;
  __device__ int item(int k) const { return blockIdx.x + k * gridDim.x; }
  __device__ unsigned char* stage(int k) const { return ring + (k % kRing) * item_bytes; }
  __device__ void wait(int k) const { mbar_wait(&full[k % kRing], (k / kRing) & 1); }
  // Every thread: the barriers initialized, then the first kRing items issued (thread 0) after
  // the PDL wait, or before it with `early` (the stable-state promise's order).
  template <bool kEvictLast = false>
  __device__ void start(bool early = false) const {
    if (threadIdx.x == 0) mbar_init<kRing>(full);
    __syncthreads();
    if (!early) pdl_wait();
    if (threadIdx.x == 0)
      for (int k = 0; k < kRing; ++k) issue<kEvictLast>(k);
    if (early) pdl_wait();
  }
  // Item k's copy, its reads under an L2 evict_last policy when kEvictLast.
  template <bool kEvictLast = false>
  __device__ void issue(int k) const {
    const int w = item(k);
    if (w >= n_items) return;
    std::uint64_t* bar = &full[k % kRing];
    mbar_arrive_expect(bar, static_cast<std::uint32_t>(item_bytes));
    const unsigned char* from = src + static_cast<std::size_t>(w) * item_bytes;
    if constexpr (kEvictLast)
      splice::cuda::detail::bulk_copy_hinted(stage(k), from, item_bytes, bar,
                                             splice::cuda::detail::l2_evict_policy<true>());
    else
      bulk_copy(stage(k), from, item_bytes, bar);
  }
};

// items: item w of `item_bytes` (a multiple of 16 * kThreads) from src to dst through the ring.
__global__ void __launch_bounds__(kThreads)
    item_copy(const unsigned char* __restrict__ src, unsigned char* __restrict__ dst, int n_items,
              int item_bytes, int early) {
  extern __shared__ __align__(128) unsigned char ring[];  // [kStages][item_bytes]
  __shared__ std::uint64_t full[kStages];
  pdl_trigger();
  const int tid = threadIdx.x;
  const ItemRing<kStages> r{ring, full, src, n_items, item_bytes};
  r.start(early != 0);
  const int vecs = item_bytes / 16;
  for (int k = 0; r.item(k) < n_items; ++k) {
    r.wait(k);
    const uint4* stage = reinterpret_cast<const uint4*>(r.stage(k));
    uint4* out = reinterpret_cast<uint4*>(dst + static_cast<std::size_t>(r.item(k)) * item_bytes);
#pragma unroll 8
    for (int i = tid; i < vecs; i += kThreads) out[i] = stage[i];
    __syncthreads();  // the stage is read: refill it
    if (tid == 0) r.issue(k + kStages);
  }
}

// read: CTA c reads vectors [c * share, (c + 1) * share) of src, 8 in flight per thread.
__global__ void __launch_bounds__(kThreads)
    grid_read(const uint4* __restrict__ src, std::size_t share, unsigned* sink) {
  pdl_trigger();
  pdl_wait();
  constexpr int kUnroll = 8;
  const uint4* base = src + blockIdx.x * share;
  unsigned acc = 0;
  for (std::size_t i0 = threadIdx.x; i0 < share; i0 += kThreads * kUnroll) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::size_t i = i0 + u * kThreads;
      v[u] = i < share ? __ldcs(base + i) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x12345678u) *sink = acc;  // keeps the loads
}

// Copy variants (mode `variants`): what the driver's copy does that grid_copy and item_copy do
// not. kLoad: 0 ld.global.cs, 1 ld.global.nc, 2 ld.global.cg; kStore: 0 st.global.cs, 1 plain
// st.global, 2 st.global.cg; kChunked: CTA c copies the contiguous range [c n / G, (c + 1) n / G)
// (else grid stride).
template <int kUnroll, int kLoad, int kStore, bool kChunked>
__global__ void __launch_bounds__(kThreads)
    copy_variant(const uint4* __restrict__ src, uint4* __restrict__ dst, std::size_t n) {
  pdl_trigger();
  pdl_wait();
  std::size_t begin = 0, end = n, first, step;
  if constexpr (kChunked) {
    begin = n * blockIdx.x / gridDim.x;
    end = n * (blockIdx.x + 1) / gridDim.x;
    first = begin + threadIdx.x;
    step = blockDim.x;
  } else {
    first = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
    step = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  }
  for (std::size_t i0 = first; i0 < end; i0 += step * kUnroll) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::size_t i = i0 + u * step;
      if (i >= end) continue;
      if constexpr (kLoad == 0)
        v[u] = __ldcs(src + i);
      else if constexpr (kLoad == 1)
        v[u] = __ldg(src + i);
      else
        v[u] = __ldcg(src + i);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::size_t i = i0 + u * step;
      if (i >= end) continue;
      if constexpr (kStore == 0)
        __stcs(dst + i, v[u]);
      else if constexpr (kStore == 1)
        dst[i] = v[u];
      else
        __stcg(dst + i, v[u]);
    }
  }
}

// item_copy's structure with the write-back as kStore: 0 plain st.global, 1 st.global.cs, 2 with
// an L2 evict_first policy (KDA's checkpoint stores at N >= 128), 3 one bulk store per item
// (cp.async.bulk global <- shared, thread 0; the stage is refilled once the store has read it).
template <int kStore, int kRing>
__global__ void __launch_bounds__(kThreads)
    item_variant(const unsigned char* __restrict__ src, unsigned char* __restrict__ dst,
                 int n_items, int item_bytes) {
  extern __shared__ __align__(128) unsigned char ring[];  // [kRing][item_bytes]
  __shared__ std::uint64_t full[kRing];
  pdl_trigger();
  const int tid = threadIdx.x;
  const ItemRing<kRing> r{ring, full, src, n_items, item_bytes};
  r.start();
  const int vecs = item_bytes / 16;
  const std::uint64_t policy = splice::cuda::detail::l2_evict_policy<false>();
  for (int k = 0; r.item(k) < n_items; ++k) {
    unsigned char* stage = r.stage(k);
    unsigned char* out = dst + static_cast<std::size_t>(r.item(k)) * item_bytes;
    if constexpr (kStore == 3) {
      if (tid == 0) {
        r.wait(k);
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(out),
                     "r"(splice::cuda::detail::smem_addr(stage)), "r"(item_bytes)
                     : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
        r.issue(k + kRing);
      }
      continue;
    }
    r.wait(k);
    const uint4* in = reinterpret_cast<const uint4*>(stage);
    uint4* o = reinterpret_cast<uint4*>(out);
#pragma unroll 8
    for (int i = tid; i < vecs; i += kThreads) {
      if constexpr (kStore == 0)
        o[i] = in[i];
      else if constexpr (kStore == 1)
        __stcs(o + i, in[i]);
      else
        store_hinted(o + i, in[i], policy);
    }
    __syncthreads();
    if (tid == 0) r.issue(k + kRing);
  }
  if constexpr (kStore == 3) {
    if (tid == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  }
}

// Mode `mix`: item_copy's structure writing each item to kWrites destinations (KDA at T tokens
// writes T checkpoints per source state read), stores with an L2 evict_first policy and, with
// kEvictLastReads, the reads with an evict_last one (KDA's state traffic at N >= 128); the
// item's j-th copy goes to dst + (j n_items + w) item_bytes.
template <int kWrites, bool kEvictLastReads>
__global__ void __launch_bounds__(kThreads)
    item_mix(const unsigned char* __restrict__ src, unsigned char* __restrict__ dst, int n_items,
             int item_bytes) {
  extern __shared__ __align__(128) unsigned char ring[];  // [kStages][item_bytes]
  __shared__ std::uint64_t full[kStages];
  pdl_trigger();
  const int tid = threadIdx.x;
  const ItemRing<kStages> r{ring, full, src, n_items, item_bytes};
  r.template start<kEvictLastReads>();
  const int vecs = item_bytes / 16;
  const std::uint64_t policy = splice::cuda::detail::l2_evict_policy<false>();
  for (int k = 0; r.item(k) < n_items; ++k) {
    r.wait(k);
    const uint4* in = reinterpret_cast<const uint4*>(r.stage(k));
#pragma unroll
    for (int j = 0; j < kWrites; ++j) {
      uint4* o = reinterpret_cast<uint4*>(
          dst + (static_cast<std::size_t>(j) * n_items + r.item(k)) * item_bytes);
#pragma unroll 8
      for (int i = tid; i < vecs; i += kThreads) store_hinted(o + i, in[i], policy);
    }
    __syncthreads();
    if (tid == 0) r.template issue<kEvictLastReads>(k + kStages);
  }
}

// Mode `reads`: flash decode's B = 1 stream without its math: CTA c reads its contiguous share
// of `tiles` 8 KB tiles (a 16-key K + V tile at head_dim 128) through a ring of kReadStages bulk
// copies (thread 0 issues; a tile's stage is refilled as soon as it has landed), so up to
// kReadStages x 8 KB are in flight per CTA (flash decode's 8 warps x 3 stages: 192 KB).
constexpr int kReadStages = 24;
constexpr int kTileBytes = 8192;
__global__ void __launch_bounds__(kThreads)
    bulk_read(const unsigned char* __restrict__ src, int tiles_per_cta, unsigned* sink) {
  extern __shared__ __align__(128) unsigned char ring[];  // [kReadStages][kTileBytes]
  __shared__ std::uint64_t full[kReadStages];
  pdl_trigger();
  if (threadIdx.x == 0) mbar_init<kReadStages>(full);
  __syncthreads();
  if (threadIdx.x != 0) return;
  const unsigned char* base =
      src + static_cast<std::size_t>(blockIdx.x) * tiles_per_cta * kTileBytes;
  auto issue = [&](int t) {
    std::uint64_t* bar = &full[t % kReadStages];
    mbar_arrive_expect(bar, kTileBytes);
    bulk_copy(ring + (t % kReadStages) * kTileBytes,
              base + static_cast<std::size_t>(t) * kTileBytes, kTileBytes, bar);
  };
  pdl_wait();
  for (int t = 0; t < kReadStages && t < tiles_per_cta; ++t) issue(t);
  unsigned acc = 0;
  for (int t = 0; t < tiles_per_cta; ++t) {
    mbar_wait(&full[t % kReadStages], (t / kReadStages) & 1);
    acc ^= ring[(t % kReadStages) * kTileBytes];
    if (t + kReadStages < tiles_per_cta) issue(t + kReadStages);
  }
  if (acc == 0x12345678u) *sink = acc;
}

// Median us per launch of `launches` calls of enqueue(stream, set) captured in one graph, timed
// by the benches' own replay timer (3 warm-up replays, then >= 50 ms of them, 20 timed).
double time_per_launch(const std::function<void(cudaStream_t, int)>& enqueue, int launches,
                       int sets) {
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < launches; ++i) enqueue(stream, i % sets);
  CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const double us = splice::bench::time_replays(exec, stream, 3, 20, launches, 50.0).median_us;
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaStreamDestroy(stream));
  return us;
}

void row(const std::string& name, double bytes, double us, double ceiling) {
  const double tbs = bytes / (us * 1e-6) / 1e12;
  std::printf("%-34s %9.1f %10.2f %7.2f %6.1f%% %9.2f\n", name.c_str(), bytes / 1e6, us, tbs,
              100.0 * tbs * 1e12 / ceiling, 1e6 * bytes / ceiling);
}

}  // namespace

// Mode `variants`: the copy variants beside memcpy at bf16 N = 128 and 512.
void run_variants(unsigned char* src, unsigned char* dst, std::size_t pool, int sms) {
  constexpr double kCopy = 4.24e12;
  using CopyFn = void (*)(const uint4*, uint4*, std::size_t);
  struct Variant {
    const char* name;
    CopyFn fn;
    int ctas_per_sm;
  };
  const Variant copies[] = {
      {"grid u4 cs/cs", copy_variant<4, 0, 0, false>, 4},
      {"grid u4 cs/cs chunked", copy_variant<4, 0, 0, true>, 4},
      {"grid u8 cs/cs", copy_variant<8, 0, 0, false>, 4},
      {"grid u8 nc/plain", copy_variant<8, 1, 1, false>, 4},
      {"grid u8 cg/cg", copy_variant<8, 2, 2, false>, 4},
      {"grid u8 nc/plain chunked", copy_variant<8, 1, 1, true>, 4},
      {"grid u8 nc/plain 8/SM", copy_variant<8, 1, 1, false>, 8},
      {"grid u16 nc/plain chunked", copy_variant<16, 1, 1, true>, 4},
      {"grid u4 nc/plain 8/SM", copy_variant<4, 1, 1, false>, 8},
  };
  using ItemFn = void (*)(const unsigned char*, unsigned char*, int, int);
  struct ItemVariant {
    const char* name;
    ItemFn fn;
    int ring;
  };
  const ItemVariant item_variants[] = {
      {"items plain", item_variant<0, 3>, 3},
      {"items cs", item_variant<1, 3>, 3},
      {"items evict_first", item_variant<2, 3>, 3},
      {"items bulk store", item_variant<3, 3>, 3},
      {"items plain ring 4", item_variant<0, 4>, 4},
      {"items bulk store ring 4", item_variant<3, 4>, 4},
  };
  for (const ItemVariant& v : item_variants)
    CHECK(cudaFuncSetAttribute(v.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, 4 * 32768));
  const int items_of[] = {4096, 16384};
  for (int items : items_of) {
    const std::size_t bytes = static_cast<std::size_t>(items) * 32768;
    const int sets = static_cast<int>(std::min(pool / bytes, (std::size_t{512} << 20) / bytes + 1));
    const double moved = 2.0 * bytes;
    std::printf("-- bf16 N=%d (%d items of 32 KB), %d sets\n", items / 32, items, sets);
    row("memcpy", moved,
        time_per_launch(
            [&](cudaStream_t s, int set) {
              CHECK(cudaMemcpyAsync(dst + set * bytes, src + set * bytes, bytes,
                                    cudaMemcpyDeviceToDevice, s));
            },
            2 * sets, sets),
        kCopy);
    for (const Variant& v : copies)
      row(v.name, moved,
          time_per_launch(
              [&](cudaStream_t s, int set) {
                launch_pdl(v.fn, v.ctas_per_sm * sms, kThreads, 0, s,
                           reinterpret_cast<const uint4*>(src + set * bytes),
                           reinterpret_cast<uint4*>(dst + set * bytes), bytes / 16);
              },
              2 * sets, sets),
          kCopy);
    for (const ItemVariant& v : item_variants)
      row(v.name, moved,
          time_per_launch(
              [&](cudaStream_t s, int set) {
                launch_pdl(v.fn, sms, kThreads, v.ring * 32768, s, src + set * bytes,
                           dst + set * bytes, items, 32768);
              },
              2 * sets, sets),
          kCopy);
  }
}

// Mode `mix`: item_mix at 1, 2, 4 and 8 writes an item, bf16 N = 32 / 128 / 256 / 512.
void run_mix(unsigned char* src, unsigned char* dst, std::size_t pool, std::size_t dst_pool,
             int sms) {
  constexpr double kCopy = 4.24e12;
  using ItemFn = void (*)(const unsigned char*, unsigned char*, int, int);
  const ItemFn fns[] = {item_mix<1, false>, item_mix<2, false>, item_mix<4, false>,
                        item_mix<8, false>, item_mix<1, true>,  item_mix<2, true>,
                        item_mix<4, true>,  item_mix<8, true>};
  const int writes[] = {1, 2, 4, 8, 1, 2, 4, 8};
  for (ItemFn f : fns)
    CHECK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, kStages * 32768));
  const int items_of[] = {1024, 4096, 8192, 16384};
  for (int items : items_of) {
    const std::size_t bytes = static_cast<std::size_t>(items) * 32768;
    for (int v = 0; v < 8; ++v) {
      const std::size_t out = writes[v] * bytes;
      const int sets = static_cast<int>(std::max<std::size_t>(
          1, std::min({pool / bytes, dst_pool / out, (std::size_t{512} << 20) / bytes + 1})));
      char name[64];
      std::snprintf(name, sizeof name, "bf16 N=%d, 1 read%s : %d writes", items / 32,
                    v >= 4 ? " (evict_last)" : "", writes[v]);
      row(name, static_cast<double>(bytes + out),
          time_per_launch(
              [&](cudaStream_t s, int set) {
                launch_pdl(fns[v], sms, kThreads, kStages * 32768, s, src + set * bytes,
                           dst + set * out, items, 32768);
              },
              std::max(2, sets), sets),
          kCopy);
    }
  }
}

// Mode `reads`: bulk_read at flash decode's B = 1 (32, 8) K/V sizes on 64-264 CTAs.
void run_reads(unsigned char* src, std::size_t pool, unsigned* sink, int sms) {
  constexpr double kRead = 4.48e12;
  CHECK(cudaFuncSetAttribute(bulk_read, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kReadStages * kTileBytes));
  const int keys_of[] = {1024, 4096, 16384};
  const int ctas[] = {64, 128, sms};
  for (int keys : keys_of) {
    const std::size_t bytes = static_cast<std::size_t>(keys) * 8 * 512;  // 8 kv heads, K + V
    const int sets = static_cast<int>(std::min(pool / bytes, (std::size_t{512} << 20) / bytes + 1));
    for (int g : ctas) {
      const int tiles = static_cast<int>(bytes / kTileBytes / g);
      char name[64];
      std::snprintf(name, sizeof name, "bulk read %dK keys, %d CTAs", keys / 1024, g);
      row(name, static_cast<double>(tiles) * kTileBytes * g,
          time_per_launch(
              [&](cudaStream_t s, int set) {
                launch_pdl(bulk_read, g, kThreads, kReadStages * kTileBytes, s,
                           static_cast<const unsigned char*>(src + set * bytes), tiles, sink);
              },
              std::max(2, sets), sets),
          kRead);
    }
  }
}

// Mode `ncu`: each copy once, eagerly, for a profiler (bf16 N = 128's 134 MB).
void run_once(unsigned char* src, unsigned char* dst, int sms) {
  const std::size_t bytes = std::size_t{4096} * 32768;
  for (int i = 0; i < 2; ++i)
    CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, nullptr));
  launch_pdl(grid_copy, 4 * sms, kThreads, 0, nullptr, reinterpret_cast<const uint4*>(src),
             reinterpret_cast<uint4*>(dst), bytes / 16);
  launch_pdl(item_copy, sms, kThreads, kStages * 32768, nullptr,
             static_cast<const unsigned char*>(src), dst, 4096, 32768, 0);
  CHECK(cudaDeviceSynchronize());
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "floor";
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  constexpr double kCopy = 4.24e12, kRead = 4.48e12;  // design.md §4 ceilings, bytes/s
  const std::size_t pool = std::size_t{2} << 30;      // 2 GiB each for sources and destinations
  unsigned char *src = nullptr, *dst = nullptr;
  unsigned* sink = nullptr;
  CHECK(cudaMalloc(&src, pool));
  CHECK(cudaMalloc(&dst, pool));
  CHECK(cudaMalloc(&sink, 4));
  CHECK(cudaMemset(src, 1, pool));
  CHECK(cudaMemset(dst, 0, pool));
  CHECK(cudaFuncSetAttribute(item_copy, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kStages * 65536));
  if (mode == "variants") {
    run_variants(src, dst, pool, sms);
    return 0;
  }
  if (mode == "mix") {
    const std::size_t dst_pool = std::size_t{8} << 30;
    unsigned char* big = nullptr;
    CHECK(cudaMalloc(&big, dst_pool));
    CHECK(cudaMemset(big, 0, dst_pool));
    run_mix(src, big, pool, dst_pool, sms);
    return 0;
  }
  if (mode == "reads") {
    run_reads(src, pool, sink, sms);
    return 0;
  }
  if (mode == "ncu") {
    run_once(src, dst, sms);
    return 0;
  }
  const auto sets_for = [&](std::size_t bytes) {
    const std::size_t wanted = (std::size_t{512} << 20) / bytes + 1;  // >= 512 MB a replay
    return static_cast<int>(std::min(pool / bytes, wanted));
  };
  std::printf(
      "%d SMs; us per launch, graph replay with PDL; floor = bytes / ceiling "
      "(copy 4.24, read 4.48 TB/s)\n",
      sms);
  std::printf("%-34s %9s %10s %7s %7s %9s\n", "case", "MB moved", "us", "TB/s", "of ceil",
              "floor us");

  // Copies at KDA's state sizes (H = 32, K = V = 128): bf16 N = 32 / 128 / 512, fp32 N = 128.
  struct CopyCase {
    const char* label;
    int items;
    int item_bytes;
  };
  const CopyCase copies[] = {{"bf16 N=32", 1024, 32768},
                             {"bf16 N=128", 4096, 32768},
                             {"fp32 N=128", 4096, 65536},
                             {"bf16 N=512", 16384, 32768}};
  for (const CopyCase& c : copies) {
    const std::size_t bytes = static_cast<std::size_t>(c.items) * c.item_bytes;
    const int sets = sets_for(bytes);
    const double moved = 2.0 * bytes;
    const std::string l = c.label;
    row(l + " memcpy", moved,
        time_per_launch(
            [&](cudaStream_t s, int set) {
              CHECK(cudaMemcpyAsync(dst + set * bytes, src + set * bytes, bytes,
                                    cudaMemcpyDeviceToDevice, s));
            },
            2 * sets, sets),
        kCopy);
    row(l + " grid", moved,
        time_per_launch(
            [&](cudaStream_t s, int set) {
              launch_pdl(grid_copy, 4 * sms, kThreads, 0, s,
                         reinterpret_cast<const uint4*>(src + set * bytes),
                         reinterpret_cast<uint4*>(dst + set * bytes), bytes / 16);
            },
            2 * sets, sets),
        kCopy);
    for (int early = 0; early <= 1; ++early)
      row(l + (early ? " items early" : " items"), moved,
          time_per_launch(
              [&](cudaStream_t s, int set) {
                launch_pdl(item_copy, sms, kThreads, kStages * c.item_bytes, s, src + set * bytes,
                           dst + set * bytes, c.items, c.item_bytes, early);
              },
              2 * sets, sets),
          kCopy);
  }

  // Reads at flash decode's B = 1 (32, 8) D = 128 K/V sizes (4K / 16K / 64K keys).
  const std::size_t reads[] = {std::size_t{4096} * 8 * 512, std::size_t{16384} * 8 * 512,
                               std::size_t{65536} * 8 * 512};
  const int ctas[] = {64, 128, sms, 2 * sms};
  for (std::size_t bytes : reads) {
    const int sets = sets_for(bytes);
    for (int g : ctas) {
      const std::size_t share = bytes / 16 / g;  // vectors per CTA (a remainder is not read)
      char name[64];
      std::snprintf(name, sizeof name, "read %zu MB, %d CTAs", bytes >> 20, g);
      row(name, static_cast<double>(share * 16 * g),
          time_per_launch(
              [&](cudaStream_t s, int set) {
                launch_pdl(grid_read, g, kThreads, 0, s,
                           reinterpret_cast<const uint4*>(src + set * bytes), share, sink);
              },
              std::max(2, sets), sets),
          kRead);
    }
  }
  std::printf("done\n");
  return 0;
}
