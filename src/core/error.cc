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

}  // namespace detail

void rethrow_with_context(const std::string& context) {
  // Most derived first: every type below is a direct subclass of Error.
  detail::rethrow_as<ShapeError>(context);
  detail::rethrow_as<DTypeError>(context);
  detail::rethrow_as<ValueError>(context);
  detail::rethrow_as<LayoutError>(context);
  detail::rethrow_as<DeviceError>(context);
  detail::rethrow_as<UnboundSymbolError>(context);
  detail::rethrow_as<SymbolBindingError>(context);
  detail::rethrow_as<GraphError>(context);
  detail::rethrow_as<IoError>(context);
  detail::rethrow_as<UnsupportedError>(context);
  detail::rethrow_as<CudaError>(context);
  detail::rethrow_as<InternalError>(context);
  detail::rethrow_as<Error>(context);
  throw;
}

}  // namespace splice
