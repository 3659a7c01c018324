#include "client/client_env.h"

#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr const char* kVariables[] = {
    env::kSocket,           env::kJob,          env::kAutotune,
    env::kAutostart,        env::kReadAheadMs,  env::kHandoverMs,
    env::kClientCreates,    env::kInitialAllocConf,
    env::kLearnedAllocConf, env::kPytorchCudaAllocConf,
    env::kTorchRunId,       env::kRank,         env::kWorldSize,
    env::kMasterAddr,       env::kMasterPort, env::kTorchNcclRegisterHook,
    env::kFeatures};

class ClientEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : kVariables) unsetenv(name);
  }
  void TearDown() override { SetUp(); }
};

TEST_F(ClientEnvTest, AnEmptyEnvironmentGivesTheDefaults) {
  absl::StatusOr<ClientEnv> e = ClientEnv::FromEnvironment();
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->socket, kDefaultSocket);
  EXPECT_EQ(e->socket, "/run/allocd/allocd.sock");
  EXPECT_EQ(e->job, "");
  EXPECT_EQ(e->autotune, "");
  EXPECT_FALSE(e->autostart);
  EXPECT_EQ(e->read_ahead, absl::Milliseconds(200));
  EXPECT_EQ(e->handover, absl::Milliseconds(30000));
  EXPECT_TRUE(e->client_creates);
  EXPECT_EQ(e->initial_config, "");
  EXPECT_EQ(e->started_on_learned, "");
  EXPECT_EQ(e->run_id, "");
  EXPECT_EQ(e->rank, 0u);
  EXPECT_EQ(e->world_size, 0u);

  // An empty socket is the default too (the Python package passes "").
  setenv(env::kSocket, "", 1);
  EXPECT_EQ(ClientEnv::FromEnvironment()->socket, kDefaultSocket);
  EXPECT_EQ(SocketOrDefault(""), kDefaultSocket);
  EXPECT_EQ(SocketOrDefault("/tmp/b.sock"), "/tmp/b.sock");
}

TEST_F(ClientEnvTest, EveryVariableIsRead) {
  setenv(env::kSocket, "/tmp/a.sock", 1);
  setenv(env::kJob, "llama", 1);
  setenv(env::kAutotune, R"({"mode": "apply"})", 1);
  setenv(env::kAutostart, "1", 1);
  setenv(env::kReadAheadMs, "0", 1);
  setenv(env::kHandoverMs, "1500", 1);
  setenv(env::kClientCreates, "0", 1);
  setenv(env::kPytorchCudaAllocConf, "expandable_segments:True", 1);
  absl::StatusOr<ClientEnv> e = ClientEnv::FromEnvironment();
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->socket, "/tmp/a.sock");
  EXPECT_EQ(e->job, "llama");
  EXPECT_EQ(e->autotune, R"({"mode": "apply"})");
  EXPECT_TRUE(e->autostart);
  EXPECT_EQ(e->read_ahead, absl::ZeroDuration());
  EXPECT_EQ(e->handover, absl::Milliseconds(1500));
  EXPECT_FALSE(e->client_creates);
  EXPECT_EQ(e->initial_config, "expandable_segments:True");
}

TEST_F(ClientEnvTest, AJobStartedOnItsLearnedConfigDeclaresIt) {
  setenv(env::kInitialAllocConf, "max_split_size_mb:64", 1);
  setenv(env::kLearnedAllocConf, "expandable_segments:True", 1);
  setenv(env::kPytorchCudaAllocConf, "expandable_segments:True", 1);
  absl::StatusOr<ClientEnv> e = ClientEnv::FromEnvironment();
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->started_on_learned, "expandable_segments:True");
  EXPECT_EQ(e->initial_config, "max_split_size_mb:64");

  // The program changed its config since: it runs its own.
  setenv(env::kPytorchCudaAllocConf, "garbage_collection_threshold:0.6", 1);
  e = ClientEnv::FromEnvironment();
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->started_on_learned, "");
  EXPECT_EQ(e->initial_config, "garbage_collection_threshold:0.6");
}

TEST_F(ClientEnvTest, AValueAVariableCannotHaveIsRefusedByName) {
  setenv(env::kReadAheadMs, "-1", 1);
  absl::StatusOr<ClientEnv> e = ClientEnv::FromEnvironment();
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(e.status().message(), HasSubstr("ALLOCD_READ_AHEAD_MS"));
  unsetenv(env::kReadAheadMs);

  setenv(env::kHandoverMs, "soon", 1);
  EXPECT_THAT(ClientEnv::FromEnvironment().status().message(),
              HasSubstr("ALLOCD_HANDOVER_MS must be milliseconds"));
  unsetenv(env::kHandoverMs);

  setenv(env::kClientCreates, "yes", 1);
  EXPECT_THAT(ClientEnv::FromEnvironment().status().message(),
              HasSubstr("ALLOCD_CLIENT_CREATES must be 1"));
}

// PyTorch reads its NCCL hook variable with getCvarBool: any of its true
// spellings turns the registration on, anything else leaves it off.
TEST_F(ClientEnvTest, NcclRegistrationIsPyTorchsReadingOfItsHookVariable) {
  EXPECT_FALSE(NcclRegistersSegments());
  for (const char* on : {"1", "true", "TRUE", "y", "yes", "on", "t"}) {
    setenv(env::kTorchNcclRegisterHook, on, 1);
    EXPECT_TRUE(NcclRegistersSegments()) << on;
  }
  for (const char* off : {"0", "false", "", "no"}) {
    setenv(env::kTorchNcclRegisterHook, off, 1);
    EXPECT_FALSE(NcclRegistersSegments()) << off;
  }
}

// ALLOCD_FEATURES declares what the job will do, by JobFeatures' field
// names; NCCL's variable adds its registration; a name JobFeatures lacks is
// refused, naming the ones it has.
TEST_F(ClientEnvTest, DeclaredFeaturesAreJobFeaturesByName) {
  absl::StatusOr<v1::JobFeatures> features = DeclaredFeatures();
  ASSERT_TRUE(features.ok()) << features.status();
  EXPECT_EQ(features->ByteSizeLong(), 0u);
  setenv(env::kFeatures, " cuda_ipc, mem_pool ", 1);
  setenv(env::kTorchNcclRegisterHook, "1", 1);
  features = DeclaredFeatures();
  ASSERT_TRUE(features.ok()) << features.status();
  EXPECT_TRUE(features->cuda_ipc());
  EXPECT_TRUE(features->mem_pool());
  EXPECT_TRUE(features->nccl_registration());
  EXPECT_FALSE(features->cuda_graphs());
  setenv(env::kFeatures, "cuda_ipc,ipc", 1);
  EXPECT_THAT(DeclaredFeatures().status().message(),
              AllOf(HasSubstr("ALLOCD_FEATURES names \"ipc\""), HasSubstr("cuda_graphs")));
  EXPECT_EQ(ClientEnv::FromEnvironment().status().code(), absl::StatusCode::kInvalidArgument);
}

// torchrun's environment for each rank: the run its ranks share, the rank
// and how many there are.
TEST_F(ClientEnvTest, ATorchrunRankSaysItsRunRankAndWorldSize) {
  setenv(env::kTorchRunId, "3f2c-9a", 1);
  setenv(env::kRank, "1", 1);
  setenv(env::kWorldSize, "2", 1);
  absl::StatusOr<ClientEnv> e = ClientEnv::FromEnvironment();
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->run_id, "3f2c-9a");
  EXPECT_EQ(e->rank, 1u);
  EXPECT_EQ(e->world_size, 2u);

  // torchrun's default run id, the same for every run started without
  // --rdzv-id, is told apart by the rendezvous address.
  setenv(env::kTorchRunId, "none", 1);
  setenv(env::kMasterAddr, "127.0.0.1", 1);
  setenv(env::kMasterPort, "29500", 1);
  EXPECT_EQ(ClientEnv::FromEnvironment()->run_id, "none/127.0.0.1:29500");

  setenv(env::kRank, "2", 1);
  EXPECT_THAT(ClientEnv::FromEnvironment().status().message(),
              HasSubstr("RANK 2 is not below WORLD_SIZE 2"));
  setenv(env::kRank, "first", 1);
  EXPECT_THAT(ClientEnv::FromEnvironment().status().message(),
              HasSubstr("RANK must be a whole number"));
}

TEST_F(ClientEnvTest, ARunIdKeepsOnlyTheBytesTheDaemonTakes) {
  EXPECT_EQ(JobRunId("", "10.0.0.1", "29500"), "");
  EXPECT_EQ(JobRunId("my run #4", "", ""), "my_run__4");
  EXPECT_EQ(JobRunId(std::string(200, 'a'), "", "").size(), 128u);
}

}  // namespace
}  // namespace allocd
