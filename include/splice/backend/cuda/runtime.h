// splice/backend/cuda/runtime.h: the CUDA backend's host runtime.
//
// Device tensors come from a caching allocator over cudaMalloc (freed blocks are kept per size
// class and reused, so steady-state decode allocates nothing); copies go through cudaMemcpyAsync
// on the current stream (then wait for that stream). Every CUDA call's return code is checked
// (SPLICE_CUDA_CHECK) and every launch, all through launch.cuh's one launcher, is followed by a
// last-error check, raising splice::CudaError.
//
// Streams and graphs (plan-once replay, spec decode_attention.md §6):
//   1. Every primitive launches on `current_stream()` (per host thread; nullptr = the legacy
//      default stream). A Session makes its device's shared blocking stream current for the
//      duration of a step (StreamGuard), so kernels, cuBLASLt calls and copies stay in order.
//   2. A step is captured once with begin_capture / end_capture (thread-local capture mode, so a
//      stray synchronous call on this thread fails loudly instead of escaping the graph) and then
//      replayed with launch_graph after the step's device scalars were copied in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "splice/core/tensor.h"

struct CUstream_st;
struct CUgraphExec_st;
struct CUevent_st;

namespace splice::cuda {

using Stream = CUstream_st*;        // a cudaStream_t; nullptr is the legacy default stream
using GraphExec = CUgraphExec_st*;  // a cudaGraphExec_t
using Event = CUevent_st*;          // a cudaEvent_t

// True when a CUDA device is usable (false on machines with nvcc but no GPU).
bool device_available();
// Registers the CUDA allocator and copy hooks with core; idempotent, cheap.
void ensure_registered();
// A short description of the device, e.g. "NVIDIA H200 (sm_90, 132 SMs)".
std::string device_name(int index = 0);
void synchronize();

// ---- device facts --------------------------------------------------------------------------
// What the launchers and planners read about a device on every launch: queried once per device,
// then cached (thread-safe; the first call for a device pays the driver queries).
struct DeviceFacts {
  int sm_count = 0;             // streaming multiprocessors
  std::int64_t l2_bytes = 0;    // L2 cache size
  int smem_optin_bytes = 0;     // dynamic shared memory one CTA may opt in to
  int registers_per_sm = 0;     // 32-bit registers of one SM
  double dram_bytes_per_s = 0;  // peak DRAM bandwidth: 2 x memory clock x bus width (datasheet)
};
// The calling host thread's current device (cudaGetDevice).
int current_device();
// `device`'s facts; `device` in [0, 64).
const DeviceFacts& device_facts(int device);
inline const DeviceFacts& current_device_facts() { return device_facts(current_device()); }

// ---- streams ------------------------------------------------------------------------------
// The stream this host thread launches on (nullptr: the legacy default stream).
Stream current_stream();
void set_current_stream(Stream stream);
// Makes `stream` current for a scope and restores the previous one.
class StreamGuard {
 public:
  explicit StreamGuard(Stream stream) : previous_(current_stream()) { set_current_stream(stream); }
  ~StreamGuard() { set_current_stream(previous_); }
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
};
// A blocking stream (ordered with the legacy default stream, so code that still uses it, e.g. a
// synchronous copy, sees this stream's work) on `device`.
Stream create_stream(int device = 0);
// The process-wide blocking stream of `device` that every Session on it launches on (created on
// first use, never destroyed). One stream orders the work of all sessions, which kernels with
// module-owned workspaces (flash_decode's split partials and merge counters) require.
Stream shared_stream(int device = 0);
void destroy_stream(Stream stream);  // never throws
void stream_synchronize(Stream stream);
// True while `stream` is being captured into a graph.
bool is_capturing(Stream stream);

// ---- async copies and pinned host memory ---------------------------------------------------
// cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault) on `stream`; no synchronization.
void copy_async(void* dst, const void* src, std::size_t bytes, Stream stream);
void* alloc_pinned(std::size_t bytes);
void free_pinned(void* pointer);  // never throws
Event create_event();
// An event that keeps a device timestamp (create_event's do not): for elapsed_us.
Event create_timing_event();
void destroy_event(Event event);  // never throws
void record_event(Event event, Stream stream);
void event_synchronize(Event event);
// Microseconds between two completed timing events (cudaEventElapsedTime, ~0.5 us resolution).
double elapsed_us(Event start, Event end);

// ---- graphs -------------------------------------------------------------------------------
void begin_capture(Stream stream);
// Ends the capture and instantiates the graph.
GraphExec end_capture(Stream stream);
// Ends a capture that failed part-way and discards what was recorded; never throws.
void abort_capture(Stream stream);
void launch_graph(GraphExec graph, Stream stream);
void destroy_graph(GraphExec graph);  // never throws

// ---- programmatic dependent launch (src/backend/cuda/launch.cuh) ----------------------------
// Whether kernels launch with the PDL attribute (env SPLICE_PDL, read once; default on).
bool pdl_enabled();
// Overrides SPLICE_PDL for later launches (A/B timing, tests).
void set_pdl_enabled(bool enabled);

}  // namespace splice::cuda
