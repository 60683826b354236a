// dev/cluster_occupancy: how many thread-block clusters of n CTAs can be resident at once on this
// GPU for a CTA of flash decode's shapes (threads, dynamic shared memory), n = 1..16
// (cudaOccupancyMaxActiveClusters; 16 needs the non-portable size attribute). A cluster's CTAs must
// sit in one GPC, so with one CTA per SM a 16-CTA cluster needs 16 free SMs of one GPC.
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -o cluster_occupancy cluster_occupancy.cu
#include <cuda_runtime.h>

#include <cstdio>

#include "../experiment_util.cuh"  // CHECK, cluster_launch_config

__global__ void probe_kernel(int* out) {
  extern __shared__ int smem[];
  if (out) out[0] = smem[0];
}

int main() {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s: %d SMs\n", prop.name, prop.multiProcessorCount);
  CHECK(cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448));
  CHECK(cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  struct Case {
    const char* name;
    int threads, smem;
  } cases[] = {{"D128 wide (8 warps, 196 KB)", 256, 200704},
               {"D128 wide + 31 KB", 256, 231664},
               {"D128 narrow (4 warps, 100 KB)", 128, 102400},
               {"D128 narrow + 124 KB", 128, 229000},
               {"D128 narrow + 31 KB", 128, 134096},
               {"D64 narrow (67.5 KB)", 128, 69632},
               {"D64 wide (8 warps, 130 KB)", 256, 133120}};
  std::printf("%-32s", "max active clusters of n CTAs");
  const int sizes[] = {1, 2, 4, 8, 12, 16};
  for (int n : sizes) std::printf(" %6d", n);
  std::printf("   (CTAs resident)\n");
  for (const Case& c : cases) {
    std::printf("%-32s", c.name);
    for (int n : sizes) {
      cudaLaunchAttribute attr;
      cudaLaunchConfig_t cfg = experiment::cluster_launch_config(
          dim3(1, n * 16, 1), dim3(c.threads, 1, 1), c.smem, dim3(1, n, 1), attr);
      cfg.numAttrs = 1;  // a cluster of 1 too: its occupancy is the reference
      int clusters = -1;
      const cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, probe_kernel, &cfg);
      if (e != cudaSuccess) {
        cudaGetLastError();
        std::printf(" %6s", "err");
      } else {
        std::printf(" %6d", clusters);
      }
    }
    std::printf("\n");
  }
  return 0;
}
