// A daemon restart under load, end to end: a real `allocd serve` (sim) and
// real client processes that acquire and release chunks in a loop; the
// daemon is killed with SIGKILL and started again. The restarted daemon
// must count exactly what the surviving clients hold (NodePool::Adopt),
// per session and in total, hand no chunk out twice, lose none, and hand
// out no new memory before the survivors re-declared theirs.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "allocd.grpc.pb.h"
#include "client/daemon_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ipc/unix_socket.h"
#include "tests/scoped_temp_dir.h"
#include "tests/server/daemon_harness.h"

namespace allocd {
namespace {

using harness::Child;
using harness::Dial;
using harness::DialAdmin;

constexpr int kClients = 4;
constexpr uint64_t kMaxChunksPerClient = 24;

// What a paused churn client said it holds.
struct Holding {
  uint64_t session = 0;
  uint64_t bytes = 0;
  std::vector<uint64_t> ids;
};

Holding ParseHolding(const std::string& line) {
  // "holding SESSION BYTES ID,ID,..."
  std::vector<std::string> f = absl::StrSplit(line, ' ');
  Holding h;
  EXPECT_GE(f.size(), 3u) << line;
  if (f.size() < 3 || f[0] != "holding") return h;
  EXPECT_TRUE(absl::SimpleAtoi(f[1], &h.session));
  EXPECT_TRUE(absl::SimpleAtoi(f[2], &h.bytes));
  if (f.size() > 3 && !f[3].empty()) {
    for (absl::string_view id : absl::StrSplit(f[3], ',')) {
      uint64_t value = 0;
      EXPECT_TRUE(absl::SimpleAtoi(id, &value));
      h.ids.push_back(value);
    }
  }
  return h;
}

class DaemonRestartTest : public ::testing::Test {
 public:
  void SetUp() override {
    socket_ = dir_.path() + "/allocd.sock";
  }

  // A long window: that it closes long before proves it ends when the
  // survivors are back.
  void StartDaemon() {
    daemon_ = std::make_unique<Child>(std::vector<std::string>{
        ALLOCD_BINARY, "serve", "--socket", socket_, "--metrics-addr", "",
        "--capacity", "512MiB", "--adopt-window", "60s"});
    harness::WaitForDaemon(socket_);
    admin_ = v1::Admin::NewStub(DialAdmin(socket_));
  }

  v1::StatusResponse Status() { return harness::PoolStatus(*admin_); }

  std::map<int32_t, v1::SessionInfo> SessionsByPid() {
    grpc::ClientContext context;
    v1::ListSessionsResponse r;
    EXPECT_TRUE(admin_->ListSessions(&context, {}, &r).ok());
    std::map<int32_t, v1::SessionInfo> by_pid;
    for (const v1::SessionInfo& s : r.sessions()) by_pid[s.pid()] = s;
    return by_pid;
  }

  // First: removed after the daemon below is stopped.
  ScopedTempDir dir_{"allocd_restart_"};
  std::string socket_;
  std::unique_ptr<Child> daemon_;
  std::unique_ptr<v1::Admin::Stub> admin_;
};

TEST_F(DaemonRestartTest, KilledUnderLoadTheNewDaemonCountsExactlyWhatClientsHold) {
  StartDaemon();
  std::vector<std::unique_ptr<Child>> clients;
  std::set<int32_t> pids;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<Child>(std::vector<std::string>{
        CHURN_CLIENT_BINARY, socket_, std::to_string(kMaxChunksPerClient),
        std::to_string(i + 1)}));
    const std::string ready = clients.back()->Line();
    ASSERT_THAT(ready, ::testing::StartsWith("ready ")) << ready;
    pids.insert(clients.back()->pid());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(700));  // under load
  const uint64_t before = Status().in_use_bytes();
  ASSERT_GT(before, 0u);

  daemon_->Kill();  // SIGKILL: nothing of the daemon's runs
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  StartDaemon();
  const absl::Time restarted = absl::Now();

  // A newcomer asks for memory at once: it waits for the survivors.
  absl::Time newcomer_served;
  std::unique_ptr<DaemonClient> newcomer;
  absl::StatusOr<ReceivedChunks> newcomer_chunks;
  std::thread newcomer_thread;
  // However the test ends: a newcomer still waiting gives up once the
  // daemon is gone.
  struct JoinAtExit {
    std::thread& thread;
    DaemonRestartTest& test;
    ~JoinAtExit() {
      if (!thread.joinable()) return;
      test.daemon_->Kill();
      thread.join();
    }
  } join_at_exit{newcomer_thread, *this};
  newcomer_thread = std::thread([&] {
    absl::StatusOr<std::unique_ptr<DaemonClient>> c =
        DaemonClient::Connect({.socket = socket_, .job = "newcomer"});
    ASSERT_TRUE(c.ok()) << c.status();
    newcomer = std::move(*c);
    newcomer_chunks = newcomer->Acquire(2 << 20);
    newcomer_served = absl::Now();
  });

  // Every survivor has a session on the new daemon; the last one's
  // registration is "the last client reconnecting".
  absl::Time last_reconnect;
  for (int i = 0; i < 3000; ++i) {
    std::map<int32_t, v1::SessionInfo> sessions = SessionsByPid();
    int back = 0;
    int64_t latest = 0;
    for (int32_t pid : pids) {
      if (auto s = sessions.find(pid); s != sessions.end()) {
        ++back;
        latest = std::max(latest, s->second.registered_unix_micros());
      }
    }
    if (back == kClients) {
      last_reconnect = absl::FromUnixMicros(latest);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (last_reconnect == absl::Time()) {
    std::map<int32_t, v1::SessionInfo> sessions = SessionsByPid();
    for (auto& c : clients) {
      if (sessions.contains(c->pid())) continue;
      std::printf("client %d did not come back; running %d, said: %s\n",
                  c->pid(), c->running(), c->Rest(absl::Seconds(1)).c_str());
      const std::string where = absl::StrCat(
          "gdb -batch -p ", c->pid(), " -ex 'thread apply all bt' 2>&1 | grep -E '^#|^Thread' | head -80");
      std::system(where.c_str());
    }
  }
  ASSERT_NE(last_reconnect, absl::Time()) << "the clients did not reconnect";
  // The window closes when the survivors are back, not after its 60 s.
  for (int i = 0; i < 500 && Status().adopting(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(Status().adopting());
  newcomer_thread.join();
  ASSERT_TRUE(newcomer_chunks.ok()) << newcomer_chunks.status();
  EXPECT_GE(newcomer_served, last_reconnect);

  // Stop the load: each client finishes its call and says what it holds.
  std::vector<Holding> held;
  for (auto& c : clients) kill(c->pid(), SIGUSR1);
  for (auto& c : clients) {
    const std::string line = c->Line();
    ASSERT_THAT(line, ::testing::StartsWith("holding ")) << line;
    held.push_back(ParseHolding(line));
  }
  // The daemon's books equal the clients' own, per session and in total.
  auto exact = [&] {
    std::map<int32_t, v1::SessionInfo> sessions = SessionsByPid();
    uint64_t total = 2 << 20;  // the newcomer's chunk
    for (size_t i = 0; i < clients.size(); ++i) {
      auto s = sessions.find(clients[i]->pid());
      if (s == sessions.end() || s->second.session_id() != held[i].session ||
          s->second.held_bytes() != held[i].bytes) {
        return false;
      }
      total += held[i].bytes;
    }
    return Status().in_use_bytes() == total;
  };
  bool matched = false;
  for (int i = 0; i < 500 && !(matched = exact()); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const absl::Time exact_at = absl::Now();
  std::map<int32_t, v1::SessionInfo> sessions = SessionsByPid();
  uint64_t total = 0;
  for (size_t i = 0; i < clients.size(); ++i) {
    EXPECT_EQ(sessions[clients[i]->pid()].held_bytes(), held[i].bytes)
        << "client " << i;
    total += held[i].bytes;
  }
  EXPECT_EQ(Status().in_use_bytes(), total + (2 << 20));
  ASSERT_TRUE(matched);
  // No chunk is two clients'.
  std::set<uint64_t> ids;
  for (const Holding& h : held) {
    for (uint64_t id : h.ids) EXPECT_TRUE(ids.insert(id).second) << id;
  }
  for (uint64_t id : newcomer_chunks->ids) {
    EXPECT_TRUE(ids.insert(id).second) << id;
  }
  const v1::StatusResponse status = Status();
  EXPECT_GT(status.adopted_bytes_total(), 0u);
  std::printf(
      "held before the kill: %llu MiB; after the restart: %llu MiB in %d "
      "sessions, adopted %llu MiB; last client back %.0f ms after the "
      "restart; the newcomer served %.0f ms after it; books exact %.0f ms "
      "after the last client reconnected (checked with the load paused)\n",
      static_cast<unsigned long long>(before >> 20),
      static_cast<unsigned long long>(total >> 20), kClients,
      static_cast<unsigned long long>(status.adopted_bytes_total() >> 20),
      absl::ToDoubleMilliseconds(last_reconnect - restarted),
      absl::ToDoubleMilliseconds(newcomer_served - last_reconnect),
      absl::ToDoubleMilliseconds(exact_at - last_reconnect));

  // Nothing lost: when the clients go, everything they held comes back.
  for (auto& c : clients) {
    EXPECT_TRUE(c->running()) << "a client failed: " << c->Rest();
    c->Kill();
  }
  newcomer.reset();
  EXPECT_EQ(harness::WaitForInUse(*admin_, 0, absl::Seconds(10)) <
                absl::Seconds(10),
            true);
  EXPECT_EQ(Status().in_use_bytes(), 0u);
}

}  // namespace
}  // namespace allocd
