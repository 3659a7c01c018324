// One `allocd serve --backend sim --sim-devices N` process serving N
// devices, and client processes over real sockets, each registered with
// one device's UUID (device_client.cc). Every client tags the chunks it
// gets with its device's UUID and checks the tag of every chunk it gets
// back from a cache, and reports each chunk's identity (memfd inode and
// offset): a chunk seen by clients of two devices, or a foreign tag, is a
// chunk handed across devices.
//  - Ddp: a DDP-shaped job, one rank per device, holding, releasing and
//    getting memory back at the same time.
//  - LoadOverFourDevices: 24 clients over 4 devices for several seconds,
//    the pools short; at the end no chunk was ever handed to a session of
//    another device, and every pool is back to nothing in use.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ipc/unix_socket.h"
#include "tests/server/daemon_harness.h"

namespace allocd {
namespace {

using harness::Child;
using ::testing::HasSubstr;

constexpr uint64_t kMiB = uint64_t{1} << 20;

std::string SimUuid(int i) { return absl::StrCat("SIM-GPU-", i); }

class MultiDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/multi_device." + std::to_string(getpid());
    std::filesystem::create_directories(dir_);
    socket_ = dir_ + "/allocd.sock";
  }
  void TearDown() override {
    clients_.clear();
    daemon_.reset();
    std::filesystem::remove_all(dir_);
  }

  void StartDaemon(int devices, const std::string& capacity) {
    daemon_ = std::make_unique<Child>(std::vector<std::string>{
        ALLOCD_BINARY, "serve", "--backend", "sim", "--sim-devices",
        std::to_string(devices), "--capacity", capacity, "--trim-after",
        "inf", "--socket", socket_, "--metrics-addr", ""});
    harness::WaitForDaemon(socket_);
    admin_ = v1::Admin::NewStub(harness::DialAdmin(socket_));
  }

  void Touch(const std::string& name) { std::ofstream(dir_ + "/" + name); }

  std::string dir_;
  std::string socket_;
  std::unique_ptr<Child> daemon_;
  std::unique_ptr<v1::Admin::Stub> admin_;
  std::vector<std::unique_ptr<Child>> clients_;
};

// "WORD A B ... ID ID ...": the first `numbers` fields after WORD, and the
// rest as a set.
struct Report {
  std::vector<uint64_t> numbers;
  std::set<std::string> ids;
};
Report Parse(const std::string& line, const std::string& word,
             size_t numbers) {
  std::vector<std::string> fields = absl::StrSplit(line, ' ');
  Report r;
  EXPECT_FALSE(fields.empty());
  if (fields.empty() || fields[0] != word) {
    ADD_FAILURE() << "expected \"" << word << " ...\", got \"" << line << "\"";
    return r;
  }
  for (size_t i = 1; i < fields.size(); ++i) {
    if (i <= numbers) {
      r.numbers.push_back(std::stoull(fields[i]));
    } else {
      r.ids.insert(fields[i]);
    }
  }
  EXPECT_EQ(r.numbers.size(), numbers) << line;
  return r;
}

// Chunks seen by clients of more than one device.
std::vector<std::string> SharedAcrossDevices(
    const std::map<int, std::set<std::string>>& ids_by_device) {
  std::map<std::string, int> device_of;
  std::vector<std::string> shared;
  for (const auto& [device, ids] : ids_by_device) {
    for (const std::string& id : ids) {
      auto [it, inserted] = device_of.emplace(id, device);
      if (!inserted && it->second != device) {
        shared.push_back(absl::StrCat(id, " on devices ", it->second, " and ",
                                      device));
      }
    }
  }
  return shared;
}

TEST_F(MultiDeviceTest, DdpRanksGetChunksFromTheirOwnGpusPool) {
  constexpr int kRanks = 4;
  StartDaemon(kRanks, "64MiB");
  // Rank r holds (r + 2) * 4 MiB, so each device's use tells whose it is.
  auto bytes_of = [](int rank) { return (rank + 2) * 4 * kMiB; };
  for (int rank = 0; rank < kRanks; ++rank) {
    clients_.push_back(std::make_unique<Child>(std::vector<std::string>{
        DEVICE_CLIENT_BINARY, "ddp", socket_, SimUuid(rank),
        std::to_string(bytes_of(rank)), dir_}));
  }
  std::map<int, std::set<std::string>> ids;
  std::map<uint64_t, int> rank_of_session;
  for (int rank = 0; rank < kRanks; ++rank) {
    const Report held = Parse(clients_[rank]->Line(), "held", 1);
    ASSERT_EQ(held.numbers.size(), 1u);
    rank_of_session[held.numbers[0]] = rank;
    ids[rank] = held.ids;
    EXPECT_FALSE(held.ids.empty());
  }
  // Each device's pool holds exactly its rank's memory.
  const v1::StatusResponse status = harness::PoolStatus(*admin_);
  ASSERT_EQ(status.devices_size(), kRanks);
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_EQ(status.devices(rank).gpu_uuid(), SimUuid(rank));
    EXPECT_EQ(status.devices(rank).in_use_bytes(), bytes_of(rank));
    EXPECT_EQ(status.devices(rank).sessions(), 1u);
  }
  grpc::ClientContext context;
  v1::ListSessionsResponse sessions;
  ASSERT_TRUE(admin_->ListSessions(&context, {}, &sessions).ok());
  ASSERT_EQ(sessions.sessions_size(), kRanks);
  for (const v1::SessionInfo& s : sessions.sessions()) {
    const int rank = rank_of_session.at(s.session_id());
    EXPECT_EQ(s.gpu_uuid(), SimUuid(rank));
    EXPECT_EQ(s.node_device(), rank);
    EXPECT_EQ(s.pid(), clients_[rank]->pid());
    EXPECT_EQ(s.held_bytes(), bytes_of(rank));
  }

  // Every rank releases, then all take their memory back from the caches,
  // which now hold every device's chunks.
  Touch("release");
  for (auto& client : clients_) EXPECT_EQ(client->Line(), "released");
  Touch("reacquire");
  for (int rank = 0; rank < kRanks; ++rank) {
    const Report back = Parse(clients_[rank]->Line(), "reacquired", 2);
    ASSERT_EQ(back.numbers.size(), 2u);
    EXPECT_EQ(back.numbers[0], ids[rank].size())
        << "rank " << rank << " should have had its own cached chunks back";
    EXPECT_EQ(back.numbers[1], 0u) << "rank " << rank << " got "
                                   << back.numbers[1]
                                   << " chunks another device's rank wrote";
    EXPECT_EQ(back.ids, ids[rank]) << "rank " << rank;
  }
  EXPECT_THAT(SharedAcrossDevices(ids), ::testing::IsEmpty());
  Touch("exit");
  for (auto& client : clients_) EXPECT_EQ(client->Wait(), 0);
  harness::WaitForInUse(*admin_, 0, absl::Seconds(10));
  const v1::StatusResponse after = harness::PoolStatus(*admin_);
  for (const v1::DeviceStatus& d : after.devices()) {
    EXPECT_EQ(d.in_use_bytes(), 0u) << d.gpu_uuid();
    EXPECT_EQ(d.free_bytes(), bytes_of(d.node_device())) << d.gpu_uuid();
  }
}

TEST_F(MultiDeviceTest, AClientOfAGpuTheDaemonDoesNotServeIsRefused) {
  StartDaemon(2, "16MiB");
  Child stranger({DEVICE_CLIENT_BINARY, "ddp", socket_,
                  "GPU-00000000-0000-0000-0000-000000000000", "2097152",
                  dir_});
  const std::string line = stranger.Line();
  EXPECT_THAT(line, HasSubstr("connect-error"));
  EXPECT_THAT(line, HasSubstr("SIM-GPU-0 (device 0), SIM-GPU-1 (device 1)"));
  EXPECT_EQ(stranger.Wait(), 2);
}

TEST_F(MultiDeviceTest, LoadOverFourDevicesNeverCrossesDevices) {
  constexpr int kDevices = 4;
  constexpr int kClientsPerDevice = 6;
  // 6 clients holding up to 3 grants of up to 12 MiB each want more than a
  // 48 MiB device has: the pools run short and refuse.
  StartDaemon(kDevices, "48MiB");
  for (int i = 0; i < kDevices * kClientsPerDevice; ++i) {
    clients_.push_back(std::make_unique<Child>(std::vector<std::string>{
        DEVICE_CLIENT_BINARY, "load", socket_, SimUuid(i % kDevices), "6",
        std::to_string(12 * kMiB), std::to_string(1000 + i)}));
  }
  std::map<int, std::set<std::string>> ids;
  uint64_t acquires = 0, refused = 0, reused = 0, foreign = 0;
  for (int i = 0; i < kDevices * kClientsPerDevice; ++i) {
    const Report done =
        Parse(clients_[i]->Line(absl::Seconds(120)), "done", 4);
    ASSERT_EQ(done.numbers.size(), 4u) << "client " << i;
    acquires += done.numbers[0];
    refused += done.numbers[1];
    reused += done.numbers[2];
    foreign += done.numbers[3];
    ids[i % kDevices].insert(done.ids.begin(), done.ids.end());
    EXPECT_EQ(clients_[i]->Wait(), 0) << "client " << i;
  }
  EXPECT_EQ(foreign, 0u) << "chunks another device's client wrote";
  EXPECT_THAT(SharedAcrossDevices(ids), ::testing::IsEmpty());
  EXPECT_GT(acquires, 0u);
  EXPECT_GT(reused, 0u) << "chunks should be reused within a device";
  std::cout << acquires << " acquires, " << refused << " refused, " << reused
            << " chunks reused, over " << kDevices << " devices\n";

  harness::WaitForInUse(*admin_, 0, absl::Seconds(10));
  const v1::StatusResponse status = harness::PoolStatus(*admin_);
  ASSERT_EQ(status.devices_size(), kDevices);
  EXPECT_EQ(status.sessions(), 0u);
  for (const v1::DeviceStatus& d : status.devices()) {
    EXPECT_EQ(d.in_use_bytes(), 0u) << d.gpu_uuid();
    EXPECT_LE(d.free_bytes(), 48 * kMiB) << d.gpu_uuid();
    // Every chunk a device's clients saw is one its pool created.
    EXPECT_EQ(ids[d.node_device()].size(), d.chunks_created_total())
        << d.gpu_uuid();
    EXPECT_GT(d.chunks_reused_total(), 0u) << d.gpu_uuid();
  }
}

}  // namespace
}  // namespace allocd
