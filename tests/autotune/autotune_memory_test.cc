#include "server/autotune/autotune_memory.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/autotune/job_window.h"

namespace allocd {
namespace {

using ::testing::HasSubstr;

TEST(AutotuneMemoryTest, ChargesStayInsideTheTenantsShareAndTheBound) {
  AutotuneMemory memory({.total = 100, .per_tenant = 60});
  std::unique_ptr<AutotuneMemory::Account> a = memory.Open("uid:1", "a");
  std::unique_ptr<AutotuneMemory::Account> b = memory.Open("uid:1", "b");
  std::unique_ptr<AutotuneMemory::Account> c = memory.Open("uid:2", "c");
  EXPECT_TRUE(a->Resize(50));
  EXPECT_FALSE(b->Resize(20)) << "past uid:1's share of 60";
  EXPECT_TRUE(b->Resize(10));
  EXPECT_TRUE(c->Resize(40));
  EXPECT_FALSE(c->Resize(50)) << "past the bound of 100";
  EXPECT_EQ(c->charged(), 40u);
  EXPECT_EQ(memory.used(), 100u);
  EXPECT_EQ(memory.used("uid:1"), 60u);
  EXPECT_TRUE(a->Resize(0)) << "shrinking always succeeds";
  a.reset();
  b.reset();
  EXPECT_EQ(memory.used(), 40u) << "an account gives its charge back";
  EXPECT_EQ(memory.used("uid:1"), 0u);
}

std::vector<EvidenceEvent> Allocs(uint64_t first_id, size_t count) {
  std::vector<EvidenceEvent> events;
  for (size_t i = 0; i < count; ++i) {
    events.push_back({TraceOp::kAlloc, 7, first_id + i, 512});
  }
  return events;
}

// Allocated and freed at once: no live allocation stays behind.
std::vector<EvidenceEvent> Churn(uint64_t first_id, size_t count) {
  std::vector<EvidenceEvent> events;
  for (size_t i = 0; i < count; ++i) {
    events.push_back({TraceOp::kAlloc, 7, first_id + i, 512});
    events.push_back({TraceOp::kFreeCompleted, 7, first_id + i, 0});
  }
  return events;
}

TEST(AutotuneMemoryTest, AWindowOverItsShareKeepsItsNewestEvents) {
  std::vector<std::string> logged;
  AutotuneMemory memory({.total = 256 << 10,
                         .log = [&](const std::string& l) {
                           logged.push_back(l);
                         }});
  JobWindow window(1 << 20, memory.Open("uid:1", "train"));
  for (uint64_t id = 0; id < 200000; id += 1000) {
    window.Add(Churn(id, 1000), 0);
    ASSERT_LE(memory.used(), uint64_t{256} << 10);
  }
  EXPECT_FALSE(window.stopped());
  EXPECT_GT(window.size(), 1000u) << "it still decides, on fewer events";
  EXPECT_LT(window.size(), 400000u);
  ASSERT_EQ(logged.size(), 1u) << "told once";
  EXPECT_THAT(logged[0], HasSubstr("job \"train\" (uid:1) was trimmed"));
  EXPECT_THAT(logged[0], HasSubstr("--autotune-memory"));
}

TEST(AutotuneMemoryTest, AWindowWhoseLiveAllocationsDoNotFitStopsRecording) {
  std::vector<std::string> logged;
  AutotuneMemory memory({.total = 1 << 20,
                         .per_tenant = 256 << 10,
                         .log = [&](const std::string& l) {
                           logged.push_back(l);
                         }});
  // Another tenant's window is left its room.
  JobWindow other(1 << 20, memory.Open("uid:2", "other"));
  other.Add(Churn(0, 100), 0);
  JobWindow flood(1 << 20, memory.Open("uid:1", "flood"));
  for (uint64_t id = 0; id < 100000; id += 1000) {
    flood.Add(Allocs(id, 1000), 0);
    ASSERT_LE(memory.used("uid:1"), uint64_t{256} << 10);
  }
  EXPECT_TRUE(flood.stopped());
  EXPECT_EQ(flood.size(), 0u);
  EXPECT_LT(memory.used("uid:1"), uint64_t{4} << 10) << "it holds nothing";
  EXPECT_FALSE(other.stopped());
  EXPECT_EQ(other.size(), 300u) << "each churn: alloc, free_requested, free_completed";
  ASSERT_EQ(logged.size(), 1u);
  EXPECT_THAT(logged[0], HasSubstr("stopped recording"));
  EXPECT_THAT(logged[0], HasSubstr("--autotune-memory-per-tenant"));
}

}  // namespace
}  // namespace allocd
