// Seeded random fills (see random.h).
#include "splice/core/random.h"

#include <cmath>

namespace splice {
namespace {

// Stores next() into every element of `t` in row-major order (the order the seeds promise).
template <typename Next>
void fill(Tensor& t, Next&& next) {
  void* data = t.storage()->data;
  for_each_offset([&](std::int64_t at) { store_from_double(data, t.dtype(), at, next()); }, t);
}

}  // namespace

void Rng::normal(Tensor& t, double mean, double stddev) {
  std::normal_distribution<double> dist(mean, stddev);
  fill(t, [&] { return dist(engine_); });
}

void Rng::uniform(Tensor& t, double lo, double hi) {
  std::uniform_real_distribution<double> dist(lo, hi);
  fill(t, [&] { return dist(engine_); });
}

std::int64_t Rng::integer(std::int64_t lo, std::int64_t hi) {
  return std::uniform_int_distribution<std::int64_t>(lo, hi)(engine_);
}

void poison_nan(Tensor& t) {
  fill(t, [] { return static_cast<double>(NAN); });
}

}  // namespace splice
