// splice/core/random.h: seeded random fills for verification inputs, tests and benchmarks.
// Fresh random inputs for every check, never zeros (design.md §2).
#pragma once

#include <cstdint>
#include <random>

#include "splice/core/tensor.h"

namespace splice {

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : engine_(seed) {}
  // Fills a CPU tensor (any strides) with N(mean, stddev), rounded to its dtype.
  void normal(Tensor& t, double mean = 0.0, double stddev = 1.0);
  void uniform(Tensor& t, double lo, double hi);
  std::int64_t integer(std::int64_t lo, std::int64_t hi);  // inclusive
  std::mt19937_64& engine() { return engine_; }

 private:
  std::mt19937_64 engine_;
};

// Fills every element of the storage that `t` views (the whole allocation when owned) with NaN;
// used to prove a kernel never reads memory it must not.
void poison_nan(Tensor& t);

}  // namespace splice
