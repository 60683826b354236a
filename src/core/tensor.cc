// Tensor views, element access and the shared argument checks (see tensor.h).
#include "splice/core/tensor.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <utility>

#include "splice/core/error.h"

namespace splice {

namespace {
DeviceAllocFn g_device_alloc[2] = {nullptr, nullptr};
DeviceCopyFn g_device_copy = nullptr;
constexpr std::size_t kHostAlignment = 64;  // cache line: lets kernels use aligned vector loads
}  // namespace

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

std::string dims_str(const Dims& dims) {
  std::ostringstream out;
  out << "[";
  for (std::size_t i = 0; i < dims.size(); ++i) out << (i ? ", " : "") << dims[i];
  out << "]";
  return out.str();
}

void register_device_allocator(DeviceKind kind, DeviceAllocFn fn) {
  g_device_alloc[static_cast<int>(kind)] = fn;
}
void register_device_copy(DeviceCopyFn fn) { g_device_copy = fn; }

void device_copy(void* dst, Device dst_device, const void* src, Device src_device,
                 std::size_t bytes) {
  if (bytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memmove(dst, src, bytes);
    return;
  }
  if (!g_device_copy)
    fail<DeviceError>("cannot copy between ", src_device.str(), " and ", dst_device.str(),
                      ": this build has no CUDA backend");
  g_device_copy(dst, dst_device, src, src_device, bytes);
}

Dims Tensor::contiguous_strides(const Dims& shape) {
  Dims strides(shape.size());
  std::int64_t running = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = running;
    running *= shape[i];
  }
  return strides;
}

static std::int64_t checked_numel(const Dims& shape) {
  std::int64_t n = 1;
  for (auto d : shape)
    if (d < 0) fail<ShapeError>("tensor dims must be >= 0, got ", dims_str(shape));
  // Strides multiply the dims other than zeros too, so every partial product must fit in int64.
  std::int64_t span = 1;
  for (auto d : shape) {
    if (__builtin_mul_overflow(span, std::max<std::int64_t>(d, 1), &span))
      fail<ShapeError>("tensor shape ", dims_str(shape), " has more elements than fit in int64");
    n *= d;
  }
  return n;
}

Tensor Tensor::empty(const Dims& shape, DType dtype, Device device) {
  std::int64_t bytes_signed = 0;
  if (__builtin_mul_overflow(checked_numel(shape), static_cast<std::int64_t>(dtype_size(dtype)),
                             &bytes_signed))
    fail<ShapeError>("tensor shape ", dims_str(shape), " of ", dtype_name(dtype), " is too large");
  const auto bytes = static_cast<std::size_t>(bytes_signed);
  std::shared_ptr<Storage> storage;
  if (device.is_cpu()) {
    storage = std::make_shared<Storage>();
    const std::size_t padded = ((bytes + kHostAlignment - 1) / kHostAlignment) * kHostAlignment;
    storage->data = std::aligned_alloc(kHostAlignment, padded == 0 ? kHostAlignment : padded);
    if (!storage->data) fail<Error>("out of host memory allocating ", bytes, " bytes");
    storage->bytes = bytes;
    storage->device = device;
    storage->deleter = [](void* p) { std::free(p); };
  } else {
    auto alloc = g_device_alloc[static_cast<int>(device.kind)];
    if (!alloc) fail<DeviceError>("device ", device.str(), " is not available in this build");
    storage = alloc(bytes, device);
  }
  return view_of(std::move(storage), 0, shape, contiguous_strides(shape), dtype);
}

Tensor Tensor::zeros(const Dims& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, Device::cpu());
  if (t.nbytes()) std::memset(t.raw_data(), 0, t.nbytes());
  return device.is_cpu() ? t : t.to_device(device);
}

Tensor Tensor::borrow(void* data, const Dims& shape, DType dtype, Dims strides, Device device) {
  auto storage = std::make_shared<Storage>();
  storage->data = data;
  storage->bytes = 0;  // unknown extent: borrowed
  storage->device = device;
  if (strides.empty()) strides = contiguous_strides(shape);
  return view_of(std::move(storage), 0, shape, strides, dtype);
}

Tensor Tensor::view_of(std::shared_ptr<Storage> storage, std::int64_t offset, const Dims& shape,
                       const Dims& strides, DType dtype) {
  SPLICE_INTERNAL_CHECK(shape.size() == strides.size(), "shape ", dims_str(shape), " strides ",
                        dims_str(strides));
  Tensor t;
  t.storage_ = std::move(storage);
  t.offset_ = offset;
  t.shape_ = shape;
  t.strides_ = strides;
  t.dtype_ = dtype;
  return t;
}

static std::int64_t wrap_axis(std::int64_t axis, std::int64_t rank) {
  const std::int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank) fail<ShapeError>("axis ", axis, " is out of range for rank ", rank);
  return a;
}

std::int64_t Tensor::size(std::int64_t axis) const { return shape_[wrap_axis(axis, dim())]; }
std::int64_t Tensor::stride(std::int64_t axis) const { return strides_[wrap_axis(axis, dim())]; }
std::int64_t Tensor::numel() const {
  std::int64_t n = 1;
  for (auto d : shape_) n *= d;
  return n;
}

bool Tensor::is_contiguous() const {
  std::int64_t running = 1;
  for (std::size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] != 1 && strides_[i] != running) return false;
    running *= shape_[i];
  }
  return true;
}

void* Tensor::raw_data() const {
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->data) +
         offset_ * static_cast<std::int64_t>(dtype_size(dtype_));
}

Tensor Tensor::slice(std::int64_t axis, std::int64_t start, std::int64_t end) const {
  const std::int64_t a = wrap_axis(axis, dim());
  if (start < 0 || end < start || end > shape_[a])
    fail<ShapeError>("slice [", start, ", ", end, ") of axis ", a, " is out of range for shape ",
                     dims_str(shape_));
  Dims shape = shape_;
  shape[a] = end - start;
  return view_of(storage_, offset_ + start * strides_[a], shape, strides_, dtype_);
}

Tensor Tensor::select(std::int64_t axis, std::int64_t index) const {
  const std::int64_t a = wrap_axis(axis, dim());
  if (index < 0 || index >= shape_[a])
    fail<ShapeError>("index ", index, " is out of range for axis ", a, " of shape ",
                     dims_str(shape_));
  Dims shape = shape_, strides = strides_;
  shape.erase(shape.begin() + a);
  strides.erase(strides.begin() + a);
  return view_of(storage_, offset_ + index * strides_[a], shape, strides, dtype_);
}

Tensor Tensor::permute(const std::vector<std::int64_t>& perm) const {
  if (static_cast<std::int64_t>(perm.size()) != dim())
    fail<ShapeError>("permutation ", dims_str(perm), " does not match rank ", dim());
  Dims shape(perm.size()), strides(perm.size());
  std::vector<bool> seen(perm.size(), false);
  for (std::size_t i = 0; i < perm.size(); ++i) {
    const std::int64_t p = wrap_axis(perm[i], dim());
    if (seen[p]) fail<ShapeError>("permutation ", dims_str(perm), " repeats axis ", p);
    seen[p] = true;
    shape[i] = shape_[p];
    strides[i] = strides_[p];
  }
  return view_of(storage_, offset_, shape, strides, dtype_);
}

Tensor Tensor::reshape(const Dims& shape) const {
  if (!is_contiguous())
    fail<LayoutError>("reshape needs a contiguous tensor, got strides ", dims_str(strides_));
  Dims out = shape;
  std::int64_t known = 1, infer = -1;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      if (infer >= 0) fail<ShapeError>("reshape ", dims_str(shape), " infers more than one dim");
      infer = static_cast<std::int64_t>(i);
    } else {
      known *= out[i];
    }
  }
  if (infer >= 0) out[infer] = known == 0 ? 0 : numel() / known;
  if (checked_numel(out) != numel())
    fail<ShapeError>("cannot reshape ", dims_str(shape_), " into ", dims_str(shape));
  return view_of(storage_, offset_, out, contiguous_strides(out), dtype_);
}

std::optional<Tensor> Tensor::view_reshape(const Dims& shape) const {
  if (checked_numel(shape) != numel())
    fail<ShapeError>("cannot reshape ", dims_str(shape_), " into ", dims_str(shape));
  // Walk the input's dims from the last in runs contiguous with each other (stride[d - 1] ==
  // size[d] * stride[d]; size-1 dims join any run); each run must be covered by whole dims of
  // `shape`, which get strides inside it (size-1 dims of `shape` fit anywhere).
  if (numel() == 0) return view_of(storage_, offset_, shape, contiguous_strides(shape), dtype_);
  Dims strides(shape.size(), 1);
  auto t = static_cast<std::int64_t>(shape.size()) - 1;  // next dim of `shape` to place
  std::int64_t run_numel = 1, view_numel = 1;
  std::int64_t base = strides_.empty() ? 1 : strides_.back();  // the run's innermost stride
  for (auto d = static_cast<std::int64_t>(shape_.size()) - 1; d >= 0; --d) {
    run_numel *= shape_[d];
    const bool run_ends = d == 0 || (shape_[d - 1] != 1 && strides_[d - 1] != run_numel * base);
    if (!run_ends) continue;
    while (t >= 0 && (view_numel < run_numel || shape[t] == 1)) {
      strides[t] = view_numel * base;
      view_numel *= shape[t];
      --t;
    }
    if (view_numel != run_numel) return std::nullopt;
    if (d > 0) {
      base = strides_[d - 1];
      run_numel = view_numel = 1;
    }
  }
  for (; t >= 0 && shape[t] == 1; --t) strides[t] = view_numel * base;  // a 0-dim input's
  if (t != -1) return std::nullopt;
  return view_of(storage_, offset_, shape, strides, dtype_);
}

Tensor Tensor::expand(const Dims& shape) const {
  const auto lead = static_cast<std::int64_t>(shape.size()) - dim();
  if (lead < 0) fail<ShapeError>("cannot expand ", dims_str(shape_), " to ", dims_str(shape));
  Dims strides(shape.size(), 0);
  for (std::int64_t d = 0; d < dim(); ++d) {
    const std::int64_t to = shape[static_cast<std::size_t>(lead + d)];
    if (shape_[d] == to) {
      strides[static_cast<std::size_t>(lead + d)] = strides_[d];
    } else if (shape_[d] != 1) {
      fail<ShapeError>("cannot expand ", dims_str(shape_), " to ", dims_str(shape), ": dim ", d,
                       " is ", shape_[d], ", not 1 or ", to);
    }
  }
  return view_of(storage_, offset_, shape, strides, dtype_);
}

Tensor Tensor::unsqueeze(std::int64_t axis) const {
  const std::int64_t a = axis < 0 ? axis + dim() + 1 : axis;
  if (a < 0 || a > dim()) fail<ShapeError>("unsqueeze axis ", axis, " out of range");
  Dims shape = shape_, strides = strides_;
  const std::int64_t stride = a < dim() ? strides_[a] * shape_[a] : 1;
  shape.insert(shape.begin() + a, 1);
  strides.insert(strides.begin() + a, stride);
  return view_of(storage_, offset_, shape, strides, dtype_);
}

std::int64_t Tensor::element_offset(const Dims& index) const {
  SPLICE_INTERNAL_CHECK(index.size() == shape_.size(), "index rank");
  std::int64_t off = offset_;
  for (std::size_t i = 0; i < index.size(); ++i) off += index[i] * strides_[i];
  return off;
}

std::int64_t Tensor::linear_to_offset(std::int64_t linear) const {
  std::int64_t off = offset_;
  for (std::size_t i = shape_.size(); i-- > 0;) {
    const std::int64_t d = shape_[i];
    off += (linear % d) * strides_[i];
    linear /= d;
  }
  return off;
}

static void require_cpu(const Tensor& t, const char* what) {
  if (!t.device().is_cpu())
    fail<DeviceError>(what, " needs a cpu tensor, got one on ", t.device().str());
}

double Tensor::at(const Dims& index) const {
  require_cpu(*this, "Tensor::at");
  return load_as_double(storage_->data, dtype_, element_offset(index));
}
void Tensor::set(const Dims& index, double value) {
  require_cpu(*this, "Tensor::set");
  store_from_double(storage_->data, dtype_, element_offset(index), value);
}
double Tensor::at_linear(std::int64_t linear) const {
  return load_as_double(storage_->data, dtype_, linear_to_offset(linear));
}
void Tensor::set_linear(std::int64_t linear, double value) {
  store_from_double(storage_->data, dtype_, linear_to_offset(linear), value);
}

void Tensor::fill(double value) {
  require_cpu(*this, "Tensor::fill");
  for_each_offset([&](std::int64_t at) { store_from_double(storage_->data, dtype_, at, value); },
                  *this);
}

// Dense conversions between the float dtypes (weight loading converts whole checkpoints): typed
// loops instead of the element-by-element double path. Returns false for other dtype pairs.
static bool convert_contiguous(const Tensor& src, Tensor& dst) {
  const std::int64_t n = src.numel();
  const void* in = src.raw_data();
  void* out = dst.raw_data();
  auto run = [&](auto load, auto store) {
    for (std::int64_t i = 0; i < n; ++i) store(out, i, load(in, i));
    return true;
  };
  auto load_f32 = [](const void* p, std::int64_t i) { return static_cast<const float*>(p)[i]; };
  auto load_bf16 = [](const void* p, std::int64_t i) {
    return bf16_bits_to_f32(static_cast<const std::uint16_t*>(p)[i]);
  };
  auto load_f16 = [](const void* p, std::int64_t i) {
    return f16_bits_to_f32(static_cast<const std::uint16_t*>(p)[i]);
  };
  auto store_f32 = [](void* p, std::int64_t i, float v) { static_cast<float*>(p)[i] = v; };
  auto store_bf16 = [](void* p, std::int64_t i, float v) {
    static_cast<std::uint16_t*>(p)[i] = f32_to_bf16_bits(v);
  };
  auto store_f16 = [](void* p, std::int64_t i, float v) {
    static_cast<std::uint16_t*>(p)[i] = f32_to_f16_bits(v);
  };
  const DType a = src.dtype(), b = dst.dtype();
  if (a == DType::f32 && b == DType::bf16) return run(load_f32, store_bf16);
  if (a == DType::f32 && b == DType::f16) return run(load_f32, store_f16);
  if (a == DType::bf16 && b == DType::f32) return run(load_bf16, store_f32);
  if (a == DType::f16 && b == DType::f32) return run(load_f16, store_f32);
  if (a == DType::bf16 && b == DType::f16) return run(load_bf16, store_f16);
  if (a == DType::f16 && b == DType::bf16) return run(load_f16, store_bf16);
  return false;
}

namespace {
Tensor on_host(const Tensor& t);  // below, beside byte_span
}  // namespace

void Tensor::copy_from(const Tensor& src) {
  if (src.shape_ != shape_)
    fail<ShapeError>("copy_from: source shape ", dims_str(src.shape_), " != destination ",
                     dims_str(shape_));
  if (!device().is_cpu() || !src.device().is_cpu()) {
    if (src.dtype_ == dtype_ && src.is_contiguous() && is_contiguous()) {
      device_copy(raw_data(), device(), src.raw_data(), src.device(), nbytes());
      return;
    }
    // A strided or converting copy: through the host (tuning and I/O, never a decode step).
    if (!device().is_cpu() && !is_contiguous())
      fail<LayoutError>("copy_from: a ", device().str(), " destination must be contiguous for a ",
                        src.is_contiguous() ? "converting" : "strided", " copy; got ", describe(),
                        " with strides ", dims_str(strides_));
    const Tensor staged = on_host(src);
    if (device().is_cpu()) return copy_from(staged);
    const Tensor host =
        staged.dtype_ == dtype_ && staged.is_contiguous() ? staged : staged.to(dtype_);
    device_copy(raw_data(), device(), host.raw_data(), Device::cpu(), nbytes());
    return;
  }
  const std::int64_t n = numel();
  if (src.dtype_ == dtype_ && src.is_contiguous() && is_contiguous()) {
    if (n) std::memmove(raw_data(), src.raw_data(), nbytes());
    return;
  }
  const std::size_t es = dtype_size(dtype_);
  char* dst = static_cast<char*>(storage_->data);
  const char* s = static_cast<const char*>(src.storage_->data);
  if (src.dtype_ == dtype_) {
    for_each_offset(
        [&](std::int64_t to, std::int64_t from) { std::memcpy(dst + to * es, s + from * es, es); },
        *this, src);
    return;
  }
  if (src.is_contiguous() && is_contiguous() && convert_contiguous(src, *this)) return;
  for_each_offset(
      [&](std::int64_t to, std::int64_t from) {
        store_from_double(dst, dtype_, to, load_as_double(s, src.dtype_, from));
      },
      *this, src);
}

Tensor Tensor::contiguous() const {
  Tensor out = empty(shape_, dtype_, device());
  out.copy_from(*this);
  return out;
}
Tensor Tensor::clone() const { return contiguous(); }

Tensor Tensor::to(DType dtype) const {
  require_cpu(*this, "Tensor::to");
  Tensor out = empty(shape_, dtype);
  out.copy_from(*this);
  return out;
}

Tensor Tensor::to_device(Device device) const {
  Tensor out = empty(shape_, dtype_, device);
  out.copy_from(*this);
  return out;
}

std::string Tensor::describe() const {
  return std::string(dtype_name(dtype_)) + dims_str(shape_) + " on " + device().str();
}

namespace {

// The byte offsets [lo, hi] (inclusive) from raw_data() that axes `first`.. of `t` reach.
std::pair<std::int64_t, std::int64_t> byte_span(const Tensor& t, std::int64_t first) {
  std::int64_t lo = 0, hi = 0;
  for (std::int64_t d = first; d < t.dim(); ++d) {
    const std::int64_t reach = (t.size(d) - 1) * t.stride(d);
    (reach < 0 ? lo : hi) += reach;
  }
  const auto width = static_cast<std::int64_t>(dtype_size(t.dtype()));
  return {lo * width, hi * width + width - 1};
}

// t's values on the host: t itself there; elsewhere the bytes t's elements span, copied to the
// host and viewed with t's strides (a slice of a wider device buffer needs no gather kernel).
Tensor on_host(const Tensor& t) {
  if (t.device().is_cpu()) return t;
  if (t.numel() == 0) return Tensor::empty(t.shape(), t.dtype());
  const auto [lo, hi] = byte_span(t, 0);
  const auto width = static_cast<std::int64_t>(dtype_size(t.dtype()));
  // [(hi - lo + 1) / width] elements of t.dtype(): the span, t's first element at -lo / width.
  const Tensor span = Tensor::empty({(hi - lo + 1) / width}, t.dtype());
  device_copy(span.raw_data(), Device::cpu(), static_cast<const char*>(t.raw_data()) + lo,
              t.device(), static_cast<std::size_t>(hi - lo + 1));
  return Tensor::view_of(span.storage(), -lo / width, t.shape(), t.strides(), t.dtype());
}

std::int64_t floor_div(std::int64_t a, std::int64_t b) {  // b > 0
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

}  // namespace

bool share_memory(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || a.numel() == 0 || b.numel() == 0) return false;
  // Signed byte offsets from a's first element: b's base sits at `shift`.
  const std::int64_t shift =
      static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(b.raw_data()) -
                                reinterpret_cast<std::uintptr_t>(a.raw_data()));
  const auto [a_lo, a_hi] = byte_span(a, 0);
  const auto [b_lo, b_hi] = byte_span(b, 0);
  if (a_hi < shift + b_lo || shift + b_hi < a_lo) return false;
  // Two views that step through the same slots (one leading stride S in bytes, each slot's rest
  // narrower than S: a page per slot holding one slot of each, e.g. KDA's conv_state and state)
  // overlap exactly when slot i of a meets slot j of b for some k = j - i:
  // [a0 + i S, a1 + i S] meets [b0 + j S, b1 + j S]  <=>  a0 - b1 <= k S <= a1 - b0.
  const std::int64_t slot =
      a.dim() > 0 ? a.stride(0) * static_cast<std::int64_t>(dtype_size(a.dtype())) : 0;
  if (slot > 0 && a.size(0) > 1 && b.dim() > 0 && b.size(0) > 1 &&
      b.stride(0) * static_cast<std::int64_t>(dtype_size(b.dtype())) == slot) {
    const auto [a0, a1] = byte_span(a, 1);
    auto [b0, b1] = byte_span(b, 1);
    if (a1 - a0 < slot && b1 - b0 < slot) {
      b0 += shift;
      b1 += shift;
      const std::int64_t k_min = -floor_div(b1 - a0, slot);  // ceil((a0 - b1) / S)
      const std::int64_t k_max = floor_div(a1 - b0, slot);
      return std::max(k_min, -(a.size(0) - 1)) <= std::min(k_max, b.size(0) - 1);
    }
  }
  return true;  // byte ranges meet: conservatively shared
}

bool has_internal_overlap(const Tensor& t) {
  // Fast path, one pass (every planned buffer and row-major view; kernels check each output per
  // node and token): from the innermost axis out, each stride steps past what the inner axes span.
  std::int64_t inner_span = 0;
  bool row_major = true;
  for (std::int64_t d = t.dim() - 1; d >= 0 && row_major; --d) {
    if (t.size(d) == 0) return false;  // no element, no address to share
    if (t.size(d) == 1) continue;
    const std::int64_t stride = t.stride(d) < 0 ? -t.stride(d) : t.stride(d);
    row_major = stride > inner_span;
    inner_span += (t.size(d) - 1) * stride;
  }
  if (row_major || t.numel() == 0) return false;
  constexpr int kMaxAxes = 16;
  std::int64_t strides[kMaxAxes], sizes[kMaxAxes];
  int axes = 0;
  for (std::int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) <= 1) continue;        // an axis of one element steps nowhere
    if (axes == kMaxAxes) return false;  // beyond any tensor a kernel takes
    strides[axes] = t.stride(d) < 0 ? -t.stride(d) : t.stride(d);
    sizes[axes] = t.size(d);
    ++axes;
  }
  // Insertion sort by stride (a handful of axes); then each stride must exceed the span so far.
  for (int i = 1; i < axes; ++i)
    for (int j = i; j > 0 && strides[j] < strides[j - 1]; --j) {
      std::swap(strides[j], strides[j - 1]);
      std::swap(sizes[j], sizes[j - 1]);
    }
  std::int64_t span = 0;  // the largest offset the smaller-stride axes reach
  for (int i = 0; i < axes; ++i) {
    if (strides[i] <= span) return true;
    span += (sizes[i] - 1) * strides[i];
  }
  return false;
}

void check_no_self_overlap(const Tensor& t, const char* name) {
  if (has_internal_overlap(t))
    fail<LayoutError>("`", name, "` ", t.describe(),
                      " has elements that share an address (a stride-0 or interleaved axis); "
                      "an output needs one address per element");
}

void check_no_overlap(const Tensor& out, const char* out_name, const Tensor& in,
                      const char* in_name, bool allow_identical) {
  // Addresses, not Storage objects: two borrowed views of one buffer have different Storage.
  if (allow_identical && out.raw_data() == in.raw_data() && out.shape() == in.shape() &&
      out.strides() == in.strides() && out.dtype() == in.dtype())
    return;
  if (!share_memory(out, in)) return;
  fail<LayoutError>("`", out_name, "` ", out.describe(), " overlaps `", in_name, "` ",
                    in.describe(), " in memory",
                    allow_identical ? " (only an identical view may be updated in place)" : "");
}

void check_output_aliasing(std::initializer_list<AliasOutput> outputs,
                           std::initializer_list<AliasInput> inputs, const char* op) {
  try {
    for (const AliasOutput* o = outputs.begin(); o != outputs.end(); ++o) {
      check_no_self_overlap(o->tensor, o->name);
      for (const AliasOutput* other = o + 1; other != outputs.end(); ++other)
        if (share_memory(o->tensor, other->tensor))
          fail<LayoutError>("`", o->name, "` and `", other->name,
                            "` must not overlap in memory, got ", o->tensor.describe(), " and ",
                            other->tensor.describe());
      for (const AliasInput& in : inputs)
        check_no_overlap(o->tensor, o->name, in.tensor, in.name, in.in_place);
    }
  } catch (const LayoutError& e) {
    if (op == nullptr) throw;
    fail<LayoutError>(op, ": ", e.what());
  }
}

void check_defined(const Tensor& t, const char* name) {
  if (!t.defined()) fail<ValueError>("`", name, "` is required but was not given");
}

void check_dtype(const Tensor& t, const char* name, std::initializer_list<DType> allowed) {
  for (DType d : allowed)
    if (t.dtype() == d) return;
  std::string list;
  for (DType d : allowed) list += std::string(list.empty() ? "" : " or ") + dtype_name(d);
  fail<DTypeError>("`", name, "` must be ", list, ", got ", dtype_name(t.dtype()));
}

void check_rank(const Tensor& t, const char* name, std::int64_t rank) {
  if (t.dim() != rank)
    fail<ShapeError>("`", name, "` must have rank ", rank, ", got shape ", dims_str(t.shape()));
}

void check_shape(const Tensor& t, const char* name, const Dims& expected) {
  if (t.shape() != expected)
    fail<ShapeError>("`", name, "` must have shape ", dims_str(expected), ", got ",
                     dims_str(t.shape()));
}

void check_contiguous(const Tensor& t, const char* name) {
  if (!t.is_contiguous())
    fail<LayoutError>("`", name, "` must be contiguous, got shape ", dims_str(t.shape()),
                      " with strides ", dims_str(t.strides()));
}

}  // namespace splice
