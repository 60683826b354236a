// The CUDA runtime's device facts (runtime.h): the cached values equal the driver's properties
// (the peak DRAM bandwidth its attributes' product, in the datasheet's range on Hopper),
// repeated calls return the same cached object, and an index out of range is an InternalError.
// Skips itself without a CUDA device.
#include "splice/backend/cuda/runtime.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "splice/core/error.h"
#include "support/cuda_test_util.h"

namespace splice::cuda {
namespace {

TEST(CudaRuntime, DeviceFactsEqualTheDriversProperties) {
  SKIP_WITHOUT_GPU();
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  for (int device = 0; device < count; ++device) {
    cudaDeviceProp prop{};
    ASSERT_EQ(cudaGetDeviceProperties(&prop, device), cudaSuccess);
    const DeviceFacts& facts = device_facts(device);
    EXPECT_EQ(facts.sm_count, prop.multiProcessorCount) << "device " << device;
    EXPECT_EQ(facts.l2_bytes, prop.l2CacheSize) << "device " << device;
    EXPECT_EQ(facts.smem_optin_bytes, static_cast<int>(prop.sharedMemPerBlockOptin))
        << "device " << device;
    EXPECT_EQ(facts.registers_per_sm, prop.regsPerMultiprocessor) << "device " << device;
    // Peak DRAM bandwidth, two transfers a memory clock over the bus: the datasheet's figure on
    // the Hopper cards the KDA rule reads it on (H100 SXM 3.35 TB/s, H200 4.8-4.9 TB/s).
    int clock_khz = 0, bus_bits = 0;
    ASSERT_EQ(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device), cudaSuccess);
    ASSERT_EQ(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device),
              cudaSuccess);
    EXPECT_DOUBLE_EQ(facts.dram_bytes_per_s, 2.0 * 1e3 * clock_khz * bus_bits / 8.0);
    if (prop.major == 9) {
      EXPECT_GT(facts.dram_bytes_per_s, 3.0e12) << prop.name;
      EXPECT_LT(facts.dram_bytes_per_s, 5.5e12) << prop.name;
    }
    EXPECT_EQ(&device_facts(device), &facts) << "cached: one object per device";
  }
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current_device(), current);
  EXPECT_EQ(&current_device_facts(), &device_facts(current));
}

TEST(CudaRuntime, DeviceIndexOutOfRangeIsAnInternalError) {
  SKIP_WITHOUT_GPU();
  EXPECT_THROW(device_facts(-1), InternalError);
  EXPECT_THROW(device_facts(64), InternalError);
}

}  // namespace
}  // namespace splice::cuda
