#include "server/autotune/task_queue.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace allocd {
namespace {

AutotuneTask TaskFor(const std::string& tenant, const std::string& job,
                     AutotuneTask::Kind kind = AutotuneTask::Kind::kDecide) {
  AutotuneTask task;
  task.kind = kind;
  task.job = {.tenant = tenant, .job = job};
  return task;
}

std::vector<std::string> Drain(AutotuneTaskQueue& queue) {
  std::vector<std::string> jobs;
  while (!queue.empty()) jobs.push_back(queue.Pop().job.job);
  return jobs;
}

TEST(AutotuneTaskQueueTest, OneTenantsTasksKeepTheirOrder) {
  AutotuneTaskQueue queue;
  for (const char* job : {"a1", "a2", "a3"}) queue.Push(TaskFor("uid:1", job));
  EXPECT_EQ(Drain(queue), (std::vector<std::string>{"a1", "a2", "a3"}));
}

// A tenant with many tasks queued delays another's next task by one of its
// own at most, not by its queue.
TEST(AutotuneTaskQueueTest, TenantsTakeTurns) {
  AutotuneTaskQueue queue;
  for (const char* job : {"a1", "a2", "a3", "a4"}) queue.Push(TaskFor("uid:1", job));
  queue.Push(TaskFor("uid:2", "b1"));
  queue.Push(TaskFor("uid:2", "b2"));
  queue.Push(TaskFor("uid:3", "c1"));
  EXPECT_EQ(Drain(queue),
            (std::vector<std::string>{"a1", "b1", "c1", "a2", "b2", "a3", "a4"}));
}

// Turns are remembered across pops: a tenant whose task just started waits
// behind one that queued later but started none since.
TEST(AutotuneTaskQueueTest, ATenantThatJustRanWaitsBehindOneThatDidNot) {
  AutotuneTaskQueue queue;
  queue.Push(TaskFor("uid:1", "a1"));
  queue.Push(TaskFor("uid:2", "b1"));
  EXPECT_EQ(queue.Pop().job.job, "a1");
  EXPECT_EQ(queue.Pop().job.job, "b1");
  queue.Push(TaskFor("uid:2", "b2"));
  queue.Push(TaskFor("uid:1", "a2"));
  EXPECT_EQ(queue.Pop().job.job, "a2");  // uid:1 started longest ago
  EXPECT_EQ(queue.Pop().job.job, "b2");
  EXPECT_TRUE(queue.empty());
}

TEST(AutotuneTaskQueueTest, KnowsWhichJobsHaveTasksWaiting) {
  AutotuneTaskQueue queue;
  queue.Push(TaskFor("uid:1", "llama", AutotuneTask::Kind::kPromote));
  EXPECT_TRUE(queue.HasTaskFor({.tenant = "uid:1", .job = "llama"}));
  EXPECT_FALSE(queue.HasTaskFor({.tenant = "uid:2", .job = "llama"}));
  EXPECT_FALSE(queue.HasTaskFor({.tenant = "uid:1", .job = "vit"}));
  const AutotuneTask task = queue.Pop();
  EXPECT_EQ(task.kind, AutotuneTask::Kind::kPromote);
  EXPECT_FALSE(queue.HasTaskFor({.tenant = "uid:1", .job = "llama"}));
}

}  // namespace
}  // namespace allocd
