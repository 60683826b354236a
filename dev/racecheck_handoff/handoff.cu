// Does compute-sanitizer's racecheck model a producer / consumer hand-off between warps of one
// CTA? The precompute-group KDA kernel hands items between its warp roles through named barriers
// (bar.arrive by the producer, bar.sync by the consumer, as the PTX ISA documents), and racecheck
// reports every such hand-off as a RAW hazard (perf.md run 124). This kernel runs the same ring
// (one producer warp, one consumer warp, two slots, kRounds rounds, both directions: "full" after
// the producer's writes, "empty" after the consumer's reads) with three hand-offs:
//   mode 0: named barriers (bar.arrive / bar.sync), as the KDA kernel;
//   mode 1: mbarriers (mbarrier.arrive release / mbarrier.try_wait.parity acquire, CTA scope);
//   mode 2: __syncthreads() between the phases (the control: no hand-off at all).
// Build: nvcc -O2 -arch=sm_90a -o handoff handoff.cu. Run: compute-sanitizer --tool racecheck
// ./handoff <mode>: the hazard count racecheck prints tells whether it models the hand-off.
// Without the sanitizer the program checks the sums (the hand-off itself is correct in every mode).
#include <cstdio>
#include <cstdlib>

constexpr int kSlots = 2, kRounds = 64, kWords = 32;

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar))
               : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned phase) {
  unsigned done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(phase)
        : "memory");
  }
}
__device__ __forceinline__ void named_arrive(int id) {
  asm volatile("bar.arrive %0, 64;" ::"r"(id) : "memory");
}
__device__ __forceinline__ void named_sync(int id) {
  asm volatile("bar.sync %0, 64;" ::"r"(id) : "memory");
}

__global__ void handoff(int mode, unsigned long long* sums) {
  __shared__ int slot[kSlots][kWords];
  __shared__ unsigned long long full[kSlots], empty[kSlots];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kSlots; ++s) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 32;" ::"r"(smem_addr(&full[s])));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 32;" ::"r"(smem_addr(&empty[s])));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  unsigned long long sum = 0;
  for (int r = 0; r < kRounds; ++r) {
    const int s = r % kSlots;
    const unsigned phase = (r / kSlots) & 1u;
    if (mode == 2) {
      if (warp == 0) slot[s][lane] = r * 100 + lane;
      __syncthreads();
      if (warp == 1) sum += slot[s][lane];
      __syncthreads();
      continue;
    }
    if (warp ==
        0) {  // producer: wait until the slot is empty (not in the first pass), write, signal
      if (r >= kSlots) {
        if (mode == 0)
          named_sync(1 + kSlots + s);
        else
          mbar_wait(&empty[s], phase ^ 1u);
      }
      slot[s][lane] = r * 100 + lane;
      if (mode == 0)
        named_arrive(1 + s);
      else
        mbar_arrive(&full[s]);
    } else {  // consumer: wait until full, read, signal empty
      if (mode == 0)
        named_sync(1 + s);
      else
        mbar_wait(&full[s], phase);
      sum += slot[s][lane];
      if (r + kSlots < kRounds) {
        if (mode == 0)
          named_arrive(1 + kSlots + s);
        else
          mbar_arrive(&empty[s]);
      }
    }
  }
  if (warp == 1) sums[lane] = sum;
}

// Mode 3: the precompute-group kernel's shape: 8 "sweep" warps and 4 "precompute" warps (384
// threads); the precompute warps write slot k % 2 and arrive at barrier 1 + (k & 1) (count 384),
// the sweep warps sync there, sync among themselves (barrier 5, count 256, the kernel's cta_sync),
// read, write their result into res[k % 2] and arrive at barrier 3 + (k & 1); the precompute warps
// sync there and read the result (the kernel's norms); ids and counts in registers, as the
// kernel's named_sync / named_arrive pass them. Mode 4: the same with mbarriers, every thread
// arriving (counts 128 and 256). Mode 5: mbarriers with one arrival a warp (counts 4 and 8):
// each warp's __syncwarp, then its lane 0 arrives (release), as dev/kda-ws-mbarrier-handoffs.patch
// does in the kernel. Mode 6: mode 3 with every barrier id and count an immediate (a branch on
// the slot), to tell a register-operand model gap from a shape one.
__global__ void handoff_ws(int mode, unsigned long long* sums) {
  __shared__ int slot[2][kWords];
  __shared__ int res[2][kWords];
  __shared__ unsigned long long full[2], done[2];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool elected = mode == 5;  // one arrival a warp
  const auto arrive = [&](unsigned long long* bar) {
    if (elected) {
      __syncwarp();
      if (lane == 0) mbar_arrive(bar);
    } else {
      mbar_arrive(bar);
    }
  };
  if (threadIdx.x == 0) {
    const unsigned full_count = elected ? 4 : 128, done_count = elected ? 8 : 256;
    for (int s = 0; s < 2; ++s) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(&full[s])),
                   "r"(full_count));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(&done[s])),
                   "r"(done_count));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  // The four hand-offs: item in slot s precomputed ("full") / swept ("done").
  const bool named = mode == 3 || mode == 6;
  const auto named_sync_arrive = [&](bool sync, int id) {  // id: 1, 2 (full), 3, 4 (done)
    if (mode == 3) {
      if (sync)
        asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(384) : "memory");
      else
        asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(384) : "memory");
      return;
    }
    switch (id * 2 + (sync ? 1 : 0)) {  // mode 6: immediates
      case 2:
        asm volatile("bar.arrive 1, 384;" ::: "memory");
        break;
      case 3:
        asm volatile("bar.sync 1, 384;" ::: "memory");
        break;
      case 4:
        asm volatile("bar.arrive 2, 384;" ::: "memory");
        break;
      case 5:
        asm volatile("bar.sync 2, 384;" ::: "memory");
        break;
      case 6:
        asm volatile("bar.arrive 3, 384;" ::: "memory");
        break;
      case 7:
        asm volatile("bar.sync 3, 384;" ::: "memory");
        break;
      case 8:
        asm volatile("bar.arrive 4, 384;" ::: "memory");
        break;
      default:
        asm volatile("bar.sync 4, 384;" ::: "memory");
        break;
    }
  };
  const auto signal_full = [&](int s) {
    named ? named_sync_arrive(false, 1 + s) : arrive(&full[s]);
  };
  const auto wait_full = [&](int s, unsigned phase) {
    named ? named_sync_arrive(true, 1 + s) : mbar_wait(&full[s], phase);
  };
  const auto signal_done = [&](int s) {
    named ? named_sync_arrive(false, 3 + s) : arrive(&done[s]);
  };
  const auto wait_done = [&](int s, unsigned phase) {
    named ? named_sync_arrive(true, 3 + s) : mbar_wait(&done[s], phase);
  };
  unsigned long long sum = 0;
  const bool sweep = warp < 8;
  if (!sweep) {  // producer of item 0
    if (warp == 8) slot[0][lane] = lane;
    signal_full(0);
  }
  for (int k = 0; k < kRounds; ++k) {
    const int s = k & 1;
    const unsigned phase = (k >> 1) & 1u;
    if (sweep) {
      wait_full(s, phase);
      const int v = slot[s][lane];
      asm volatile("bar.sync 5, 256;" ::: "memory");
      if (warp == 0) res[s][lane] = v + 1;
      signal_done(s);
    } else {
      if (k + 1 < kRounds) {  // item k + 1 into the other slot (its readers passed barrier 5)
        if (warp == 8) slot[s ^ 1][lane] = (k + 1) * 100 + lane;
        signal_full(s ^ 1);
      }
      wait_done(s, phase);
      if (warp == 8) sum += res[s][lane];
      asm volatile("bar.sync 6, 128;" ::: "memory");
    }
  }
  if (warp == 8) sums[lane] = sum;
}

int main(int argc, char** argv) {
  const int mode = argc > 1 ? std::atoi(argv[1]) : 0;
  if (mode < 0 || mode > 6) {
    std::fprintf(stderr, "mode %d: 0-6\n", mode);
    return 2;
  }
  unsigned long long* d = nullptr;
  cudaMalloc(&d, 32 * sizeof(unsigned long long));
  if (mode >= 3)
    handoff_ws<<<1, 384>>>(mode, d);
  else
    handoff<<<1, 64>>>(mode, d);
  unsigned long long h[32];
  cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
  int bad = 0;
  for (int l = 0; l < 32; ++l) {
    unsigned long long want = 0;
    for (int r = 0; r < kRounds; ++r) want += mode >= 3 ? r * 100 + l + 1 : r * 100 + l;
    bad += h[l] != want;
  }
  const char* names[] = {"named barriers",
                         "mbarriers",
                         "__syncthreads",
                         "ws shape, named barriers",
                         "ws shape, mbarriers",
                         "ws shape, mbarriers, one arrival a warp",
                         "ws shape, named barriers, immediate operands"};
  std::printf("mode %d (%s): %s, %s\n", mode, names[mode], bad ? "WRONG sums" : "sums right",
              cudaGetErrorString(cudaGetLastError()));
  return bad ? 1 : 0;
}
