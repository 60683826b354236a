// splice/backend/cuda/sampling.h: greedy sampling on the device (issue 7), checked against the CPU
// oracle (include/splice/backend/cpu/sampling.h, whose greedy rule it matches bit for bit: first
// index of the maximum, NaN skipped except at index 0, -0.0 ties +0.0) in
// tests/cuda/sampling_test.cc.
//
// One launch per call, on splice::cuda::current_stream(), no synchronization and no host read, so
// it can be captured in a CUDA graph (the decode loop records it into the step's graph as a
// session epilogue, model/generate.h). It joins the programmatic-dependent-launch chain
// (launch.cuh's safety rule: every thread waits for its producers first).
#pragma once

#include <cstdint>

#include "splice/core/tensor.h"

namespace splice::cuda {

// The launch shape argmax uses: `ctas_per_row` CTAs of `threads` threads per row, one thread
// block cluster (portable size <= 8) per row, reduced through distributed shared memory.
struct ArgmaxLaunch {
  int ctas_per_row = 1;
  int threads = 0;
};

// The shape chosen for a row of `vocab` entries of `dtype`: enough CTAs that each thread issues
// one batch of 16-byte loads (at most 8 per row: latency, not bandwidth, bounds a decode row).
ArgmaxLaunch argmax_launch(std::int64_t vocab, DType dtype);

struct ArgmaxOptions {
  // 0: argmax_launch's choice (halved while the device reports that it cannot hold such a
  // cluster); 1..8 forces the CTAs per row (tests cover every reduction path).
  int ctas_per_row = 0;
  // Optional: pinned host memory (cuda::alloc_pinned) of at least `rows` int32; the kernel also
  // writes each id there (zero-copy: pinned memory is device-addressable under unified
  // addressing), readable by the host once the stream has synchronized. Saves the 4-byte copy a
  // decode loop would otherwise issue to learn its token.
  std::int32_t* host_mirror = nullptr;
  // Optional, with host_mirror and one row: a ring of `mirror_slots` ids in host_mirror. Launch n
  // (counted by `mirror_counter`, [1] uint32 in device memory on the logits' device, which the
  // kernel reads and increments; the caller zeroes it) writes slot n % mirror_slots, so a decode
  // loop can read step n's id while step n + 1 (which writes the other slot) runs.
  std::uint32_t* mirror_counter = nullptr;
  int mirror_slots = 1;
};

// ids[r] = the greedy rule over logits[r, :]. logits [rows, vocab] or [vocab] (one row), f32 /
// f16 / bf16 on a CUDA device, unit stride on the vocab axis (rows may have any stride),
// 1 <= vocab <= 2^31; ids [rows] i32 on the same device. Typed errors as cpu::argmax (same checks
// and wording), plus ValueError for ctas_per_row outside [0, 8], and for a mirror ring (a
// mirror_counter) without host_mirror, with mirror_slots < 1 or with more than one row.
void argmax(const Tensor& logits, Tensor& ids, const ArgmaxOptions& options = {});

}  // namespace splice::cuda
