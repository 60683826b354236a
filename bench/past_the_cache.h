// bench/past_the_cache.h: how many bytes a CPU benchmark must stream so that its reads come from
// memory, not from the last-level cache. Shared by the CPU benches that rotate inputs or measure a
// read / copy ceiling.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>

namespace splice::bench {

// Twice the L3 the OS reports, at least `minimum` bytes. (A host of 2026-12-05 reports a 480 MiB
// L3: two threads read a 256 MB buffer ~15% faster than a 1-4 GB one, so the benches' former
// fixed 256 MB rotation, written for a 32 MB L3, was partly served by the cache.)
inline std::int64_t past_the_cache(std::int64_t minimum) {
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);  // 0 or -1 where the OS does not say
  return std::max<std::int64_t>(minimum, l3 > 0 ? 2 * std::int64_t{l3} : 0);
}

}  // namespace splice::bench
