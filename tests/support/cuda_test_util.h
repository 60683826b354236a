// Helpers for the GPU tests (tests/cuda): device copies that keep a view's whole storage (so
// NaN padding outside the view travels both ways) and a scope guard for the PDL switch.
// Header-only: the support library is also built without CUDA.
#pragma once

#include <algorithm>
#include <cstdint>

#include "splice/backend/cuda/runtime.h"
#include "splice/core/tensor.h"

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

}  // namespace splice::testing
