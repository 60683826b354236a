// Seeded random fills (see random.h).
#include "splice/core/random.h"

#include <cmath>

namespace splice {

void Rng::normal(Tensor& t, double mean, double stddev) {
  std::normal_distribution<double> dist(mean, stddev);
  const std::int64_t n = t.numel();
  for (std::int64_t i = 0; i < n; ++i) t.set_linear(i, dist(engine_));
}

void Rng::uniform(Tensor& t, double lo, double hi) {
  std::uniform_real_distribution<double> dist(lo, hi);
  const std::int64_t n = t.numel();
  for (std::int64_t i = 0; i < n; ++i) t.set_linear(i, dist(engine_));
}

std::int64_t Rng::integer(std::int64_t lo, std::int64_t hi) {
  return std::uniform_int_distribution<std::int64_t>(lo, hi)(engine_);
}

void poison_nan(Tensor& t) {
  const std::int64_t n = t.numel();
  for (std::int64_t i = 0; i < n; ++i) t.set_linear(i, NAN);
}

}  // namespace splice
