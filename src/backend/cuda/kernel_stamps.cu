// kernel_stamps.h's host side: the ring, the per-unit setters, the captured launch names. In a
// build without SPLICE_KERNEL_STAMPS, available() is false, start() refuses and the rest are
// no-ops (the launcher does not call note_launch then).
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>

#include "backend/cuda/check.h"
#include "splice/backend/cuda/kernel_stamps.h"
#include "splice/core/error.h"

namespace splice::cuda::kernel_stamps {
namespace {

struct Registry {
  std::mutex mutex;
  std::vector<void (*)(Stamp*, std::uint64_t)> setters;  // one per kernel translation unit
  std::vector<CapturedLaunch> launches;
  Stamp* ring = nullptr;
  std::size_t capacity = 0;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: units register during static init
  return *r;
}

}  // namespace

void register_unit(void (*set_ring)(Stamp* ring, std::uint64_t mask)) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.setters.push_back(set_ring);
}

bool available() {
#ifdef SPLICE_KERNEL_STAMPS
  return true;
#else
  return false;
#endif
}

void start(std::size_t capacity) {
  if (!available())
    fail<UnsupportedError>(
        "kernel_stamps::start: this build records no stamps (configure with "
        "-DSPLICE_KERNEL_STAMPS=ON)");
  if (capacity == 0 || (capacity & (capacity - 1)) != 0)
    fail<ValueError>("kernel_stamps::start: capacity must be a power of two, got ", capacity);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  SPLICE_CUDA_CHECK(cudaDeviceSynchronize());
  if (r.capacity != capacity) {
    if (r.ring != nullptr) SPLICE_CUDA_CHECK(cudaFree(r.ring));
    r.ring = nullptr;
    SPLICE_CUDA_CHECK(cudaMalloc(&r.ring, capacity * sizeof(Stamp)));
    r.capacity = capacity;
  }
  SPLICE_CUDA_CHECK(cudaMemset(r.ring, 0, capacity * sizeof(Stamp)));
  for (auto set : r.setters) set(r.ring, capacity - 1);
  SPLICE_CUDA_CHECK(cudaDeviceSynchronize());
}

std::vector<Stamp> collect() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.ring == nullptr) return {};
  SPLICE_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<Stamp> all(r.capacity);
  SPLICE_CUDA_CHECK(
      cudaMemcpy(all.data(), r.ring, r.capacity * sizeof(Stamp), cudaMemcpyDeviceToHost));
  all.erase(std::remove_if(all.begin(), all.end(), [](const Stamp& s) { return s.grid_id == 0; }),
            all.end());
  std::sort(all.begin(), all.end(), [](const Stamp& a, const Stamp& b) {
    return a.grid_id != b.grid_id ? a.grid_id < b.grid_id : a.mark < b.mark;
  });
  return all;
}

std::vector<CapturedLaunch> captured_launches() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.launches;
}

void note_launch(const void* kernel, void* stream) {
  if (stream == nullptr) return;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  SPLICE_CUDA_CHECK(cudaStreamGetCaptureInfo(static_cast<cudaStream_t>(stream), &status, &id));
  if (status != cudaStreamCaptureStatusActive) return;
  const char* name = nullptr;
  SPLICE_CUDA_CHECK(cudaFuncGetName(&name, kernel));
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.launches.push_back({id, name != nullptr ? name : "?"});
}

}  // namespace splice::cuda::kernel_stamps
