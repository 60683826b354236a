// splice/backend/cuda/kda_decode.h: the CUDA fused KDA decode kernel (spec kda_decode.md) and its
// launcher.
//
// Called by splice::packed_fused_kda_decode / fused_kda_decode after host validation (the op layer
// builds a KdaDecodeArgs and, in validate mode, checks the value contracts). All tensors are
// device tensors with the layouts KdaDecodeArgs guarantees. The launcher reads nothing back from
// the device: query_start_loc, num_accepted_tokens and the slot tables are read by the kernel, so
// one captured launch replays correctly when they change between replays.
//
// Work decomposition: one CTA (or one thread-block cluster of `slices` CTAs) per (work unit,
// head), where a work unit is a sequence (packed mode) or a row (plain / t1 modes). Each CTA owns
// 128 / slices value rows of the head's 128 x 128 state, keeps them in registers (fp32) across
// all T tokens, reads the source state once and writes each checkpoint once. The variant (threads
// per CTA, slices, persistent or not) is picked by one rule, choose_kda_variant, from the grid
// size. The persistent `stream` variant runs one CTA per SM that walks many heads, keeping the
// next heads' state and inputs moving into a shared-memory ring (copy engine) while its warps
// compute the current head.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "splice/ops/kda_decode.h"

struct CUstream_st;

namespace splice::cuda {

using Stream = CUstream_st*;  // a cudaStream_t; nullptr is the legacy default stream

// Kernel variants: how a head's 128 value rows are spread over CTAs.
enum class KdaVariant : std::uint8_t {
  automatic,     // choose_kda_variant decides
  stream,        // one persistent CTA of 8 warps per SM, heads in turn; the next heads' state
                 // (2 fp32 / 3 bf16 stages) and first-chunk inputs are staged in shared memory
                 // by the copy engine, issued by the same warps once a head's state is in
                 // registers (16-byte aligned state; inputs staged when 16-byte aligned, else
                 // read from device memory)
  stream_plain,  // stream that stages only the state, never the inputs (tuning, A/B)
  wide,          // 1 CTA of 256 threads per head: 4 rows x 16 columns of state per thread
  wide512,       // 1 CTA of 512 threads per head, one CTA an SM: 2 rows x 16 columns a thread
  rows,          // T = 1: 1 CTA of 512 threads per head, two CTAs an SM, 8 rows x 4 columns a
                 // thread, conv and gates on threads of their own (T > 1, or state, inputs or
                 // output not 16-byte aligned: runs `wide`)
  split2,        // a cluster of 2 CTAs of 128 threads per head (64 rows each), 4 rows per thread
  split4,        // a cluster of 4 CTAs of 128 threads per head (32 rows each), 2 rows per thread
};
const char* kda_variant_name(KdaVariant variant);

// The one config rule: the variant for `units` work units (sequences, or rows in plain/t1 mode)
// x `heads` heads, T = `max_t`, state dtype, on a device with `sm_count` multiprocessors. Its
// table (measured on the H200, dev/kda_b's run) is in kda_decode.cu; in short, with
// items = units * heads:
//   T = 1, sm_count / 4 < items < 8 * sm_count (bf16 state) or 2 * sm_count (f32)
//                                  -> rows (but f32 state from sm_count / 2 to sm_count: wide512)
//   items <= sm_count / 4          -> split4
//   items < sm_count / 2           -> wide for bf16 state, wide512 for f32
//   items < sm_count               -> wide512 (one CTA an SM holds one head)
//   items < 2 * sm_count           -> wide (but f32 state at T >= 4 from 7/4 sm_count: wide512)
//   otherwise                      -> stream (each SM pipelines two or more heads), but wide for
//                                     bf16 state at T > 8 (unmeasured there; stream wins at 8)
// (stream falls back to wide when the state is not 16-byte aligned, rows when the state, inputs
// or output are not).
// `dram_bytes_per_s` (DeviceFacts; 0: unknown, read as the H200's) moves one band: bf16 T = 1
// past 8 * sm_count items runs rows, not stream, on cards of under kRowsMaxDramBytesPerSm a
// second per SM (the H100's ~25 GB/s, not the H200's ~37), where rows' two CTAs an SM keep
// enough bytes in flight.
KdaVariant choose_kda_variant(std::int64_t units, std::int64_t heads, std::int64_t max_t,
                              DType state_dtype, int sm_count, double dram_bytes_per_s = 0);

// Launch facts of the compiled `stream` kernel for a state dtype (f32 or bf16) with or without
// staged inputs, probed once per process on the current device (cudaFuncGetAttributes). When
// !launchable the launcher runs `wide` in its place (the reason printed under SPLICE_DEBUG).
struct KdaKernelInfo {
  int block = 0;                  // threads per CTA it is launched with
  int max_threads_per_block = 0;  // what the compiled kernel admits (registers per sub-partition)
  int num_regs = 0;               // registers per thread
  int local_bytes = 0;            // local memory per thread (spills)
  int smem_bytes = 0;             // dynamic shared memory per CTA
  int smem_optin = 0;             // the device's opt-in shared memory limit per CTA
  bool launchable = false;        // threads, registers and shared memory all fit one SM
  std::string reason;             // why not, when !launchable
};
// The persistent `stream` kernels: the 8-warp kernel (bf16 T > 8, fp32 T > 8 or few items a CTA,
// and every launch under kKdaTuneNoOverlap), the kernel with the precompute warp group (bf16
// T <= 8, fp32 T = 2-8 with >= 16 items a CTA) and its one-token form (fp32 T = 1: one staged
// token a stage, so fp32's ring holds 3 stages; fp32 state only).
enum class KdaStreamKernel { eight_warps, precompute_group, precompute_group_one_token };
KdaKernelInfo kda_stream_kernel_info(DType state_dtype, bool staged_inputs,
                                     KdaStreamKernel kernel = KdaStreamKernel::eight_warps);

// The dev-only A/B knob of the `stream` kernel (issue 6, dev/kda_b/): bits, all off by default.
// It changes the schedule only, never the arithmetic: outputs, caches and checkpoints are bit for
// bit those of the default schedule (tests/cuda/kda_decode_test.cc, TuneSwitchesBitIdentical).
// Read from SPLICE_KDA_TUNE (a decimal bit mask) at the first launch; set_kda_tune() overrides
// it (benchmarks, tests). (Until run 19 the bits were 1 = v7's schedule, 2 = the overlap.)
enum KdaTuneBits : unsigned {
  // bf16 T <= 8 without the overlap (the mainline: item k + 1's precompute during item k's
  // sweep, kda_decode.cuh): the item loop (at T = 1 v8's schedule: RMSNorm deferred to the next
  // item, refill at the top of the next item, staggered prefill). No effect elsewhere.
  kKdaTuneNoOverlap = 1u,
  // `stream` without its L2 priorities (source-state copies evict_last, checkpoint stores
  // evict_first, on launches whose source states exceed twice the L2): the A/B reference.
  kKdaTuneNoL2Hints = 256u,
  // The fp32 precompute-group kernel with every item static (w = CTA + k x grid) instead of
  // claiming the second half of its items from a shared pool (kda_decode.cuh, StreamItems): the
  // A/B reference of the dynamic items. (bf16 state always walks static items.)
  kKdaTuneStaticItems = 512u,
  kKdaTuneAll = kKdaTuneNoOverlap | kKdaTuneNoL2Hints | kKdaTuneStaticItems,
  // Attribution only, honoured only in a build with SPLICE_KDA_DEV_ATTRIBUTION defined (dev/
  // kda_attribution): the state sweep stores no checkpoint / skips its arithmetic (outputs,
  // states and checkpoints are then wrong). Masked off everywhere else.
  kKdaTuneDevDropCheckpoints = 2u,
  kKdaTuneDevDropSweepMath = 4u,
  // Attribution only, as above (`stream` only): the checkpoints are packed and stored into a
  // per-warp shared-memory scratch instead of device memory / rounded by truncation (no F2FP).
  kKdaTuneDevCheckpointsToShared = 8u,
  kKdaTuneDevTruncatePack = 16u,
  // (attribution) the precompute's q, k, v items / `stream`'s deferred RMSNorms / the sweep's
  // shuffle butterflies are skipped.
  kKdaTuneDevDropPrecompute = 32u,
  kKdaTuneDevDropNorms = 64u,
  kKdaTuneDevDropButterflies = 128u,
};
unsigned kda_tune();
void set_kda_tune(unsigned bits);
// Test hook: the `stream` kernels' persistent grid holds at most `ctas` CTAs (0, the default:
// one per SM). Few CTAs give each CTA many items from a small problem, so compute-sanitizer can
// follow a CTA's stage ring, hand-offs and metadata batches through several wraps in seconds.
// Like the tune bits it changes the schedule, never the arithmetic.
void set_kda_stream_grid_cap(int ctas);
// Launches of the fp32 precompute-group kernel with dynamic items (process-wide, for tests).
std::uint64_t kda_dynamic_item_launches();
#ifdef SPLICE_KDA_DEV_ATTRIBUTION
// (attribution build) the clock64 stamps of the last `stream` overlap-loop launch:
// [2 CTAs][64 items][12 warps][7 points] (kda_decode.cuh, dev_stamp), -1 where none was taken.
std::vector<long long> kda_dev_stamps();
// Clears the stamps; the next `stream` launch (only that one) writes them.
void kda_dev_stamps_reset();
// (attribution build) the %globaltimer timeline (ns) of the last kSlots launches of the
// precompute-group `stream` kernel, one row per CTA b < kCtas (kda_decode.cuh, timeline_row):
// -1 where nothing was stamped. Launch i of a reset's sequence is slot i % kSlots.
struct KdaDevTimeline {
  static constexpr int kSlots = 4, kCtas = 264, kItems = 128, kFields = 9 + 2 * kItems;
  enum Field {
    entry = 0,
    prologue_end = 1,
    sweep_exit = 2,
    norm_exit = 3,
    sm = 4,
    count = 5,
    landed0 = 6,       // item 0's stage landed (the norm warp's view)
    precomputed0 = 7,  // item 0 precomputed (the norm warp's kind)
    ring_issued = 8,   // a staggered prefill's other copies issued (thread 0; -1 without)
  };
  std::vector<long long> raw;  // [kSlots][kCtas][kFields]
  long long at(int slot, int cta, int field) const {
    return raw[(static_cast<std::size_t>(slot) * kCtas + cta) * kFields + field];
  }
  long long ready(int slot, int cta, int k) const { return at(slot, cta, 9 + k); }  // state in regs
  long long swept(int slot, int cta, int k) const { return at(slot, cta, 9 + kItems + k); }
};
KdaDevTimeline kda_dev_timeline();
void kda_dev_timeline_reset();
#endif

// Runs the decode described by `args` on `stream` with `variant` (automatic: the rule above).
// Writes args.output, updates args.conv_state and args.state in place. Never synchronizes and
// never reads device memory on the host, so it can be captured in a CUDA graph.
void kda_decode(const KdaDecodeArgs& args, Stream stream,
                KdaVariant variant = KdaVariant::automatic);

// The op layer's entry: current_stream() (the session's stream inside a step, so a step with
// KdaDecode is captured like any other), automatic variant.
void kda_decode(const KdaDecodeArgs& args);

}  // namespace splice::cuda
