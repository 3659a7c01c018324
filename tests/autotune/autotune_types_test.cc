#include "server/autotune/autotune_types.h"

#include <functional>
#include <set>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace allocd {
namespace {

// Each table names every value of its enum once, under a distinct name: the
// names are what the proto, the metrics and the logs carry.
template <typename Enum, size_t N>
void ExpectOneDistinctNamePerValue(const NamedValue<Enum> (&table)[N], int values) {
  std::set<int> seen;
  std::set<std::string> names;
  for (const NamedValue<Enum>& row : table) {
    seen.insert(static_cast<int>(row.value));
    names.insert(row.name);
  }
  EXPECT_EQ(static_cast<int>(N), values);
  EXPECT_EQ(seen.size(), N);
  EXPECT_EQ(names.size(), N);
  for (int v = 0; v < values; ++v) EXPECT_TRUE(seen.count(v)) << v;
}

TEST(AutotuneTypesTest, EachTableNamesItsWholeEnumOnce) {
  ExpectOneDistinctNamePerValue(kAutotuneModes, 3);
  ExpectOneDistinctNamePerValue(kAutotuneTriggers, 9);
  ExpectOneDistinctNamePerValue(kAutotuneResults, 5);
  ExpectOneDistinctNamePerValue(kAutotuneJobStates, 5);
}

TEST(AutotuneTypesTest, NamesAreTheWireText) {
  EXPECT_STREQ(AutotuneTriggerName(AutotuneTrigger::kFirstPass), "first_pass");
  EXPECT_STREQ(AutotuneTriggerName(AutotuneTrigger::kFragmentation), "fragmentation");
  EXPECT_STREQ(AutotuneTriggerName(AutotuneTrigger::kAllocRetry), "alloc_retry");
  EXPECT_STREQ(AutotuneTriggerName(AutotuneTrigger::kOom), "oom");
  EXPECT_STREQ(AutotuneTriggerName(AutotuneTrigger::kBadStartConfig), "bad_start_config");
  EXPECT_STREQ(AutotuneTriggerName(AutotuneTrigger::kStartReview), "start_review");
  EXPECT_STREQ(AutotuneTriggerName(AutotuneTrigger::kGrowth), "growth");
  EXPECT_STREQ(AutotuneTriggerName(AutotuneTrigger::kLargerRequest), "larger_request");
  EXPECT_STREQ(AutotuneTriggerName(AutotuneTrigger::kAdmin), "admin");
  EXPECT_STREQ(AutotuneResultName(AutotuneResult::kPushed), "pushed");
  EXPECT_STREQ(AutotuneResultName(AutotuneResult::kRecommended), "recommended");
  EXPECT_STREQ(AutotuneResultName(AutotuneResult::kKept), "kept");
  EXPECT_STREQ(AutotuneResultName(AutotuneResult::kRolledBack), "rolled_back");
  EXPECT_STREQ(AutotuneResultName(AutotuneResult::kSkipped), "skipped");
  EXPECT_STREQ(AutotuneJobStateName(AutotuneJobState::kWatching), "watching");
  EXPECT_STREQ(AutotuneJobStateName(AutotuneJobState::kDeciding), "deciding");
  EXPECT_STREQ(AutotuneJobStateName(AutotuneJobState::kCanary), "canary");
  EXPECT_STREQ(AutotuneJobStateName(AutotuneJobState::kApplied), "applied");
  EXPECT_STREQ(AutotuneJobStateName(AutotuneJobState::kOff), "off");
}

TEST(AutotuneTypesTest, StreamsWriteTheName) {
  std::ostringstream out;
  out << AutotuneJobState::kCanary << " " << AutotuneResult::kKept << " "
      << AutotuneTrigger::kOom;
  EXPECT_EQ(out.str(), "canary kept oom");
}

TEST(AutotuneTypesTest, ModesParseFromTheirNames) {
  for (const NamedValue<AutotuneMode>& row : kAutotuneModes) {
    absl::StatusOr<AutotuneMode> mode = ParseAutotuneMode(row.name);
    ASSERT_TRUE(mode.ok()) << row.name;
    EXPECT_EQ(*mode, row.value);
    EXPECT_STREQ(AutotuneModeName(row.value), row.name);
  }
  EXPECT_EQ(ParseAutotuneMode("on").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(AutotuneTypesTest, ACountedReplayIsUnderWayForAsLongAsItLives) {
  int under_way = 0;
  const std::function<void(int)> on_replay = [&](int change) { under_way += change; };
  {
    CountedReplay outer(on_replay);
    EXPECT_EQ(under_way, 1);
    {
      CountedReplay inner(on_replay);
      EXPECT_EQ(under_way, 2);
    }
    EXPECT_EQ(under_way, 1);
  }
  EXPECT_EQ(under_way, 0);
  const std::function<void(int)> none;
  CountedReplay uncounted(none);  // an empty callback is never called
}

}  // namespace
}  // namespace allocd
