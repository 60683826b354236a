// SPLICE_DEBUG (see debug.h).
#include "splice/core/debug.h"

#include <cstdlib>

namespace splice {

int debug_level() {
  const char* v = std::getenv("SPLICE_DEBUG");
  if (v == nullptr) return 0;
  const int level = std::atoi(v);
  return level < 0 ? 0 : level;
}

}  // namespace splice
