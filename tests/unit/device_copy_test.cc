// Tensor copies that cross a device boundary, on a stand-in device: host memory registered as
// cuda:0 (allocator and copy hooks), so the CPU suite checks the layout rules every device copy
// follows. A strided device source (a slice of a wider buffer, as the tuner reads a region's
// output view) and a converting copy go through the host; a contiguous same-dtype copy is one
// device_copy of nbytes; a strided device destination is refused before anything is written.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "splice/core/error.h"
#include "splice/core/tensor.h"

namespace splice {
namespace {

struct CopyLog {
  int calls = 0;
  std::size_t bytes = 0;
};
CopyLog g_log;

std::shared_ptr<Storage> stand_in_alloc(std::size_t bytes, Device device) {
  auto s = std::make_shared<Storage>();
  s->data = std::malloc(bytes ? bytes : 1);
  s->bytes = bytes;
  s->device = device;
  s->deleter = [](void* p) { std::free(p); };
  return s;
}

void stand_in_copy(void* dst, Device, const void* src, Device, std::size_t bytes) {
  ++g_log.calls;
  g_log.bytes += bytes;
  std::memmove(dst, src, bytes);
}

class DeviceCopy : public ::testing::Test {
 protected:
  void SetUp() override {
    register_device_allocator(DeviceKind::cuda, &stand_in_alloc);
    register_device_copy(&stand_in_copy);
    g_log = {};
  }
  // [rows, cols] f32 on the stand-in device, element (r, c) = 100 r + c.
  static Tensor device_matrix(std::int64_t rows, std::int64_t cols) {
    Tensor host = Tensor::empty({rows, cols}, DType::f32);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c) host.set({r, c}, 100.0 * r + c);
    return host.to_device(Device::cuda(0));
  }
};

TEST_F(DeviceCopy, ContiguousSameDtypeIsOneCopyOfItsBytes) {
  const Tensor d = device_matrix(3, 4);
  g_log = {};
  const Tensor h = d.to_device(Device::cpu());
  EXPECT_EQ(g_log.calls, 1);
  EXPECT_EQ(g_log.bytes, 3u * 4u * sizeof(float));
  EXPECT_EQ(h.at({2, 3}), 203.0);
}

TEST_F(DeviceCopy, StridedDeviceSourceReachesTheHost) {
  const Tensor d = device_matrix(4, 6);
  // [4, 2] columns 3..4 of every row, and [2, 6] rows 1..2: views of d's storage.
  const Tensor columns = d.slice(1, 3, 5);
  ASSERT_FALSE(columns.is_contiguous());
  g_log = {};
  const Tensor h = columns.to_device(Device::cpu());
  EXPECT_EQ(g_log.calls, 1);  // the span the view reaches, not every row apart
  EXPECT_LE(g_log.bytes, 4u * 6u * sizeof(float));
  EXPECT_TRUE(h.is_contiguous());
  for (std::int64_t r = 0; r < 4; ++r)
    for (std::int64_t c = 0; c < 2; ++c) EXPECT_EQ(h.at({r, c}), 100.0 * r + 3 + c) << r << c;
  // clone() and contiguous() of the device view stay on the device.
  const Tensor packed = columns.contiguous();
  EXPECT_EQ(packed.device(), Device::cuda(0));
  EXPECT_TRUE(packed.is_contiguous());
  EXPECT_EQ(packed.to_device(Device::cpu()).at({3, 1}), 304.0);
  // A transposed view (negative reach nowhere, but the inner stride is not 1).
  const Tensor t = d.permute({1, 0}).to_device(Device::cpu());
  EXPECT_EQ(t.shape(), (Dims{6, 4}));
  EXPECT_EQ(t.at({5, 2}), 205.0);
}

TEST_F(DeviceCopy, ConvertingCopiesToAndFromTheDevice) {
  const Tensor d = device_matrix(2, 3);
  Tensor bf = Tensor::empty({2, 3}, DType::bf16, Device::cuda(0));
  bf.copy_from(d);  // f32 device -> bf16 device
  Tensor back = Tensor::empty({2, 3}, DType::f32);
  back.copy_from(bf);  // bf16 device -> f32 host
  EXPECT_EQ(back.at({1, 2}), 102.0);
  Tensor strided_host = Tensor::empty({2, 6}, DType::f32).slice(1, 0, 3);
  strided_host.copy_from(d);  // device -> a strided host destination
  EXPECT_EQ(strided_host.at({1, 1}), 101.0);
}

TEST_F(DeviceCopy, StridedDeviceDestinationIsRefusedUntouched) {
  Tensor d = device_matrix(3, 4);
  Tensor view = d.slice(1, 0, 2);
  const Tensor source = Tensor::zeros({3, 2}, DType::f32);
  g_log = {};
  try {
    view.copy_from(source);
    FAIL() << "a strided device destination was accepted";
  } catch (const LayoutError& e) {
    EXPECT_NE(std::string(e.what()).find("must be contiguous"), std::string::npos) << e.what();
  }
  EXPECT_EQ(g_log.calls, 0);
  EXPECT_EQ(d.to_device(Device::cpu()).at({2, 1}), 201.0);
}

}  // namespace
}  // namespace splice
