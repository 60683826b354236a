// splice/core/error.h: the typed errors every public entry point raises.
//
// Bad input from a caller or a model file raises a subclass of `splice::Error` whose message names
// the argument, the value seen and what is allowed. Broken internal invariants raise
// `InternalError` through SPLICE_INTERNAL_CHECK, whose message says "internal error" and where.
// Library code never exits or aborts: every error reaches the CLI and Python intact.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace splice {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A tensor's shape (rank or a dimension) is not what the callee allows.
class ShapeError : public Error {
  using Error::Error;
};
// A tensor's element type is not what the callee allows.
class DTypeError : public Error {
  using Error::Error;
};
// A scalar or a tensor's content is outside the allowed set (value contracts).
class ValueError : public Error {
  using Error::Error;
};
// A tensor's memory layout (strides, contiguity, alignment) is not supported.
class LayoutError : public Error {
  using Error::Error;
};
// Tensors live on a device the callee cannot use, or on different devices.
class DeviceError : public Error {
  using Error::Error;
};
// A symbol was read before it was bound in the current pass.
class UnboundSymbolError : public Error {
  using Error::Error;
};
// A symbol was bound to a value outside its declared range, or rebound to another value.
class SymbolBindingError : public Error {
  using Error::Error;
};
// A graph, a branch or a spec handed to the optimizer is malformed.
class GraphError : public Error {
  using Error::Error;
};
// A file could not be read, or its content is malformed.
class IoError : public Error {
  using Error::Error;
};
// A feature is valid but not implemented by this backend or build.
class UnsupportedError : public Error {
  using Error::Error;
};
// A CUDA runtime or library call failed.
class CudaError : public Error {
  using Error::Error;
};
// An internal invariant was broken: a bug in splice, not in the caller's input.
class InternalError : public Error {
  using Error::Error;
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}
[[noreturn]] void throw_internal(const char* file, int line, const std::string& what);
}  // namespace detail

// Throws `ErrorType` with the streamed message parts concatenated.
template <typename ErrorType, typename... Args>
[[noreturn]] void fail(Args&&... args) {
  throw ErrorType(detail::concat(std::forward<Args>(args)...));
}

// Inside a catch block: rethrows the exception being handled, if it is a splice::Error, as the
// same type with `context` before its message (e.g. which branch and bucket the tuner was
// measuring when a kernel refused its input); any other exception propagates unchanged.
[[noreturn]] void rethrow_with_context(const std::string& context);

}  // namespace splice

// Internal invariant: on failure throws InternalError("internal error at file:line: ...").
#define SPLICE_INTERNAL_CHECK(cond, ...)                                          \
  do {                                                                            \
    if (!(cond))                                                                  \
      ::splice::detail::throw_internal(                                           \
          __FILE__, __LINE__,                                                     \
          ::splice::detail::concat("check `" #cond "` failed: ", ##__VA_ARGS__)); \
  } while (0)
