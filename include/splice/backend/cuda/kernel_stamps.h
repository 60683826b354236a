// splice/backend/cuda/kernel_stamps.h: where a decode step's time goes, kernel by kernel
// (issue #7's instrument; nsys and the hardware counters are unavailable on the device).
//
// In a build configured with -DSPLICE_KERNEL_STAMPS=ON (off by default: the mainline kernels
// carry no trace of it), every kernel launched through launch.cuh's launcher records, when its
// griddepcontrol.wait returns, one stamp from thread 0 of CTA (0, 0, 0): the grid's %gridid (the
// context's temporal launch number) and %globaltimer (ns). The store goes to a ring of
// `capacity` slots indexed by gridid modulo capacity with st.global: fire and forget, no atomic,
// no round trip on the kernel's path (a generic store would also be ordered against the thread's
// later shared-memory loads: a mark before an ldmatrix delayed it by ~0.6 us, docs/perf.md
// run 54). A dev tool built with SPLICE_KERNEL_STAMPS_CYCLES as well records %clock64 instead
// (exact SM cycles, comparable only within one CTA: dev/tile_cycles). On the host, the launcher
// notes each kernel's name (cudaFuncGetName) for launches issued while the stream is being
// captured, so the n-th stamp of a replayed step maps to the n-th captured launch.
//
// Under PDL a kernel's wait returns when its predecessor has completed, so the gap between two
// consecutive stamps of a step is the first kernel's whole share of the step: its post-wait work,
// the grid's completion and the hand-off (dev/step_stamps reads them; chain.cu measured the
// hand-off alone at ~0.5 us). Work that is not ours (cuBLASLt kernels, copies) stamps nothing and
// lands in the gap of the kernel before it.
//
// Besides the wait return, the same thread stamps its arrival at the wait (kArrival: the kernel's
// launch and pre-wait work are done), and a kernel may stamp stages of its own
// (detail::stamp_mark; flash decode stamps q ready, the tile loop done and the output stored).
//
// In a build without the option every function here is a no-op and available() is false.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace splice::cuda::kernel_stamps {

// What a stamp marks. Slot (grid_id * kMarks + mark) mod capacity of the ring.
enum Mark : std::uint32_t {
  kWaitReturn = 0,       // griddepcontrol.wait returned (the chain analysis uses these)
  kArrival = 1,          // the thread reached the wait (after the kernel's pre-wait work)
  kFirstKernelMark = 2,  // kernel-specific stages (detail::stamp_mark in launch.cuh), < kMarks
  kMarks = 16,
};

struct Stamp {
  std::uint64_t grid_id = 0;  // %gridid; 0 = an empty slot
  std::uint64_t ns = 0;       // %globaltimer (cycles mode: %clock64) at the mark, CTA 0 thread 0
  std::uint32_t mark = 0;     // Mark
};

// A launch issued while its stream was being captured.
struct CapturedLaunch {
  std::uint64_t capture_id = 0;  // cudaStreamGetCaptureInfo's id of the capture
  std::string kernel;            // cudaFuncGetName
};

// Whether this build records stamps (SPLICE_KERNEL_STAMPS).
bool available();
// Allocates (or reuses) a zeroed ring of `capacity` slots (a power of two) on the current device
// and points every kernel translation unit at it; stamps are recorded from the next launch on.
// Synchronizes the device. An UnsupportedError without the build option.
void start(std::size_t capacity);
// Synchronizes the device and returns the ring's non-empty slots sorted by grid id, then mark.
std::vector<Stamp> collect();
// Every launch noted during a capture since the process started, in launch order.
std::vector<CapturedLaunch> captured_launches();

// The hooks of launch.cuh (its launcher and each kernel unit's static initialization), called
// only in a SPLICE_KERNEL_STAMPS build.
void note_launch(const void* kernel, void* stream);
void register_unit(void (*set_ring)(Stamp* ring, std::uint64_t mask));

}  // namespace splice::cuda::kernel_stamps
