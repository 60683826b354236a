// Internal-error helper: formats the location so a bug report says where the invariant broke.
#include "splice/core/error.h"

namespace splice::detail {

void throw_internal(const char* file, int line, const std::string& what) {
  throw InternalError(concat("internal error at ", file, ":", line, ": ", what));
}

}  // namespace splice::detail
