// Runs the allocd binary as a user would and checks exit codes and output.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace {

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
          " --capacity 84465090560 --config max_split_size_mb:256 --json");
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

}  // namespace
