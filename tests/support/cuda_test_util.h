// Helpers for the GPU tests (tests/cuda): device copies that keep a view's whole storage (so
// NaN padding outside the view travels both ways), NaN-poisoned host layouts and the check that
// a kernel kept to its view, a scope guard for the PDL switch and a PDL stream, and
// SKIP_WITHOUT_GPU.
// Header-only (included by tests/cuda alone): the support library is also built without CUDA.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "splice/backend/cuda/runtime.h"
#include "splice/core/random.h"
#include "splice/core/tensor.h"
#include "support/test_util.h"

// The first statement of every GPU test: skips it without a CUDA device, and registers the CUDA
// backend otherwise.
#define SKIP_WITHOUT_GPU()                                                     \
  do {                                                                         \
    if (!::splice::cuda::device_available()) GTEST_SKIP() << "no CUDA device"; \
    ::splice::cuda::ensure_registered();                                       \
  } while (0)

namespace splice::testing {

// The same view on the device: the whole storage is copied, so the poison travels too.
inline Tensor upload(const Tensor& h) {
  const std::size_t es = dtype_size(h.dtype());
  const auto elems = static_cast<std::int64_t>(std::max<std::size_t>(h.storage()->bytes, es) / es);
  Tensor base = Tensor::empty({elems}, h.dtype(), Device::cuda());
  device_copy(base.raw_data(), base.device(), h.storage()->data, Device::cpu(), h.storage()->bytes);
  return Tensor::view_of(base.storage(), h.offset(), h.shape(), h.strides(), h.dtype());
}

// The whole storage of a device view back on the host, viewed as `d` (padding included).
inline Tensor download_view(const Tensor& d) {
  cuda::synchronize();
  const std::size_t bytes = d.storage()->bytes;
  const std::size_t es = dtype_size(d.dtype());
  Tensor base = Tensor::empty({static_cast<std::int64_t>(std::max(bytes, es) / es)}, d.dtype());
  device_copy(base.raw_data(), Device::cpu(), d.storage()->data, d.device(), bytes);
  return Tensor::view_of(base.storage(), d.offset(), d.shape(), d.strides(), d.dtype());
}

// A contiguous CPU copy of a device view (of any layout).
inline Tensor download(const Tensor& d) { return download_view(d).clone(); }

// Row layouts of a host test tensor (the last axis is the row): contiguous; padded (kLayoutPad
// elements of gap after every row); offset (rows start one element past the allocation, so a
// 16-byte path must fall back to scalars). Memory outside the view is NaN in every layout.
enum class Layout { contiguous, padded, offset };
inline constexpr Layout kLayouts[] = {Layout::contiguous, Layout::padded, Layout::offset};
inline constexpr std::int64_t kLayoutPad = 3;
inline const char* layout_name(Layout l) {
  return l == Layout::contiguous ? "contiguous" : l == Layout::padded ? "padded" : "offset";
}

// A CPU tensor of `shape` in `layout` whose memory outside the view is NaN.
inline Tensor host(const Dims& shape, DType dtype, Layout layout) {
  switch (layout) {
    case Layout::contiguous: {
      Tensor t = Tensor::empty(shape, dtype);
      poison_nan(t);
      return t;
    }
    case Layout::padded:
      return padded_tensor(shape, dtype, kLayoutPad);
    case Layout::offset: {
      Dims wider = shape;
      wider.back() += 1;
      Tensor base = Tensor::empty(wider, dtype);
      poison_nan(base);
      return base.slice(static_cast<std::int64_t>(wider.size()) - 1, 1, wider.back());
    }
  }
  return {};
}

// host() filled with normal(mean, stddev) values inside the view.
inline Tensor normal(Rng& rng, const Dims& shape, DType dtype, Layout layout, double stddev = 1.0,
                     double mean = 0.0) {
  Tensor t = host(shape, dtype, layout);
  rng.normal(t, mean, stddev);
  return t;
}

// Elements of the storage outside the view that are not NaN (0 when the kernel kept to its view).
inline std::int64_t touched_padding(const Tensor& view_on_host) {
  const Tensor flat = Tensor::view_of(
      view_on_host.storage(), 0,
      {static_cast<std::int64_t>(view_on_host.storage()->bytes / dtype_size(view_on_host.dtype()))},
      {1}, view_on_host.dtype());
  std::vector<bool> inside(static_cast<std::size_t>(flat.numel()), false);
  for (std::int64_t i = 0; i < view_on_host.numel(); ++i)
    inside[static_cast<std::size_t>(view_on_host.linear_to_offset(i))] = true;
  std::int64_t touched = 0;
  for (std::int64_t i = 0; i < flat.numel(); ++i)
    touched += !inside[static_cast<std::size_t>(i)] && !std::isnan(flat.at({i}));
  return touched;
}

// Restores the PDL switch on scope exit, so a failing test does not leak its setting.
class PdlScope {
 public:
  PdlScope() : saved_(cuda::pdl_enabled()) {}
  ~PdlScope() { cuda::set_pdl_enabled(saved_); }
  PdlScope(const PdlScope&) = delete;
  PdlScope& operator=(const PdlScope&) = delete;

 private:
  bool saved_;
};

// A non-blocking stream with programmatic dependent launch on for a test's scope (the previous
// setting restored after).
class PdlStream {
 public:
  PdlStream() {
    cuda::set_pdl_enabled(true);
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  ~PdlStream() { cudaStreamDestroy(stream_); }
  PdlStream(const PdlStream&) = delete;
  PdlStream& operator=(const PdlStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  PdlScope restore_pdl_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace splice::testing
