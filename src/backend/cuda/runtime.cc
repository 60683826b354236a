// CUDA host runtime: device discovery, a caching allocator and the copy hook (see runtime.h).
//
// Allocator: blocks are rounded up to a 512-byte multiple (and to a power-of-two bucket above
// 1 MiB) and cached by size on free; a request reuses a cached block of exactly its rounded size.
#include "splice/backend/cuda/runtime.h"

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <vector>

#include "backend/cuda/check.h"

namespace splice::cuda {
namespace {

constexpr std::size_t kSmallRound = 512;
constexpr std::size_t kLargeThreshold = std::size_t{1} << 20;

std::size_t round_size(std::size_t bytes) {
  if (bytes <= kLargeThreshold) return ((bytes + kSmallRound - 1) / kSmallRound) * kSmallRound;
  std::size_t bucket = kLargeThreshold;
  while (bucket < bytes) bucket <<= 1;
  return bucket;
}

class CachingAllocator {
 public:
  void* allocate(std::size_t bytes, int device) {
    const std::size_t size = round_size(bytes == 0 ? 1 : bytes);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto& bucket = free_[{device, size}];
      if (!bucket.empty()) {
        void* p = bucket.back();
        bucket.pop_back();
        return p;
      }
    }
    int previous = 0;
    SPLICE_CUDA_CHECK(cudaGetDevice(&previous));
    SPLICE_CUDA_CHECK(cudaSetDevice(device));
    void* p = nullptr;
    const cudaError_t status = cudaMalloc(&p, size);
    SPLICE_CUDA_CHECK(cudaSetDevice(previous));
    if (status != cudaSuccess) {
      release_cached();
      SPLICE_CUDA_CHECK(cudaSetDevice(device));
      SPLICE_CUDA_CHECK(cudaMalloc(&p, size));
      SPLICE_CUDA_CHECK(cudaSetDevice(previous));
    }
    return p;
  }
  void release(void* p, std::size_t bytes, int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_[{device, round_size(bytes == 0 ? 1 : bytes)}].push_back(p);
  }
  void release_cached() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [key, blocks] : free_)
      for (void* p : blocks) cudaFree(p);
    free_.clear();
  }

 private:
  std::mutex mutex_;
  std::map<std::pair<int, std::size_t>, std::vector<void*>> free_;
};

CachingAllocator& allocator() {
  static auto* instance = new CachingAllocator();  // outlives static destructors of tensors
  return *instance;
}

std::shared_ptr<Storage> allocate_storage(std::size_t bytes, Device device) {
  auto storage = std::make_shared<Storage>();
  storage->data = allocator().allocate(bytes, device.index);
  storage->bytes = bytes;
  storage->device = device;
  const int index = device.index;
  storage->deleter = [bytes, index](void* p) { allocator().release(p, bytes, index); };
  return storage;
}

void copy_between(void* dst, Device dst_device, const void* src, Device src_device,
                  std::size_t bytes) {
  cudaMemcpyKind kind = cudaMemcpyDefault;
  if (dst_device.is_cuda() && src_device.is_cpu()) kind = cudaMemcpyHostToDevice;
  if (dst_device.is_cpu() && src_device.is_cuda()) kind = cudaMemcpyDeviceToHost;
  if (dst_device.is_cuda() && src_device.is_cuda()) kind = cudaMemcpyDeviceToDevice;
  SPLICE_CUDA_CHECK(cudaMemcpy(dst, src, bytes, kind));
}

}  // namespace

bool device_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

void ensure_registered() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_device_allocator(DeviceKind::cuda, &allocate_storage);
    register_device_copy(&copy_between);
  });
}

std::string device_name(int index) {
  cudaDeviceProp prop{};
  SPLICE_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  return std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
         std::to_string(prop.minor) + ", " + std::to_string(prop.multiProcessorCount) + " SMs)";
}

void synchronize() { SPLICE_CUDA_CHECK(cudaDeviceSynchronize()); }

}  // namespace splice::cuda
