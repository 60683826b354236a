// splice::rethrow_with_context: inside a handler, a splice error comes back as its own type with
// the context before its message; anything else propagates untouched.
#include "splice/core/error.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <typeinfo>

namespace splice {
namespace {

// Throws E("inner"), catches it as Error and rethrows it with context "outer: ".
template <typename E>
void throw_with_context() {
  try {
    throw E("inner");
  } catch (const Error&) {
    rethrow_with_context("outer: ");
  }
}

template <typename E>
void expect_type_and_message_kept(const char* name) {
  SCOPED_TRACE(name);
  try {
    throw_with_context<E>();
    FAIL() << "nothing thrown";
  } catch (const E& e) {
    EXPECT_STREQ(e.what(), "outer: inner");
    EXPECT_EQ(typeid(e), typeid(E));  // the type itself, not a base of it
  } catch (...) {
    FAIL() << "another type came back";
  }
}

TEST(RethrowWithContext, EveryErrorTypeKeepsItsTypeAndGainsTheContext) {
  expect_type_and_message_kept<ShapeError>("ShapeError");
  expect_type_and_message_kept<DTypeError>("DTypeError");
  expect_type_and_message_kept<ValueError>("ValueError");
  expect_type_and_message_kept<LayoutError>("LayoutError");
  expect_type_and_message_kept<DeviceError>("DeviceError");
  expect_type_and_message_kept<UnboundSymbolError>("UnboundSymbolError");
  expect_type_and_message_kept<SymbolBindingError>("SymbolBindingError");
  expect_type_and_message_kept<GraphError>("GraphError");
  expect_type_and_message_kept<IoError>("IoError");
  expect_type_and_message_kept<UnsupportedError>("UnsupportedError");
  expect_type_and_message_kept<CudaError>("CudaError");
  expect_type_and_message_kept<InternalError>("InternalError");
  expect_type_and_message_kept<Error>("Error");
}

TEST(RethrowWithContext, OtherExceptionsPropagateUnchanged) {
  try {
    try {
      throw std::out_of_range("not ours");
    } catch (...) {
      rethrow_with_context("outer: ");
    }
  } catch (const std::out_of_range& e) {
    EXPECT_STREQ(e.what(), "not ours");
    return;
  }
  FAIL() << "the exception was not rethrown as itself";
}

}  // namespace
}  // namespace splice
