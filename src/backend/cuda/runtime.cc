// CUDA host runtime: device discovery, a caching allocator and the copy hook (see runtime.h).
//
// Allocator: blocks are rounded up to a 512-byte multiple (and to a power-of-two bucket above
// 1 MiB) and cached by size on free; a request reuses a cached block of exactly its rounded size.
// Copies: cudaMemcpyAsync on the current stream, then a wait on that stream (a blocking stream,
// so work queued on the legacy default stream is ordered too).
// Streams and graphs: thin checked wrappers (runtime.h); the current stream is per host thread.
#include "splice/backend/cuda/runtime.h"

#include <cuda_runtime.h>

#include <array>
#include <map>
#include <mutex>
#include <vector>

#include "backend/cuda/check.h"
#include "splice/core/error.h"

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

thread_local Stream t_current_stream = nullptr;

void copy_between(void* dst, Device dst_device, const void* src, Device src_device,
                  std::size_t bytes) {
  cudaMemcpyKind kind = cudaMemcpyDefault;
  if (dst_device.is_cuda() && src_device.is_cpu()) kind = cudaMemcpyHostToDevice;
  if (dst_device.is_cpu() && src_device.is_cuda()) kind = cudaMemcpyDeviceToHost;
  if (dst_device.is_cuda() && src_device.is_cuda()) kind = cudaMemcpyDeviceToDevice;
  const cudaStream_t stream = t_current_stream;
  SPLICE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream));
  SPLICE_CUDA_CHECK(cudaStreamSynchronize(stream));
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

int current_device() {
  int device = 0;
  SPLICE_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

const DeviceFacts& device_facts(int device) {
  constexpr int kMaxDevices = 64;
  struct Slot {
    std::once_flag once;
    DeviceFacts facts;
  };
  static std::array<Slot, kMaxDevices> slots;
  SPLICE_INTERNAL_CHECK(device >= 0 && device < kMaxDevices, "CUDA device index ", device);
  Slot& slot = slots[static_cast<std::size_t>(device)];
  // A query that throws leaves the flag unset, so a later call retries.
  std::call_once(slot.once, [&] {
    const auto attribute = [device](cudaDeviceAttr what) {
      int value = 0;
      SPLICE_CUDA_CHECK(cudaDeviceGetAttribute(&value, what, device));
      return value;
    };
    slot.facts.sm_count = attribute(cudaDevAttrMultiProcessorCount);
    slot.facts.l2_bytes = attribute(cudaDevAttrL2CacheSize);
    slot.facts.smem_optin_bytes = attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
    slot.facts.registers_per_sm = attribute(cudaDevAttrMaxRegistersPerMultiprocessor);
    // Double data rate: two transfers a memory clock (kHz) over the bus (bits). H100 SXM: 2619
    // MHz x 5120 bits = 3.35 TB/s; H200: 3201 MHz x 6144 bits = 4.92 TB/s.
    slot.facts.dram_bytes_per_s = 2.0 * 1e3 * attribute(cudaDevAttrMemoryClockRate) *
                                  (attribute(cudaDevAttrGlobalMemoryBusWidth) / 8.0);
  });
  return slot.facts;
}

Stream current_stream() { return t_current_stream; }
void set_current_stream(Stream stream) { t_current_stream = stream; }

Stream create_stream(int device) {
  int previous = 0;
  SPLICE_CUDA_CHECK(cudaGetDevice(&previous));
  SPLICE_CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t stream = nullptr;
  const cudaError_t status = cudaStreamCreateWithFlags(&stream, cudaStreamDefault);
  SPLICE_CUDA_CHECK(cudaSetDevice(previous));
  SPLICE_CUDA_CHECK(status);
  return stream;
}

Stream shared_stream(int device) {
  static std::mutex mutex;
  static auto* streams = new std::map<int, Stream>();  // lives for the process
  std::lock_guard<std::mutex> lock(mutex);
  Stream& stream = (*streams)[device];
  if (!stream) stream = create_stream(device);
  return stream;
}

void destroy_stream(Stream stream) {
  if (stream) cudaStreamDestroy(stream);
}

void stream_synchronize(Stream stream) { SPLICE_CUDA_CHECK(cudaStreamSynchronize(stream)); }

bool is_capturing(Stream stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  SPLICE_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

void copy_async(void* dst, const void* src, std::size_t bytes, Stream stream) {
  if (bytes == 0) return;
  SPLICE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
}

void* alloc_pinned(std::size_t bytes) {
  void* pointer = nullptr;
  SPLICE_CUDA_CHECK(cudaMallocHost(&pointer, bytes == 0 ? 1 : bytes));
  return pointer;
}

void free_pinned(void* pointer) {
  if (pointer) cudaFreeHost(pointer);
}

Event create_event() {
  cudaEvent_t event = nullptr;
  SPLICE_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return event;
}

Event create_timing_event() {
  cudaEvent_t event = nullptr;
  SPLICE_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDefault));
  return event;
}

double elapsed_us(Event start, Event end) {
  float ms = 0;
  SPLICE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, end));
  return 1e3 * static_cast<double>(ms);
}

void destroy_event(Event event) {
  if (event) cudaEventDestroy(event);
}

void record_event(Event event, Stream stream) { SPLICE_CUDA_CHECK(cudaEventRecord(event, stream)); }

void event_synchronize(Event event) { SPLICE_CUDA_CHECK(cudaEventSynchronize(event)); }

void begin_capture(Stream stream) {
  SPLICE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
}

GraphExec end_capture(Stream stream) {
  cudaGraph_t graph = nullptr;
  SPLICE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  SPLICE_CUDA_CHECK(status);
  return exec;
}

void abort_capture(Stream stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) return;
  if (status == cudaStreamCaptureStatusNone) return;
  cudaGraph_t graph = nullptr;
  if (cudaStreamEndCapture(stream, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
  cudaGetLastError();  // clear the sticky-free error the failed capture left
}

void launch_graph(GraphExec graph, Stream stream) {
  SPLICE_CUDA_CHECK(cudaGraphLaunch(graph, stream));
}

void destroy_graph(GraphExec graph) {
  if (graph) cudaGraphExecDestroy(graph);
}

}  // namespace splice::cuda
