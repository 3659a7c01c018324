// The autotuning loop end to end (issue 12): a real `allocd serve
// --autotune ...` process on a real Unix socket, jobs as real processes
// (`allocd client-replay` of the shipped llama_lora trace, whose events and
// stats reach the daemon through the client library) or as a client in this
// process fed the same trace, and the daemon's surfaces (the Admin service,
// allocctl). No mocks.
//
// llama_lora under the guides' max_split_size_mb:64 peaks near 20 GiB of
// reserved memory per replay, under expandable_segments:True near 4.5 GiB:
// the push the autotuner should make. Its first decision waits for 300000
// events (--autotune-first-pass-events), a little more than one replay, so
// the window covers the job's largest step.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "allocator/trace/snapshot_reader.h"
#include "allocd.grpc.pb.h"
#include "client/daemon_client.h"
#include "client/client_env.h"
#include "client/daemon_connection.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ipc/unix_socket.h"
#include "nlohmann/json.hpp"
#include "tests/scoped_temp_dir.h"
#include "tests/server/daemon_harness.h"

namespace allocd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using harness::Child;
using harness::Dial;
using harness::DialAdmin;

const std::string kTrace =
    std::string(ALLOCD_SOURCE_DIR) + "/traces/llama_lora.pickle.gz";

// Under AddressSanitizer the replays (the job's and the autotuner's) run
// several times slower: jobs run longer and waits last longer, so that the
// same push happens at the same point of a job.
#if defined(__SANITIZE_ADDRESS__)
constexpr int kSlowdown = 4;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr int kSlowdown = 4;
#else
constexpr int kSlowdown = 1;
#endif
#else
constexpr int kSlowdown = 1;
#endif

// `seconds` of a job's --duration, as the build runs.
std::string JobSeconds(int seconds) { return std::to_string(seconds * kSlowdown); }

class AutotuneEndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    socket_ = dir_.path() + "/allocd.sock";
  }

  // `prior`: --autotune-prior. Off for the tests of what the autotuner
  // does with a job running a harmful config (learned, the default, would
  // replace it at registration: the test of issue 40's start configs).
  void StartDaemon(const std::string& mode, std::vector<std::string> extra = {},
                   const std::string& prior = "off", const std::string& capacity = "24GiB") {
    std::vector<std::string> args = {
        ALLOCD_BINARY, "serve", "--backend", "sim", "--socket", socket_,
        "--metrics-addr", "",
        "--capacity", capacity, "--autotune", mode,
        "--autotune-first-pass-events", "300000", "--autotune-prior", prior};
    args.insert(args.end(), extra.begin(), extra.end());
    daemon_ = std::make_unique<Child>(std::move(args));
    harness::WaitForDaemon(socket_);
    admin_ = v1::Admin::NewStub(DialAdmin(socket_));
  }

  // `environment`: NAME=VALUE for the replay's process (torchrun's, for a
  // rank).
  std::unique_ptr<Child> Replay(const std::string& job,
                                std::vector<std::string> extra,
                                std::vector<std::string> environment = {}) {
    std::vector<std::string> args = {"/usr/bin/env"};
    args.insert(args.end(), environment.begin(), environment.end());
    args.insert(args.end(), {ALLOCD_BINARY, "client-replay", kTrace, "--socket", socket_,
                             "--job", job, "--json"});
    args.insert(args.end(), extra.begin(), extra.end());
    return std::make_unique<Child>(std::move(args));
  }

  static nlohmann::json Finish(Child& child) {
    const std::string out = child.Rest(absl::Seconds(120 * kSlowdown));
    EXPECT_EQ(child.Wait(), 0) << out;
    nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << out;
    return j;
  }

  std::vector<v1::AutotuneDecision> Decisions(const std::string& job) {
    grpc::ClientContext context;
    v1::AutotuneHistoryRequest request;
    request.set_job(job);
    request.set_limit(100);
    v1::AutotuneHistoryResponse r;
    EXPECT_TRUE(admin_->AutotuneHistory(&context, request, &r).ok());
    return {r.decisions().begin(), r.decisions().end()};
  }

  // Waits until `job` has a decision whose result is one of `results`.
  std::optional<v1::AutotuneDecision> AwaitDecision(
      const std::string& job, const std::vector<std::string>& results,
      absl::Duration limit = absl::Seconds(90)) {
    const absl::Time deadline = absl::Now() + limit * kSlowdown;
    while (absl::Now() < deadline) {
      for (const v1::AutotuneDecision& d : Decisions(job)) {
        for (const std::string& r : results) {
          if (d.result() == r) return d;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return std::nullopt;
  }

  std::vector<v1::HistoryEntry> ConfigHistory() {
    grpc::ClientContext context;
    v1::HistoryRequest request;
    request.set_limit(1000);
    v1::HistoryResponse r;
    EXPECT_TRUE(admin_->History(&context, request, &r).ok());
    return {r.entries().begin(), r.entries().end()};
  }

  int CountEvents(const std::string& event) {
    int n = 0;
    for (const v1::HistoryEntry& e : ConfigHistory()) n += e.event() == event;
    return n;
  }

  // allocctl's output for `args` (exit 0 expected).
  std::string Allocctl(std::vector<std::string> args) {
    args.insert(args.begin(), {ALLOCCTL_BINARY, "--socket", socket_});
    Child ctl(std::move(args), /*with_stderr=*/true);
    std::string out = ctl.Rest(absl::Seconds(20));
    EXPECT_EQ(ctl.Wait(), 0) << out;
    return out;
  }

  v1::AutotuneLearnedResponse Learned() {
    grpc::ClientContext context;
    v1::AutotuneLearnedResponse r;
    EXPECT_TRUE(admin_->AutotuneLearned(&context, v1::AutotuneLearnedRequest(), &r).ok());
    return r;
  }

  // First: removed after the daemon below is stopped.
  ScopedTempDir dir_{"allocd_autotune_"};
  std::string socket_;
  std::unique_ptr<Child> daemon_;
  std::unique_ptr<v1::Admin::Stub> admin_;
};

TEST_F(AutotuneEndToEndTest, ApplyPushesABetterConfigAndTheJobsReservedMemoryDrops) {
  StartDaemon("apply");
  std::unique_ptr<Child> job =
      Replay("llama", {"--config", "max_split_size_mb:64", "--duration", JobSeconds(40)});
  nlohmann::json out = Finish(*job);

  // (At 25 s, an AddressSanitizer build on 2 cores decided 19 s after the
  // job had ended: its first pass waits for three of llama_lora's 280k-event
  // steps.)
  std::optional<v1::AutotuneDecision> d = AwaitDecision("llama", {"pushed"});
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->trigger(), "bad_start_config");
  EXPECT_EQ(d->from_config(), "max_split_size_mb:64");
  EXPECT_GT(d->predicted_saving(), 0);
  ASSERT_TRUE(d->has_realized_saving());
  EXPECT_GT(d->realized_saving(), 0);
  // The job ran the pushed config, and said why.
  EXPECT_EQ(out["config"], d->to_config());
  EXPECT_THAT(out["config_reason"].get<std::string>(), HasSubstr("autotune"));
  // Its replays before the push ran the config it kept until then: every
  // replay after it peaked below every one before. (The loop the push
  // landed in ran both: under load it peaked as one before.)
  int64_t before_min = INT64_MAX, after_max = 0;
  int64_t ran_pushed_max = 0;  // the loop the push landed in too
  int before = 0, after = 0;
  for (const nlohmann::json& loop : out["loop_peaks"]) {
    const int64_t peak = loop["peak_reserved"].get<int64_t>();
    if (loop["config"] != "max_split_size_mb:64") ran_pushed_max = std::max(ran_pushed_max, peak);
    if (loop["started_config_version"] != loop["config_version"]) continue;
    if (loop["config"] == "max_split_size_mb:64") {
      before_min = std::min(before_min, peak);
      ++before;
    } else {
      after_max = std::max(after_max, peak);
      ++after;
    }
  }
  ASSERT_GT(before, 0);
  ASSERT_GT(after, 0);
  EXPECT_LT(after_max, before_min);
  // The realised peak the daemon recorded is one the job saw under it.
  EXPECT_LE(d->realized_peak(), ran_pushed_max);
}

// At the job's own event rate (--speed 1: each event at its recorded time)
// the client sends every event it records, and the loop decides on them.
TEST_F(AutotuneEndToEndTest, AtTheJobsOwnRateEveryEventReachesTheDaemonAndItDecides) {
  StartDaemon("apply");
  const int seconds = 30 * kSlowdown;
  std::unique_ptr<Child> job =
      Replay("llama", {"--config", "max_split_size_mb:64", "--speed", "1",
                       "--duration", std::to_string(seconds)});
  nlohmann::json out = Finish(*job);
  EXPECT_EQ(out["speed"], 1.0);
  EXPECT_EQ(out["events_dropped"], 0) << out.dump();
  // llama_lora's events span 12.8 s: paced, no loop takes less.
  const absl::StatusOr<Trace> trace = ReadSnapshotFile(kTrace, {});
  ASSERT_TRUE(trace.ok()) << trace.status();
  const double span_seconds =
      (trace->event_times_us.back() - trace->event_times_us.front()) / 1e6;
  EXPECT_GT(span_seconds, 10);
  EXPECT_LE(out["loops"].get<int>(), seconds / span_seconds);

  std::optional<v1::AutotuneDecision> d = AwaitDecision("llama", {"pushed"});
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->trigger(), "bad_start_config");
  EXPECT_EQ(out["config"], d->to_config());
}

// A job of two processes (issue 40): two replays of llama_lora as the ranks
// of one torchrun run, rank 1 first. One decision, on the canary rank's
// stream, reaches both ranks once the canary's push is judged within the
// margin (a replay marks no steps: over a first pass of events after the
// push), before the canary_window would have let it: both replays end on
// the pushed config.
// A DDP job as it runs on a node: a rank on each GPU, one daemon serving both.
TEST_F(AutotuneEndToEndTest, TheRanksOfOneRunAreOneJobAndBothEndOnThePushedConfig) {
  StartDaemon("apply", {"--sim-devices", "2"}, "off", "48GiB");
  const std::vector<std::string> run = {"TORCHELASTIC_RUN_ID=ddp-run-1", "WORLD_SIZE=2"};
  std::vector<std::string> replay = {"--config", "max_split_size_mb:64", "--speed", "4",
                                     "--duration", JobSeconds(35)};
  std::vector<std::string> rank1 = run, rank0 = run;
  rank1.push_back("RANK=1");
  rank0.push_back("RANK=0");
  std::vector<std::string> on_gpu1 = replay;
  on_gpu1.insert(on_gpu1.end(), {"--gpu", "SIM-GPU-1"});
  replay.insert(replay.end(), {"--gpu", "SIM-GPU-0"});
  std::unique_ptr<Child> canary = Replay("ddp", on_gpu1, rank1);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  std::unique_ptr<Child> other = Replay("ddp", replay, rank0);

  // Each rank under the job, with its rank, while they run.
  bool both_ranks_shown = false;
  for (int i = 0; i < 100 && !both_ranks_shown; ++i) {
    // (No job yet: the JSON has no "jobs".)
    const nlohmann::json jobs = nlohmann::json::parse(Allocctl({"autotune", "status", "--json"}))
                                    .value("jobs", nlohmann::json::array());
    if (jobs.size() == 1 && jobs[0].value("ranks", nlohmann::json::array()).size() == 2) {
      const nlohmann::json& job = jobs[0];
      EXPECT_EQ(job["run_id"], "ddp-run-1");
      EXPECT_EQ(job["ranks"][0]["rank"], 0) << job.dump();
      EXPECT_EQ(job["ranks"][1]["rank"], 1) << job.dump();
      EXPECT_EQ(job["ranks"][1]["world_size"], 2) << job.dump();
      EXPECT_EQ(job["ranks"][0]["gpu_uuid"], "SIM-GPU-0") << job.dump();
      EXPECT_EQ(job["ranks"][1]["gpu_uuid"], "SIM-GPU-1") << job.dump();
      both_ranks_shown = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(both_ranks_shown);
  EXPECT_THAT(Allocctl({"autotune", "status"}), HasSubstr("rank 1/2 (session"));
  EXPECT_THAT(Allocctl({"autotune", "status"}), HasSubstr("SIM-GPU-1)"));

  const nlohmann::json canary_out = Finish(*canary);
  const nlohmann::json other_out = Finish(*other);
  std::optional<v1::AutotuneDecision> d = AwaitDecision("ddp", {"pushed"});
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->run_id(), "ddp-run-1");
  EXPECT_EQ(d->from_config(), "max_split_size_mb:64");
  // One decision for the job: pushed to the canary rank, then every rank.
  int pushed = 0;
  for (const v1::AutotuneDecision& decision : Decisions("ddp")) {
    pushed += decision.result() == "pushed" || decision.result() == "rolled_back";
  }
  EXPECT_EQ(pushed, 1);
  ASSERT_EQ(d->sessions_size(), 2) << d->why();
  EXPECT_EQ(d->sessions(0), canary_out["first_session_id"].get<uint64_t>());
  EXPECT_EQ(d->sessions(1), other_out["first_session_id"].get<uint64_t>());
  EXPECT_THAT(d->why(), HasSubstr("every rank runs it")) << d->why();
  EXPECT_EQ(canary_out["config"], d->to_config()) << canary_out.dump();
  EXPECT_EQ(other_out["config"], d->to_config()) << other_out.dump();
}

TEST_F(AutotuneEndToEndTest, RecommendPushesNothingAndShowsTheRecommendation) {
  StartDaemon("recommend");
  std::unique_ptr<Child> job =
      Replay("llama", {"--config", "max_split_size_mb:64", "--duration", JobSeconds(12)});
  std::optional<v1::AutotuneDecision> d = AwaitDecision("llama", {"recommended"});
  nlohmann::json out = Finish(*job);
  ASSERT_TRUE(d.has_value());
  EXPECT_FALSE(d->to_config().empty());
  // The job's need after the switch point, as PyTorch rounds it and as it
  // asked (what a push's watch measures growth against).
  EXPECT_GT(d->predicted_peak_requested(), 0);
  EXPECT_LE(d->predicted_peak_requested(), d->predicted_peak_allocated());
  EXPECT_EQ(d->version(), 0u);
  EXPECT_EQ(out["configs_applied"], 0);
  EXPECT_EQ(out["config"], "max_split_size_mb:64");
  EXPECT_EQ(CountEvents("push") + CountEvents("set"), 0);
  // allocctl shows it, --json anywhere on the line.
  EXPECT_THAT(Allocctl({"autotune", "history"}), HasSubstr("recommended"));
  nlohmann::json status =
      nlohmann::json::parse(Allocctl({"autotune", "status", "--json"}));
  ASSERT_EQ(status["jobs"].size(), 1u);
  // The last decision is the recommendation, unless a later run was skipped:
  // replayed as fast as it goes, a client on a loaded machine drops events,
  // and a window with a gap is not decided on (the history above has the
  // recommendation either way).
  const nlohmann::json& last = status["jobs"][0]["last"];
  if (last["result"] == "skipped") {
    EXPECT_THAT(last["why"].get<std::string>(), HasSubstr("dropped events")) << last.dump();
  } else {
    EXPECT_EQ(last["result"], "recommended") << last.dump();
  }
  EXPECT_EQ(status["mode"], "recommend");
}

TEST_F(AutotuneEndToEndTest, PinnedKeysAreNeverChanged) {
  StartDaemon("apply");
  std::unique_ptr<Child> job =
      Replay("pinned", {"--config", "max_split_size_mb:64", "--duration", JobSeconds(15),
                        "--pin", "expandable_segments"});
  std::optional<v1::AutotuneDecision> d = AwaitDecision(
      "pinned", {"pushed", "kept", "skipped", "recommended", "rolled_back"});
  nlohmann::json out = Finish(*job);
  ASSERT_TRUE(d.has_value());
  EXPECT_THAT(d->to_config(), Not(HasSubstr("expandable_segments:True")));
  EXPECT_THAT(out["config"].get<std::string>(),
              Not(HasSubstr("expandable_segments:True")));
  nlohmann::json status =
      nlohmann::json::parse(Allocctl({"--json", "autotune", "status"}));
  EXPECT_EQ(status["jobs"][0]["pinned_keys"],
            nlohmann::json::array({"expandable_segments"}));
}

TEST_F(AutotuneEndToEndTest, AnOomAfterAnAutotunePushRollsTheCanaryBack) {
  StartDaemon("apply");
  absl::StatusOr<Trace> trace = ReadSnapshotFile(kTrace);
  ASSERT_TRUE(trace.ok()) << trace.status();
  absl::StatusOr<std::unique_ptr<DaemonClient>> client = DaemonClient::Connect(
      {.socket = socket_,
       .job = "oom",
       .initial_config = "max_split_size_mb:64",
       .event_capacity = size_t{1} << 19});
  ASSERT_TRUE(client.ok()) << client.status();
  EventRecorder* events = (*client)->events();
  ASSERT_NE(events, nullptr);
  // A lifetime of the job's allocation stream and most of a second (280k
  // events each; not the second's teardown), fed no faster than the
  // telemetry thread sends it, with stats like the real run's. Where the
  // first pass looks depends on how the telemetry batches the events (a look
  // just after the first lifetime freed the model and the second built it
  // again finds no training step), so if it has not pushed by then, an
  // admin's run decides on the window as it is: this test is about what
  // follows the push.
  std::optional<v1::ConfigPush> push;
  auto take_push = [&] {
    for (v1::ControlMessage& m : (*client)->TakeControl()) {
      if (m.has_config()) push = m.config();
    }
  };
  const size_t fed = trace->events.size() * 19 / 10;
  for (size_t k = 0; k < fed && !push; ++k) {
    const size_t i = k % trace->events.size();
    const TraceEvent& e = trace->events[i];
    events->Record(e.op, trace->streams[e.stream],
                   uint64_t{e.id} + k / trace->events.size() * trace->num_ids, e.size);
    if (i % 20000 == 0) {
      (*client)->PublishStats({{"reserved_bytes.all.current", int64_t{20} << 30},
                               {"allocated_bytes.all.current", int64_t{4} << 30}},
                              (*client)->running_version());
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      take_push();
    }
  }
  EXPECT_EQ(events->dropped_total(), 0u);
  if (!push) {
    ASSERT_TRUE((*client)->FlushTelemetry().ok());
    grpc::ClientContext context;
    v1::AutotuneRunRequest request;
    request.set_job("oom");
    v1::AutotuneRunResponse response;
    // Unavailable when the push was made since the last look: it comes below.
    (void)admin_->AutotuneRun(&context, request, &response);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(90) * kSlowdown;
  while (!push && absl::Now() < deadline) {
    take_push();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(push.has_value()) << "no canary push";
  EXPECT_FALSE(push->rollback());
  const uint64_t version = push->config().version();
  ASSERT_TRUE((*client)->Ack(version, true, "").ok());
  ASSERT_TRUE((*client)->ReportOom(uint64_t{2} << 20, "CUDA out of memory", version).ok());

  std::optional<v1::ConfigPush> rollback;
  const absl::Time until = absl::Now() + absl::Seconds(10) * kSlowdown;
  while (!rollback && absl::Now() < until) {
    for (v1::ControlMessage& m : (*client)->TakeControl()) {
      if (m.has_config()) rollback = m.config();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(rollback.has_value());
  EXPECT_TRUE(rollback->rollback());
  EXPECT_EQ(rollback->config().config(), "max_split_size_mb:64");
  ASSERT_TRUE((*client)->Ack(rollback->config().version(), true, "").ok());
  std::optional<v1::AutotuneDecision> d = AwaitDecision("oom", {"rolled_back"});
  ASSERT_TRUE(d.has_value());
  // One rollback, though the core and the autotuner both saw the OOM.
  EXPECT_EQ(CountEvents("rollback"), 1);
  EXPECT_TRUE((*client)->TakeControl().empty());
}

// Learned configs end to end (issue 30): a push kept for the whole job is
// learned, kept in the state directory, and a second daemon on that
// directory hands it to the job's next run at registration, before its
// first allocation, where the run applies it at its first safe point.
TEST_F(AutotuneEndToEndTest, AKeptPushIsLearnedAndTheJobsNextRunUnderANewDaemonStartsWithIt) {
  const std::string state_dir = dir_.path() + "/state";
  StartDaemon("apply", {"--state-dir", state_dir});
  // Runs until the push was kept (canary watch, judgement, promotion).
  std::unique_ptr<Child> first =
      Replay("llama", {"--config", "max_split_size_mb:64", "--duration", JobSeconds(300)});
  v1::AutotuneLearnedResponse learned;
  const absl::Time deadline = absl::Now() + absl::Seconds(120) * kSlowdown;
  while (learned.learned().empty() && absl::Now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    learned = Learned();
  }
  ASSERT_EQ(kill(first->pid(), SIGTERM), 0);
  nlohmann::json first_out = Finish(*first);
  ASSERT_EQ(learned.learned_size(), 1) << first_out.dump();
  const v1::LearnedConfig& l = learned.learned(0);
  EXPECT_EQ(l.job(), "llama");
  EXPECT_EQ(l.from_config(), "max_split_size_mb:64");
  EXPECT_EQ(learned.state_file(), state_dir + "/learned_configs.json");
  std::optional<v1::AutotuneDecision> kept = AwaitDecision("llama", {"pushed"});
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(l.decision_id(), kept->id());
  EXPECT_EQ(l.config(), kept->to_config());
  EXPECT_NE(kept->version(), 0u);
  EXPECT_EQ(first_out["config"], l.config());
  // allocctl lists it and exports it as the config file's jobs.
  EXPECT_THAT(Allocctl({"autotune", "learned"}),
              AllOf(HasSubstr(l.config()), HasSubstr(state_dir)));
  nlohmann::json exported = nlohmann::json::parse(Allocctl({"autotune", "export"}));
  EXPECT_EQ(exported["jobs"]["llama"], l.config());

  // The daemon dies (no clean shutdown: the file was written when it
  // learned); the next one reads it back and hands it to the next run.
  daemon_->Kill();
  StartDaemon("apply", {"--state-dir", state_dir});
  ASSERT_EQ(Learned().learned_size(), 1);

  // A job about to start asks for it (allocd run, before the program runs);
  // another job learned nothing.
  absl::StatusOr<std::string> asked = AskLearnedConfig(socket_, "llama", absl::Seconds(10));
  ASSERT_TRUE(asked.ok()) << asked.status();
  EXPECT_EQ(*asked, l.config());
  asked = AskLearnedConfig(socket_, "bert", absl::Seconds(10));
  ASSERT_TRUE(asked.ok()) << asked.status();
  EXPECT_EQ(*asked, "");
  // A process about to import torch (allocd.enable(), through the C ABI)
  // starts on it: the environment PyTorch and the interposer read.
  setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64", 1);
  asked = StartOnLearnedConfig(socket_, "llama", absl::Seconds(10));
  ASSERT_TRUE(asked.ok()) << asked.status();
  EXPECT_EQ(*asked, l.config());
  EXPECT_STREQ(std::getenv("PYTORCH_CUDA_ALLOC_CONF"), l.config().c_str());
  EXPECT_STREQ(std::getenv("ALLOCD_LEARNED_ALLOC_CONF"), l.config().c_str());
  EXPECT_STREQ(std::getenv("ALLOCD_INITIAL_ALLOC_CONF"), "max_split_size_mb:64");
  for (const char* name : {"PYTORCH_CUDA_ALLOC_CONF", "ALLOCD_LEARNED_ALLOC_CONF",
                           "ALLOCD_INITIAL_ALLOC_CONF"}) {
    unsetenv(name);
  }
  // allocd run starts the program on it, the job's own config kept as its
  // initial config for the interposer to declare. (Not under AddressSanitizer:
  // allocd run preloads the interposer ahead of the sanitizer's runtime.)
  if (kSlowdown == 1) {
    Child run({"/usr/bin/env", "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64", ALLOCD_BINARY,
               "run", "--socket", socket_, "--job", "llama", "--", "/bin/sh", "-c",
               "echo \"$PYTORCH_CUDA_ALLOC_CONF|$ALLOCD_INITIAL_ALLOC_CONF|"
               "$ALLOCD_LEARNED_ALLOC_CONF\""});
    EXPECT_EQ(run.Line(absl::Seconds(20)),
              absl::StrCat(l.config(), "|max_split_size_mb:64|", l.config()));
    EXPECT_EQ(run.Wait(), 0);
  }
  // A client that started on it registers as such: it runs the learned
  // version and is pushed nothing (its own config is its initial one).
  {
    const int pushes = CountEvents("push");
    absl::StatusOr<std::unique_ptr<DaemonClient>> started =
        DaemonClient::Connect({.socket = socket_,
                               .job = "llama",
                               .initial_config = "max_split_size_mb:64",
                               .started_on_learned = l.config()});
    ASSERT_TRUE(started.ok()) << started.status();
    const uint64_t version = (*started)->running_version();
    EXPECT_NE(version, 0u);
    bool learned_version = false;
    for (const v1::HistoryEntry& e : ConfigHistory()) {
      learned_version |= e.event() == "learned" && e.version() == version &&
                         e.config() == l.config();
    }
    EXPECT_TRUE(learned_version);
    EXPECT_EQ(CountEvents("push"), pushes);
  }

  std::unique_ptr<Child> next =
      Replay("llama", {"--config", "max_split_size_mb:64", "--loop", "1"});
  nlohmann::json next_out = Finish(*next);
  EXPECT_EQ(next_out["config"], l.config()) << next_out.dump();
  EXPECT_THAT(next_out["config_reason"].get<std::string>(), HasSubstr("learned"));
  EXPECT_EQ(next_out["configs_applied"], 1);
  // It ran the learned config from its first event: its one loop peaked
  // below every loop of the first run under max_split_size_mb:64.
  ASSERT_EQ(next_out["loop_peaks"].size(), 1u);
  EXPECT_EQ(next_out["loop_peaks"][0]["config"], l.config());
  int64_t before_min = INT64_MAX;
  for (const nlohmann::json& loop : first_out["loop_peaks"]) {
    if (loop["config"] == "max_split_size_mb:64" &&
        loop["started_config_version"] == loop["config_version"]) {
      before_min = std::min(before_min, loop["peak_reserved"].get<int64_t>());
    }
  }
  ASSERT_NE(before_min, INT64_MAX) << first_out.dump();
  EXPECT_LT(next_out["peak_reserved"].get<int64_t>(), before_min);
  // The config history says where it came from.
  bool recorded = false;
  for (const v1::HistoryEntry& e : ConfigHistory()) {
    if (e.event() != "learned") continue;
    recorded = true;
    EXPECT_EQ(e.config(), l.config());
    EXPECT_THAT(e.detail(), HasSubstr(absl::StrCat("decision ", l.decision_id())));
  }
  EXPECT_TRUE(recorded);
}

// Issue 40's CI target: a job label this daemon has never seen, started on
// the guides' max_split_size_mb:64 and replayed at its recorded pace
// (--speed), reserves less than half of staying on it in its first replay:
// the daemon replaced the harmful config at registration, before the job's
// first allocation (on this fresh node, by the seed prior). Staying is the trace's ground truth under that config
// (a real run: 19.7 GiB; expandable_segments:True, the best, 4.5 GiB).
TEST_F(AutotuneEndToEndTest, ANewJobStartedOnAHarmfulConfigReservesLessThanHalfOfStaying) {
  std::ifstream truth_file(std::string(ALLOCD_SOURCE_DIR) + "/traces/ground_truth.json");
  const nlohmann::json truth = nlohmann::json::parse(truth_file, nullptr, false);
  ASSERT_FALSE(truth.is_discarded());
  int64_t staying = 0;
  for (const nlohmann::json& run : truth["workloads"]["llama_lora"]["runs"]) {
    if (run["conf"] == "max_split_size_mb:64") staying = run["peak_reserved"].get<int64_t>();
  }
  ASSERT_GT(staying, 0);

  StartDaemon("apply", {}, "learned");
  std::unique_ptr<Child> job =
      Replay("never-seen", {"--config", "max_split_size_mb:64", "--speed", "2", "--duration",
                            JobSeconds(25)});
  // Its first decision reviews the replacement against staying on its own
  // config, on its own events (the window's first pass, once it holds
  // 300000 events: in its second replay), and keeps it.
  std::optional<v1::AutotuneDecision> review;
  const absl::Time deadline = absl::Now() + absl::Seconds(90) * kSlowdown;
  while (!review.has_value() && absl::Now() < deadline) {
    for (const v1::AutotuneDecision& d : Decisions("never-seen")) {
      if (d.trigger() == "start_review") review = d;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  nlohmann::json out = Finish(*job);
  ASSERT_TRUE(review.has_value()) << out.dump();
  EXPECT_EQ(review->result(), "kept") << review->why();
  EXPECT_EQ(review->from_config(), "max_split_size_mb:64");
  EXPECT_EQ(review->to_config(), "expandable_segments:True");
  EXPECT_GT(review->predicted_peak_current(), 2 * review->predicted_peak_switched())
      << review->why();
  EXPECT_THAT(review->why(), AllOf(HasSubstr("started on the seed prior expandable_segments:True"),
                                   HasSubstr("instead of max_split_size_mb:64")));

  ASSERT_GE(out["loop_peaks"].size(), 1u) << out.dump();
  const nlohmann::json& first = out["loop_peaks"][0];
  EXPECT_LT(first["peak_reserved"].get<int64_t>(), staying / 2) << out.dump();
  // It ran the replacement from its first event (the push at registration,
  // applied there: the loop started as version 0, its own), and says why.
  EXPECT_EQ(first["config"], "expandable_segments:True");
  EXPECT_EQ(first["started_config_version"], 0);
  EXPECT_EQ(out["start_config_source"], "prior");
  EXPECT_THAT(out["config_reason"].get<std::string>(),
              AllOf(HasSubstr("the seed prior expandable_segments:True"),
                    HasSubstr("instead of max_split_size_mb:64"),
                    HasSubstr("known to be harmful")));
  // The config history names the replacement, as allocctl shows it.
  bool recorded = false;
  for (const v1::HistoryEntry& e : ConfigHistory()) {
    recorded |= e.job() == "never-seen" && e.config() == "expandable_segments:True" &&
                absl::StrContains(e.detail(), "known to be harmful");
  }
  EXPECT_TRUE(recorded);
}

// A job that declares it shares CUDA tensors (ALLOCD_FEATURES=cuda_ipc) is
// never started on expandable segments, which a consumer of another uid
// cannot open: its harmful start config is replaced without them.
TEST_F(AutotuneEndToEndTest, AJobThatDeclaresCudaIpcIsNotStartedOnExpandableSegments) {
  StartDaemon("apply", {}, "learned");
  absl::StatusOr<std::string> undeclared =
      AskLearnedConfig(socket_, "ipc", absl::Seconds(10), "max_split_size_mb:64");
  ASSERT_TRUE(undeclared.ok()) << undeclared.status();
  EXPECT_EQ(*undeclared, "expandable_segments:True");
  setenv(env::kFeatures, "cuda_ipc", 1);
  absl::StatusOr<std::string> declared =
      AskLearnedConfig(socket_, "ipc", absl::Seconds(10), "max_split_size_mb:64");
  unsetenv(env::kFeatures);
  ASSERT_TRUE(declared.ok()) << declared.status();
  EXPECT_EQ(*declared, "expandable_segments:False");
}

// Two daemons decide on one job in turn, each on a window of its own, so
// the job runs until the second has decided and is then stopped (SIGTERM):
// on a loaded machine a decision took 80 s of a 140 s job. Each window holds
// 2^19 events, so that each daemon decides by the time that many have come
// in, whatever its first looks found.
//
// What the second daemon decides is its own judgement on its own window:
// it starts where the job was when it reconnected, so its steps fall
// elsewhere, and on a CI machine it once found 9.7% to save on top of the
// first push. The restart's contract is that it loses no job and pushes
// nothing twice: the job's config is adopted as what it runs, the new
// daemon decides from it, and the only push after the restart is a new
// decision's, to another config.
TEST_F(AutotuneEndToEndTest, ADaemonRestartMidDecisionLosesNoJobAndPushesNothingTwice) {
  const std::vector<std::string> window = {"--autotune-window-events", "524288"};
  StartDaemon("apply", window);
  std::unique_ptr<Child> job =
      Replay("llama", {"--config", "max_split_size_mb:64", "--duration", JobSeconds(300)});
  // The canary runs the pushed config (it ACKed); the daemon dies while it
  // watches.
  std::optional<v1::AutotuneDecision> first = AwaitDecision("llama", {"pushed"});
  ASSERT_TRUE(first.has_value());
  for (int i = 0; i < 1000 && CountEvents("ack") < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(CountEvents("ack"), 1);
  daemon_->Kill();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  StartDaemon("apply", window);

  // The job came back, declaring what it runs; the new daemon decides on
  // its own window, from that config.
  std::optional<v1::AutotuneDecision> d =
      AwaitDecision("llama", {"pushed", "kept", "recommended", "skipped"});
  // A new push is run before the job is stopped.
  for (int i = 0; i < 1000 && d.has_value() && d->result() == "pushed" && CountEvents("ack") < 1;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(kill(job->pid(), SIGTERM), 0);
  nlohmann::json out = Finish(*job);
  ASSERT_TRUE(d.has_value());
  EXPECT_GE(out["reconnects"].get<int>(), 1);
  EXPECT_EQ(CountEvents("adopt"), 1);
  EXPECT_EQ(d->from_config(), first->to_config()) << d->why();
  EXPECT_EQ(CountEvents("set"), 0);
  if (d->result() == "pushed") {
    EXPECT_NE(d->to_config(), d->from_config()) << d->why();
    EXPECT_EQ(out["config"], d->to_config());
    EXPECT_EQ(out["configs_applied"], 2);  // the canary push, then the new decision's
    EXPECT_EQ(CountEvents("push"), 1);
  } else {
    EXPECT_EQ(out["config"], d->from_config()) << d->why();
    EXPECT_EQ(out["configs_applied"], 1);  // the canary push, once
    EXPECT_EQ(CountEvents("push"), 0);
  }
}

}  // namespace
}  // namespace allocd
