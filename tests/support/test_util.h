// Shared test helpers: random tensors, padded layouts and tolerance assertions.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <exception>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "splice/core/random.h"
#include "splice/core/tensor.h"
#include "splice/core/tolerance.h"

namespace splice::testing {

// A CPU tensor of `shape` with N(mean, stddev) entries.
Tensor random_tensor(Rng& rng, const Dims& shape, DType dtype, double stddev = 1.0,
                     double mean = 0.0);

// A view of `shape` whose storage has `pad` extra elements on every axis's stride (so strides
// are not contiguous); the padding is filled with NaN so a kernel reading it is caught.
Tensor padded_tensor(const Dims& shape, DType dtype, std::int64_t pad);

// The policy for logits computed from bf16 layers (stored as f32) against another backend or
// another summation order: `ulps` bf16 ulps of the largest |logit| in `expected` plus 2%
// relative. Two bf16 layers upstream move logits by up to ~4 ulps of the largest one through
// rounding order alone (rope_kv_append_test: 0.28 at |logit| ~60 on the CPU, fused vs
// decomposed), which the default bf16 policy, relative to each logit, does not allow.
Tolerance bf16_logit_tolerance(const Tensor& expected, double ulps = 4);

// Asserts `actual` matches `expected` within `tol`, printing the report on failure.
::testing::AssertionResult close(const Tensor& actual, const Tensor& expected, Tolerance tol);
::testing::AssertionResult bit_equal(const Tensor& actual, const Tensor& expected);

// Host bytes posing as device memory: tensors borrowed from them claim Device::cuda(), so a CUDA
// launcher's host-side checks run without a GPU (they never dereference a tensor; a call that
// passes them goes on to a CUDA call, which fails without a device).
class FakeDeviceMemory {
 public:
  explicit FakeDeviceMemory(std::size_t bytes) : bytes_(bytes + kAlign, 0) {}
  // A contiguous `shape` view `offset` elements of `dtype` in.
  Tensor at(std::int64_t offset, const Dims& shape, DType dtype) {
    return view(offset, shape, Tensor::contiguous_strides(shape), dtype);
  }
  Tensor view(std::int64_t offset, const Dims& shape, const Dims& strides, DType dtype) {
    const auto start = reinterpret_cast<std::uintptr_t>(bytes_.data());
    auto* base = reinterpret_cast<unsigned char*>((start + kAlign - 1) / kAlign * kAlign) +
                 offset * static_cast<std::int64_t>(dtype_size(dtype));
    return Tensor::borrow(base, shape, dtype, strides, Device::cuda());
  }

 private:
  static constexpr std::uintptr_t kAlign = 256;  // as cudaMalloc's
  std::vector<unsigned char> bytes_;
};

// Expects `call()` to throw ErrorType whose message contains `needle`; a call that returns, or
// throws another type, is a test failure naming the needle.
template <typename ErrorType, typename Call>
void expect_error_with(Call&& call, const std::string& needle) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one naming " << needle;
  } catch (const ErrorType& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message does not name " << needle << ": " << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong error type for " << needle << ": " << e.what();
  }
}

// A path under gtest's TempDir() that no other process shares: `name` plus this process's id.
// ctest runs every test case of a binary as a process of its own, in parallel, so a fixed path
// (a model directory the cases write and read back) would be rewritten under a reader's feet.
// Whatever lies at the paths handed out is removed when the process exits.
inline std::string process_temp_path(const std::string& name) {
  struct Removed {
    std::vector<std::string> paths;
    ~Removed() {
      std::error_code ec;
      for (const std::string& p : paths) std::filesystem::remove_all(p, ec);
    }
  };
  static Removed removed;
  std::string path = ::testing::TempDir() + "/" + name + "-" + std::to_string(::getpid());
  removed.paths.push_back(path);
  return path;
}

}  // namespace splice::testing
