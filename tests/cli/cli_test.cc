// Runs the allocd binary as a user would and checks exit codes and output.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>

#include <array>
#include <chrono>
#include <thread>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/statusor.h"
#include "allocator/trace/snapshot_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/trace/partial_snapshot.h"

namespace {

using testing::AllOf;
using testing::ContainsRegex;
using testing::HasSubstr;
using testing::Not;

struct CommandResult {
  int exit_code;
  std::string output;  // stdout and stderr together
};

CommandResult Run(const std::string& binary, const std::string& args) {
  const std::string command = binary + " " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) {
    output.append(buffer.data(), n);
  }
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

CommandResult RunAllocd(const std::string& args) { return Run(ALLOCD_BINARY, args); }

const std::string kLlama =
    std::string(ALLOCD_SOURCE_DIR) + "/traces/llama_lora.pickle.gz";

TEST(CliTest, HelpExplainsTheCommands) {
  const CommandResult r = RunAllocd("--help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("replay"));
  EXPECT_THAT(r.output, HasSubstr("check-config"));
  const CommandResult replay = RunAllocd("replay --help");
  EXPECT_EQ(replay.exit_code, 0);
  EXPECT_THAT(replay.output, HasSubstr("--memory-fraction"));
  EXPECT_THAT(replay.output, HasSubstr("--capacity"));
}

TEST(CliTest, NoCommandIsAnError) {
  EXPECT_NE(RunAllocd("").exit_code, 0);
}

TEST(CliTest, ReplayJsonHasTheDocumentedFields) {
  const CommandResult r =
      RunAllocd("replay " + kLlama +
          " --capacity 84465090560B --config max_split_size_mb:256 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  for (const char* key :
       {"peak_reserved", "peak_allocated", "num_device_alloc", "num_device_free",
        "num_alloc_retries", "num_ooms", "events", "replay_seconds"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  // PyTorch 2.11 on an H100 reserved 16835936256 bytes for this run.
  EXPECT_NEAR(j["peak_reserved"].get<double>(), 16835936256.0,
              0.001 * 16835936256.0);
  // 93,347 allocs and 93,345 frees, each requested and completed; the
  // 289 segment_alloc records are the recorded run's, not replayed.
  EXPECT_EQ(j["events"].get<int64_t>(), 93347 + 2 * 93345);
  EXPECT_EQ(j["num_ooms"].get<int64_t>(), 0);
  EXPECT_EQ(j["config"], "max_split_size_mb:256");
}

TEST(CliTest, ReplayWithAMemoryFractionRetries) {
  // The real run: 2 retries and a 5.87 GB peak under a 0.07 fraction.
  const CommandResult r = RunAllocd("replay " + kLlama +
                              " --capacity 79.18GiB --memory-fraction 0.07 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["num_alloc_retries"].get<int64_t>(), 2);
  EXPECT_EQ(j["num_ooms"].get<int64_t>(), 0);
}

TEST(CliTest, ReplayReportsOomsAndWhere) {
  const CommandResult r = RunAllocd("replay " + kLlama + " --capacity 2GB");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("OOMs"));
  EXPECT_THAT(r.output, HasSubstr("first at event"));
}

TEST(CliTest, HumanOutputSaysWhatItMeasured) {
  const CommandResult r = RunAllocd("replay " + kLlama);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("peak reserved"));
  EXPECT_THAT(r.output, HasSubstr("reserved/allocated"));
  EXPECT_THAT(r.output, HasSubstr("M events/s"));
}

TEST(CliTest, CudaMallocAsyncSaysItIsAnEstimate) {
  const CommandResult r = RunAllocd("replay " + kLlama + " --config backend:cudaMallocAsync");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("estimate"));
}

TEST(CliTest, ReplayRejectsABadConfigWithPyTorchsWords) {
  const CommandResult r = RunAllocd("replay " + kLlama + " --config roundup_power2:true");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("Unrecognized key 'roundup_power2'"));
}

TEST(CliTest, ReplayRejectsBadSizesAndFractions) {
  EXPECT_EQ(RunAllocd("replay " + kLlama + " --capacity 12XB").exit_code, 2);
  const CommandResult no_capacity = RunAllocd("replay " + kLlama + " --memory-fraction 0.5");
  EXPECT_EQ(no_capacity.exit_code, 1);
  EXPECT_THAT(no_capacity.output, HasSubstr("needs --capacity"));
  EXPECT_EQ(RunAllocd("replay " + kLlama + " --capacity 80GB --memory-fraction 1.5").exit_code, 1);
}

TEST(CliTest, ReplayOfAMissingFileNamesIt) {
  const CommandResult r = RunAllocd("replay /nonexistent/trace.pickle");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("/nonexistent/trace.pickle"));
}

// A path for the test's output files, unique to this process.
std::string TempPath(const std::string& name) {
  return testing::TempDir() + "/cli_test_" + std::to_string(getpid()) + "_" + name;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(CliTest, ReplayExportsASnapshotThatReplaysTheSame) {
  const std::string out = TempPath("llama.pickle");
  const CommandResult r = RunAllocd("replay " + kLlama +
                                    " --config max_split_size_mb:256 --export-snapshot " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("snapshot written to " + out));
  EXPECT_THAT(r.output, HasSubstr("python -m torch.cuda._memory_viz trace_plot " + out));
  EXPECT_THAT(r.output, HasSubstr("https://pytorch.org/memory_viz"));
  // A plain pickle (PROTO 2), as PyTorch's viewer wants it.
  EXPECT_EQ(ReadFile(out).substr(0, 2), "\x80\x02");

  // The exported snapshot holds every event at the replay's addresses:
  // replayed again under the same config it gives the same numbers.
  const CommandResult original =
      RunAllocd("replay " + kLlama + " --config max_split_size_mb:256 --json");
  const CommandResult again = RunAllocd("replay " + out + " --config max_split_size_mb:256 --json");
  ASSERT_EQ(original.exit_code, 0) << original.output;
  ASSERT_EQ(again.exit_code, 0) << again.output;
  const nlohmann::json a = nlohmann::json::parse(original.output);
  const nlohmann::json b = nlohmann::json::parse(again.output);
  EXPECT_EQ(b["events"], a["events"]);
  EXPECT_EQ(b["peak_reserved"], a["peak_reserved"]);
  EXPECT_EQ(b["num_device_alloc"], a["num_device_alloc"]);
  std::remove(out.c_str());
}

TEST(CliTest, ReplayExportWithJsonKeepsStdoutJson) {
  const std::string out = TempPath("json.pickle.gz");
  const std::string command = std::string(ALLOCD_BINARY) + " replay " + kLlama +
                              " --json --export-snapshot " + out + " 2>/dev/null";
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) output.append(buffer.data(), n);
  ASSERT_EQ(pclose(pipe), 0);
  EXPECT_EQ(nlohmann::json::parse(output)["num_ooms"], 0);
  // Gzipped, as the name asks.
  EXPECT_EQ(ReadFile(out).substr(0, 2), "\x1f\x8b");
  std::remove(out.c_str());
}

TEST(CliTest, ReplayExportErrorsAreClear) {
  const CommandResult unwritable =
      RunAllocd("replay " + kLlama + " --export-snapshot /nonexistent/dir/out.pickle");
  EXPECT_EQ(unwritable.exit_code, 1);
  EXPECT_THAT(unwritable.output, HasSubstr("cannot write /nonexistent/dir/out.pickle"));
  const CommandResult async = RunAllocd("replay " + kLlama +
                                        " --config backend:cudaMallocAsync --export-snapshot " +
                                        TempPath("async.pickle"));
  EXPECT_EQ(async.exit_code, 1);
  EXPECT_THAT(async.output, HasSubstr("needs the native allocator"));
}

TEST(CliTest, TuneWritesAnHtmlReport) {
  const std::string dir = TempPath("report");
  const CommandResult r = RunAllocd("tune " + kLlama +
                                    " --capacity 84465090560B --budget 30 --jobs 2 --report " + dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("report written to " + dir + "/index.html"));
  // The prediction, ready to travel with a push to a node's daemon.
  EXPECT_THAT(r.output, ContainsRegex("allocctl config set '[^']+' --job JOB "
                                      "--predicted-peak-reserved [1-9][0-9]+\n"));
  const std::string index = ReadFile(dir + "/index.html");
  EXPECT_THAT(index, HasSubstr("<!DOCTYPE html>"));
  EXPECT_THAT(index, HasSubstr("export PYTORCH_CUDA_ALLOC_CONF="));
  for (const char* svg : {"timeline.svg", "fragmentation.svg", "landscape.svg"}) {
    const std::string content = ReadFile(dir + "/" + svg);
    EXPECT_THAT(content, HasSubstr("<svg xmlns=\"http://www.w3.org/2000/svg\"")) << svg;
    EXPECT_THAT(index, HasSubstr(content)) << svg;
  }
}

// Issue #15: two answers when a memory fraction (a hard cap) saves most,
// and the allocctl line always, last, with the prediction of what it pushes.
TEST(CliTest, TuneShowsTheRobustAndTheCappedAnswer) {
  const std::string args = "tune " + kLlama +
                           " --capacity 84465090560B --total-memory 85017493504B --budget 60 --jobs 2";
  // On llama_lora a fraction saves 0.8% over expandable_segments:True.
  const CommandResult text = RunAllocd(args);
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_THAT(text.output, HasSubstr("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"));
  EXPECT_THAT(text.output, HasSubstr("robust (no hard cap), recommended: expandable_segments:True"));
  EXPECT_THAT(text.output, HasSubstr("most saving (hard cap): garbage_collection_threshold"));
  EXPECT_THAT(text.output, HasSubstr("risk: a hard cap"));
  EXPECT_THAT(text.output,
              ContainsRegex("allocctl config set 'expandable_segments:True' --job JOB "
                            "--predicted-peak-reserved [1-9][0-9]+\n$"));

  // With no threshold the cap is recommended; allocctl still pushes the
  // robust config, which is all a running process can take.
  const CommandResult json = RunAllocd(args + " --cap-threshold 0 --json");
  ASSERT_EQ(json.exit_code, 0) << json.output;
  const nlohmann::json j = nlohmann::json::parse(json.output);
  EXPECT_EQ(j["recommended"]["answer"], "capped");
  EXPECT_TRUE(j["recommended"]["memory_fraction"].is_number());
  const nlohmann::json& robust = j["answers"]["robust"];
  ASSERT_TRUE(robust.is_object());
  EXPECT_TRUE(robust["memory_fraction"].is_null());
  EXPECT_EQ(j["answers"]["capped"]["config"], j["recommended"]["config"]);
  for (const char* answer : {"robust", "capped"}) {
    EXPECT_GT(j["answers"][answer]["saving"]["percent"].get<double>(), 0) << answer;
    EXPECT_FALSE(j["answers"][answer]["risk"].get<std::string>().empty()) << answer;
  }
  EXPECT_GT(j["answers"]["cap_gain"].get<double>(), 0);
  EXPECT_EQ(j["allocctl"]["config"], robust["config"]);
  EXPECT_EQ(j["allocctl"]["predicted_peak_reserved"], robust["peak_reserved"]);

  const CommandResult bad = RunAllocd(args + " --cap-threshold 150");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(bad.output, HasSubstr("--cap-threshold"));
}

TEST(CliTest, TuneReportIntoAnUnwritableDirectoryFails) {
  const CommandResult r =
      RunAllocd("tune " + kLlama + " --budget 5 --jobs 2 --report /dev/null/report");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("--report"));
  EXPECT_THAT(r.output, HasSubstr("/dev/null/report"));
  // Checked before the tune, not after it.
  EXPECT_THAT(r.output, Not(HasSubstr("PYTORCH_CUDA_ALLOC_CONF")));
}

TEST(CliTest, CheckConfigAcceptsAndExplains) {
  const CommandResult r = RunAllocd("check-config 'max_split_size_mb:128,expandable_segments:True'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("max_split_size_mb"));
  EXPECT_THAT(r.output, HasSubstr("expandable_segments"));
}

TEST(CliTest, CheckConfigRejectsNearMissesWithAFix) {
  const CommandResult r = RunAllocd("check-config 'max_split_size_mb:64,roundup_power2:true,allocator:cudaMallocAsync'");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("roundup_power2_divisions"));
  EXPECT_THAT(r.output, HasSubstr("backend"));
  const CommandResult lower = RunAllocd("check-config expandable_segments:true");
  EXPECT_EQ(lower.exit_code, 1);
  EXPECT_THAT(lower.output, HasSubstr("True"));
}

TEST(CliTest, CheckConfigJson) {
  const CommandResult r = RunAllocd("check-config expandable_segments:true --json");
  EXPECT_EQ(r.exit_code, 1);
  const nlohmann::json j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["accepted"], false);
  EXPECT_THAT(j["error"].get<std::string>(), HasSubstr("Expected 'True' or 'False'"));
}

// The hard RLIMIT_NOFILE, or 0 where it has no useful value for the tests
// below (so large that their capacities are not worth building).
uint64_t HardFdLimit() {
  rlimit limit{};
  EXPECT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  return limit.rlim_max == RLIM_INFINITY || limit.rlim_max > (uint64_t{1} << 20)
             ? 0
             : limit.rlim_max;
}

TEST(CliTest, ServeRefusesAPoolItsFdLimitCannotHold) {
  // One FD per memfd chunk, of up to 1 GiB: a pool that even its largest
  // chunks cannot fill within the hard limit must fail at start, saying
  // what to raise, not deep into a job.
  const uint64_t hard = HardFdLimit();
  if (hard == 0) GTEST_SKIP() << "RLIMIT_NOFILE has no useful hard limit here";
  const uint64_t capacity = (hard + 1) << 30;
  const std::string socket = ::testing::TempDir() + "/fd_limit.sock";
  const CommandResult r = RunAllocd(
      "serve --backend sim --metrics-addr '' --socket " + socket +
      " --capacity " + std::to_string(capacity) + "B");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("RLIMIT_NOFILE"));
  EXPECT_THAT(r.output, HasSubstr("lower --capacity to at most"));
}

TEST(CliTest, ServeStartsAPoolOnlyItsSmallestChunksWouldOverflow) {
  // More 2 MiB chunks than the hard limit, but few of 1 GiB: it serves
  // (until `timeout` stops it), and says what small segments would meet.
  const uint64_t hard = HardFdLimit();
  if (hard == 0) GTEST_SKIP() << "RLIMIT_NOFILE has no useful hard limit here";
  const uint64_t capacity = (hard + 1) << 21;
  const std::string socket = ::testing::TempDir() + "/fd_small.sock";
  const CommandResult r = ::Run(
      std::string("timeout 5 ") + ALLOCD_BINARY,
      "serve --backend sim --metrics-addr '' --socket " + socket +
          " --capacity " + std::to_string(capacity) + "B");
  EXPECT_EQ(r.exit_code, 124) << r.output;  // timed out: it was serving
  EXPECT_THAT(r.output, HasSubstr("serving on " + socket));
  EXPECT_THAT(r.output, HasSubstr("fail as a node shortage"));
}

// ---------------------------------------------------------------------------
// Partial snapshots: the last events of the llama trace, as a ring buffer
// keeps them, with or without the end state to reconstruct from.

std::string PartialLlama(const std::string& name, bool with_end_state) {
  const std::string out = TempPath(name);
  absl::StatusOr<std::string> cut = allocd::MakePartialSnapshot(
      allocd::ReadGunzipped(kLlama),
      {.keep_last_events = 100000, .drop_end_state = !with_end_state});
  EXPECT_TRUE(cut.ok()) << cut.status();
  EXPECT_TRUE(allocd::WriteSnapshotFile(out, cut.value_or("")).ok());
  return out;
}

TEST(CliTest, ReplayOfAPartialSnapshotSaysWhatItReconstructed) {
  const std::string path = PartialLlama("partial.pickle", true);
  const CommandResult text = RunAllocd("replay " + path);
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_THAT(text.output, HasSubstr("partial trace      yes: recording began after"));
  EXPECT_THAT(text.output, HasSubstr("wrapped _record_memory_history(max_entries=N)"));
  EXPECT_THAT(text.output, ContainsRegex("reconstructed      the state at the first event, "
                                         "from the snapshot's end state: [0-9]+ segments"));
  // The whole job's peak allocated, not the window's 1.99 GiB alone.
  EXPECT_THAT(text.output, HasSubstr("peak allocated     3.92 GiB"));

  const CommandResult json = RunAllocd("replay " + path + " --json");
  ASSERT_EQ(json.exit_code, 0) << json.output;
  const nlohmann::json partial = nlohmann::json::parse(json.output)["partial"];
  EXPECT_EQ(partial["partial"], true);
  EXPECT_EQ(partial["reconstructed"], true);
  EXPECT_EQ(partial["ring_buffer_wrapped"], true);
  EXPECT_GT(partial["unmatched_frees"].get<int>(), 0);
  EXPECT_GT(partial["initial_state"]["live_bytes"].get<int64_t>(), int64_t{2} << 30);
  EXPECT_TRUE(partial["unrecoverable"].is_null());

  // A whole trace says so too.
  const CommandResult whole = RunAllocd("replay " + kLlama + " --json");
  EXPECT_EQ(nlohmann::json::parse(whole.output)["partial"]["partial"], false);
  EXPECT_THAT(RunAllocd("replay " + kLlama).output, Not(HasSubstr("partial trace")));
  std::remove(path.c_str());
}

TEST(CliTest, TuneRefusesAPartialSnapshotItCannotReconstructUnlessForced) {
  const std::string path = PartialLlama("no_end_state.pickle", false);
  const CommandResult replay = RunAllocd("replay " + path);
  ASSERT_EQ(replay.exit_code, 0) << replay.output;
  EXPECT_THAT(replay.output, HasSubstr("WARNING            the state at the first event "
                                       "cannot be reconstructed: the snapshot has no "
                                       "'segments'"));

  const CommandResult refused = RunAllocd("tune " + path + " --budget 5 --jobs 2");
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_THAT(refused.output, HasSubstr("cannot be reconstructed"));
  EXPECT_THAT(refused.output, HasSubstr("--force"));
  const CommandResult forced = RunAllocd("tune " + path + " --budget 5 --jobs 2 --force --json");
  ASSERT_EQ(forced.exit_code, 0) << forced.output;
  EXPECT_EQ(nlohmann::json::parse(forced.output.substr(forced.output.find('{')))["partial"]["reconstructed"],
            false);

  // A partial snapshot with its end state tunes without --force.
  const std::string reconstructible = PartialLlama("tunable.pickle", true);
  EXPECT_EQ(RunAllocd("tune " + reconstructible + " --budget 5 --jobs 2").exit_code, 0);
  std::remove(path.c_str());
  std::remove(reconstructible.c_str());
}


// --- Sizes: one parser for every flag (allocator/bytes.h) ---------------

int64_t ReplayCapacity(const std::string& capacity) {
  const CommandResult r = RunAllocd("replay " + kLlama + " --json --capacity " + capacity);
  EXPECT_EQ(r.exit_code, 0) << capacity << ": " << r.output;
  if (r.exit_code != 0) return -1;
  return nlohmann::json::parse(r.output)["capacity"].get<int64_t>();
}

TEST(CliSizeTest, EveryUnitForm) {
  EXPECT_EQ(ReplayCapacity("80GB"), 80000000000);
  EXPECT_EQ(ReplayCapacity("80G"), 80000000000);
  EXPECT_EQ(ReplayCapacity("80GiB"), int64_t{80} << 30);
  EXPECT_EQ(ReplayCapacity("80Gi"), int64_t{80} << 30);
  EXPECT_EQ(ReplayCapacity("79.1GiB"), 84932978278);
  EXPECT_EQ(ReplayCapacity("84465090560B"), 84465090560);
}

TEST(CliSizeTest, ABareNumberIsAUsageErrorWithASuggestion) {
  const CommandResult r = RunAllocd("replay " + kLlama + " --capacity 80");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("did you mean 80GB?"));
  EXPECT_THAT(r.output, HasSubstr("Usage: allocd replay"));
  const CommandResult bytes = RunAllocd("replay " + kLlama + " --capacity 84465090560");
  EXPECT_EQ(bytes.exit_code, 2);
  EXPECT_THAT(bytes.output, HasSubstr("did you mean 84465090560B?"));
  for (const char* flag : {"--capacity", "--total-memory", "--memory-budget"}) {
    const CommandResult tune = RunAllocd("tune " + kLlama + " " + flag + " 80");
    EXPECT_EQ(tune.exit_code, 2) << flag;
    EXPECT_THAT(tune.output, HasSubstr("did you mean 80GB?")) << flag;
  }
}

TEST(CliSizeTest, PercentNeedsADevice) {
  // A snapshot does not say how much memory its GPU had.
  const CommandResult replay = RunAllocd("replay " + kLlama + " --capacity 80%");
  EXPECT_EQ(replay.exit_code, 1) << replay.output;
  EXPECT_THAT(replay.output, HasSubstr("is a percentage"));
  const CommandResult no_total = RunAllocd("tune " + kLlama + " --capacity 95% --budget 3");
  EXPECT_EQ(no_total.exit_code, 1) << no_total.output;
  EXPECT_THAT(no_total.output, HasSubstr("no --total-memory"));
  // tune knows the device from --total-memory.
  const CommandResult tune = RunAllocd(
      "tune " + kLlama + " --capacity 95% --total-memory 80GB --budget 3 --jobs 2 --json");
  ASSERT_EQ(tune.exit_code, 0) << tune.output;
  EXPECT_EQ(nlohmann::json::parse(tune.output)["capacity"].get<int64_t>(), 76000000000);
}

TEST(CliSizeTest, TotalMemoryBelowTheTracesPeakIsRefused) {
  const CommandResult r = RunAllocd("tune " + kLlama + " --total-memory 2GB --budget 3");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--total-memory 1.86 GiB is less than the 3.92 GiB"));
  // Nothing was tuned.
  EXPECT_THAT(r.output, Not(HasSubstr("PYTORCH_CUDA_ALLOC_CONF")));
}

// --- Exit status: 0 done, 1 error, 2 usage (the usage printed) ----------

TEST(CliExitTest, UsageErrorsPrintTheUsageAndExit2) {
  struct Case {
    std::string args, message, usage;
  };
  for (const Case& c : std::vector<Case>{
           {"", "A subcommand is required", "Usage: allocd [OPTIONS] SUBCOMMAND"},
           {"replay", "TRACE is required", "Usage: allocd replay [OPTIONS] TRACE"},
           {"replay " + kLlama + " --bogus", "--bogus", "Usage: allocd replay"},
           {"tune " + kLlama + " --objective fastest", "--objective", "Usage: allocd tune"},
           {"--socket /tmp/x.sock replay " + kLlama,
            "--socket does not apply to `allocd replay`", "Usage: allocd replay"},
           {"frobnicate", "frobnicate", "Usage: allocd"}}) {
    const CommandResult r = RunAllocd(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_THAT(r.output, AllOf(HasSubstr(c.message), HasSubstr(c.usage),
                                HasSubstr("--help' for the options")))
        << c.args;
  }
}

TEST(CliExitTest, HelpDocumentsTheExitStatus) {
  for (const char* args : {"--help", "replay --help", "check-config --help"}) {
    const CommandResult r = RunAllocd(args);
    EXPECT_EQ(r.exit_code, 0) << args;
    EXPECT_THAT(r.output, AllOf(HasSubstr("Exit status:"), HasSubstr("2: a usage error")))
        << args;
  }
  EXPECT_THAT(RunAllocd("tune --help").output, HasSubstr("3: no candidate config fits"));
}

TEST(CliExitTest, TuneWithNothingThatFitsExits3) {
  const CommandResult r = RunAllocd("tune " + kLlama + " --capacity 1GB --budget 3 --jobs 2");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_THAT(r.output, HasSubstr("No candidate"));
}

TEST(CliExitTest, GlobalFlagsBeforeTheSubcommand) {
  const CommandResult r = RunAllocd("--json replay " + kLlama);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(r.output)["num_ooms"], 0);
  const CommandResult check = RunAllocd("--json check-config expandable_segments:True");
  ASSERT_EQ(check.exit_code, 0) << check.output;
  EXPECT_EQ(nlohmann::json::parse(check.output)["accepted"], true);
}

// --- Messages that say what happened and what to do ----------------------

TEST(CliMessageTest, ATextFileIsNotAPickleSnapshot) {
  const std::string path = TempPath("notes.txt");
  std::ofstream(path) << "hello world, these are my notes\n";
  const CommandResult r = RunAllocd("replay " + path);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("not a pickle snapshot"));
  EXPECT_THAT(r.output, HasSubstr("hello world"));
  EXPECT_THAT(r.output, Not(HasSubstr("BINGET")));
  // The path once.
  EXPECT_EQ(r.output.find(path), r.output.rfind(path)) << r.output;
  std::remove(path.c_str());
}

TEST(CliMessageTest, CheckConfigExplainsTheSyntax) {
  const CommandResult equals = RunAllocd("check-config max_split_size_mb=64");
  EXPECT_EQ(equals.exit_code, 1);
  EXPECT_THAT(equals.output, HasSubstr("key:value"));
  EXPECT_THAT(equals.output, Not(HasSubstr("INTERNAL ASSERT")));
  EXPECT_THAT(equals.output, HasSubstr("fixed config (PyTorch accepts it): max_split_size_mb:64"));
  const CommandResult spaces =
      RunAllocd("check-config 'max_split_size_mb:64 expandable_segments:True'");
  EXPECT_THAT(spaces.output, HasSubstr("spaces do not separate keys"));
  EXPECT_THAT(spaces.output, HasSubstr("fixed config (PyTorch accepts it): "
                                       "max_split_size_mb:64,expandable_segments:True"));
  const CommandResult threshold = RunAllocd("check-config garbage_collection_threshold:1.5");
  EXPECT_THAT(threshold.output, HasSubstr("strictly between 0 and 1, such as 0.8"));
  EXPECT_THAT(threshold.output, Not(HasSubstr("0.015")));
  const CommandResult json = RunAllocd("check-config max_split_size_mb=64 --json");
  const nlohmann::json j = nlohmann::json::parse(json.output);
  EXPECT_THAT(j["pytorch_error"].get<std::string>(), HasSubstr("INTERNAL ASSERT"));
  EXPECT_THAT(j["error"].get<std::string>(), HasSubstr("key:value"));
}

#ifdef ALLOCCTL_BINARY
CommandResult RunAllocctl(const std::string& args) { return Run(ALLOCCTL_BINARY, args); }

TEST(CliMessageTest, ABusyMetricsPortSaysSo) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  const std::string port = std::to_string(ntohs(address.sin_port));
  const CommandResult r = RunAllocd("serve --capacity 64MiB --socket " + TempPath("busy.sock") +
                                    " --metrics-addr 127.0.0.1:" + port);
  close(fd);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("port " + port + " is already in use"));
  EXPECT_THAT(r.output, HasSubstr("--metrics-addr"));
  EXPECT_THAT(r.output, Not(HasSubstr("CivetServer")));
}

TEST(CliMessageTest, ABadConfigFileAtStartIsNotKeptFromBefore) {
  const std::string config = TempPath("bad_config.json");
  std::ofstream(config) << R"({"jobs": {"llama": "max_split_size_mb=64"}})";
  const CommandResult r = RunAllocd("serve --capacity 64MiB --metrics-addr '' --socket " +
                                    TempPath("config.sock") + " --config " + config);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("cannot start with --config " + config));
  EXPECT_THAT(r.output, HasSubstr("jobs.llama"));
  EXPECT_THAT(r.output, Not(HasSubstr("last good")));
  std::remove(config.c_str());
}

// A percentage of the pool's device: --backend cuda knows its memory
// (cuMemGetInfo's total, tested on a GPU), sim has none and says so.
TEST(CliSizeTest, ServeCapacityInPercentNeedsADevice) {
  const CommandResult r = RunAllocd("serve --backend sim --capacity 90% --metrics-addr '' --socket " +
                                    TempPath("percent.sock"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--backend sim has no device memory"));
  const CommandResult bare = RunAllocd("serve --capacity 64 --metrics-addr ''");
  EXPECT_EQ(bare.exit_code, 2) << bare.output;
  EXPECT_THAT(bare.output, HasSubstr("did you mean 64GB?"));
}

TEST(CliSizeTest, ServeDeviceFlagsAreCheckedBeforeStarting) {
  const CommandResult none = RunAllocd("serve --backend sim --sim-devices 0");
  EXPECT_EQ(none.exit_code, 2) << none.output;
  EXPECT_THAT(none.output, HasSubstr("--sim-devices"));
  const CommandResult headroom = RunAllocd("serve --headroom 2XB");
  EXPECT_EQ(headroom.exit_code, 2) << headroom.output;
  EXPECT_THAT(headroom.output, HasSubstr("--headroom"));
  const CommandResult tenant_quota = RunAllocd("serve --default-tenant-quota 40");
  EXPECT_EQ(tenant_quota.exit_code, 2) << tenant_quota.output;
  EXPECT_THAT(tenant_quota.output, HasSubstr("--default-tenant-quota"));
  EXPECT_THAT(tenant_quota.output, HasSubstr("did you mean 40GB?"));
  const CommandResult backend = RunAllocd("serve --backend gpu");
  EXPECT_EQ(backend.exit_code, 2) << backend.output;
  EXPECT_THAT(backend.output, HasSubstr("auto"));
}

TEST(CliExitTest, AllocctlUsageErrorsExit2) {
  for (const char* args : {"", "config", "quota set 20GiB", "sessions --bogus",
                           "quota set 80 --uid 1000"}) {
    const CommandResult r = RunAllocctl(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr("Usage: allocctl")) << args;
  }
  EXPECT_THAT(RunAllocctl("quota set 80 --uid 1000").output, HasSubstr("did you mean 80GB?"));
  EXPECT_THAT(RunAllocctl("--help").output, HasSubstr("4: the daemon does not allow"));
  // A subcommand's help says where the global flags are.
  EXPECT_THAT(RunAllocctl("sessions --help").output,
              HasSubstr("before or after the subcommand: --socket PATH, --json"));
}

// docs/daemon.md: allocctl exits 4 when it cannot reach the admin socket,
// as when the daemon refuses the caller.
TEST(CliExitTest, AllocctlWithoutADaemonExits4) {
  const CommandResult r = RunAllocctl("status --socket " + TempPath("no_daemon.sock"));
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_THAT(r.output, HasSubstr("cannot reach allocd's admin socket"));
}

// A daemon of the sim backend for allocctl to talk to.
class CliDaemonTest : public testing::Test {
 protected:
  void SetUp() override {
    socket_ = TempPath("daemon.sock");
    std::vector<std::string> args = {ALLOCD_BINARY, "serve", "--backend", "sim",
                                     "--capacity", "64MiB", "--metrics-addr", "",
                                     "--socket", socket_};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ASSERT_EQ(posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), environ), 0);
    for (int i = 0; i < 500 && access(socket_.c_str(), F_OK) != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  void TearDown() override {
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
  }
  std::string socket_;
  pid_t pid_ = 0;
};

TEST_F(CliDaemonTest, GlobalFlagsBeforeOrAfterTheSubcommand) {
  for (const std::string& args :
       {"--socket " + socket_ + " --json sessions", "sessions --json --socket " + socket_,
        "--json sessions -s " + socket_, "config history --socket " + socket_ + " --json"}) {
    const CommandResult r = RunAllocctl(args);
    ASSERT_EQ(r.exit_code, 0) << args << "\n" << r.output;
    EXPECT_TRUE(nlohmann::json::parse(r.output).is_object()) << args << "\n" << r.output;
  }
}

TEST_F(CliDaemonTest, QuotaSizes) {
  EXPECT_EQ(RunAllocctl("quota set 25% --uid 1000 --socket " + socket_).exit_code, 0);
  EXPECT_EQ(RunAllocctl("quota set 20Gi --uid 1000 --socket " + socket_).exit_code, 0);
  EXPECT_EQ(RunAllocctl("quota set none --uid 1000 --socket " + socket_).exit_code, 0);
  const CommandResult tenant =
      RunAllocctl("quota set 25% --tenant uid:1000 --socket " + socket_);
  EXPECT_EQ(tenant.exit_code, 0) << tenant.output;
  EXPECT_THAT(tenant.output, HasSubstr("quota of tenant uid:1000: 25%"));
  EXPECT_EQ(RunAllocctl("quota set none --tenant uid:1000 --socket " + socket_).exit_code, 0);
  // One target only.
  EXPECT_EQ(RunAllocctl("quota set 1GiB --uid 1000 --tenant uid:1000 --socket " + socket_)
                .exit_code,
            2);
  const CommandResult predicted = RunAllocctl(
      "config set expandable_segments:True --predicted-peak-reserved 4802478080 --json -s " +
      socket_);
  ASSERT_EQ(predicted.exit_code, 0) << predicted.output;
  EXPECT_THAT(predicted.output, HasSubstr("4802478080"));
}

TEST_F(CliDaemonTest, AMissingAdminSocketExits4) {
  const std::string missing = TempPath("missing.admin");
  const CommandResult r = RunAllocctl("status --socket " + socket_ + " --admin-socket " + missing);
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_THAT(r.output, HasSubstr(missing));
  // The daemon's own admin socket still answers.
  EXPECT_EQ(RunAllocctl("status --socket " + socket_).exit_code, 0);
}
#endif

}  // namespace

