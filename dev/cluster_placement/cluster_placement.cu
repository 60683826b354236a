// dev/cluster_placement: does where a grid's thread-block clusters land explain the cluster
// grids' slow mode (issue #5; docs/perf.md runs 65-67)? Eight eight-warp splits per kv head in
// clusters of 8 (B = 1, (32, 8), head_dim 128) read 18.85-20.75 us at 16K in most processes and
// 22.8-22.9 in others; 16 global-merge splits read a steady 20.7. Not yet run.
//
//   cluster_placement [PROCESS_LABEL]
//
//   1. The SM -> GPC map. A probe kernel records %smid per CTA. It is launched at one CTA per SM
//      (flash decode's wide CTA: 256 threads, its dynamic shared memory) in clusters of 16, 8 and
//      4, 8 launches each; SMs that shared a cluster share a GPC (union-find). Printed: each
//      GPC's SM count.
//   2. Placement of the flash-shaped grid. The probe with flash decode's grid (1, 8 splits,
//      8 kv heads) in clusters of (1, 8, 1), 8 launches: per launch, how many of the 8 clusters
//      each GPC holds.
//   3. The real cluster-merge kernel (flash_decode_kernel<bf16, 128, 8, false, true>) at k_len
//      16K and 64K: 20 launches captured in a graph, median of 20 replays per launch, its largest
//      error against a float64 reference (tolerance units, <= 1 passes); then the probe's
//      placement again. For reference, the global-merge instance with 16 splits.
// Run it in several processes (e.g. `for i in 1 2 3 4 5; do cluster_placement $i; done`) and
// compare a slow process's placement with a fast one's.
//
// Build (here, nvcc 13): nvcc -O3 -DNDEBUG -DSPLICE_WITH_CUDA=1 -arch=sm_90a -std=c++20
//   --expt-relaxed-constexpr -diag-suppress 20050 -Iinclude -Isrc -o cluster_placement
//   dev/cluster_placement/cluster_placement.cu
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "../../bench/cuda/bench_util.cuh"  // time_replays
#include "../experiment_util.cuh"  // CHECK
#include "backend/cuda/flash_decode_kernel.cuh"
#include "../flash_case.cuh"  // Case, Buffers, params_for, max_error

namespace {

using namespace flash_case;
using Cfg = splice::cuda::detail::FlashDecodeConfig<128, 8>;

__global__ void probe_kernel(int* smids) {
  extern __shared__ int smem[];
  if (threadIdx.x == 0) {
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    const unsigned cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    smids[cta] = static_cast<int>(smid);
    smem[0] = static_cast<int>(smid);  // touch the shared memory the CTA reserves
  }
}

// A launch of `grid` wide flash-decode-shaped CTAs (256 threads, its dynamic shared memory) in
// clusters of `cluster` (none when it holds one CTA); `attribute` must outlive the config.
cudaLaunchConfig_t cluster_config(dim3 grid, dim3 cluster, cudaLaunchAttribute& attribute,
                                  cudaStream_t stream = nullptr) {
  return experiment::cluster_launch_config(grid, dim3(Cfg::kThreads), Cfg::kSmemBytes, cluster,
                                           attribute, stream);
}

// %smid of every CTA of one probe launch of `grid` in clusters of `cluster`.
std::vector<int> probe(dim3 grid, dim3 cluster) {
  const int ctas = static_cast<int>(grid.x * grid.y * grid.z);
  int* d = nullptr;
  CHECK(cudaMalloc(&d, ctas * sizeof(int)));
  cudaLaunchAttribute attribute;
  const cudaLaunchConfig_t config = cluster_config(grid, cluster, attribute);
  CHECK(cudaLaunchKernelEx(&config, probe_kernel, d));
  CHECK(cudaDeviceSynchronize());
  std::vector<int> smids(ctas);
  CHECK(cudaMemcpy(smids.data(), d, ctas * sizeof(int), cudaMemcpyDeviceToHost));
  CHECK(cudaFree(d));
  return smids;
}

struct UnionFind {
  std::vector<int> parent;
  explicit UnionFind(int n) : parent(n) { std::iota(parent.begin(), parent.end(), 0); }
  int find(int x) { return parent[x] == x ? x : parent[x] = find(parent[x]); }
  void join(int a, int b) { parent[find(a)] = find(b); }
};

// Clusters per GPC of one flash-shaped probe launch, as "g0:n g1:n ..." over the GPCs used.
std::string clusters_per_gpc(const std::vector<int>& smids, int cluster_size,
                             const std::vector<int>& gpc_of) {
  std::map<int, int> count;
  for (std::size_t c = 0; c < smids.size(); c += cluster_size) ++count[gpc_of[smids[c]]];
  std::string s;
  for (const auto& [g, n] : count) s += " g" + std::to_string(g) + ":" + std::to_string(n);
  return s;
}

// Median us per launch of `kernel` over 20 replays (after 3) of a graph of 20 launches.
template <typename Kernel>
double time_launches(Kernel kernel, const FlashDecodeParams& p, dim3 grid, dim3 cluster) {
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaLaunchAttribute attribute;
  const cudaLaunchConfig_t config = cluster_config(grid, cluster, attribute, stream);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < 20; ++i) CHECK(cudaLaunchKernelEx(&config, kernel, p));
  CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const double us = splice::bench::time_replays(exec, stream, 3, 20, 20).median_us;
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaStreamDestroy(stream));
  return us;
}

}  // namespace

int main(int argc, char** argv) {
  const char* label = argc > 1 ? argv[1] : "-";
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             Cfg::kSmemBytes));
  CHECK(cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));

  // 1. The SM -> GPC map.
  int max_smid = 0;
  std::vector<std::vector<int>> launches;
  for (int size : {16, 8, 4})
    for (int rep = 0; rep < 8; ++rep) {
      cudaLaunchAttribute attribute;
      const dim3 cluster(static_cast<unsigned>(size), 1, 1);
      const cudaLaunchConfig_t config = cluster_config(cluster, cluster, attribute);
      int resident = 0;
      CHECK(cudaOccupancyMaxActiveClusters(&resident, probe_kernel, &config));
      const std::vector<int> smids = probe(dim3(size * resident, 1, 1), dim3(size, 1, 1));
      for (int s : smids) max_smid = std::max(max_smid, s);
      launches.push_back(smids);
      launches.back().push_back(size);  // the cluster size, last
    }
  UnionFind sets(max_smid + 1);
  for (const auto& smids : launches) {
    const int size = smids.back();
    for (std::size_t c = 0; c + size < smids.size(); c += size)
      for (int i = 1; i < size; ++i) sets.join(smids[c], smids[c + i]);
  }
  std::map<int, std::vector<int>> gpcs;
  std::set<int> seen;
  for (const auto& smids : launches)
    for (std::size_t i = 0; i + 1 < smids.size(); ++i) seen.insert(smids[i]);
  for (int s : seen) gpcs[sets.find(s)].push_back(s);
  std::vector<int> gpc_of(max_smid + 1, -1);
  int g = 0;
  std::printf("[%s] %d SMs; GPCs from co-clustered SMs:", label, sms);
  for (const auto& [root, members] : gpcs) {
    for (int s : members) gpc_of[s] = g;
    std::printf(" g%d:%zu", g++, members.size());
  }
  std::printf("\n");

  // 2. The flash-shaped grid's placement: 8 kv heads x 8 splits, clusters of (1, 8, 1).
  const dim3 grid(1, 8, 8), cluster(1, 8, 1);
  for (int rep = 0; rep < 4; ++rep)
    std::printf("[%s] probe placement %d: clusters per GPC%s\n", label, rep,
                clusters_per_gpc(probe(grid, cluster), 8, gpc_of).c_str());

  // 3. The real kernels.
  const auto cluster_kernel = splice::cuda::detail::flash_decode_kernel<T, 128, 8, false, true>;
  const auto global_kernel = splice::cuda::detail::flash_decode_kernel<T, 128, 8, false, false>;
  for (auto kernel : {cluster_kernel, global_kernel}) {
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               Cfg::kSmemBytes));
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
  }
  CHECK(cudaFuncSetAttribute(cluster_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  for (int k_len : {16384, 65536}) {
    for (int splits : {8, 16}) {
      const bool clustered = splits == 8;
      const Case c{8, 4, 128, k_len, false, splits};
      Buffers b = allocate(c);
      CHECK(cudaMemcpy(b.k_len, &k_len, sizeof k_len, cudaMemcpyHostToDevice));
      const FlashDecodeParams p = params_for(c, b);
      const double us = time_launches(clustered ? cluster_kernel : global_kernel, p,
                                      dim3(1, splits, 8), clustered ? cluster : dim3(1, 1, 1));
      std::printf("[%s] k_len %5d, %2d splits, %s merge: %7.2f us per launch, max err %.3f\n",
                  label, k_len, splits, clustered ? "cluster" : "global ", us,
                  k_len <= 16384 ? max_error(c, b, k_len) : 0.0);
      release(b);
    }
    std::printf("[%s] probe placement after: clusters per GPC%s\n", label,
                clusters_per_gpc(probe(grid, cluster), 8, gpc_of).c_str());
  }
  return 0;
}
