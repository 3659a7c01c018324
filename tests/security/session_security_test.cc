// Attacks on sessions and on the Admin service, each its own test, against
// a real `allocd serve` (sim) and attackers running as other uids: what
// issue 29 measured (session takeover with guessed ids, chunks released by
// guessing their ids, root's Admin power on the clients' socket) must be
// refused, and so must issue 41's chunks forged and declared after no
// restart. The tests that need another uid run as root (CI does) and skip,
// saying why, otherwise.
#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/match.h"
#include "allocd.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "ipc/unix_socket.h"
#include "tests/scoped_temp_dir.h"
#include "tests/server/daemon_harness.h"
#include "tests/security/run_as.h"

namespace allocd {
namespace {

using ::testing::HasSubstr;
using harness::Child;
using harness::Dial;
using harness::DialAdmin;

constexpr uid_t kAttacker = 1002;

// What a command run as `uid` with `groups` printed, by line, and its exit
// code.
struct Ran {
  std::vector<std::string> lines;
  int exit_code = -1;
};
Ran RunAs(uid_t uid, std::vector<gid_t> groups, std::vector<std::string> args) {
  const RanAs ran = ::allocd::RunAs(uid, groups, std::move(args));
  return {absl::StrSplit(ran.output, '\n', absl::SkipEmpty()), ran.exit_code};
}

class SessionSecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Other uids reach the sockets (0660, root's group) through a
    // supplementary group 0, as a container user in the socket's group would.
    chmod(dir_.path().c_str(), 0755);
    socket_ = dir_.path() + "/allocd.sock";
    daemon_ = std::make_unique<Child>(std::vector<std::string>{
        ALLOCD_BINARY, "serve", "--backend", "sim", "--socket", socket_,
        "--metrics-addr", "", "--capacity", "64MiB"});
    harness::WaitForDaemon(socket_);
    stub_ = v1::Allocd::NewStub(Dial(socket_));
  }

  void TearDown() override { daemon_.reset(); }

  static bool Root() { return geteuid() == 0; }

  // A victim's session, registered and leased (it lives while this test
  // holds `lease`), holding one chunk.
  struct Victim {
    v1::RegisterResponse session;
    UniqueFd lease;
    uint64_t chunk = 0;
  };
  Victim RegisterVictim() {
    Victim v;
    grpc::ClientContext c;
    v1::RegisterRequest hello;
    hello.set_protocol_version(1);
    EXPECT_TRUE(stub_->Register(&c, hello, &v.session).ok());
    EXPECT_GE(v.session.session_secret().size(), 16u);
    v.lease = std::move(*ConnectUnix(v.session.fd_socket()));
    v1::SideRequest lease;
    lease.set_lease_session_id(v.session.session_id());
    lease.set_session_secret(v.session.session_secret());
    EXPECT_TRUE(SendMessage(v.lease.get(), lease.SerializeAsString()).ok());
    absl::StatusOr<ReceivedMessage> answer =
        ReceiveMessage(v.lease.get(), 1 << 20, absl::Seconds(5));
    EXPECT_TRUE(answer.ok());
    v1::SideResponse leased;
    leased.ParseFromString(answer->payload);
    EXPECT_EQ(leased.code(), 0) << leased.error();
    grpc::ClientContext ac;
    v1::AcquireChunksRequest acquire;
    acquire.set_session_id(v.session.session_id());
    acquire.set_session_secret(v.session.session_secret());
    acquire.set_bytes(2 << 20);
    v1::AcquireChunksResponse granted;
    EXPECT_TRUE(stub_->AcquireChunks(&ac, acquire, &granted).ok());
    if (granted.chunk_ids_size() > 0) v.chunk = granted.chunk_ids(0);
    return v;
  }

  uint64_t InUse() {
    auto admin = v1::Admin::NewStub(DialAdmin(socket_));
    return harness::PoolStatus(*admin).in_use_bytes();
  }

  // First: removed after the daemon below is stopped.
  ScopedTempDir dir_{"allocd_security_"};
  std::string socket_;
  std::unique_ptr<Child> daemon_;
  std::unique_ptr<v1::Allocd::Stub> stub_;
};

// Session ids are counters: a guessed id with a guessed secret is answered
// as an id that does not exist, and does nothing.
TEST_F(SessionSecurityTest, AGuessedSessionSecretIsRefused) {
  Victim victim = RegisterVictim();
  std::string guessed = victim.session.session_secret();
  guessed[0] ^= 0x55;
  auto release_with = [&](uint64_t id, const std::string& secret) {
    grpc::ClientContext c;
    v1::ReleaseChunksRequest r;
    r.set_session_id(id);
    r.set_session_secret(secret);
    r.add_chunk_ids(victim.chunk);
    v1::ReleaseChunksResponse response;
    return stub_->ReleaseChunks(&c, r, &response);
  };
  const uint64_t id = victim.session.session_id();
  for (const std::string& secret : {guessed, std::string()}) {
    grpc::Status s = release_with(id, secret);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
    // The same words as for an id nobody holds.
    grpc::Status none = release_with(id + 1000, secret);
    EXPECT_EQ(none.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(absl::StrReplaceAll(none.error_message(),
                                  {{std::to_string(id + 1000), "ID"}}),
              absl::StrReplaceAll(s.error_message(),
                                  {{std::to_string(id), "ID"}}));
  }
  EXPECT_EQ(InUse(), uint64_t{2} << 20);
  EXPECT_TRUE(release_with(id, victim.session.session_secret()).ok());
  EXPECT_EQ(InUse(), 0u);
}

// Even with the victim's id AND its secret (leaked), another uid's process
// gets nothing: not a request over gRPC, not the lease.
TEST_F(SessionSecurityTest, AnotherUidsCallsOnASessionAreRefusedEvenWithItsSecret) {
  if (!Root()) GTEST_SKIP() << "needs root to run the attacker as uid 1002";
  Victim victim = RegisterVictim();
  const Ran ran = RunAs(
      kAttacker, {0},
      {SESSION_ATTACKER_BINARY, socket_, "take",
       std::to_string(victim.session.session_id()),
       absl::BytesToHexString(victim.session.session_secret())});
  ASSERT_EQ(ran.exit_code, 0) << absl::StrJoin(ran.lines, "\n");
  int refused = 0;
  for (const std::string& line : ran.lines) {
    if (absl::StartsWith(line, "register ")) continue;
    EXPECT_THAT(line, HasSubstr(absl::StrCat(" ", grpc::StatusCode::NOT_FOUND,
                                             " no session ")));
    ++refused;
  }
  EXPECT_EQ(refused, 7);  // acquire, release, ack, oom, telemetry, watch, lease
  // The victim's chunk is still its own, and nothing was billed to it.
  EXPECT_EQ(InUse(), uint64_t{2} << 20);
}

// Chunk ids are an epoch and a counter: an attacker releasing guessed ids
// from its own session learns nothing from the answer (a live chunk of
// another's is refused in the words an unknown id is) and frees nothing.
TEST_F(SessionSecurityTest, GuessedChunkIdsAreRefusedAsUnknownOnesAre) {
  if (!Root()) GTEST_SKIP() << "needs root to run the attacker as uid 1002";
  Victim victim = RegisterVictim();
  const uint64_t unknown = victim.chunk + 1000;
  const Ran ran =
      RunAs(kAttacker, {0},
            {SESSION_ATTACKER_BINARY, socket_, "release",
             std::to_string(victim.chunk), std::to_string(unknown)});
  ASSERT_EQ(ran.exit_code, 0) << absl::StrJoin(ran.lines, "\n");
  ASSERT_EQ(ran.lines.size(), 2u) << absl::StrJoin(ran.lines, "\n");
  EXPECT_THAT(ran.lines[0],
              HasSubstr(absl::StrCat(grpc::StatusCode::PERMISSION_DENIED)));
  EXPECT_EQ(absl::StrReplaceAll(ran.lines[0],
                                {{std::to_string(victim.chunk), "ID"}}),
            absl::StrReplaceAll(ran.lines[1], {{std::to_string(unknown), "ID"}}));
  EXPECT_EQ(InUse(), uint64_t{2} << 20);
}

// A job running as root in its container is no admin: the clients' socket
// refuses every Admin call, naming the admin socket.
TEST_F(SessionSecurityTest, AdminOnTheClientSocketIsRefusedAlsoForRoot) {
  auto admin = v1::Admin::NewStub(Dial(socket_));
  grpc::ClientContext c;
  v1::StatusResponse status;
  grpc::Status s = admin->Status(&c, v1::StatusRequest(), &status);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr(socket_ + ".admin"));
  grpc::ClientContext set_context;
  v1::SetConfigRequest set;
  set.set_config("expandable_segments:True");
  v1::SetConfigResponse set_response;
  EXPECT_EQ(admin->SetConfig(&set_context, set, &set_response).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

TEST_F(SessionSecurityTest, AdminOnTheAdminSocketWorks) {
  struct stat st {};
  ASSERT_EQ(stat((socket_ + ".admin").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto admin = v1::Admin::NewStub(DialAdmin(socket_));
  grpc::ClientContext c;
  v1::StatusResponse status;
  ASSERT_TRUE(admin->Status(&c, v1::StatusRequest(), &status).ok());
  EXPECT_EQ(status.capacity_bytes(), uint64_t{64} << 20);
  // allocctl finds it from the daemon's --socket.
  Child allocctl({ALLOCCTL_BINARY, "--socket", socket_, "status"});
  EXPECT_EQ(allocctl.Wait(), 0);
}

// Another uid cannot even connect to the admin socket, and allocctl says
// what would let it.
TEST_F(SessionSecurityTest, AllocctlAsAnotherUidIsToldWhoMayAdminister) {
  if (!Root()) GTEST_SKIP() << "needs root to run allocctl as uid 1002";
  const Ran ran =
      RunAs(kAttacker, {0}, {ALLOCCTL_BINARY, "--socket", socket_, "status"});
  EXPECT_EQ(ran.exit_code, 4);
  ASSERT_FALSE(ran.lines.empty());
  EXPECT_THAT(ran.lines[0], HasSubstr("admin socket"));
  EXPECT_THAT(ran.lines[0], HasSubstr("--admin-group"));
}

// A client whose pid the daemon cannot see: the daemon runs in a PID
// namespace of its own (as in a pod without hostPID) and this test's
// process, outside it, is pid 0 to it (SO_PEERCRED). Such clients all look
// alike, so unless the tenancy is node their registration is refused,
// saying why and what to set (server/tenant.cc).
class PidNamespaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) {
      GTEST_SKIP() << "needs root to run the daemon in a PID namespace of "
                      "its own (unshare --pid)";
    }
    for (const char* path : {"/usr/bin/unshare", "/bin/unshare"}) {
      if (access(path, X_OK) == 0) {
        unshare_ = path;
        break;
      }
    }
    if (unshare_.empty()) GTEST_SKIP() << "no unshare(1) to make a PID namespace";
    // Where the namespace cannot be made (a container without
    // CAP_SYS_ADMIN, or one whose seccomp profile forbids unshare), the
    // daemon could not run in one either.
    Child probe(UnshareArgs({"/bin/true"}), /*with_stderr=*/true);
    const std::string said = probe.Rest();
    if (probe.Wait() != 0) {
      GTEST_SKIP() << "cannot create a PID namespace here: " << said;
    }
    socket_ = dir_.path() + "/allocd.sock";
  }

  void TearDown() override { daemon_.reset(); }

  // `command` run by unshare(1) as pid 1 of a new PID namespace (with its
  // own /proc), killed when unshare is.
  std::vector<std::string> UnshareArgs(std::vector<std::string> command) const {
    std::vector<std::string> args = {unshare_, "--pid", "--fork",
                                     "--kill-child", "--mount-proc"};
    args.insert(args.end(), command.begin(), command.end());
    return args;
  }

  // `allocd serve` in a PID namespace of its own, under `tenancy`; a stub
  // on its clients' socket, from outside that namespace.
  std::unique_ptr<v1::Allocd::Stub> StartDaemon(const std::string& tenancy) {
    daemon_ = std::make_unique<Child>(
        UnshareArgs({ALLOCD_BINARY, "serve", "--backend", "sim", "--socket",
                     socket_, "--metrics-addr", "", "--capacity", "64MiB",
                     "--tenancy", tenancy}),
        /*with_stderr=*/true);
    // The clients' socket opens last: when it accepts, the daemon serves.
    for (int i = 0; i < 500 && !ConnectUnix(socket_).ok(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_TRUE(daemon_->running()) << daemon_->Rest(absl::Seconds(5));
    return v1::Allocd::NewStub(Dial(socket_));
  }

  static grpc::Status Register(v1::Allocd::Stub& stub,
                               v1::RegisterResponse* registered) {
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::RegisterRequest hello;
    hello.set_protocol_version(1);
    hello.set_job("outside");
    return stub.Register(&c, hello, registered);
  }

  std::string unshare_;
  // Before the daemon: removed after it is stopped.
  ScopedTempDir dir_{"allocd_pidns_"};
  std::string socket_;
  std::unique_ptr<Child> daemon_;
};

TEST_F(PidNamespaceTest, APeerThePidOfWhichTheDaemonCannotSeeIsRefusedSayingWhatToSet) {
  std::unique_ptr<v1::Allocd::Stub> stub = StartDaemon("uid");
  v1::RegisterResponse registered;
  const grpc::Status s = Register(*stub, &registered);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("pid 0"));
  EXPECT_THAT(s.error_message(), HasSubstr("PID namespace"));
  EXPECT_THAT(s.error_message(), HasSubstr("hostPID"));
  EXPECT_THAT(s.error_message(), HasSubstr("--tenancy node"));
}

TEST_F(PidNamespaceTest, UnderTenancyNodeAPeerThePidOfWhichTheDaemonCannotSeeRegisters) {
  std::unique_ptr<v1::Allocd::Stub> stub = StartDaemon("node");
  v1::RegisterResponse registered;
  const grpc::Status s = Register(*stub, &registered);
  ASSERT_TRUE(s.ok()) << s.error_code() << " " << s.error_message();
  EXPECT_NE(registered.session_id(), 0u);
  EXPECT_FALSE(registered.session_secret().empty());
}

// Issue 41: an attacker makes memfds as the daemon makes chunks and
// declares them on its lease, with no restart. Under a 512 MiB tenant quota
// and 2 GiB of capacity it got "8 adopted (8.00 GiB)", starved a victim,
// and with 19,500 2 MiB memfds took the daemon to its FD limit. Now: 0
// bytes adopted, no FD kept, and the victim is served.
class ForgedAdoptionSecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) {
      GTEST_SKIP() << "needs root to run the attacker as uid " << kAttacker;
    }
    chmod(dir_.path().c_str(), 0755);
    socket_ = dir_.path() + "/allocd.sock";
    daemon_ = std::make_unique<Child>(std::vector<std::string>{
        ALLOCD_BINARY, "serve", "--backend", "sim", "--socket", socket_,
        "--metrics-addr", "", "--capacity", "2GiB",
        "--default-tenant-quota", "512MiB"});
    harness::WaitForDaemon(socket_);
    admin_ = v1::Admin::NewStub(DialAdmin(socket_));
  }
  void TearDown() override { daemon_.reset(); }

  // The daemon's open files.
  int DaemonFds() const {
    int n = 0;
    for (const auto& entry : std::filesystem::directory_iterator(
             absl::StrCat("/proc/", daemon_->pid(), "/fd"))) {
      (void)entry;
      ++n;
    }
    return n;
  }
  std::vector<std::string> Forge(int count, uint64_t bytes) {
    return RunAs(kAttacker, {0},
                 {SESSION_ATTACKER_BINARY, socket_, "forge",
                  absl::StrCat(count), absl::StrCat(bytes)})
        .lines;
  }

  ScopedTempDir dir_{"allocd_forged_"};
  std::string socket_;
  std::unique_ptr<Child> daemon_;
  std::unique_ptr<v1::Admin::Stub> admin_;
};

TEST_F(ForgedAdoptionSecurityTest, ForgedChunksAreNeverAdopted) {
  const int fds_before = DaemonFds();
  EXPECT_THAT(Forge(8, uint64_t{1} << 30),
              ::testing::ElementsAre("declared 0 8"));
  EXPECT_THAT(Forge(2000, uint64_t{2} << 20),
              ::testing::ElementsAre("declared 0 2000"));
  const v1::StatusResponse status = harness::PoolStatus(*admin_);
  EXPECT_EQ(status.adopted_bytes_total(), 0u);
  EXPECT_EQ(status.in_use_bytes() + status.free_bytes(), 0u);
  EXPECT_LE(DaemonFds(), fds_before + 2);  // a connection or two closing
  // The victim gets its memory.
  auto stub = v1::Allocd::NewStub(Dial(socket_));
  grpc::ClientContext c;
  v1::RegisterRequest hello;
  hello.set_protocol_version(1);
  v1::RegisterResponse victim;
  ASSERT_TRUE(stub->Register(&c, hello, &victim).ok());
  grpc::ClientContext ac;
  v1::AcquireChunksRequest acquire;
  acquire.set_session_id(victim.session_id());
  acquire.set_session_secret(victim.session_secret());
  acquire.set_bytes(uint64_t{256} << 20);
  v1::AcquireChunksResponse granted;
  const grpc::Status s = stub->AcquireChunks(&ac, acquire, &granted);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

}  // namespace
}  // namespace allocd
