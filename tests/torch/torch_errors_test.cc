#include "client/torch/torch_errors.h"

#include <dlfcn.h>

#include <stdexcept>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/torch/fake_c10.h"

namespace allocd {
namespace {

using ::testing::HasSubstr;

constexpr char kMessage[] =
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.19 GiB of which 1.00 GiB is free.";

// The first test must run before the second loads the stand-in in the same
// process (ctest runs each in its own).
TEST(TorchErrorsTest, WithoutPyTorchInTheProcessAnOomIsARuntimeError) {
  EXPECT_FALSE(TorchOutOfMemoryErrorAvailable());
  try {
    ThrowOutOfMemory(kMessage);
    FAIL() << "nothing thrown";
  } catch (const c10::Error&) {
    FAIL() << "a c10 error without c10 loaded";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), kMessage);
  }
}

TEST(TorchErrorsTest, WithPyTorchLoadedAnOomIsC10OutOfMemoryError) {
  // As Python imports PyTorch: RTLD_LOCAL, found again by its soname.
  void* c10 = dlopen(FAKE_C10_PATH, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(c10, nullptr) << dlerror();
  const int* live = static_cast<int*>(dlsym(c10, "fake_c10_live_errors"));
  ASSERT_NE(live, nullptr);
  ASSERT_TRUE(TorchOutOfMemoryErrorAvailable());

  try {
    ThrowOutOfMemory(kMessage);
    FAIL() << "nothing thrown";
  } catch (const c10::OutOfMemoryError& e) {
    // What PyTorch's Python binding catches, by this type, to raise
    // torch.OutOfMemoryError with the message.
    EXPECT_EQ(e.msg(), kMessage);
    EXPECT_STREQ(e.what_without_backtrace(), kMessage);
    EXPECT_THAT(e.what(), HasSubstr("allocd_torch_malloc"));
    EXPECT_EQ(*live, 1);
  }
  EXPECT_EQ(*live, 0) << "the exception's destructor did not run";

  // The handlers PyTorch's C++ may have on the way catch it as well.
  EXPECT_THROW(ThrowOutOfMemory(kMessage), c10::Error);
  EXPECT_THROW(ThrowOutOfMemory(kMessage), std::exception);
  EXPECT_EQ(*live, 0);
}

}  // namespace
}  // namespace allocd
