// backend/cpu/parallel.h: the CPU backend's thread pool and `parallel_for`.
//
// One process-wide pool of `num_threads() - 1` persistent workers (the calling thread is the
// last one). `parallel_for` splits an index range into contiguous chunks:
//   1. chunks = min(num_threads(), ceil((end - begin) / grain)); one chunk runs inline, with no
//      synchronization at all (so small ops pay nothing).
//   2. Otherwise chunk c covers [begin + c*n/chunks, begin + (c+1)*n/chunks); workers and the
//      caller claim chunks from an atomic counter, the caller waits for the last to finish.
//   3. The first exception a chunk throws is rethrown on the calling thread after every chunk
//      has finished (later chunks still run; kernels validate before they start writing).
// The split depends only on (range, grain, num_threads()), and every kernel here gives each output
// element to exactly one chunk, so results do not depend on the thread count.
// A `parallel_for` issued from inside a chunk, or while another thread holds the pool, runs
// inline on its caller: nesting and concurrent callers are safe, never deadlock.
//
// Sizing: `num_threads()` is SPLICE_NUM_THREADS when set (a positive integer), otherwise the
// hardware concurrency; `set_num_threads` (primitives.h) resizes the pool; it must not be called
// while a `parallel_for` is running.
#pragma once

#include <cstdint>
#include <functional>

namespace splice::cpu {

// A chunk body: processes indices [chunk_begin, chunk_end).
using ChunkFn = std::function<void(std::int64_t chunk_begin, std::int64_t chunk_end)>;

// Runs `fn` over [begin, end) in chunks of at least `grain` indices (grain <= 0 means 1) on up to
// num_threads() threads; blocks until every chunk is done; rethrows the first exception.
void parallel_for(std::int64_t begin, std::int64_t end, std::int64_t grain, const ChunkFn& fn);

// Number of chunks `parallel_for(begin, end, grain, ...)` would use (1 = runs inline). Lets a
// kernel size per-chunk scratch before it starts.
std::int64_t parallel_chunks(std::int64_t begin, std::int64_t end, std::int64_t grain);

// Work (in elements touched) below which a kernel should not bother splitting: waking the pool
// costs a few microseconds, about what one core needs for this many simple element updates.
inline constexpr std::int64_t kParallelGrain = 32768;

}  // namespace splice::cpu
