#include "client/thread_name.h"

#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace allocd {
namespace {

TEST(ThreadNameTest, NamesTheCallingThreadOnly) {
  const std::string before = ThisThreadName();
  std::string seen;
  std::thread worker([&] {
    NameThisThread("allocd-test");
    seen = ThisThreadName();
  });
  worker.join();
  EXPECT_EQ(seen, "allocd-test");
  EXPECT_EQ(ThisThreadName(), before);
}

TEST(ThreadNameTest, CutsToWhatLinuxKeeps) {
  std::string seen;
  std::thread worker([&] {
    NameThisThread("allocd-a-name-longer-than-fifteen");
    seen = ThisThreadName();
  });
  worker.join();
  EXPECT_EQ(seen, "allocd-a-name-l");
}

}  // namespace
}  // namespace allocd
