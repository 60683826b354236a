// splice/core/tensor.h: a strided view over typed storage on one device.
//
// A `Tensor` is (storage, element offset, shape, strides in elements, dtype). Storage is owned
// (allocated here, freed with the last view) or borrowed (a caller's pointer, never freed).
// Views (`slice`, `permute`, `reshape` of contiguous data, `select`) share storage, so
// non-contiguous tensors are ordinary. Shapes are concrete here; symbolic shapes live in the IR.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "splice/core/dtype.h"

namespace splice {

enum class DeviceKind : std::uint8_t { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;
  static Device cpu() { return {DeviceKind::cpu, 0}; }
  static Device cuda(int index = 0) { return {DeviceKind::cuda, index}; }
  bool is_cpu() const { return kind == DeviceKind::cpu; }
  bool is_cuda() const { return kind == DeviceKind::cuda; }
  bool operator==(const Device&) const = default;
  std::string str() const;
};

using Dims = std::vector<std::int64_t>;
std::string dims_str(const Dims& dims);

// Raw memory on one device. `deleter` is empty for borrowed memory.
struct Storage {
  void* data = nullptr;
  std::size_t bytes = 0;
  Device device;
  std::function<void(void*)> deleter;
  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage() {
    if (deleter && data) deleter(data);
  }
};

// Allocator hook for non-CPU devices (the CUDA backend registers itself when it is linked).
using DeviceAllocFn = std::shared_ptr<Storage> (*)(std::size_t bytes, Device device);
void register_device_allocator(DeviceKind kind, DeviceAllocFn fn);

class Tensor {
 public:
  Tensor() = default;

  // A new, uninitialized, contiguous tensor.
  static Tensor empty(const Dims& shape, DType dtype, Device device = Device::cpu());
  // A new contiguous tensor filled with zeros (CPU only).
  static Tensor zeros(const Dims& shape, DType dtype, Device device = Device::cpu());
  // A view over caller memory that this tensor never frees. Empty `strides` means contiguous.
  static Tensor borrow(void* data, const Dims& shape, DType dtype, Dims strides = {},
                       Device device = Device::cpu());
  // A view over shared storage at an element offset.
  static Tensor view_of(std::shared_ptr<Storage> storage, std::int64_t offset, const Dims& shape,
                        const Dims& strides, DType dtype);
  // Contiguous row-major strides of `shape`.
  static Dims contiguous_strides(const Dims& shape);

  bool defined() const { return storage_ != nullptr; }
  const Dims& shape() const { return shape_; }
  const Dims& strides() const { return strides_; }
  std::int64_t dim() const { return static_cast<std::int64_t>(shape_.size()); }
  std::int64_t size(std::int64_t axis) const;
  std::int64_t stride(std::int64_t axis) const;
  std::int64_t numel() const;
  std::int64_t offset() const { return offset_; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device : Device::cpu(); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  void* raw_data() const;
  template <typename T>
  T* data() const;

  // Views sharing storage.
  Tensor slice(std::int64_t axis, std::int64_t start, std::int64_t end) const;
  Tensor select(std::int64_t axis, std::int64_t index) const;  // drops `axis`
  Tensor permute(const std::vector<std::int64_t>& perm) const;
  Tensor reshape(const Dims& shape) const;  // contiguous input only; -1 infers one dim
  // `shape` (same element count) as a view of any strided tensor, torch's view rule: each run of
  // dims contiguous with each other is split into, or merged from, whole dims of `shape`;
  // nullopt where the strides allow no view (a copy is needed).
  std::optional<Tensor> view_reshape(const Dims& shape) const;
  Tensor unsqueeze(std::int64_t axis) const;
  // A view of this tensor broadcast to `shape` (numpy's broadcast_to, torch's expand): dims
  // aligned from the last, each of size 1 or `shape`'s, missing leading dims added; a broadcast
  // dim gets stride 0. ShapeError where the shapes do not broadcast.
  Tensor expand(const Dims& shape) const;

  // A contiguous deep copy (CPU).
  Tensor contiguous() const;
  Tensor clone() const;
  // Copies `src` element by element into this tensor (same shape; casts dtype) (CPU).
  void copy_from(const Tensor& src);
  // Converts to `dtype` (CPU).
  Tensor to(DType dtype) const;
  // Copies to another device (host <-> CUDA through the registered backend).
  Tensor to_device(Device device) const;

  // Element access by multi-index, as double (CPU; for tests, references and tools).
  double at(const Dims& index) const;
  void set(const Dims& index, double value);
  // Element at flat row-major logical position `linear` (handles strides).
  double at_linear(std::int64_t linear) const;
  void set_linear(std::int64_t linear, double value);
  std::int64_t element_offset(const Dims& index) const;
  std::int64_t linear_to_offset(std::int64_t linear) const;

  void fill(double value);  // CPU

  std::string describe() const;  // "bf16[2, 8, 128] on cpu"

 private:
  std::shared_ptr<Storage> storage_;
  std::int64_t offset_ = 0;
  Dims shape_;
  Dims strides_;
  DType dtype_ = DType::f32;
};

template <typename T>
T* Tensor::data() const {
  return static_cast<T*>(raw_data());
}

// Calls f(offset_0, ..., offset_k) for every element of the same-shape tensors `first`, `rest...`
// (the caller checks the shapes), in row-major order, with each tensor's storage element offset
// (offset() + index . strides()). The offsets advance like an odometer, with no division per
// element: the loop over strided tensors (Tensor::at_linear costs a division per dimension).
template <typename F, typename... Rest>
void for_each_offset(F&& f, const Tensor& first, const Rest&... rest) {
  constexpr std::size_t kCount = 1 + sizeof...(Rest);
  const std::array<const Tensor*, kCount> tensors{&first, &rest...};
  const Dims& shape = first.shape();
  const std::size_t rank = shape.size();
  std::array<std::int64_t, kCount> offsets;
  for (std::size_t k = 0; k < kCount; ++k) offsets[k] = tensors[k]->offset();
  if (rank == 0) {
    std::apply(f, offsets);
    return;
  }
  for (std::int64_t extent : shape)
    if (extent == 0) return;
  const std::int64_t inner = shape[rank - 1];
  std::array<std::int64_t, kCount> inner_stride;
  for (std::size_t k = 0; k < kCount; ++k) inner_stride[k] = tensors[k]->strides()[rank - 1];
  Dims index(rank, 0);  // the outer dimensions' odometer
  for (;;) {
    std::array<std::int64_t, kCount> at = offsets;
    for (std::int64_t j = 0; j < inner; ++j) {
      std::apply(f, at);
      for (std::size_t k = 0; k < kCount; ++k) at[k] += inner_stride[k];
    }
    std::size_t axis = rank - 1;
    for (;;) {  // carry into the next outer dimension
      if (axis == 0) return;
      --axis;
      for (std::size_t k = 0; k < kCount; ++k) offsets[k] += tensors[k]->strides()[axis];
      if (++index[axis] < shape[axis]) break;
      for (std::size_t k = 0; k < kCount; ++k)
        offsets[k] -= shape[axis] * tensors[k]->strides()[axis];
      index[axis] = 0;
    }
  }
}

// Hooks for device copies (registered by the CUDA backend).
using DeviceCopyFn = void (*)(void* dst, Device dst_device, const void* src, Device src_device,
                              std::size_t bytes);
void register_device_copy(DeviceCopyFn fn);
void device_copy(void* dst, Device dst_device, const void* src, Device src_device,
                 std::size_t bytes);

// Argument checks used by every public entry point; each throws a typed error naming `name`.
void check_dtype(const Tensor& t, const char* name, std::initializer_list<DType> allowed);
void check_rank(const Tensor& t, const char* name, std::int64_t rank);
void check_shape(const Tensor& t, const char* name, const Dims& expected);
void check_contiguous(const Tensor& t, const char* name);
void check_defined(const Tensor& t, const char* name);

// Aliasing, by addresses (views of one buffer from different Storage objects count too; any
// strides; empty and undefined tensors hold no address).
// Whether `a` and `b` may share a byte: their byte ranges meet, and, for two views stepping
// through slots of one leading stride (a page per slot holding one slot of each), some slot of
// one meets a slot of the other. Other interleavings that share no element count as shared.
bool share_memory(const Tensor& a, const Tensor& b);
// Whether two elements of `t` share an address: a stride-0 axis of more than one element (an
// expanded view) or axes whose strides interleave. Conservative, like PyTorch's internal-overlap
// check: axes sorted by stride must each step past everything the smaller ones span.
bool has_internal_overlap(const Tensor& t);
// LayoutError naming `name` when `t`, an output, has internal overlap: a kernel writing it from
// several rows or threads would race on the shared addresses.
void check_no_self_overlap(const Tensor& t, const char* name);
// LayoutError naming both when the output `out` shares memory with the input `in`, unless
// `allow_identical` and the two are the very same view (first address, shape, strides and dtype:
// an in-place elementwise update).
void check_no_overlap(const Tensor& out, const char* out_name, const Tensor& in,
                      const char* in_name, bool allow_identical);
// The aliasing rule of a kernel call, checked before anything is written: each output has one
// address per element (check_no_self_overlap), the outputs share no memory with each other, and
// no output shares memory with an input except the identical view of an input marked `in_place`
// (one the op reads elementwise). Undefined tensors are skipped. LayoutError naming both tensors;
// `op`, when given, prefixes the messages.
struct AliasOutput {
  const Tensor& tensor;
  const char* name;
};
struct AliasInput {
  const Tensor& tensor;
  const char* name;
  bool in_place = false;  // the identical view may be written
};
void check_output_aliasing(std::initializer_list<AliasOutput> outputs,
                           std::initializer_list<AliasInput> inputs, const char* op = nullptr);

}  // namespace splice
