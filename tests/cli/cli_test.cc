// Runs the allocd binary as a user would and checks exit codes and output.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace {

using testing::ContainsRegex;
using testing::HasSubstr;

struct CommandResult {
  int exit_code;
  std::string output;  // stdout and stderr together
};

CommandResult RunAllocd(const std::string& args) {
  const std::string command = std::string(ALLOCD_BINARY) + " " + args + " 2>&1";
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
  EXPECT_EQ(RunAllocd("replay " + kLlama + " --capacity 12XB").exit_code, 1);
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

TEST(CliTest, ServeRefusesAPoolItsFdLimitCannotHold) {
  // One FD per 2 MiB memfd chunk: a pool of more chunks than the hard
  // limit must fail at start, saying what to raise, not deep into a job.
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  if (limit.rlim_max == RLIM_INFINITY || limit.rlim_max > (uint64_t{1} << 28)) {
    GTEST_SKIP() << "RLIMIT_NOFILE has no useful hard limit here";
  }
  const uint64_t capacity = (uint64_t{limit.rlim_max} + 1) << 21;
  const std::string socket = ::testing::TempDir() + "/fd_limit.sock";
  const CommandResult r = RunAllocd(
      "serve --backend sim --metrics-addr '' --socket " + socket +
      " --capacity " + std::to_string(capacity) + "B");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("RLIMIT_NOFILE"));
  EXPECT_THAT(r.output, HasSubstr("lower --capacity to at most"));
}

}  // namespace
