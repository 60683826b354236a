// kernel_stamps.h's contract in a build without -DSPLICE_KERNEL_STAMPS=ON (the mainline, CI's):
// nothing is recorded, start() refuses with an UnsupportedError naming the option (before it
// touches a device, so this runs on a machine without a GPU), and collect() / captured_launches()
// are empty. A stamps build skips it (dev/step_stamps exercises that build on the device).
#include <gtest/gtest.h>

#ifdef SPLICE_WITH_CUDA
#include <string>

#include "splice/backend/cuda/kernel_stamps.h"
#include "splice/core/error.h"

namespace splice {
namespace {

namespace stamps = cuda::kernel_stamps;

TEST(KernelStamps, AMainlineBuildRecordsNothingAndRefusesToStart) {
  if (stamps::available()) GTEST_SKIP() << "a SPLICE_KERNEL_STAMPS build";
  try {
    stamps::start(std::size_t{1} << 10);
    FAIL() << "start() must refuse in a build without the option";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("SPLICE_KERNEL_STAMPS"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(stamps::collect().empty());
  EXPECT_TRUE(stamps::captured_launches().empty());
}

}  // namespace
}  // namespace splice
#endif
