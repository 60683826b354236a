// Error helpers: the internal-error location (so a bug report says where the invariant broke) and
// the type-preserving rethrow that puts a caller's context before a message.
#include "splice/core/error.h"

namespace splice {

namespace detail {

void throw_internal(const char* file, int line, const std::string& what) {
  throw InternalError(concat("internal error at ", file, ":", line, ": ", what));
}

// Rethrows the current exception as E with `context` first when its dynamic type is E.
template <typename E>
void rethrow_as(const std::string& context) {
  try {
    throw;
  } catch (const E& e) {
    throw E(context + e.what());
  } catch (...) {
  }
}

// rethrow_as for each of E..., in order: the first that matches throws.
template <typename... E>
void rethrow_as_first_match(const std::string& context) {
  (rethrow_as<E>(context), ...);
}

}  // namespace detail

void rethrow_with_context(const std::string& context) {
  // Each subclass before Error itself (they all derive from Error directly).
  detail::rethrow_as_first_match<ShapeError, DTypeError, ValueError, LayoutError, DeviceError,
                                 UnboundSymbolError, SymbolBindingError, GraphError, IoError,
                                 UnsupportedError, CudaError, InternalError, Error>(context);
  throw;  // not a splice::Error
}

}  // namespace splice
