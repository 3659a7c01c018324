// Limits against a real `allocd serve` (sim): no peer can stall or bloat
// the daemon (issue 29). Measured before: ten side connections each sending
// one byte of a frame delayed a registration 9.8 s until it failed; 20,000
// registrations without a lease blocked the side socket for minutes; 8 job
// labels x 1.08 M autotune events took the daemon from 45 MB to 753 MB.
//
// The flood of registrations comes from another uid where the suite runs
// as root (CI does): the legitimate client is then another tenant, which
// the flood must not crowd out. Each test asserts the mechanism (what is
// refused, and why); the 1 s a legitimate client gets is a deadline on its
// calls, twenty times what it needs on a loaded CI machine and a tenth of
// what a stalled peer cost it before.
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "allocd.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "ipc/unix_socket.h"
#include "proto/protocol.h"
#include "server/request_limits.h"
#include "tests/scoped_temp_dir.h"
#include "tests/server/daemon_harness.h"
#include "tests/security/run_as.h"
#include "tests/security/under_asan.h"

namespace allocd {
namespace {


using ::testing::HasSubstr;
using harness::Child;
using harness::Dial;

constexpr uid_t kFlooder = 1002;
// What the legitimate client's calls get: see the file's comment.
constexpr absl::Duration kLegitimateDeadline = absl::Seconds(1);

// What `args` printed (stdout and stderr) run as `uid`, without groups.
std::string RunAs(uid_t uid, std::vector<std::string> args) {
  return ::allocd::RunAs(uid, {}, std::move(args)).output;
}

// VmRSS of process `pid`, in bytes.
uint64_t Rss(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  for (std::string line; std::getline(status, line);) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, "VmRSS:")) continue;
    rest = absl::StripAsciiWhitespace(rest);
    uint64_t kib = 0;
    EXPECT_TRUE(absl::SimpleAtoi(absl::StripSuffix(rest, " kB"), &kib)) << line;
    return kib << 10;
  }
  ADD_FAILURE() << "no VmRSS for pid " << pid;
  return 0;
}

// Sends `request` again and again on `fd` (made non-blocking) without
// reading an answer, until the daemon stops reading them (the socket takes
// no more within 50 ms) or kFloodRequests went; how many were sent.
constexpr int kFloodRequests = 100000;
int SendUntilUnread(int fd, const v1::SideRequest& request) {
  const std::string frame = request.SerializeAsString();
  fcntl(fd, F_SETFL, O_NONBLOCK);
  int sent = 0;
  for (; sent < kFloodRequests; ++sent) {
    if (!SendMessage(fd, frame).ok()) break;
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, 50) == 0) break;
  }
  return sent;
}

class LimitsTest : public ::testing::Test {
 protected:
  void TearDown() override { daemon_.reset(); }

  void StartDaemon(std::vector<std::string> flags = {}) {
    // Other uids reach the sockets through the directory.
    chmod(dir_.path().c_str(), 0755);
    socket_ = dir_.path() + "/allocd.sock";
    std::vector<std::string> args = {
        ALLOCD_BINARY, "serve",          "--backend",   "sim",
        "--socket",    socket_,          "--metrics-addr", "",
        "--capacity",  "64MiB"};
    args.insert(args.end(), flags.begin(), flags.end());
    daemon_ = std::make_unique<Child>(args);
    harness::WaitForDaemon(socket_);
    // Both sockets' modes let other uids in (the daemon's are 0660).
    chmod(socket_.c_str(), 0666);
    chmod((socket_ + ".fds").c_str(), 0666);
    stub_ = v1::Allocd::NewStub(Dial(socket_));
  }

  // Registers (job `job`) within the legitimate deadline.
  v1::RegisterResponse Register(const std::string& job = "legit") {
    grpc::ClientContext c;
    c.set_deadline(absl::ToChronoTime(absl::Now() + kLegitimateDeadline));
    v1::RegisterRequest hello;
    hello.set_protocol_version(1);
    hello.set_job(job);
    v1::RegisterResponse session;
    const grpc::Status s = stub_->Register(&c, hello, &session);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return session;
  }

  // Opens the lease of `session` and waits for its answer within the
  // legitimate deadline; the lease connection.
  UniqueFd Lease(const v1::RegisterResponse& session) {
    absl::StatusOr<UniqueFd> lease = ConnectUnix(socket_ + ".fds");
    EXPECT_TRUE(lease.ok()) << lease.status();
    if (!lease.ok()) return UniqueFd();
    v1::SideRequest request;
    request.set_lease_session_id(session.session_id());
    request.set_session_secret(session.session_secret());
    EXPECT_TRUE(SendMessage(lease->get(), request.SerializeAsString()).ok());
    absl::StatusOr<ReceivedMessage> answer = ReceiveMessage(
        lease->get(), kMaxSideMessageBytes, kLegitimateDeadline);
    EXPECT_TRUE(answer.ok()) << answer.status();
    if (answer.ok()) {
      v1::SideResponse response;
      EXPECT_TRUE(response.ParseFromString(answer->payload));
      EXPECT_EQ(response.error(), "");
    }
    return *std::move(lease);
  }

  // First: removed after the daemon below is stopped.
  ScopedTempDir dir_{"allocd_limits_"};
  std::string socket_;
  std::unique_ptr<Child> daemon_;
  std::unique_ptr<v1::Allocd::Stub> stub_;
};

TEST_F(LimitsTest, SlowConnectionsHoldingPartFramesDoNotDelayALease) {
  StartDaemon();
  // Ten peers each start a frame (one byte of its header) and stall.
  std::vector<UniqueFd> slow;
  for (int i = 0; i < 10; ++i) {
    absl::StatusOr<UniqueFd> fd = ConnectUnix(socket_ + ".fds");
    ASSERT_TRUE(fd.ok()) << fd.status();
    ASSERT_EQ(write(fd->get(), "\x10", 1), 1);
    slow.push_back(*std::move(fd));
  }
  // Each had a second to stall the side socket's loop before: ten of them
  // made this lease wait ten.
  const v1::RegisterResponse session = Register();
  UniqueFd lease = Lease(session);
  EXPECT_TRUE(lease.valid());
}

TEST_F(LimitsTest, APeerThatDoesNotReadItsAnswersDelaysNoOtherLease) {
  StartDaemon();
  // A peer sends request after request and never reads: its answers fill
  // its socket, and the daemon serves it no more until it reads.
  absl::StatusOr<UniqueFd> greedy = ConnectUnix(socket_ + ".fds");
  ASSERT_TRUE(greedy.ok());
  v1::SideRequest claim;
  claim.set_claim_token(std::string(32, 'a'));
  EXPECT_LT(SendUntilUnread(greedy->get(), claim), kFloodRequests)
      << "the daemon read every request of a peer that read none of its "
         "answers";
  const v1::RegisterResponse session = Register();
  UniqueFd lease = Lease(session);
  EXPECT_TRUE(lease.valid());
}

// What a peer's unread answers hold (a claim's FDs, in the daemon's open
// files) does not stay: a lease that reads none of its answers for a few
// seconds is closed, and its session ends, giving its chunks back.
TEST_F(LimitsTest, ALeaseThatReadsNoneOfItsAnswersIsClosedAndItsChunksGoBack) {
  StartDaemon();
  auto admin = v1::Admin::NewStub(harness::DialAdmin(socket_));
  const v1::RegisterResponse session = Register();
  UniqueFd lease = Lease(session);
  ASSERT_TRUE(lease.valid());
  // Acquires, one chunk each, sent without reading a grant: the daemon
  // queues their FDs until the socket is full, then reads no more.
  v1::SideRequest acquire;
  acquire.mutable_acquire()->set_bytes(2 << 20);
  ASSERT_LT(SendUntilUnread(lease.get(), acquire), kFloodRequests);
  EXPECT_GT(harness::PoolStatus(*admin).in_use_bytes(), 0u);
  // Within the answer deadline (5 s) and a tick, with room for a slow
  // machine; never before, the lease not reading.
  harness::WaitForInUse(*admin, 0, absl::Seconds(60));
  EXPECT_EQ(harness::PoolStatus(*admin).in_use_bytes(), 0u);
  grpc::ClientContext context;
  v1::ListSessionsResponse sessions;
  ASSERT_TRUE(admin->ListSessions(&context, {}, &sessions).ok());
  EXPECT_EQ(sessions.sessions_size(), 0);
  // The connection is closed: reading ends at the end of the stream, or at
  // ECONNRESET (the daemon closed it with requests of ours unread).
  char buffer[65536];
  ssize_t got = 0;
  pollfd p{lease.get(), POLLIN, 0};
  while (poll(&p, 1, 5000) == 1 &&
         (got = read(lease.get(), buffer, sizeof buffer)) > 0) {
  }
  EXPECT_TRUE(got == 0 || (got < 0 && errno == ECONNRESET))
      << "the daemon kept the connection open: " << strerror(errno);
}

TEST_F(LimitsTest, ARegistrationFloodIsRefusedPastItsBoundAndOthersRegister) {
  if (geteuid() != 0) {
    GTEST_SKIP() << "needs root: the flood runs as uid " << kFlooder
                 << ", another tenant than this test's client";
  }
  StartDaemon({"--max-unleased-sessions-per-tenant", "32"});
  const std::string flood = RunAs(
      kFlooder, {FLOOD_CLIENT_BINARY, socket_, "register", "2000"});
  // 32 wait for their lease; the rest are refused, saying why (but for
  // the few that find room as the first ones expire unleased, on a machine
  // slow enough for the flood to outlast the lease grace).
  int registered = 0;
  int refused = 0;
  ASSERT_EQ(std::sscanf(flood.c_str(), "registered %d refused %d",
                        &registered, &refused), 2) << flood;
  EXPECT_EQ(registered + refused, 2000);
  EXPECT_GE(registered, 32);
  EXPECT_GT(refused, 1000);
  EXPECT_THAT(flood, HasSubstr("refusal 8 "));  // RESOURCE_EXHAUSTED
  EXPECT_THAT(flood, HasSubstr("--max-unleased-sessions-per-tenant=32"));
  // Another tenant registers and leases at once.
  const v1::RegisterResponse session = Register();
  UniqueFd lease = Lease(session);
  EXPECT_TRUE(lease.valid());
}

TEST_F(LimitsTest, ConnectionsPastTheTenantsBoundAreRefusedSayingWhy) {
  StartDaemon({"--max-connections-per-tenant", "4"});
  std::vector<UniqueFd> held;
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<UniqueFd> fd = ConnectUnix(socket_ + ".fds");
    ASSERT_TRUE(fd.ok());
    held.push_back(*std::move(fd));
  }
  // The fifth is told why, then closed.
  absl::StatusOr<UniqueFd> fifth = ConnectUnix(socket_ + ".fds");
  ASSERT_TRUE(fifth.ok());
  absl::StatusOr<ReceivedMessage> answer =
      ReceiveMessage(fifth->get(), kMaxSideMessageBytes, absl::Seconds(30));
  ASSERT_TRUE(answer.ok()) << answer.status();
  v1::SideResponse response;
  ASSERT_TRUE(response.ParseFromString(answer->payload));
  EXPECT_EQ(response.code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(response.error(), HasSubstr("--max-connections-per-tenant=4"));
  // One given back makes room again.
  held.pop_back();
  for (int i = 0; i < 100; ++i) {
    absl::StatusOr<UniqueFd> again = ConnectUnix(socket_ + ".fds");
    ASSERT_TRUE(again.ok());
    v1::SideRequest request;
    request.set_lease_session_id(1);
    ASSERT_TRUE(SendMessage(again->get(), request.SerializeAsString()).ok());
    absl::StatusOr<ReceivedMessage> reply =
        ReceiveMessage(again->get(), kMaxSideMessageBytes, absl::Seconds(30));
    ASSERT_TRUE(reply.ok());
    v1::SideResponse r;
    ASSERT_TRUE(r.ParseFromString(reply->payload));
    // Admitted: the lease itself is refused (no such session), not the
    // connection. The daemon may not have seen the close yet: try again.
    if (!absl::StrContains(r.error(), "--max-connections")) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ADD_FAILURE() << "a connection given back never made room";
}

// Whether the daemon closes `fd` within `wait` (what it sends first, gRPC's
// HTTP/2 settings, is read and dropped).
bool ClosedByDaemon(int fd, absl::Duration wait) {
  const absl::Time until = absl::Now() + wait;
  for (absl::Time now = absl::Now(); now < until; now = absl::Now()) {
    pollfd p{fd, POLLIN | POLLRDHUP, 0};
    if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(until - now))) <= 0) {
      return false;
    }
    char buffer[4096];
    const ssize_t n = recv(fd, buffer, sizeof buffer, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN)) return true;
  }
  return false;
}

TEST_F(LimitsTest, ClientSocketConnectionsPastTheTenantsBoundAreClosedAndOthersConnect) {
  StartDaemon({"--max-connections-per-tenant", "4"});
  // The fixture's channel holds one; the tenant's fifth connection is the
  // first one closed.
  std::vector<UniqueFd> held;
  int admitted = 1;
  for (;; ++admitted) {
    ASSERT_LE(admitted, 4) << "a connection past the tenant's bound was kept";
    absl::StatusOr<UniqueFd> fd = ConnectUnix(socket_);
    ASSERT_TRUE(fd.ok()) << fd.status();
    if (ClosedByDaemon(fd->get(), absl::Milliseconds(300))) break;
    held.push_back(*std::move(fd));
  }
  EXPECT_EQ(admitted, 4);
  // Whether a registration on a new channel gets through in time.
  auto registers_on_a_new_channel = [&] {
    auto stub = v1::Allocd::NewStub(Dial(socket_));
    grpc::ClientContext c;
    c.set_deadline(absl::ToChronoTime(absl::Now() + kLegitimateDeadline));
    v1::RegisterRequest hello;
    hello.set_protocol_version(1);
    v1::RegisterResponse session;
    return stub->Register(&c, hello, &session).ok();
  };
  // A new channel of the same tenant gets no call through.
  EXPECT_FALSE(registers_on_a_new_channel());
  // The one held already serves: the bound closes new connections only.
  Register();
  if (geteuid() == 0) {
    // Another tenant connects and registers.
    EXPECT_THAT(RunAs(kFlooder, {FLOOD_CLIENT_BINARY, socket_, "register", "1"}),
                HasSubstr("registered 1 refused 0"));
  }
  // Connections closed make room again, once the daemon sees them gone
  // (their hang-up).
  held.clear();
  for (int i = 0; i < 100; ++i) {
    if (registers_on_a_new_channel()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ADD_FAILURE() << "connections closed never made room";
}

// A uid that opens connections faster than its rate has those past it
// closed at once, on either socket, without a handshake; the side socket
// says why first.
TEST_F(LimitsTest, ConnectionsPastTheUidsRateAreClosedSayingWhy) {
  // A burst of 40, then 10 a second.
  StartDaemon({"--accept-rate-per-uid", "10"});
  std::vector<UniqueFd> side;
  for (int i = 0; i < 100; ++i) {
    absl::StatusOr<UniqueFd> fd = ConnectUnix(socket_ + ".fds");
    ASSERT_TRUE(fd.ok()) << fd.status();
    side.push_back(*std::move(fd));
  }
  // Each answers a lease: those kept with its refusal (no such session),
  // the others with what they were told before they were closed.
  int refused = 0;
  v1::SideRequest lease;
  lease.set_lease_session_id(1);
  for (const UniqueFd& fd : side) {
    (void)SendMessage(fd.get(), lease.SerializeAsString());
    absl::StatusOr<ReceivedMessage> answer =
        ReceiveMessage(fd.get(), kMaxSideMessageBytes, absl::Seconds(30));
    ASSERT_TRUE(answer.ok()) << answer.status();
    v1::SideResponse response;
    ASSERT_TRUE(response.ParseFromString(answer->payload));
    if (!absl::StrContains(response.error(), "--accept-rate-per-uid")) {
      continue;
    }
    EXPECT_EQ(response.code(),
              static_cast<int>(absl::StatusCode::kResourceExhausted));
    EXPECT_THAT(response.error(), HasSubstr("--accept-rate-per-uid=10"));
    ++refused;
  }
  // All but the burst and what a slow machine's seconds refill.
  EXPECT_GE(refused, 30);
  // The client socket's: closed without gRPC's settings.
  int closed = 0;
  std::vector<UniqueFd> clients;
  for (int i = 0; i < 100; ++i) {
    absl::StatusOr<UniqueFd> fd = ConnectUnix(socket_);
    ASSERT_TRUE(fd.ok()) << fd.status();
    clients.push_back(*std::move(fd));
  }
  for (const UniqueFd& fd : clients) {
    closed += ClosedByDaemon(fd.get(), absl::Milliseconds(100)) ? 1 : 0;
  }
  EXPECT_GE(closed, 30);
}

// One uid connecting and closing in a loop from several threads, holding
// every connection its tenant may hold, made another tenant's Register fail
// 3 times in 5 (UNAVAILABLE) and take up to 3.5 s (issue 41): one thread
// accepted, and walked every held connection before each accept (here,
// 1024 held: 4.9 s). Every registration of the other tenant, each on a new
// connection, now succeeds within a deadline three times the target (a
// loaded CI machine); the latencies are printed (the target: each within
// 1 s).
TEST_F(LimitsTest, ConnectionChurnOfOneUidFailsNoOtherTenantsRegistration) {
  if (geteuid() != 0) {
    GTEST_SKIP() << "needs root: the churn runs as uid " << kFlooder
                 << ", another tenant than this test's client";
  }
  constexpr int kHeld = 1024;
  constexpr int kChurnSeconds = 8;
  constexpr absl::Duration kGenerousDeadline = absl::Seconds(3);
  StartDaemon({"--max-connections-per-tenant", absl::StrCat(kHeld)});
  std::string churn;
  std::thread churner([&] {
    churn = RunAs(kFlooder, {FLOOD_CLIENT_BINARY, socket_, "churn",
                             absl::StrCat(kHeld), "4",
                             absl::StrCat(kChurnSeconds)});
  });
  // Once it holds its connections and churns (it holds them within a
  // second), a registration every 100 ms while it lasts.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const absl::Time end =
      absl::Now() + absl::Seconds(kChurnSeconds) - absl::Seconds(2);
  std::vector<absl::Duration> took;
  while (absl::Now() < end) {
    const absl::Time start = absl::Now();
    auto stub = v1::Allocd::NewStub(Dial(socket_));
    grpc::ClientContext c;
    c.set_deadline(absl::ToChronoTime(start + kGenerousDeadline));
    v1::RegisterRequest hello;
    hello.set_protocol_version(1);
    hello.set_job("legit");
    v1::RegisterResponse session;
    const grpc::Status s = stub->Register(&c, hello, &session);
    took.push_back(absl::Now() - start);
    EXPECT_TRUE(s.ok()) << "registration " << took.size() << " after "
                        << took.back() << ": " << s.error_message();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  churner.join();
  int held = 0;
  long connects = 0;
  double seconds = 0;
  ASSERT_EQ(std::sscanf(churn.c_str(), "held %d connects %ld seconds %lf",
                        &held, &connects, &seconds), 3) << churn;
  EXPECT_EQ(held, kHeld);
  EXPECT_GT(connects, 1000) << "the churn hardly ran";
  ASSERT_FALSE(took.empty());
  std::sort(took.begin(), took.end());
  std::printf("%zu registrations under a churn of %.0f connects/s (%d held): "
              "median %s, slowest %s\n",
              took.size(), connects / seconds, held,
              absl::FormatDuration(took[took.size() / 2]).c_str(),
              absl::FormatDuration(took.back()).c_str());
}

// What a registration asks of the autotuner is checked before anything
// keeps it: an unknown mode once aborted the daemon (an unchecked parse),
// and pinned keys were kept, and copied under the autotuner's lock, however
// many came.
TEST_F(LimitsTest, AutotunePreferencesPastTheirBoundsAreRefusedAndTheDaemonServesOn) {
  StartDaemon({"--autotune", "apply"});
  auto refused = [&](const std::function<void(v1::AutotunePreferences&)>& ask) {
    grpc::ClientContext c;
    c.set_deadline(absl::ToChronoTime(absl::Now() + kLegitimateDeadline));
    v1::RegisterRequest hello;
    hello.set_protocol_version(1);
    hello.set_job("asks");
    ask(*hello.mutable_autotune());
    v1::RegisterResponse session;
    const grpc::Status s = stub_->Register(&c, hello, &session);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    return s.error_message();
  };
  EXPECT_THAT(refused([](v1::AutotunePreferences& p) { p.set_mode("aply"); }),
              HasSubstr("off, recommend or apply"));
  EXPECT_THAT(refused([](v1::AutotunePreferences& p) {
                for (size_t i = 0; i <= kMaxPinnedKeys; ++i) p.add_pinned_keys("expandable_segments");
              }),
              HasSubstr("pins"));
  EXPECT_THAT(refused([](v1::AutotunePreferences& p) {
                p.add_pinned_keys(std::string(kMaxPinnedKey + 1, 'k'));
              }),
              HasSubstr("pinned key"));
  EXPECT_EQ(kill(daemon_->pid(), 0), 0);
  // A job that asks within them registers as before.
  grpc::ClientContext c;
  v1::RegisterRequest hello;
  hello.set_protocol_version(1);
  hello.set_job("asks");
  hello.mutable_autotune()->set_mode("recommend");
  hello.mutable_autotune()->add_pinned_keys("expandable_segments");
  v1::RegisterResponse session;
  const grpc::Status s = stub_->Register(&c, hello, &session);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

TEST_F(LimitsTest, AFloodOfLabelsAndEventsStaysInsideTheAutotunersMemory) {
  if (kUnderAsan) {
    GTEST_SKIP() << "the daemon's RSS under AddressSanitizer is the "
                    "sanitizer's, not the autotuner's bound";
  }
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  constexpr uint64_t kBound = 16 * kMiB;
  // One tenant may use the whole bound here: the flood's tenant is the
  // test's.
  StartDaemon({"--autotune-memory", "16MiB", "--autotune-memory-per-tenant",
               "16MiB"});
  const uint64_t before = Rss(daemon_->pid());
  // 8 labels, each 256 Ki allocations never freed (~25 MB of window each
  // without a bound: 200 MB in all).
  constexpr int kLabels = 8;
  constexpr uint64_t kEvents = 256 * 1024;
  uint64_t peak = before;
  std::vector<UniqueFd> leases;
  for (int label = 0; label < kLabels; ++label) {
    const v1::RegisterResponse session =
        Register(absl::StrCat("flood-", label));
    leases.push_back(Lease(session));
    grpc::ClientContext c;
    v1::TelemetryAck ack;
    std::unique_ptr<grpc::ClientWriter<v1::TelemetryReport>> stream =
        stub_->StreamTelemetry(&c, &ack);
    uint64_t next_id = 1;
    for (uint64_t sent = 0; sent < kEvents; sent += 16384) {
      v1::TelemetryReport report;
      report.set_session_id(session.session_id());
      report.set_session_secret(session.session_secret());
      v1::EventBatch* batch = report.mutable_events();
      batch->set_sequence(sent);
      for (int i = 0; i < 16384; ++i) {
        batch->add_ops(0);
        batch->add_sizes(512);
        batch->add_ids(next_id++);
        batch->add_streams(7);
      }
      ASSERT_TRUE(stream->Write(report));
    }
    stream->WritesDone();
    ASSERT_TRUE(stream->Finish().ok());
    peak = std::max(peak, Rss(daemon_->pid()));
  }
  // The windows hold at most kBound; a decision's replay may copy one
  // window meanwhile (at most the tenant's share, here kBound too); gRPC's
  // buffers and the sessions take a few MiB more.
  EXPECT_LE(peak - before, 2 * kBound + 24 * kMiB)
      << "the daemon grew from " << before / kMiB << " MiB to " << peak / kMiB
      << " MiB";
}

}  // namespace
}  // namespace allocd
