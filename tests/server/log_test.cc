#include "server/log.h"

#include <string>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

const absl::Time kStart = absl::FromUnixSeconds(1'000'000);

TEST(RefusalLogTest, AFloodIsOneLineAPeriodCountingWhatItLeftOut) {
  RefusalLog log;
  int accounts = 0;
  auto last = [&](std::string who) {
    return [&accounts, who] {
      ++accounts;
      return who + "'s: over its limit";
    };
  };

  testing::internal::CaptureStderr();
  log.Refused(kStart, "session", last("pid 1"));
  const std::string first = testing::internal::GetCapturedStderr();
  EXPECT_THAT(first, HasSubstr(" allocd error refused 1 session(s), the last pid 1's: over its limit"));
  EXPECT_THAT(first, EndsWith("\n"));

  testing::internal::CaptureStderr();
  log.Refused(kStart + absl::Seconds(1), "session", last("pid 2"));
  log.Refused(kStart + RefusalLog::kPeriod - absl::Milliseconds(1), "session", last("pid 3"));
  EXPECT_THAT(testing::internal::GetCapturedStderr(), IsEmpty());
  // The refusals it did not log made no account of themselves.
  EXPECT_EQ(accounts, 1);

  testing::internal::CaptureStderr();
  log.Refused(kStart + RefusalLog::kPeriod, "session", last("pid 4"));
  EXPECT_THAT(testing::internal::GetCapturedStderr(),
              HasSubstr("refused 3 session(s), the last pid 4's: over its limit"));
  EXPECT_EQ(accounts, 2);
}

}  // namespace
}  // namespace allocd
