#include "server/autotune/job_registry.h"

#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace allocd {
namespace {

AutotuneOptions Options(size_t ended_jobs_kept = 256) {
  AutotuneOptions options;
  options.default_policy.mode = AutotuneMode::kRecommend;
  options.window_events = 100;
  options.first_pass_min_events = 10;
  options.aperiodic_after_events = 50;
  options.ended_jobs_kept = ended_jobs_kept;
  return options;
}

const JobKey kLlama{.tenant = "uid:1", .job = "llama"};

TEST(JobRegistryTest, AJobRecordsItsFirstSessionAndTheNextWhenItEnds) {
  JobRegistry jobs(Options());
  AutotuneJob* job = jobs.AddSession(1, kLlama, "", 0, /*marks_steps=*/false);
  ASSERT_NE(job, nullptr);
  EXPECT_EQ(jobs.AddSession(2, kLlama, "", 0, false), job);
  EXPECT_EQ(job->sessions, (std::vector<SessionId>{1, 2}));
  EXPECT_EQ(job->recorded, 1u);
  ASSERT_NE(job->window, nullptr);
  EXPECT_EQ(job->next_first_pass_check, 10u);

  // Declared again: only what it runs changes.
  EXPECT_EQ(jobs.AddSession(1, kLlama, "expandable_segments:True", 3, false), nullptr);
  EXPECT_EQ(jobs.FindSession(1)->config, "expandable_segments:True");
  EXPECT_EQ(jobs.FindSession(1)->config_version, 3u);

  EXPECT_EQ(jobs.RemoveSession(1), kLlama);
  EXPECT_EQ(jobs.FindSession(1), nullptr);
  EXPECT_EQ(job->sessions, (std::vector<SessionId>{2}));
  jobs.StartRecording(*job, 2);
  EXPECT_EQ(job->recorded, 2u);
}

TEST(JobRegistryTest, AClientThatMarksStepsIsProbedOnlyOnceItCouldBeAperiodic) {
  JobRegistry jobs(Options());
  AutotuneJob* job = jobs.AddSession(1, kLlama, "", 0, /*marks_steps=*/true);
  EXPECT_EQ(job->next_first_pass_check, 50u);
}

TEST(JobRegistryTest, AJobTurnedOffKeepsNoWindowAndTheDefaultAppliesToJobsWithoutTheirOwn) {
  JobRegistry jobs(Options());
  AutotuneJob* llama = jobs.AddSession(1, kLlama, "", 0, false);
  AutotuneJob* vit = jobs.AddSession(2, {.tenant = "uid:1", .job = "vit"}, "", 0, false);
  using Switched = std::vector<AutotuneJob*>;  // the jobs whose recorded session switched
  EXPECT_EQ(jobs.SetPolicy(kLlama, JobPolicy{.mode = AutotuneMode::kOff}), Switched{llama});
  EXPECT_EQ(llama->window, nullptr);
  EXPECT_EQ(jobs.StateOf(*llama), AutotuneJobState::kOff);
  EXPECT_EQ(jobs.ModeOf(*vit), AutotuneMode::kRecommend);

  // The default: vit goes from recommend to apply, llama keeps its own off.
  EXPECT_EQ(jobs.SetPolicy({}, JobPolicy{.mode = AutotuneMode::kApply}), Switched{});
  EXPECT_EQ(jobs.ModeOf(*vit), AutotuneMode::kApply);
  EXPECT_EQ(jobs.ModeOf(*llama), AutotuneMode::kOff);  // its own
  EXPECT_EQ(jobs.SetPolicy({}, JobPolicy{.mode = AutotuneMode::kOff}), Switched{vit});
  EXPECT_EQ(vit->recorded, 2u);
  EXPECT_EQ(jobs.ModeOf(*vit), AutotuneMode::kOff);
  EXPECT_EQ(jobs.SetPolicy({}, JobPolicy{.mode = AutotuneMode::kApply}), Switched{vit});
  EXPECT_EQ(jobs.ModeOf(*vit), AutotuneMode::kApply);

  EXPECT_EQ(jobs.SetPolicy(kLlama, JobPolicy{.mode = AutotuneMode::kRecommend}),
            Switched{llama});
  EXPECT_EQ(llama->recorded, 1u);
  EXPECT_NE(llama->window, nullptr);
  EXPECT_EQ(jobs.StateOf(*llama), AutotuneJobState::kWatching);
  llama->queued = true;
  EXPECT_EQ(jobs.StateOf(*llama), AutotuneJobState::kDeciding);
}

TEST(JobRegistryTest, OnlyTheMostRecentlyEndedJobsAreKeptUnlessSomethingRefersToThem) {
  JobRegistry jobs(Options(/*ended_jobs_kept=*/1));
  AutotuneTaskQueue tasks;
  const JobKey a{.tenant = "uid:1", .job = "a"};
  const JobKey b{.tenant = "uid:1", .job = "b"};
  const JobKey c{.tenant = "uid:1", .job = "c"};
  for (const auto& [id, key] : std::vector<std::pair<SessionId, JobKey>>{{1, a}, {2, b}, {3, c}}) {
    jobs.AddSession(id, key, "", 0, false);
  }
  jobs.RemoveSession(1);
  jobs.Ended(a, tasks);
  tasks.Push(AutotuneTask{.kind = AutotuneTask::Kind::kReview, .job = b});
  jobs.RemoveSession(2);
  jobs.Ended(b, tasks);  // a goes
  jobs.RemoveSession(3);
  jobs.Ended(c, tasks);  // b has a task waiting: kept, and looked at again later
  std::vector<std::string> kept;
  for (const AutotuneJobStatus& s : jobs.Status()) kept.push_back(s.job);
  EXPECT_EQ(kept, (std::vector<std::string>{"b", "c"}));
}

TEST(JobRegistryTest, TheFeaturesOfALabelAreEveryRunsOfItsTenantEndedOnesIncluded) {
  JobRegistry jobs(Options());
  AutotuneTaskQueue tasks;
  const JobKey run_a{.tenant = "uid:1", .job = "llama", .run = "a"};
  const JobKey other_label{.tenant = "uid:1", .job = "llamas"};
  const JobKey other_tenant{.tenant = "uid:2", .job = "llama"};
  jobs.AddSession(1, kLlama, "", 0, false)->features.cuda_graphs = true;
  jobs.AddSession(2, run_a, "", 0, false)->features.cuda_ipc = true;
  jobs.AddSession(3, other_label, "", 0, false)->features.mem_pool = true;
  jobs.AddSession(4, other_tenant, "", 0, false)->features.nccl_registration = true;
  jobs.RemoveSession(2);
  jobs.Ended(run_a, tasks);
  EXPECT_EQ(jobs.FeaturesOf("uid:1", "llama"),
            (JobFeatures{.cuda_ipc = true, .cuda_graphs = true}));
  EXPECT_EQ(jobs.FeaturesOf("uid:2", "llama"), (JobFeatures{.nccl_registration = true}));
  EXPECT_EQ(jobs.FeaturesOf("uid:3", "llama"), JobFeatures{});
}

TEST(JobRegistryTest, StatusAndHistoryGoByLabelThenTenant) {
  JobRegistry jobs(Options());
  jobs.AddSession(1, {.tenant = "uid:2", .job = "llama"}, "", 0, /*marks_steps=*/true);
  jobs.AddSession(2, {.tenant = "uid:1", .job = "vit"}, "", 0, false);
  jobs.AddSession(3, {.tenant = "uid:1", .job = "llama"}, "", 0, false);
  jobs.Job({.tenant = "uid:2", .job = "llama"}).Record(AutotuneDecision{.id = 1}, 8);
  jobs.Job({.tenant = "uid:1", .job = "llama"}).Record(AutotuneDecision{.id = 3}, 8);
  jobs.Job({.tenant = "uid:1", .job = "vit"}).Record(AutotuneDecision{.id = 2}, 8);

  const std::vector<AutotuneJobStatus> status = jobs.Status();
  ASSERT_EQ(status.size(), 3u);
  EXPECT_EQ(status[0].job, "llama");
  EXPECT_EQ(status[0].tenant, "uid:1");
  EXPECT_EQ(status[1].job, "llama");
  EXPECT_EQ(status[1].tenant, "uid:2");
  EXPECT_TRUE(status[1].marks_steps);
  ASSERT_TRUE(status[1].last.has_value());
  EXPECT_EQ(status[1].last->id, 1u);
  EXPECT_EQ(status[2].job, "vit");

  const std::vector<AutotuneDecision> llama = jobs.History("llama", 10);
  ASSERT_EQ(llama.size(), 2u);
  EXPECT_EQ(llama[0].id, 3u);  // newest first
  EXPECT_EQ(jobs.History("", 2).size(), 2u);
  EXPECT_EQ(jobs.LiveJobs("llama", "uid:2").size(), 1u);
  EXPECT_EQ(jobs.LiveJobs("llama", "").size(), 2u);
}

// The ranks of one run are one job (its key carries the run id), lockstep
// as soon as one of several ranks joins; another run of the label is
// another job, and a session of the label without a run a third. Status
// shows each rank's config, by rank.
TEST(JobRegistryTest, TheRanksOfOneRunAreOneLockstepJobApartFromAnotherRunOfTheLabel) {
  JobRegistry jobs(Options());
  const JobKey run_a{.tenant = "uid:1", .job = "llama", .run = "run-a"};
  const JobKey run_b{.tenant = "uid:1", .job = "llama", .run = "run-b"};
  AutotuneJob* a = jobs.AddSession(1, run_a, "max_split_size_mb:64", 0, true,
                                   {.run = "run-a", .rank = 1, .world_size = 2});
  ASSERT_NE(a, nullptr);
  EXPECT_TRUE(a->lockstep);
  EXPECT_EQ(jobs.AddSession(2, run_a, "expandable_segments:True", 4, true,
                            {.run = "run-a", .rank = 0, .world_size = 2}),
            a);
  EXPECT_EQ(a->sessions, (std::vector<SessionId>{1, 2}));
  EXPECT_EQ(a->recorded, 1u);  // one stream: the first rank's
  AutotuneJob* b = jobs.AddSession(3, run_b, "", 0, true,
                                   {.run = "run-b", .rank = 0, .world_size = 2});
  EXPECT_NE(b, a);
  AutotuneJob* label = jobs.AddSession(4, kLlama, "", 0, false);
  EXPECT_NE(label, a);
  EXPECT_FALSE(label->lockstep);
  EXPECT_EQ(jobs.RemoveSession(2), run_a);

  jobs.AddSession(2, run_a, "expandable_segments:True", 4, true,
                  {.run = "run-a", .rank = 0, .world_size = 2});
  const std::vector<AutotuneJobStatus> status = jobs.Status();
  ASSERT_EQ(status.size(), 3u);
  // By label, then tenant, then run: the label's own job first.
  EXPECT_EQ(status[0].run, "");
  EXPECT_EQ(status[1].run, "run-a");
  EXPECT_EQ(status[2].run, "run-b");
  ASSERT_EQ(status[1].ranks.size(), 2u);
  EXPECT_EQ(status[1].ranks[0].rank, 0u);
  EXPECT_EQ(status[1].ranks[0].session, 2u);
  EXPECT_EQ(status[1].ranks[0].world_size, 2u);
  EXPECT_EQ(status[1].ranks[0].config, "expandable_segments:True");
  EXPECT_EQ(status[1].ranks[0].config_version, 4u);
  EXPECT_EQ(status[1].ranks[1].rank, 1u);
  EXPECT_EQ(status[1].ranks[1].config, "max_split_size_mb:64");
  ASSERT_EQ(status[0].ranks.size(), 1u);
  EXPECT_EQ(status[0].ranks[0].world_size, 0u);  // no rank reported
  EXPECT_EQ(jobs.LiveJobs("llama", "uid:1").size(), 3u);
}

}  // namespace
}  // namespace allocd
