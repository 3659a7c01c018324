// The daemon end to end: a real `allocd serve` process on a real Unix
// socket, clients in this process (the real client library) and in other
// processes (test_client, allocd client-replay), no mocks.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "allocd.grpc.pb.h"
#include "client/daemon_backend.h"
#include "client/daemon_client.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel_posix.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "ipc/unix_socket.h"
#include "nlohmann/json.hpp"
#include "proto/protocol.h"
#include "tests/scoped_temp_dir.h"
#include "tests/server/daemon_harness.h"

extern char** environ;

namespace allocd {
namespace {

using ::testing::HasSubstr;
using harness::Child;
using harness::Dial;
using harness::DialAdmin;

constexpr uint64_t kChunk = uint64_t{2} << 20;

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    socket_ = dir_.path() + "/allocd.sock";
    StartDaemon();
  }

  // 64 MiB makes the pool's limits easy to reach; the live clients'
  // tests replay a real job and get room for it.
  void StartDaemon(const std::string& capacity = "64MiB",
                   std::vector<std::string> extra = {}) {
    SpawnDaemon(capacity, std::move(extra));
    harness::WaitForDaemon(socket_);
    admin_ = v1::Admin::NewStub(DialAdmin(socket_));
  }

  // `allocd serve --backend sim` on socket_, not waited for; the daemon
  // running before is stopped first (started while it still listened, the
  // new one would refuse its sockets, and WaitForDaemon would find the old).
  void SpawnDaemon(const std::string& capacity = "64MiB",
                   std::vector<std::string> extra = {}) {
    daemon_.reset();
    std::vector<std::string> args = {ALLOCD_BINARY, "serve", "--backend",
                                     "sim", "--socket",
                                     socket_, "--metrics-addr", "",
                                     "--capacity", capacity};
    args.insert(args.end(), extra.begin(), extra.end());
    daemon_ = std::make_unique<Child>(std::move(args));
  }

  v1::StatusResponse Status() { return harness::PoolStatus(*admin_); }
  absl::Duration WaitForInUse(uint64_t bytes, absl::Duration limit) {
    return harness::WaitForInUse(*admin_, bytes, limit);
  }

  // A client of job `job`, reading ahead for `read_ahead_keep` (zero:
  // not reading ahead), releasing in the background or not.
  std::unique_ptr<DaemonClient> Client(
      std::string job = "",
      absl::Duration read_ahead_keep = absl::ZeroDuration(),
      bool release_in_background = false) {
    absl::StatusOr<std::unique_ptr<DaemonClient>> c = DaemonClient::Connect(
        {.socket = socket_,
         .job = job,
         .reconnect_wait = absl::Seconds(2),
         .read_ahead_keep = read_ahead_keep,
         .release_in_background = release_in_background});
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  std::vector<v1::HistoryEntry> History() {
    grpc::ClientContext context;
    v1::HistoryRequest request;
    request.set_limit(100);
    v1::HistoryResponse r;
    EXPECT_TRUE(admin_->History(&context, request, &r).ok());
    return {r.entries().begin(), r.entries().end()};
  }

  int CountEvents(const std::string& event) {
    int n = 0;
    for (const v1::HistoryEntry& e : History()) n += e.event() == event;
    return n;
  }

  absl::StatusOr<v1::SetConfigResponse> SetConfig(const std::string& job,
                                                  const std::string& config) {
    grpc::ClientContext context;
    v1::SetConfigRequest request;
    request.set_job(job);
    request.set_config(config);
    v1::SetConfigResponse r;
    grpc::Status s = admin_->SetConfig(&context, request, &r);
    if (!s.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                          s.error_message());
    }
    return r;
  }

  // Pushes `config` to `job`, whose session is `client`, which applies it:
  // its version in `*version`.
  void ApplyPush(DaemonClient& client, const std::string& job,
                 const std::string& config, uint64_t* version) {
    absl::StatusOr<v1::SetConfigResponse> set = SetConfig(job, config);
    ASSERT_TRUE(set.ok()) << set.status();
    ASSERT_EQ(AwaitControl(client).size(), 1u);
    ASSERT_TRUE(client.Ack(set->config().version(), true, "").ok());
    *version = set->config().version();
  }

  // The session `client`, running config `version`, reports an OOM and is
  // pushed a rollback: in `*rollback`.
  void OomRollsBack(DaemonClient& client, uint64_t version,
                    v1::ControlMessage* rollback) {
    ASSERT_TRUE(client.ReportOom(kChunk, "CUDA out of memory", version).ok());
    std::vector<v1::ControlMessage> got = AwaitControl(client);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_TRUE(got[0].config().rollback());
    *rollback = got[0];
  }

  // Publishes `stats` (PyTorch's names) for `client` and waits until the
  // daemon lists them: FlushTelemetry says they were sent, and the daemon
  // reads the telemetry stream on a thread of its own, so a request on
  // another connection could reach it before them.
  void PublishAndAwaitRead(DaemonClient& client,
                           const std::map<std::string, int64_t>& stats) {
    client.PublishStats(stats, 0);
    ASSERT_TRUE(client.FlushTelemetry().ok());
    bool read = false;
    for (int i = 0; i < 500 && !read; ++i) {
      grpc::ClientContext context;
      v1::ListSessionsResponse sessions;
      ASSERT_TRUE(admin_->ListSessions(&context, {}, &sessions).ok());
      for (const v1::SessionInfo& session : sessions.sessions()) {
        if (session.session_id() != client.session_id()) continue;
        read = std::all_of(stats.begin(), stats.end(), [&](const auto& stat) {
          auto listed = session.stats().find(stat.first);
          return listed != session.stats().end() && listed->second == stat.second;
        });
      }
      if (!read) absl::SleepFor(absl::Milliseconds(10));
    }
    ASSERT_TRUE(read) << "the daemon never listed the stats published";
  }

  // What the daemon sent `client` within `limit` (DaemonClient::AwaitControl).
  static std::vector<v1::ControlMessage> AwaitControl(
      DaemonClient& client, absl::Duration limit = absl::Seconds(5)) {
    if (!client.AwaitControl(limit)) return {};
    return client.TakeControl();
  }

  // First: removed after the daemon below is stopped.
  ScopedTempDir dir_{"allocd_daemon_"};
  std::string socket_;
  std::unique_ptr<Child> daemon_;
  std::unique_ptr<v1::Admin::Stub> admin_;
};

// Clients, probes and scripts wait for the tenant socket to answer; when it
// does, so do the side channel and the admin socket. Each start is watched
// without pause, so that the other sockets are asked within microseconds:
// an order that opened the admin socket last failed here (and in CI, on a
// GPU test's first Admin.Status).
TEST_F(DaemonTest, WhenItsSocketAnswersEveryOtherSocketAlreadyDoes) {
  for (int start = 0; start < 20; ++start) {
    daemon_->Kill();
    SpawnDaemon();
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (!ConnectUnix(socket_).ok()) ASSERT_LT(absl::Now(), deadline);
    EXPECT_TRUE(ConnectUnix(socket_ + ".admin").ok()) << "start " << start;
    EXPECT_TRUE(ConnectUnix(socket_ + ".fds").ok()) << "start " << start;
  }
}

TEST_F(DaemonTest, SessionsAreTheKernelsPidsAndChunksFlowBetweenProcesses) {
  std::unique_ptr<DaemonClient> mine = Client("mine");
  absl::StatusOr<ReceivedChunks> chunks = mine->Acquire(4 * kChunk);
  ASSERT_TRUE(chunks.ok()) << chunks.status();
  ASSERT_EQ(chunks->ids.size(), 4u);
  char* p = static_cast<char*>(mmap(nullptr, kChunk, PROT_READ | PROT_WRITE,
                                    MAP_SHARED, chunks->fds[0].get(),
                                    static_cast<off_t>(chunks->offsets[0])));
  ASSERT_NE(p, MAP_FAILED);
  p[0] = 'A';
  munmap(p, kChunk);

  Child holder({TEST_CLIENT_BINARY, "hold", socket_, std::to_string(kChunk)});
  ASSERT_THAT(holder.Line(), HasSubstr("ready"));
  grpc::ClientContext context;
  v1::ListSessionsResponse sessions;
  ASSERT_TRUE(admin_->ListSessions(&context, {}, &sessions).ok());
  ASSERT_EQ(sessions.sessions_size(), 2);
  EXPECT_EQ(sessions.sessions(0).pid(), getpid());
  EXPECT_EQ(sessions.sessions(0).job(), "mine");
  EXPECT_EQ(sessions.sessions(0).held_bytes(), 4 * kChunk);
  EXPECT_EQ(sessions.sessions(1).pid(), holder.pid());
  EXPECT_EQ(sessions.sessions(1).held_bytes(), kChunk);

  // What this process releases, another process gets: the same memory.
  ASSERT_TRUE(mine->Release(chunks->epoch, chunks->ids).ok());
  Child reader({TEST_CLIENT_BINARY, "read", socket_, std::to_string(4 * kChunk)});
  const std::string line = reader.Line();
  EXPECT_THAT(line, HasSubstr("reused 4"));
  EXPECT_EQ(reader.Wait(), 0);
  EXPECT_EQ(Status().chunks_created_total(), 5u);  // 4 + the holder's 1
}

TEST_F(DaemonTest, ClientKilledWithSigkillGivesItsChunksBackWithinASecond) {
  Child holder({TEST_CLIENT_BINARY, "hold", socket_, std::to_string(8 * kChunk)});
  ASSERT_THAT(holder.Line(), HasSubstr("ready"));
  EXPECT_EQ(Status().in_use_bytes(), 8 * kChunk);
  holder.Kill();
  const absl::Duration took = WaitForInUse(0, absl::Seconds(5));
  EXPECT_LT(took, absl::Seconds(1));
  EXPECT_EQ(Status().in_use_bytes(), 0u);
  EXPECT_EQ(Status().free_bytes(), 8 * kChunk);  // kept for the next one
  EXPECT_EQ(Status().sessions(), 0u);
}

TEST_F(DaemonTest, AnIdleNodeGivesItsCachedMemoryBackAfterTheTrimDelay) {
  daemon_.reset();
  StartDaemon("64MiB", {"--trim-after", "1s"});
  Child holder({TEST_CLIENT_BINARY, "hold", socket_, std::to_string(8 * kChunk)});
  ASSERT_THAT(holder.Line(), HasSubstr("ready"));
  holder.Kill();
  ASSERT_LT(WaitForInUse(0, absl::Seconds(5)), absl::Seconds(5));
  EXPECT_EQ(Status().free_bytes(), 8 * kChunk);  // cached at first
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (Status().free_bytes() > 0 && absl::Now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(Status().free_bytes(), 0u);
  EXPECT_EQ(Status().trimmed_bytes_total(), 8 * kChunk);
}

TEST_F(DaemonTest, PoolTrimGivesTheCacheBackNowAndKeepsWhatIsHeld) {
  std::unique_ptr<DaemonClient> mine = Client();
  absl::StatusOr<ReceivedChunks> chunks = mine->Acquire(6 * kChunk);
  ASSERT_TRUE(chunks.ok()) << chunks.status();
  const std::vector<uint64_t> four(chunks->ids.begin(),
                                   chunks->ids.begin() + 4);
  ASSERT_TRUE(mine->Release(chunks->epoch, four).ok());
  Child trim({ALLOCCTL_BINARY, "--socket", socket_, "pool", "trim"});
  EXPECT_THAT(trim.Rest(), HasSubstr("gave 8.00 MiB of cached chunks back"));
  EXPECT_EQ(trim.Wait(), 0);
  EXPECT_EQ(Status().free_bytes(), 0u);
  EXPECT_EQ(Status().in_use_bytes(), 2 * kChunk);
  EXPECT_EQ(Status().trimmed_bytes_total(), 4 * kChunk);
}

TEST_F(DaemonTest, AnotherProcessCannotClaimATokenOrReleaseAChunk) {
  std::unique_ptr<DaemonClient> owner = Client();
  // A raw acquire so the token is not claimed yet.
  auto stub = v1::Allocd::NewStub(Dial(socket_));
  grpc::ClientContext register_context;
  v1::RegisterRequest register_request;
  register_request.set_protocol_version(1);
  v1::RegisterResponse session;
  ASSERT_TRUE(stub->Register(&register_context, register_request, &session).ok());
  grpc::ClientContext acquire_context;
  v1::AcquireChunksRequest acquire;
  acquire.set_session_id(session.session_id());
  acquire.set_session_secret(session.session_secret());
  acquire.set_bytes(kChunk);
  v1::AcquireChunksResponse grant;
  ASSERT_TRUE(stub->AcquireChunks(&acquire_context, acquire, &grant).ok());

  Child thief({TEST_CLIENT_BINARY, "claim", session.fd_socket(), grant.claim_token()});
  EXPECT_EQ(thief.Line(), absl::StrCat("code ", grpc::StatusCode::PERMISSION_DENIED, " fds 0"));
  Child releaser({TEST_CLIENT_BINARY, "release", socket_,
                  std::to_string(session.session_id()),
                  std::to_string(grant.chunk_ids(0))});
  // With the victim's session: not its session (answered as for none);
  // with its own: not its chunk.
  EXPECT_EQ(releaser.Line(), absl::StrCat("code ", grpc::StatusCode::NOT_FOUND));
  EXPECT_EQ(releaser.Line(), absl::StrCat("code ", grpc::StatusCode::PERMISSION_DENIED));
  EXPECT_EQ(releaser.Wait(), 0);

  // The owner still can claim: the thief did not use the token up.
  UniqueFd side = std::move(*ConnectUnix(session.fd_socket()));
  v1::SideRequest claim;
  claim.set_claim_token(grant.claim_token());
  ASSERT_TRUE(SendMessage(side.get(), claim.SerializeAsString()).ok());
  absl::StatusOr<ReceivedMessage> frame = ReceiveMessage(side.get(), 1 << 20, absl::Seconds(5));
  ASSERT_TRUE(frame.ok());
  EXPECT_EQ(frame->fds.size(), 1u);
}

// What a cudaMalloc waits for in transparent mode: one frame on the lease
// with the chunks and their FDs, and one to give them back.
TEST_F(DaemonTest, ALeaseAcquiresWithItsFdsInOneAnswerAndReleases) {
  auto stub = v1::Allocd::NewStub(Dial(socket_));
  grpc::ClientContext register_context;
  v1::RegisterRequest register_request;
  register_request.set_protocol_version(1);
  v1::RegisterResponse session;
  ASSERT_TRUE(
      stub->Register(&register_context, register_request, &session).ok());
  ASSERT_TRUE(session.lease_acquires());
  UniqueFd side = std::move(*ConnectUnix(session.fd_socket()));
  auto call = [&](const v1::SideRequest& request) {
    EXPECT_TRUE(SendMessage(side.get(), request.SerializeAsString()).ok());
    absl::StatusOr<ReceivedMessage> frame =
        ReceiveMessage(side.get(), 1 << 20, absl::Seconds(5));
    EXPECT_TRUE(frame.ok()) << frame.status();
    v1::SideResponse response;
    if (frame.ok()) {
      EXPECT_TRUE(response.ParseFromString(frame->payload));
    }
    return std::pair{response, frame.ok() ? frame->fds.size() : 0};
  };
  v1::SideRequest acquire;
  acquire.mutable_acquire()->set_bytes(3 * kChunk);
  // Not before the connection is the session's lease.
  auto [refused, no_fds] = call(acquire);
  EXPECT_EQ(refused.code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(no_fds, 0u);
  v1::SideRequest lease;
  lease.set_lease_session_id(session.session_id());
  lease.set_session_secret(session.session_secret());
  ASSERT_TRUE(call(lease).first.error().empty());

  auto [granted, fds] = call(acquire);
  ASSERT_TRUE(granted.error().empty()) << granted.error();
  EXPECT_FALSE(granted.more());
  EXPECT_FALSE(granted.would_wait());
  EXPECT_EQ(granted.chunk_ids_size(), 3);
  EXPECT_EQ(fds, 3u);
  EXPECT_EQ(granted.reused_chunks(), 0u);
  EXPECT_EQ(Status().in_use_bytes(), 3 * kChunk);

  v1::SideRequest release;
  *release.mutable_release()->mutable_chunk_ids() = granted.chunk_ids();
  auto [released, none] = call(release);
  EXPECT_TRUE(released.error().empty()) << released.error();
  EXPECT_EQ(released.released_bytes(), 3 * kChunk);
  EXPECT_EQ(Status().in_use_bytes(), 0u);
  // Released twice: not the session's any more.
  EXPECT_EQ(call(release).first.code(), grpc::StatusCode::PERMISSION_DENIED);
  // As many ids as a release takes, each a long varint: refused (none is
  // the session's), and the lease, whose loss would end the session, stays.
  v1::SideRequest largest;
  for (uint64_t i = 0; i < 65536; ++i) {
    largest.mutable_release()->add_chunk_ids((uint64_t{1} << 62) + i);
  }
  ASSERT_GT(largest.ByteSizeLong(), size_t{512} << 10);
  EXPECT_EQ(call(largest).first.code(), grpc::StatusCode::PERMISSION_DENIED);

  // The cache serves the next one; more than the node has is refused.
  auto [again, fds_again] = call(acquire);
  EXPECT_EQ(again.reused_chunks(), 3u);
  EXPECT_EQ(fds_again, 3u);
  acquire.mutable_acquire()->set_bytes(64 * kChunk);
  auto [too_much, _] = call(acquire);
  EXPECT_EQ(too_much.code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_FALSE(too_much.would_wait());
}

TEST_F(DaemonTest, QuotaExceededIsAClearErrorAndLeaksNothing) {
  std::unique_ptr<DaemonClient> client = Client();
  grpc::ClientContext context;
  v1::SetQuotaRequest quota;
  quota.set_session_id(client->session_id());
  quota.set_bytes(3 * kChunk);
  v1::SetQuotaResponse ignored;
  ASSERT_TRUE(admin_->SetQuota(&context, quota, &ignored).ok());
  ASSERT_TRUE(client->Acquire(2 * kChunk).ok());
  absl::StatusOr<ReceivedChunks> over = client->Acquire(2 * kChunk);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(), HasSubstr("session quota exceeded"));
  EXPECT_EQ(Status().in_use_bytes(), 2 * kChunk);
  // The node's capacity is a limit too.
  absl::StatusOr<ReceivedChunks> huge = Client()->Acquire(31 * kChunk);
  EXPECT_THAT(huge.status().message(), HasSubstr("node pool exhausted"));
  EXPECT_EQ(Status().in_use_bytes(), 2 * kChunk);
}

TEST_F(DaemonTest, ADefaultTenantQuotaCountsATenantsSessionsTogether) {
  StartDaemon("64MiB", {"--default-tenant-quota", "25%"});  // 16 MiB
  const std::string tenant = absl::StrCat("uid:", getuid());
  std::unique_ptr<DaemonClient> first = Client();
  std::unique_ptr<DaemonClient> second = Client();  // the same tenant
  ASSERT_TRUE(first->Acquire(6 * kChunk).ok());
  absl::StatusOr<ReceivedChunks> over = second->Acquire(4 * kChunk);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(),
              HasSubstr(absl::StrCat("tenant ", tenant, " quota exceeded: its "
                                     "sessions hold 12.00 MiB, asks 8.00 MiB, "
                                     "quota 16.00 MiB")));
  EXPECT_EQ(Status().in_use_bytes(), 6 * kChunk);

  // The tenant's own quota overrides the default.
  grpc::ClientContext context;
  v1::SetQuotaRequest quota;
  quota.set_tenant(tenant);
  quota.set_bytes(20 * kChunk);
  v1::SetQuotaResponse ignored;
  ASSERT_TRUE(admin_->SetQuota(&context, quota, &ignored).ok());
  EXPECT_TRUE(second->Acquire(4 * kChunk).ok());
  // `allocctl sessions` names the tenant a quota is set for.
  Child sessions({ALLOCCTL_BINARY, "--socket", socket_, "sessions"});
  EXPECT_THAT(sessions.Rest(), ::testing::AllOf(HasSubstr("TENANT"), HasSubstr(tenant)));
  EXPECT_EQ(sessions.Wait(), 0);
}

TEST_F(DaemonTest, MalformedOrOversizedFieldsAreInvalidArgumentAndServingGoesOn) {
  auto stub = v1::Allocd::NewStub(Dial(socket_));
  auto code_of = [](const grpc::Status& s) { return s.error_code(); };
  {
    grpc::ClientContext c;
    v1::RegisterRequest r;
    r.set_protocol_version(1);
    r.set_job("bad job label!");
    v1::RegisterResponse out;
    EXPECT_EQ(code_of(stub->Register(&c, r, &out)), grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    grpc::ClientContext c;
    v1::RegisterRequest r;
    r.set_protocol_version(1);
    r.set_client(std::string(1000, 'x'));
    v1::RegisterResponse out;
    EXPECT_EQ(code_of(stub->Register(&c, r, &out)), grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    grpc::ClientContext c;
    v1::RegisterRequest r;
    r.set_protocol_version(1);
    r.set_initial_config("max_split_size_mb:1");
    v1::RegisterResponse out;
    EXPECT_EQ(code_of(stub->Register(&c, r, &out)), grpc::StatusCode::INVALID_ARGUMENT);
  }
  grpc::ClientContext rc;
  v1::RegisterRequest rr;
  rr.set_protocol_version(1);
  v1::RegisterResponse session;
  ASSERT_TRUE(stub->Register(&rc, rr, &session).ok());
  for (uint64_t bytes : {uint64_t{0}, uint64_t{1} << 50}) {
    grpc::ClientContext c;
    v1::AcquireChunksRequest r;
    r.set_session_id(session.session_id());
    r.set_session_secret(session.session_secret());
    r.set_bytes(bytes);
    v1::AcquireChunksResponse out;
    EXPECT_EQ(code_of(stub->AcquireChunks(&c, r, &out)), grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    grpc::ClientContext c;
    v1::ReleaseChunksRequest r;
    r.set_session_id(session.session_id());
    r.set_session_secret(session.session_secret());
    for (int i = 0; i < 70000; ++i) r.add_chunk_ids(i);
    v1::ReleaseChunksResponse out;
    EXPECT_EQ(code_of(stub->ReleaseChunks(&c, r, &out)), grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    grpc::ClientContext c;
    v1::OomReport r;
    r.set_session_id(session.session_id());
    r.set_session_secret(session.session_secret());
    r.set_message(std::string(5000, 'm'));
    v1::OomResponse out;
    EXPECT_EQ(code_of(stub->ReportOom(&c, r, &out)), grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    // Over the daemon's 1 MiB message limit: refused before parsing.
    grpc::ClientContext c;
    v1::RegisterRequest r;
    r.set_client(std::string(2 << 20, 'x'));
    v1::RegisterResponse out;
    EXPECT_EQ(code_of(stub->Register(&c, r, &out)), grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  {
    grpc::ClientContext c;
    v1::SetConfigRequest r;
    r.set_config("expandable_segments:true");
    v1::SetConfigResponse out;
    grpc::Status s = admin_->SetConfig(&c, r, &out);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("'True' or 'False'"));
  }
  // Garbage on the side socket closes that connection only.
  {
    UniqueFd side = std::move(*ConnectUnix(session.fd_socket()));
    ASSERT_TRUE(SendMessage(side.get(), "\xff\xff not a protobuf").ok());
    absl::StatusOr<ReceivedMessage> answer = ReceiveMessage(side.get(), 1 << 16, absl::Seconds(5));
    ASSERT_TRUE(answer.ok());
    v1::SideResponse response;
    ASSERT_TRUE(response.ParseFromString(answer->payload));
    EXPECT_EQ(response.code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  auto health = grpc::health::v1::Health::NewStub(Dial(socket_));
  grpc::ClientContext hc;
  grpc::health::v1::HealthCheckResponse hr;
  ASSERT_TRUE(health->Check(&hc, {}, &hr).ok());
  EXPECT_EQ(hr.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_TRUE(Client()->Acquire(kChunk).ok());
}

// A watcher blocks on the control stream for as long as nothing comes (no
// wake-ups that take a Python job's GIL) and is stopped by StopAwaitingControl:
// the wait under way ends and every later one returns at once, while what
// the daemon pushes is still there to take.
TEST_F(DaemonTest, StoppingTheControlWaitEndsItAndEveryLaterOne) {
  std::unique_ptr<DaemonClient> client = Client("train");
  // Each wait is on a thread of its own: a test whose wait was not ended
  // fails within seconds, not at the wait's hour.
  auto ended_within_seconds = [&client]() {
    absl::Notification ended;
    std::thread waiter([&] {
      client->AwaitControl(absl::Hours(1));
      ended.Notify();
    });
    const bool in_time = ended.WaitForNotificationWithTimeout(absl::Seconds(20));
    if (!in_time) client->StopAwaitingControl();  // lets the thread be joined
    waiter.join();
    return in_time;
  };
  std::thread stopper([&] {
    absl::SleepFor(absl::Milliseconds(50));  // most likely while the wait is under way
    client->StopAwaitingControl();
  });
  EXPECT_TRUE(ended_within_seconds());
  stopper.join();
  EXPECT_TRUE(ended_within_seconds());
  absl::StatusOr<v1::SetConfigResponse> set = SetConfig("train", "expandable_segments:True");
  ASSERT_TRUE(set.ok()) << set.status();
  std::vector<v1::ControlMessage> got;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (got.empty() && absl::Now() < deadline) {
    client->AwaitControl(absl::Milliseconds(10));
    got = client->TakeControl();
    if (got.empty()) absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].config().config().config(), "expandable_segments:True");
}

TEST_F(DaemonTest, ConfigPushReachesEveryWatcherAndIsAcked) {
  std::unique_ptr<DaemonClient> a = Client("train");
  std::unique_ptr<DaemonClient> b = Client("train");
  std::unique_ptr<DaemonClient> other = Client("infer");
  absl::StatusOr<v1::SetConfigResponse> set =
      SetConfig("train", "expandable_segments:True");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->pushed_to(), 2u);
  for (DaemonClient* c : {a.get(), b.get()}) {
    std::vector<v1::ControlMessage> got = AwaitControl(*c);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].config().config().config(), "expandable_segments:True");
    EXPECT_EQ(got[0].config().config().version(), set->config().version());
    ASSERT_TRUE(c->Ack(set->config().version(), true, "").ok());
  }
  EXPECT_FALSE(other->AwaitControl(absl::Milliseconds(100)));
  EXPECT_TRUE(other->TakeControl().empty());
  EXPECT_EQ(CountEvents("ack"), 2);
  // A default push skips jobs with their own config.
  ASSERT_EQ(SetConfig("", "max_split_size_mb:256")->pushed_to(), 1u);
  EXPECT_EQ(AwaitControl(*other).size(), 1u);
}

TEST_F(DaemonTest, LiveClientsAckConfigsTheyCanApplyAndNackOthers) {
  daemon_->Kill();
  StartDaemon("24GiB");
  std::vector<std::unique_ptr<Child>> clients;
  for (int i = 0; i < 2; ++i) {
    clients.push_back(std::make_unique<Child>(std::vector<std::string>{
        ALLOCD_BINARY, "client-replay",
        std::string(ALLOCD_SOURCE_DIR) + "/traces/llama_lora.pickle.gz",
        "--socket", socket_, "--job", "llama", "--duration", "60", "--json"}));
  }
  auto sessions = [&] { return Status().sessions(); };
  for (int i = 0; i < 1000 && sessions() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(SetConfig("llama", "garbage_collection_threshold:0.6").ok());
  // The backend cannot change in a running process: both must NACK.
  ASSERT_TRUE(SetConfig("llama", "backend:cudaMallocAsync").ok());
  for (int i = 0; i < 1000 && (CountEvents("ack") < 2 || CountEvents("nack") < 2); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::string history;
  for (const v1::HistoryEntry& e : History()) history += e.DebugString();
  EXPECT_EQ(CountEvents("ack"), 2) << history;
  EXPECT_EQ(CountEvents("nack"), 2) << history;
  for (const v1::HistoryEntry& e : History()) {
    if (e.event() == "nack") {
      EXPECT_THAT(e.detail(), HasSubstr("backend"));
    }
  }
}

TEST_F(DaemonTest, AnOomAfterAPushRollsTheSessionBack) {
  std::unique_ptr<DaemonClient> client = Client("job");
  uint64_t version = 0;
  ASSERT_NO_FATAL_FAILURE(ApplyPush(*client, "job", "max_split_size_mb:64", &version));
  v1::ControlMessage rollback;
  ASSERT_NO_FATAL_FAILURE(OomRollsBack(*client, version, &rollback));
  EXPECT_EQ(rollback.config().config().version(), 0u);  // its initial config
  EXPECT_THAT(rollback.config().reason(), HasSubstr("OOM"));
  EXPECT_EQ(CountEvents("rollback"), 1);
  // A second OOM before the rollback is applied does not roll back again.
  ASSERT_TRUE(client->ReportOom(kChunk, "again", version).ok());
  EXPECT_TRUE(AwaitControl(*client, absl::Milliseconds(300)).empty());
  // Running its initial config, an OOM has nothing to roll back to.
  ASSERT_TRUE(client->Ack(0, true, "").ok());
  ASSERT_TRUE(client->ReportOom(kChunk, "third", 0).ok());
  EXPECT_TRUE(AwaitControl(*client, absl::Milliseconds(300)).empty());
  EXPECT_EQ(CountEvents("rollback"), 1);
}

TEST_F(DaemonTest, AnOomAfterTheNodeRefusedMemoryKeepsThePushedConfig) {
  std::unique_ptr<DaemonClient> client = Client("job");
  uint64_t version = 0;
  ASSERT_NO_FATAL_FAILURE(ApplyPush(*client, "job", "max_split_size_mb:64", &version));
  // The 64 MiB pool cannot give 33 chunks: any config would have OOMed.
  EXPECT_TRUE(absl::IsResourceExhausted(client->Acquire(33 * kChunk).status()));
  ASSERT_TRUE(client->ReportOom(33 * kChunk, "CUDA out of memory", version).ok());
  EXPECT_TRUE(AwaitControl(*client, absl::Milliseconds(300)).empty());
  EXPECT_EQ(CountEvents("rollback"), 0);
  // The next OOM, with no refusal before it, is the config's.
  v1::ControlMessage rollback;
  ASSERT_NO_FATAL_FAILURE(OomRollsBack(*client, version, &rollback));
  EXPECT_EQ(CountEvents("rollback"), 1);
}

// A pre-warm the node refused is no refusal of the job's: the job's next
// OOM is still its config's, and rolls it back.
TEST_F(DaemonTest, ARefusedPrewarmDoesNotSpareTheConfigItsRollback) {
  std::unique_ptr<DaemonClient> client = Client("job", absl::Seconds(60));
  ASSERT_NE(client, nullptr);
  uint64_t version = 0;
  ASSERT_NO_FATAL_FAILURE(ApplyPush(*client, "job", "max_split_size_mb:64", &version));
  // The 64 MiB pool cannot give 33 chunks.
  EXPECT_TRUE(absl::IsResourceExhausted(
      client->Prewarm(33 * kChunk, UINT64_MAX, false)));
  v1::ControlMessage rollback;
  ASSERT_NO_FATAL_FAILURE(OomRollsBack(*client, version, &rollback));
  EXPECT_EQ(CountEvents("rollback"), 1);
}

TEST_F(DaemonTest, DaemonKilledAndRestartedClientsReconnectAndFinish) {
  daemon_->Kill();
  StartDaemon("16GiB");
  Child replay({ALLOCD_BINARY, "client-replay",
                std::string(ALLOCD_SOURCE_DIR) + "/traces/llama_lora.pickle.gz",
                "--socket", socket_, "--duration", "4", "--json"});
  for (int i = 0; i < 1000 && Status().sessions() < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  daemon_->Kill();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  StartDaemon("16GiB");  // replaces the dead daemon's stale socket
  const std::string out = replay.Rest();
  EXPECT_EQ(replay.Wait(), 0) << out;
  nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_GE(j["reconnects"].get<int>(), 1);
  EXPECT_GT(j["events"].get<uint64_t>(), 0u);
  // The new daemon took the client in and got everything back at its end.
  EXPECT_EQ(Status().in_use_bytes(), 0u);
  EXPECT_GT(Status().chunks_created_total(), 0u);
}

// A client-replay stopped by hand (SIGTERM, or Ctrl-C's SIGINT) stops at
// its next safe point and reports what ran, as when its duration is up: how
// the autotuner's tests end a job once they have seen what they waited for,
// whatever the machine's speed.
TEST_F(DaemonTest, ClientReplayStoppedBySigtermReportsWhatRan) {
  daemon_->Kill();
  StartDaemon("24GiB");
  Child replay({ALLOCD_BINARY, "client-replay",
                std::string(ALLOCD_SOURCE_DIR) + "/traces/llama_lora.pickle.gz",
                "--socket", socket_, "--duration", "600", "--json"});
  for (int i = 0; i < 3000 && Status().in_use_bytes() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GT(Status().in_use_bytes(), 0u);
  ASSERT_EQ(kill(replay.pid(), SIGTERM), 0);
  const std::string out = replay.Rest(absl::Seconds(60));
  EXPECT_EQ(replay.Wait(), 0) << out;
  nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_GT(j["events"].get<uint64_t>(), 0u);
  EXPECT_LT(j["seconds"].get<double>(), 600);
  // The session ended as a finished job's does: everything came back.
  WaitForInUse(0, absl::Seconds(10));
  EXPECT_EQ(Status().in_use_bytes(), 0u);
}

// A transparent job's cudaMalloc while the daemon is away rounds to the last
// daemon's chunks and waits for the next one (on the H100, two of three jobs
// died of SIGFPE here: the chunk size read 0 while disconnected).
TEST_F(DaemonTest, ASegmentAskedForWhileTheDaemonIsAwayComesFromTheNextOne) {
  std::unique_ptr<DaemonClient> client = Client();
  const uint64_t chunk = client->chunk_bytes();
  const uint64_t capacity = client->capacity_bytes();
  ASSERT_EQ(chunk, kChunk);
  daemon_->Kill();
  for (int i = 0; i < 500 && client->connected(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_FALSE(client->connected());
  EXPECT_EQ(client->chunk_bytes(), chunk);
  EXPECT_EQ(client->capacity_bytes(), capacity);
  DaemonBackend backend(client.get());
  absl::StatusOr<uint64_t> segment;
  std::thread allocate([&] { segment = backend.AllocateSegment(3 * client->chunk_bytes()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  StartDaemon("16GiB");
  allocate.join();
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(Status().in_use_bytes(), 3 * kChunk);
  backend.FreeSegment(*segment, 3 * kChunk);
}

// A client reading ahead: from the second segment of a size on, the next
// one's chunks are already the process's when it asks; what nobody took
// goes back at once when another session is short (its time, in
// GrantReadAheadTest, is never waited for here).
TEST_F(DaemonTest, AClientReadsTheNextSegmentsAheadFromTheCacheAndGivesThemBackWhenAsked) {
  std::unique_ptr<DaemonClient> connected = Client("loader", absl::Seconds(60));
  ASSERT_NE(connected, nullptr);
  DaemonClient& client = *connected;
  DaemonBackend backend(&client);
  constexpr uint64_t kSegment = 4 * kChunk;
  std::vector<uint64_t> segments;
  // A cold pool: nothing is read ahead (that would make the daemon create
  // chunks while the client maps); each segment's chunks are made for it.
  for (int i = 0; i < 6; ++i) {
    segments.push_back(backend.AllocateSegment(kSegment).value());
  }
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(Status().in_use_bytes(), 6 * kSegment);
  const uint64_t created = Status().chunks_created_total();
  EXPECT_EQ(created, 6 * kSegment / kChunk);
  for (uint64_t segment : segments) backend.FreeSegment(segment, kSegment);
  segments.clear();

  // Warm: the first segment comes from the cache, so the next is read
  // ahead; taking it reads the two after it ahead in one round trip.
  segments.push_back(backend.AllocateSegment(kSegment).value());
  EXPECT_LT(WaitForInUse(2 * kSegment, absl::Seconds(5)), absl::Seconds(5));
  segments.push_back(backend.AllocateSegment(kSegment).value());
  EXPECT_LT(WaitForInUse(4 * kSegment, absl::Seconds(5)), absl::Seconds(5));
  segments.push_back(backend.AllocateSegment(kSegment).value());
  EXPECT_EQ(backend.held_bytes(), 3 * kSegment);
  EXPECT_EQ(Status().in_use_bytes(), 4 * kSegment);
  EXPECT_EQ(Status().chunks_created_total(), created) << "all from the cache";

  // 56 MiB of 64 taken: 8 MiB of them read ahead.
  std::unique_ptr<DaemonClient> other = Client("other");
  ASSERT_TRUE(other->Acquire(12 * kChunk).ok());
  ASSERT_TRUE(client.FlushTelemetry().ok());
  // A session short by 6 MiB gets them from what was read ahead.
  absl::StatusOr<ReceivedChunks> needy = other->Acquire(7 * kChunk);
  ASSERT_TRUE(needy.ok()) << needy.status();
  EXPECT_EQ(Status().in_use_bytes(), 3 * kSegment + 19 * kChunk);
  for (uint64_t segment : segments) backend.FreeSegment(segment, kSegment);
}

// A client that makes its own chunks reads ahead on a cold pool too: the
// grants are budget (nothing held, nothing created), and the next
// segments take them without a round trip.
TEST_F(DaemonTest, AClientThatMakesItsChunksReadsAheadBudgetOnAColdPool) {
  std::unique_ptr<DaemonClient> connected = Client("maker", absl::Milliseconds(300));
  ASSERT_NE(connected, nullptr);
  DaemonBackend backend(connected.get());
  backend.set_client_creates(true);
  constexpr uint64_t kSegment = 3 * kChunk;
  std::vector<uint64_t> segments;
  // Own, own (a run: 1 read ahead), that one (2 read ahead), one of them.
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<uint64_t> segment = backend.AllocateSegment(kSegment);
    ASSERT_TRUE(segment.ok()) << segment.status();
    std::memset(reinterpret_cast<void*>(*segment), i, kSegment);
    segments.push_back(*segment);
  }
  v1::StatusResponse status = Status();
  EXPECT_EQ(status.chunks_created_total(), 0u);
  EXPECT_EQ(status.chunks_client_made_total(), 5 * kSegment / kChunk);
  EXPECT_EQ(status.in_use_bytes(), 5 * kSegment);  // one still read ahead
  // Not taken within the keep, it goes back; nothing is cached.
  EXPECT_LT(WaitForInUse(4 * kSegment, absl::Seconds(5)), absl::Seconds(5));
  for (uint64_t segment : segments) backend.FreeSegment(segment, kSegment);
  status = Status();
  EXPECT_EQ(status.in_use_bytes(), 0u);
  // Freed while nobody is short, their memory leaves the pool with them:
  // the daemon's cache holds no more than reclaims bring back.
  EXPECT_EQ(status.free_bytes(), 0u);
  EXPECT_EQ(connected->map_path().chunks_given.load(), 0u);
}

// A mapped segment's time is told by part: the daemon's round trip, the
// chunks' mapping, enabling access; its free's unmapping (what a slow
// reclaimed peak is read by, allocd.stats()["map_path"]).
TEST_F(DaemonTest, TheMapPathCountersSayWhereASegmentsTimeWent) {
  std::unique_ptr<DaemonClient> client = Client("counted", absl::ZeroDuration());
  ASSERT_NE(client, nullptr);
  DaemonBackend backend(client.get());
  const MapPathCounters& counters = client->map_path();
  EXPECT_EQ(counters.segments_mapped.load(), 0u);
  absl::StatusOr<uint64_t> segment = backend.AllocateSegment(3 * kChunk);
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(counters.segments_mapped.load(), 1u);
  EXPECT_EQ(counters.chunks_mapped.load() + counters.chunks_created.load(), 3u);
  EXPECT_GT(counters.acquire_ns.load(), 0u);
  EXPECT_GT(counters.map_ns.load(), 0u);
  EXPECT_EQ(counters.segments_unmapped.load(), 0u);
  backend.FreeSegment(*segment, 3 * kChunk);
  EXPECT_EQ(counters.segments_unmapped.load(), 1u);
  EXPECT_GT(counters.unmap_ns.load(), 0u);
  const nlohmann::json reported = counters.ToJson();
  EXPECT_EQ(reported.at("segments_mapped"), 1u);
  EXPECT_EQ(reported.at("acquire_ns"), counters.acquire_ns.load());
}

// A pre-warm (the advisor's, of a recurring peak) takes an idle session's
// cache ahead, waiting for it in the pre-warm rather than in the segment
// request, which then asks the daemon nothing; it never asks a session
// whose memory is in use, and one that the idle caches cannot cover parks
// nothing.
TEST_F(DaemonTest, APrewarmTakesAnIdleCacheAheadAndNeverABusyOnes) {
  std::unique_ptr<DaemonClient> idle = Client("idle");
  absl::StatusOr<ReceivedChunks> cached = idle->Acquire(16 * kChunk);
  ASSERT_TRUE(cached.ok()) << cached.status();
  ASSERT_NO_FATAL_FAILURE(PublishAndAwaitRead(
      *idle, {{"reserved_bytes.all.current", 16 * kChunk}, {"allocated_bytes.all.current", 0}}));
  std::unique_ptr<DaemonClient> busy = Client("busy");
  absl::StatusOr<ReceivedChunks> used = busy->Acquire(12 * kChunk);
  ASSERT_TRUE(used.ok()) << used.status();
  ASSERT_NO_FATAL_FAILURE(PublishAndAwaitRead(
      *busy,
      {{"reserved_bytes.all.current", 12 * kChunk}, {"allocated_bytes.all.current", 12 * kChunk}}));

  std::unique_ptr<DaemonClient> job =
      Client("job", absl::Seconds(60), /*release_in_background=*/true);
  ASSERT_NE(job, nullptr);
  DaemonBackend backend(job.get());
  constexpr uint64_t kSegment = 12 * kChunk;  // 4 chunks free: 8 short
  absl::Status prewarmed;
  std::thread prewarm([&] { prewarmed = backend.Prewarm(kSegment); });
  std::vector<v1::ControlMessage> asked = AwaitControl(*idle);
  ASSERT_EQ(asked.size(), 1u);
  ASSERT_TRUE(asked[0].has_reclaim());
  EXPECT_EQ(asked[0].reclaim().bytes(), 0u) << "the job's peak is not known: all";
  // The segment it foresees, come early, waits for it rather than asking.
  absl::StatusOr<uint64_t> segment;
  std::thread allocate([&] { segment = backend.AllocateSegment(kSegment); });
  ASSERT_TRUE(idle->Release(cached->epoch, cached->ids).ok());
  prewarm.join();
  allocate.join();
  ASSERT_TRUE(prewarmed.ok()) << prewarmed;
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(job->own_acquires(), 0u) << "the segment took the pre-warmed grant";
  EXPECT_TRUE(busy->TakeControl().empty());
  EXPECT_EQ(Status().in_use_bytes(), 12 * kChunk + kSegment);
  backend.FreeSegment(*segment, kSegment);

  // Pre-warmed with room to spare, the next one is parked at once and the
  // segment after it asks nothing either.
  ASSERT_TRUE(backend.Prewarm(kSegment).ok());
  segment = backend.AllocateSegment(kSegment);
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(job->own_acquires(), 0u);
  EXPECT_EQ(Status().in_use_bytes(), 12 * kChunk + kSegment);

  // Nothing idle is left (8 chunks free, the busy session's in use): the
  // pre-warm is refused, nobody asked, nothing parked.
  ASSERT_NO_FATAL_FAILURE(PublishAndAwaitRead(
      *idle, {{"reserved_bytes.all.current", 0}, {"allocated_bytes.all.current", 0}}));
  const absl::Status refused = backend.Prewarm(kSegment);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_TRUE(busy->TakeControl().empty());
  EXPECT_TRUE(idle->TakeControl().empty());
  EXPECT_EQ(Status().in_use_bytes(), 12 * kChunk + kSegment);
  backend.FreeSegment(*segment, kSegment);
}

// DaemonBackend::MapPrewarmed as a caller that holds `lock` for every call
// of the backend (the interposer) makes it.
absl::StatusOr<bool> MapPrewarmedUnder(DaemonBackend& backend, size_t bytes,
                                       absl::Mutex& lock) {
  absl::MutexLock held(&lock);
  return backend.MapPrewarmed(bytes, lock);
}

// A pre-warmed grant mapped ahead, on the pre-warming thread: the segment
// it foresees takes it mapped (nothing asked, nothing mapped under the
// caller's lock); one nobody takes goes back whole; one the segment took
// first is not mapped twice.
TEST_F(DaemonTest, APrewarmedGrantIsMappedAheadAndTheSegmentTakesItAsItIs) {
  std::unique_ptr<DaemonClient> job =
      Client("job", absl::Seconds(60), /*release_in_background=*/true);
  ASSERT_NE(job, nullptr);
  DaemonBackend backend(job.get());
  absl::Mutex caller;
  constexpr uint64_t kSegment = 8 * kChunk;
  ASSERT_TRUE(backend.Prewarm(kSegment).ok());
  absl::StatusOr<bool> mapped = MapPrewarmedUnder(backend, kSegment, caller);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_TRUE(*mapped);
  EXPECT_EQ(backend.held_bytes(), kSegment);
  const uint64_t segments_mapped = job->map_path().segments_mapped.load();
  const uint64_t chunks_mapped = job->map_path().chunks_mapped.load();
  absl::StatusOr<uint64_t> segment = backend.AllocateSegment(kSegment);
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(job->own_acquires(), 0u);
  EXPECT_EQ(job->map_path().segments_mapped.load(), segments_mapped) << "mapped ahead";
  EXPECT_EQ(job->map_path().chunks_mapped.load(), chunks_mapped);
  // The memory is the segment's: written and read through it.
  auto* bytes = reinterpret_cast<volatile uint8_t*>(*segment);
  bytes[0] = 0x5a;
  bytes[kSegment - 1] = 0xa5;
  EXPECT_EQ(bytes[0] + bytes[kSegment - 1], 0x5a + 0xa5);
  EXPECT_EQ(backend.TakeUnusedPrewarmed().size(), 0u) << "taken: nothing unused";
  EXPECT_EQ(Status().in_use_bytes(), kSegment);

  // Mapped and not taken: given back whole.
  ASSERT_TRUE(backend.Prewarm(kSegment).ok());
  ASSERT_TRUE(MapPrewarmedUnder(backend, kSegment, caller).value());
  EXPECT_EQ(backend.held_bytes(), 2 * kSegment);
  DaemonBackend::TakenSpares unused = backend.TakeUnusedPrewarmed();
  EXPECT_EQ(unused.size(), 1u);
  EXPECT_EQ(backend.held_bytes(), kSegment) << "out of the books once taken";
  EXPECT_EQ(backend.UnmapTaken(std::move(unused)), kSegment);
  job->FlushReleases();
  EXPECT_EQ(Status().in_use_bytes(), kSegment);

  // The segment came while the grant was parked: it took it, and there is
  // nothing left to map.
  backend.FreeSegment(*segment, kSegment);
  ASSERT_TRUE(backend.Prewarm(kSegment).ok());
  segment = backend.AllocateSegment(kSegment);
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(job->own_acquires(), 0u);
  mapped = MapPrewarmedUnder(backend, kSegment, caller);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_FALSE(*mapped);
  EXPECT_EQ(backend.held_bytes(), kSegment);
  backend.FreeSegment(*segment, kSegment);
  job->FlushReleases();
  EXPECT_EQ(Status().in_use_bytes(), 0u);
}

// A reclaim's partial give-back: the segments an empty_cache frees stay
// mapped, the daemon counts them as the job's cache, only the largest go
// back, and a request of a kept size takes one without asking or mapping.
TEST_F(DaemonTest, AReclaimGivesBackTheLargestFreedSegmentsAndKeepsTheRestMapped) {
  std::unique_ptr<DaemonClient> job =
      Client("job", absl::ZeroDuration(), /*release_in_background=*/true);
  ASSERT_NE(job, nullptr);
  DaemonBackend backend(job.get());
  const uint64_t batch = backend.AllocateSegment(16 * kChunk).value();
  const uint64_t cache = backend.AllocateSegment(2 * kChunk).value();
  const uint64_t other = backend.AllocateSegment(kChunk).value();
  job->FlushReleases();
  ASSERT_EQ(Status().in_use_bytes(), 19 * kChunk);

  backend.KeepFreedSegments(true);
  for (auto [address, bytes] : {std::pair{batch, 16 * kChunk}, {cache, 2 * kChunk},
                                {other, kChunk}}) {
    backend.FreeSegment(address, bytes);
  }
  backend.KeepFreedSegments(false);
  EXPECT_EQ(backend.held_bytes(), 19 * kChunk) << "kept mapped";
  EXPECT_EQ(backend.spare_bytes(), 19 * kChunk);
  EXPECT_EQ(job->map_path().segments_kept.load(), 3u);
  // PyTorch's cache is empty now; the daemon hears of the spares as cache.
  ASSERT_NO_FATAL_FAILURE(PublishAndAwaitRead(
      *job, {{"reserved_bytes.all.current", 0}, {"allocated_bytes.all.current", 0},
             {kReadAheadStat, 19 * kChunk}}));

  // A neighbour short of 5 chunks: the 16-chunk segment covers it alone.
  EXPECT_EQ(backend.UnmapTaken(backend.TakeSpares(5 * kChunk)), 16 * kChunk);
  EXPECT_EQ(backend.held_bytes(), 3 * kChunk);
  job->FlushReleases();
  EXPECT_EQ(Status().in_use_bytes(), 3 * kChunk);

  const uint64_t acquires = job->own_acquires();
  const uint64_t segments_mapped = job->map_path().segments_mapped.load();
  absl::StatusOr<uint64_t> again = backend.AllocateSegment(2 * kChunk);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, cache) << "the kept segment, as it was";
  EXPECT_EQ(job->own_acquires(), acquires);
  EXPECT_EQ(job->map_path().segments_mapped.load(), segments_mapped);
  EXPECT_EQ(job->map_path().spares_taken.load(), 1u);
  auto* bytes = reinterpret_cast<volatile uint8_t*>(*again);
  bytes[0] = 0x5a;
  bytes[2 * kChunk - 1] = 0xa5;
  EXPECT_EQ(bytes[0] + bytes[2 * kChunk - 1], 0x5a + 0xa5);

  // What no request took goes back once it has waited long enough.
  EXPECT_EQ(backend.TakeSparesOlderThan(absl::Hours(1)).size(), 0u);
  EXPECT_EQ(backend.UnmapTaken(backend.TakeSparesOlderThan(absl::ZeroDuration())), kChunk);
  EXPECT_EQ(backend.spare_bytes(), 0u);
  // Not keeping: a free gives the segment back.
  backend.FreeSegment(*again, 2 * kChunk);
  EXPECT_EQ(backend.held_bytes(), 0u);
  job->FlushReleases();
  EXPECT_EQ(Status().in_use_bytes(), 0u);

  // A segment shared with another process (which may map it still) is
  // never kept for this one's next request.
  const uint64_t shared = backend.AllocateSegment(2 * kChunk).value();
  ASSERT_TRUE(backend.ShareSegment(shared).ok());
  backend.KeepFreedSegments(true);
  backend.FreeSegment(shared, 2 * kChunk);
  backend.KeepFreedSegments(false);
  EXPECT_EQ(backend.spare_bytes(), 0u);
  EXPECT_EQ(backend.held_bytes(), 0u);
}

// Spares of other sizes are the job's own cache: a segment the pool has no
// room for gets them back first, as PyTorch frees its cache and retries.
TEST_F(DaemonTest, ASegmentThePoolCannotFitTakesTheRoomOfTheJobsSpares) {
  std::unique_ptr<DaemonClient> job =
      Client("job", absl::ZeroDuration(), /*release_in_background=*/true);
  ASSERT_NE(job, nullptr);
  DaemonBackend backend(job.get());
  constexpr uint64_t kPool = 32 * kChunk;
  const uint64_t kept = backend.AllocateSegment(24 * kChunk).value();
  backend.KeepFreedSegments(true);
  backend.FreeSegment(kept, 24 * kChunk);
  backend.KeepFreedSegments(false);
  ASSERT_EQ(backend.spare_bytes(), 24 * kChunk);
  absl::StatusOr<uint64_t> larger = backend.AllocateSegment(kPool);
  ASSERT_TRUE(larger.ok()) << larger.status();
  EXPECT_EQ(backend.spare_bytes(), 0u);
  EXPECT_EQ(backend.held_bytes(), kPool);
  backend.FreeSegment(*larger, kPool);
}

// The interposer's client returns what a free unmapped in the background:
// a free does not wait for the daemon (here stopped), and the daemon hears
// of it before it must refuse the next acquire.
TEST_F(DaemonTest, AFreeDoesNotWaitForTheDaemonWhichHearsOfItBeforeTheNextAcquire) {
  std::unique_ptr<DaemonClient> client =
      Client("freer", absl::ZeroDuration(), /*release_in_background=*/true);
  ASSERT_NE(client, nullptr);
  DaemonBackend backend(client.get());
  constexpr uint64_t kPool = 32 * kChunk;
  const uint64_t segment = backend.AllocateSegment(kPool).value();
  const uint64_t created = Status().chunks_created_total();
  ASSERT_EQ(kill(daemon_->pid(), SIGSTOP), 0);
  const absl::Time start = absl::Now();
  backend.FreeSegment(segment, kPool);
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
  EXPECT_EQ(backend.held_bytes(), 0u);
  absl::SleepFor(absl::Milliseconds(50));
  ASSERT_EQ(kill(daemon_->pid(), SIGCONT), 0);
  // The whole pool again, from the chunks just released.
  absl::StatusOr<uint64_t> again = backend.AllocateSegment(kPool);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(Status().in_use_bytes(), kPool);
  EXPECT_EQ(Status().chunks_created_total(), created) << "all from the cache";
  backend.FreeSegment(*again, kPool);
  client->FlushReleases();
  EXPECT_EQ(Status().in_use_bytes(), 0u);
  EXPECT_EQ(Status().free_bytes(), kPool);
}

// A job that makes its chunks and gathers its peak from what a reclaim
// brought back (a neighbour's chunks, made in its own process, leave the
// pool when released: the grants after it are budget) reads the next
// segments ahead again, though its fetches were refused while the pool was
// short.
TEST_F(DaemonTest, APeakGatheredFromAReclaimIsReadAheadAgain) {
  std::unique_ptr<DaemonClient> cacher = Client("cacher");
  absl::StatusOr<ReceivedChunks> cached =
      cacher->Acquire(20 * kChunk, UINT64_MAX, /*client_creates=*/true);
  ASSERT_TRUE(cached.ok()) << cached.status();
  ASSERT_EQ(cached->client_made, cached->ids.size());
  ASSERT_NO_FATAL_FAILURE(PublishAndAwaitRead(
      *cacher, {{"reserved_bytes.all.current", 20 * kChunk}, {"allocated_bytes.all.current", 0}}));

  std::unique_ptr<DaemonClient> job =
      Client("job", absl::Seconds(60), /*release_in_background=*/true);
  ASSERT_NE(job, nullptr);
  DaemonBackend backend(job.get());
  backend.set_client_creates(true);
  constexpr uint64_t kSegment = 4 * kChunk;
  std::vector<uint64_t> segments;
  // The room beside the cacher's 40 MiB: three segments, the fetches after
  // the second and third refused (they would leave the pool nothing).
  for (int i = 0; i < 3; ++i) {
    segments.push_back(backend.AllocateSegment(kSegment).value());
  }
  EXPECT_EQ(Status().in_use_bytes(), 20 * kChunk + 3 * kSegment);
  absl::StatusOr<uint64_t> fourth;
  std::thread allocate([&] { fourth = backend.AllocateSegment(kSegment); });
  std::vector<v1::ControlMessage> asked = AwaitControl(*cacher);
  ASSERT_EQ(asked.size(), 1u);
  ASSERT_TRUE(asked[0].has_reclaim());
  ASSERT_TRUE(cacher->Release(cached->epoch, cached->ids).ok());
  allocate.join();
  ASSERT_TRUE(fourth.ok()) << fourth.status();
  segments.push_back(*fourth);
  // The fifth is read ahead, as budget, and taken without asking.
  EXPECT_LT(WaitForInUse(5 * kSegment, absl::Seconds(5)), absl::Seconds(5));
  absl::StatusOr<uint64_t> fifth = backend.AllocateSegment(kSegment);
  ASSERT_TRUE(fifth.ok()) << fifth.status();
  segments.push_back(*fifth);
  EXPECT_EQ(job->own_acquires(), 4u);
  for (uint64_t segment : segments) backend.FreeSegment(segment, kSegment);
}

// A job that starts again is handed the segments its last run held at its
// peak, mapped ahead from the daemon's cache (nothing created for them),
// and its segment requests take them; another job is handed nothing, and
// what the new run has not taken goes back when another session is short.
TEST_F(DaemonTest, AJobsNextRunFindsItsLastWorkingSetMappedFromTheCache) {
  constexpr uint64_t kLarge = 4 * kChunk;
  {
    std::unique_ptr<DaemonClient> first = Client("trainer");
    ASSERT_NE(first, nullptr);
    EXPECT_TRUE(first->handed_working_set().empty());
    DaemonBackend backend(first.get());
    const uint64_t a = backend.AllocateSegment(kLarge).value();
    const uint64_t b = backend.AllocateSegment(kChunk).value();
    const uint64_t c = backend.AllocateSegment(kLarge).value();
    // Below the peak: the working set stays large, small, large.
    backend.FreeSegment(b, kChunk);
    const uint64_t d = backend.AllocateSegment(kChunk).value();
    // Sent is not yet read: the daemon reads the telemetry stream on
    // another thread than the lease whose end ends the session. A stat
    // published after the working set shows, once the daemon lists it,
    // that the daemon has read the working set too (the stream is in order).
    ASSERT_NO_FATAL_FAILURE(PublishAndAwaitRead(*first, {{"allocd.test_marker", 1}}));
    for (auto [address, bytes] : {std::pair{a, kLarge}, std::pair{c, kLarge},
                                  std::pair{d, kChunk}}) {
      backend.FreeSegment(address, bytes);
    }
  }
  for (int i = 0; i < 500 && Status().sessions() != 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(Status().sessions(), 0u);
  const uint64_t created = Status().chunks_created_total();

  std::unique_ptr<DaemonClient> other = Client("evaluator");
  EXPECT_TRUE(other->handed_working_set().empty());
  std::unique_ptr<DaemonClient> second = Client("trainer");
  ASSERT_NE(second, nullptr);
  EXPECT_THAT(second->handed_working_set(),
              ::testing::ElementsAre(kLarge, kChunk, kLarge));
  DaemonBackend backend(second.get());
  backend.HandOver(absl::Seconds(60));
  ASSERT_NE(backend.handover(), nullptr);
  ASSERT_TRUE(backend.handover()->WaitPrepared(absl::Seconds(5)));
  EXPECT_EQ(backend.handover()->counts().prepared, 3u);
  EXPECT_EQ(Status().in_use_bytes(), 2 * kLarge + kChunk);
  EXPECT_EQ(Status().chunks_created_total(), created) << "all from the cache";
  EXPECT_EQ(backend.held_bytes(), 0u) << "none is the process's segment yet";

  absl::StatusOr<uint64_t> large = backend.AllocateSegment(kLarge);
  ASSERT_TRUE(large.ok()) << large.status();
  std::memset(reinterpret_cast<void*>(*large), 7, kLarge);  // mapped
  EXPECT_EQ(backend.handover()->counts().taken, 1u);
  EXPECT_EQ(backend.held_bytes(), kLarge);
  EXPECT_EQ(Status().in_use_bytes(), 2 * kLarge + kChunk);

  // 64 MiB: 14 in use, 5 of them handed over and not taken. A session
  // asking for 54 is short by 4: the daemon asks for what was handed over.
  ASSERT_TRUE(second->FlushTelemetry().ok());
  absl::StatusOr<ReceivedChunks> needy = other->Acquire(27 * kChunk);
  ASSERT_TRUE(needy.ok()) << needy.status();
  EXPECT_EQ(backend.handover()->counts().given_back, 2u);
  EXPECT_EQ(Status().in_use_bytes(), kLarge + 27 * kChunk);
  backend.FreeSegment(*large, kLarge);
}

TEST_F(DaemonTest, AShortPoolAsksOtherSessionsToReleaseCachedMemoryFirst) {
  std::unique_ptr<DaemonClient> cacher = Client("cacher");
  absl::StatusOr<ReceivedChunks> cached = cacher->Acquire(28 * kChunk);
  ASSERT_TRUE(cached.ok());
  // Its allocator caches all of it: reserved, nothing allocated.
  ASSERT_NO_FATAL_FAILURE(PublishAndAwaitRead(
      *cacher, {{"reserved_bytes.all.current", 28 * kChunk}, {"allocated_bytes.all.current", 0}}));

  std::unique_ptr<DaemonClient> needy = Client("needy");
  absl::StatusOr<ReceivedChunks> got;
  std::thread acquire([&] { got = needy->Acquire(8 * kChunk); });
  // The cacher answers the reclaim request as its allocator would:
  // empty_cache, segments back to the daemon.
  std::vector<v1::ControlMessage> asked = AwaitControl(*cacher);
  ASSERT_EQ(asked.size(), 1u);
  ASSERT_TRUE(asked[0].has_reclaim());
  // All it caches: the asker's peak is not known (ReclaimerTest has the
  // asks of a known one).
  EXPECT_EQ(asked[0].reclaim().bytes(), 0u);
  EXPECT_THAT(asked[0].reclaim().reason(), HasSubstr("short"));
  ASSERT_TRUE(cacher->Release(cached->epoch, cached->ids).ok());
  acquire.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->reused, got->ids.size());  // all the cacher's memory

  // With nothing cached anywhere, a short pool answers at once.
  ASSERT_NO_FATAL_FAILURE(PublishAndAwaitRead(
      *cacher, {{"reserved_bytes.all.current", 0}, {"allocated_bytes.all.current", 0}}));
  const absl::Time start = absl::Now();
  absl::StatusOr<ReceivedChunks> more = Client()->Acquire(30 * kChunk);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(900));
  EXPECT_TRUE(cacher->TakeControl().empty());
}

// A job that has just freed its peak into its allocator's cache tells the
// daemon with its next telemetry: a short pool waits for that report
// before it answers.
TEST_F(DaemonTest, AShortPoolWaitsForTheTelemetryOfJobsHoldingMemory) {
  std::unique_ptr<DaemonClient> holder = Client("holder");
  absl::StatusOr<ReceivedChunks> held = holder->Acquire(28 * kChunk);
  ASSERT_TRUE(held.ok());
  // All of it allocated when it last reported.
  ASSERT_NO_FATAL_FAILURE(PublishAndAwaitRead(
      *holder,
      {{"reserved_bytes.all.current", 28 * kChunk}, {"allocated_bytes.all.current", 28 * kChunk}}));

  std::unique_ptr<DaemonClient> needy = Client("needy");
  absl::StatusOr<ReceivedChunks> got;
  std::thread acquire([&] { got = needy->Acquire(8 * kChunk); });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_TRUE(holder->TakeControl().empty()) << "nothing known to be cached";
  // Its peak freed, its next report says so: now it is asked.
  ASSERT_NO_FATAL_FAILURE(PublishAndAwaitRead(
      *holder, {{"reserved_bytes.all.current", 28 * kChunk}, {"allocated_bytes.all.current", 0}}));
  std::vector<v1::ControlMessage> asked = AwaitControl(*holder);
  ASSERT_EQ(asked.size(), 1u);
  ASSERT_TRUE(asked[0].has_reclaim());
  ASSERT_TRUE(holder->Release(held->epoch, held->ids).ok());
  acquire.join();
  ASSERT_TRUE(got.ok()) << got.status();
}

// A segment, freed whole, gets the daemon's largest chunks; pages of an
// expandable segment, unmapped in any sub-range, the smallest.
TEST_F(DaemonTest, SegmentsGetLargeChunksAndExpandablePagesSmallOnes) {
  std::unique_ptr<DaemonClient> client = Client();
  DaemonBackend backend(client.get());
  absl::StatusOr<uint64_t> segment = backend.AllocateSegment(17 * kChunk);
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(Status().chunks_created_total(), 3u);  // 16 + 16 + 2 MiB
  EXPECT_EQ(backend.held_bytes(), 17 * kChunk);
  std::memset(reinterpret_cast<void*>(*segment), 7, 17 * kChunk);
  backend.FreeSegment(*segment, 17 * kChunk);
  EXPECT_EQ(Status().free_bytes(), 17 * kChunk);

  absl::StatusOr<uint64_t> range = backend.ReserveAddressRange(16 * kChunk);
  ASSERT_TRUE(range.ok()) << range.status();
  ASSERT_TRUE(backend.MapPages(*range, 8 * kChunk).ok());
  // The cached 2 MiB chunk and 7 new ones, not the cached 16 MiB chunks.
  EXPECT_EQ(Status().chunks_created_total(), 10u);
  backend.UnmapPages(*range + 2 * kChunk, 3 * kChunk);
  EXPECT_EQ(backend.held_bytes(), 5 * kChunk);
  EXPECT_EQ(Status().in_use_bytes(), 5 * kChunk);
  std::memset(reinterpret_cast<void*>(*range), 1, 2 * kChunk);
  std::memset(reinterpret_cast<void*>(*range + 5 * kChunk), 1, 3 * kChunk);
  backend.ReleaseAddressRange(*range, 16 * kChunk);
  EXPECT_EQ(Status().in_use_bytes(), 0u);
}

// CUDA IPC in transparent mode, in sim: a segment one process shares is
// mapped by another, the same memory, while the first keeps it; it goes
// back to the pool when both are done with it.
TEST_F(DaemonTest, ASharedSegmentIsMappedByAnotherSessionUntilBothAreDone) {
  std::unique_ptr<DaemonClient> owner_client = Client("owner");
  std::unique_ptr<DaemonClient> opener_client = Client("opener");
  DaemonBackend owner(owner_client.get());
  DaemonBackend opener(opener_client.get());
  constexpr size_t kBytes = 9 * kChunk;  // chunks of two sizes
  absl::StatusOr<uint64_t> segment = owner.AllocateSegment(kBytes);
  ASSERT_TRUE(segment.ok()) << segment.status();
  char* mine = reinterpret_cast<char*>(*segment);
  std::strcpy(mine + kBytes - 64, "written by the owner");

  absl::StatusOr<std::string> token = owner.ShareSegment(*segment);
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(owner.ShareSegment(*segment + kChunk).status().code(),
            absl::StatusCode::kNotFound);  // not a segment's start
  absl::StatusOr<std::pair<uint64_t, size_t>> theirs =
      opener.OpenShared(*token);
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  EXPECT_EQ(theirs->second, kBytes);
  EXPECT_NE(theirs->first, *segment);
  char* seen = reinterpret_cast<char*>(theirs->first);
  EXPECT_STREQ(seen + kBytes - 64, "written by the owner");
  std::strcpy(seen, "and by the opener");
  EXPECT_STREQ(mine, "and by the opener");
  EXPECT_EQ(opener.held_bytes(), 0u);  // the owner's memory

  // The owner frees it: the opener still maps it, the pool keeps it.
  owner.FreeSegment(*segment, kBytes);
  EXPECT_STREQ(seen, "and by the opener");
  EXPECT_EQ(Status().in_use_bytes(), kBytes);
  EXPECT_EQ(Status().free_bytes(), 0u);
  EXPECT_EQ(opener.OpenShared(*token).status().code(),
            absl::StatusCode::kNotFound);  // no new opens
  EXPECT_TRUE(opener.CloseShared(theirs->first));
  EXPECT_FALSE(opener.CloseShared(theirs->first));
  EXPECT_EQ(Status().in_use_bytes(), 0u);
  EXPECT_EQ(Status().free_bytes(), kBytes);
}

// Transparent mode's client on a GPU makes the chunks the pool has not
// cached (cheaper than the daemon's creation, export and its import); in
// sim the same path: memfds made in this process, counted by the daemon,
// their memory given to it when a segment is shared.
TEST_F(DaemonTest, AClientMakesWhatThePoolHasNotCachedAndGivesItToShare) {
  std::unique_ptr<DaemonClient> owner_client = Client("owner");
  std::unique_ptr<DaemonClient> opener_client = Client("opener");
  DaemonBackend owner(owner_client.get());
  owner.set_client_creates(true);
  DaemonBackend opener(opener_client.get());
  constexpr size_t kBytes = 9 * kChunk;  // 16 MiB + 2 MiB
  absl::StatusOr<uint64_t> shared = owner.AllocateSegment(kBytes);
  ASSERT_TRUE(shared.ok()) << shared.status();
  absl::StatusOr<uint64_t> kept = owner.AllocateSegment(kChunk);
  ASSERT_TRUE(kept.ok()) << kept.status();
  v1::StatusResponse status = Status();
  EXPECT_EQ(status.chunks_created_total(), 0u);
  EXPECT_EQ(status.chunks_client_made_total(), 3u);
  EXPECT_EQ(status.in_use_bytes(), kBytes + kChunk);
  EXPECT_EQ(owner.held_bytes(), kBytes + kChunk);
  char* mine = reinterpret_cast<char*>(*shared);
  std::strcpy(mine + kBytes - 64, "made and written by the owner");
  std::memset(reinterpret_cast<void*>(*kept), 3, kChunk);

  absl::StatusOr<std::string> token = owner.ShareSegment(*shared);
  ASSERT_TRUE(token.ok()) << token.status();
  absl::StatusOr<std::pair<uint64_t, size_t>> theirs =
      opener.OpenShared(*token);
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  char* seen = reinterpret_cast<char*>(theirs->first);
  EXPECT_STREQ(seen + kBytes - 64, "made and written by the owner");
  std::strcpy(seen, "and by the opener");
  EXPECT_STREQ(mine, "and by the opener");  // one memory
  EXPECT_TRUE(owner.ShareSegment(*shared).ok());  // given once, shared again

  // Never given, the other segment leaves the pool when freed.
  owner.FreeSegment(*kept, kChunk);
  status = Status();
  EXPECT_EQ(status.in_use_bytes(), kBytes);
  EXPECT_EQ(status.free_bytes(), 0u);
  // Given, the shared one is cached once both are done, and serves the next.
  owner.FreeSegment(*shared, kBytes);
  EXPECT_TRUE(opener.CloseShared(theirs->first));
  EXPECT_EQ(Status().free_bytes(), kBytes);
  absl::StatusOr<uint64_t> next = owner.AllocateSegment(kBytes);
  ASSERT_TRUE(next.ok()) << next.status();
  status = Status();
  EXPECT_EQ(status.chunks_reused_total(), 2u);
  EXPECT_EQ(status.chunks_client_made_total(), 3u);
  EXPECT_STREQ(reinterpret_cast<char*>(*next), "and by the opener");
  owner.FreeSegment(*next, kBytes);
}

// What a process made and frees while a neighbour is short serves the
// neighbour by import, through the daemon's cache: the neighbour creates
// none of it (on a GPU, memory created right after another process freed
// it waits for the driver's scrub; bench/gpu/packing.sh measured a
// reclaimed 84 GiB peak at 104 ms that way, 14 ms imported).
TEST_F(DaemonTest, WhatAProcessMadeAndFreesForAReclaimServesTheAskerByImport) {
  std::unique_ptr<DaemonClient> giver_client = Client("giver");
  std::unique_ptr<DaemonClient> asker_client = Client("asker");
  DaemonBackend giver(giver_client.get());
  DaemonBackend asker(asker_client.get());
  giver.set_client_creates(true);
  asker.set_client_creates(true);
  constexpr size_t kGiven = 16 * kChunk;  // two 16 MiB chunks
  absl::StatusOr<uint64_t> made = giver.AllocateSegment(kGiven);
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ(giver_client->map_path().chunks_created.load(), 2u);
  ASSERT_NO_FATAL_FAILURE(PublishAndAwaitRead(
      *giver_client, {{"reserved_bytes.all.current", kGiven}, {"allocated_bytes.all.current", 0}}));
  // Past what the pool has left beside the giver's: the daemon asks it.
  absl::StatusOr<uint64_t> taken;
  std::thread allocate([&] { taken = asker.AllocateSegment(kGiven + kGiven / 2); });
  std::vector<v1::ControlMessage> asked = AwaitControl(*giver_client);
  ASSERT_EQ(asked.size(), 1u);
  ASSERT_TRUE(asked[0].has_reclaim());
  giver.FreeSegment(*made, kGiven);
  EXPECT_EQ(giver_client->map_path().chunks_given.load(), 2u);
  allocate.join();
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(asker_client->map_path().chunks_mapped.load(), 2u);
  EXPECT_EQ(Status().chunks_reused_total(), 2u);
  asker.FreeSegment(*taken, kGiven + kGiven / 2);
}

// Sim mode's ChunkMapper, counting the chunks it exports: one per chunk
// made here whose memory a give hands the daemon.
class CountingMapper : public ChunkMapper {
 public:
  absl::StatusOr<uint64_t> Reserve(size_t bytes) override {
    return mapper_->Reserve(bytes);
  }
  void Free(uint64_t address, size_t bytes) override {
    mapper_->Free(address, bytes);
  }
  absl::StatusOr<uint64_t> Map(uint64_t address, size_t chunk_bytes, int fd,
                               uint64_t offset) override {
    return mapper_->Map(address, chunk_bytes, fd, offset);
  }
  bool CanCreate() const override { return true; }
  absl::StatusOr<uint64_t> Create(uint64_t address,
                                  size_t chunk_bytes) override {
    return mapper_->Create(address, chunk_bytes);
  }
  absl::StatusOr<UniqueFd> Export(const ChunkMapping& chunk) override {
    ++exports;
    return mapper_->Export(chunk);
  }
  void Unmap(uint64_t address, size_t bytes,
             absl::Span<const ChunkMapping> chunks) override {
    mapper_->Unmap(address, bytes, chunks);
  }
  uint64_t exports = 0;

 private:
  const std::unique_ptr<ChunkMapper> mapper_ = MakeMmapChunkMapper();
};

// Sim mode's mapper whose unmap of one range waits until the test lets it
// go: a reclaim's give-back caught in the middle of its unmaps.
class HeldUnmapMapper final : public CountingMapper {
 public:
  void Hold(uint64_t address) { held_.store(address); }
  void Unmap(uint64_t address, size_t bytes,
             absl::Span<const ChunkMapping> chunks) override {
    if (address == held_.load()) {
      unmapping.Notify();
      let_go.WaitForNotification();
    }
    CountingMapper::Unmap(address, bytes, chunks);
  }
  absl::Notification unmapping;
  absl::Notification let_go;

 private:
  std::atomic<uint64_t> held_{0};
};

// The spares a reclaim gives back are taken out of the backend under the
// caller's lock and unmapped after it: while a taken segment is still
// being unmapped on the advisor's thread, the job's thread takes a kept
// spare, maps a new segment and frees it, as the interposer's cudaMalloc
// and cudaFree do under the lock the give-back no longer holds.
TEST_F(DaemonTest, TakenSparesAreUnmappedBesideTheJobsAllocations) {
  std::unique_ptr<DaemonClient> job =
      Client("job", absl::ZeroDuration(), /*release_in_background=*/true);
  ASSERT_NE(job, nullptr);
  auto mapper = std::make_unique<HeldUnmapMapper>();
  HeldUnmapMapper& held = *mapper;
  DaemonBackend backend(job.get(), std::move(mapper));
  const uint64_t batch = backend.AllocateSegment(8 * kChunk).value();
  const uint64_t cache = backend.AllocateSegment(2 * kChunk).value();
  backend.KeepFreedSegments(true);
  backend.FreeSegment(batch, 8 * kChunk);
  backend.FreeSegment(cache, 2 * kChunk);
  backend.KeepFreedSegments(false);

  DaemonBackend::TakenSpares taken = backend.TakeSpares(5 * kChunk);
  EXPECT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken.bytes(), 8 * kChunk) << "the batch covers the ask alone";
  EXPECT_EQ(backend.held_bytes(), 2 * kChunk) << "out of the books once taken";
  EXPECT_EQ(backend.spare_bytes(), 2 * kChunk);
  held.Hold(batch);
  std::thread advisor([&] { EXPECT_EQ(backend.UnmapTaken(std::move(taken)), 8 * kChunk); });
  held.unmapping.WaitForNotification();

  absl::StatusOr<uint64_t> again = backend.AllocateSegment(2 * kChunk);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, cache) << "the kept spare, as it was";
  absl::StatusOr<uint64_t> fresh = backend.AllocateSegment(kChunk);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(backend.held_bytes(), 3 * kChunk);
  const uint64_t unmapped = job->map_path().segments_unmapped.load();
  backend.FreeSegment(*fresh, kChunk);
  EXPECT_EQ(job->map_path().segments_unmapped.load(), unmapped + 1)
      << "the free's own unmap, while the batch's waits";

  held.let_go.Notify();
  advisor.join();
  job->FlushReleases();
  EXPECT_EQ(Status().in_use_bytes(), 2 * kChunk) << "the batch and the fresh segment went back";
  backend.FreeSegment(*again, 2 * kChunk);
  job->FlushReleases();
  EXPECT_EQ(Status().in_use_bytes(), 0u);
}

// Sim mode's mapper whose next Map waits until the test lets it go: a
// pre-warm caught in the middle of its mapping.
class HeldMapMapper final : public CountingMapper {
 public:
  void HoldNextMap() { hold_.store(true); }
  absl::StatusOr<uint64_t> Map(uint64_t address, size_t chunk_bytes, int fd,
                               uint64_t offset) override {
    if (hold_.exchange(false)) {
      mapping.Notify();
      let_go.WaitForNotification();
    }
    return CountingMapper::Map(address, chunk_bytes, fd, offset);
  }
  absl::Notification mapping;
  absl::Notification let_go;

 private:
  std::atomic<bool> hold_{false};
};

// A pre-warm maps its grant with the caller's lock released: while it maps
// on the advisor's thread, the job's thread takes the lock, maps a segment
// of another size and frees it, as the interposer's cudaMalloc and cudaFree
// do. A request of the pre-warmed size that waits while it is mapping (as
// the interposer's cudaMalloc does) takes it mapped, asking nothing.
TEST_F(DaemonTest, APrewarmMapsWithTheCallersLockReleased) {
  std::unique_ptr<DaemonClient> job =
      Client("job", absl::Seconds(60), /*release_in_background=*/true);
  ASSERT_NE(job, nullptr);
  auto mapper = std::make_unique<HeldMapMapper>();
  HeldMapMapper& held = *mapper;
  DaemonBackend backend(job.get(), std::move(mapper));
  absl::Mutex caller;
  constexpr uint64_t kSegment = 8 * kChunk;
  ASSERT_TRUE(backend.Prewarm(kSegment).ok());
  held.HoldNextMap();
  absl::StatusOr<bool> mapped;
  std::thread advisor([&] { mapped = MapPrewarmedUnder(backend, kSegment, caller); });
  held.mapping.WaitForNotification();

  if (caller.TryLock()) {
    EXPECT_TRUE(backend.MappingPrewarmed(kSegment));
    EXPECT_FALSE(backend.MappingPrewarmed(kChunk));
    absl::StatusOr<uint64_t> other = backend.AllocateSegment(kChunk);
    EXPECT_TRUE(other.ok()) << other.status();
    EXPECT_EQ(job->own_acquires(), 1u);
    if (other.ok()) backend.FreeSegment(*other, kChunk);
    caller.Unlock();
  } else {
    ADD_FAILURE() << "the pre-warm maps with the caller's lock held";
  }

  held.let_go.Notify();
  absl::StatusOr<uint64_t> segment;
  {
    absl::MutexLock lock(&caller);
    caller.Await(absl::Condition(
        +[](DaemonBackend* b) { return !b->MappingPrewarmed(kSegment); }, &backend));
    segment = backend.AllocateSegment(kSegment);
  }
  advisor.join();
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_TRUE(*mapped);
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(job->own_acquires(), 1u) << "the pre-warmed segment: nothing asked";
  EXPECT_EQ(backend.held_bytes(), kSegment);
  EXPECT_EQ(backend.spare_bytes(), 0u);
  backend.FreeSegment(*segment, kSegment);
  job->FlushReleases();
  EXPECT_EQ(Status().in_use_bytes(), 0u);
}

// A daemon that stalls while a reclaim's frees give it the memory they
// made costs the first free the give's own deadline (not the lease's 10
// s), and the window's later frees nothing: they release what they made
// without asking, as when nobody is short. The next reclaim request is
// given to again. Every chunk goes back once: nothing stays in use.
TEST_F(DaemonTest, AGiveTheStalledDaemonDidNotTakeEndsGivingUntilItAsksAgain) {
  // Released in the background, as the interposer releases.
  std::unique_ptr<DaemonClient> giver_client =
      Client("giver", absl::ZeroDuration(), /*release_in_background=*/true);
  std::unique_ptr<DaemonClient> asker_client = Client("asker");
  auto mapper = std::make_unique<CountingMapper>();
  const CountingMapper& mapped = *mapper;
  DaemonBackend giver(giver_client.get(), std::move(mapper));
  DaemonBackend asker(asker_client.get());
  giver.set_client_creates(true);
  const MapPathCounters& counters = giver_client->map_path();
  constexpr size_t kSegment = 4 * kChunk;
  std::vector<uint64_t> made;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<uint64_t> segment = giver.AllocateSegment(kSegment);
    ASSERT_TRUE(segment.ok()) << segment.status();
    made.push_back(*segment);
  }
  const uint64_t chunks_each = counters.chunks_created.load() / 3;
  ASSERT_GT(chunks_each, 0u);
  // Told, and heard: the asker's acquire, on another connection, could
  // reach the daemon before the telemetry.
  auto publish_cached = [&](uint64_t bytes) {
    PublishAndAwaitRead(*giver_client, {{"reserved_bytes.all.current", bytes},
                                        {"allocated_bytes.all.current", 0}});
  };
  // The giver caches all three; a segment of 48 MiB, with 40 of the 64
  // left, is short by 8, which the daemon asks of it.
  ASSERT_NO_FATAL_FAILURE(publish_cached(3 * kSegment));
  absl::StatusOr<uint64_t> first;
  std::jthread ask_first([&] { first = asker.AllocateSegment(6 * kSegment); });
  std::vector<v1::ControlMessage> asked = AwaitControl(*giver_client);
  ASSERT_EQ(asked.size(), 1u);
  ASSERT_TRUE(asked[0].has_reclaim());

  const pid_t daemon = daemon_->pid();
  ASSERT_EQ(kill(daemon, SIGSTOP), 0);
  absl::Cleanup resume = [daemon] { kill(daemon, SIGCONT); };
  int stopped = 0;
  ASSERT_EQ(waitpid(daemon, &stopped, WUNTRACED), daemon);
  ASSERT_TRUE(WIFSTOPPED(stopped));
  const absl::Time start = absl::Now();
  giver.FreeSegment(made[0], kSegment);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << "the give's 200 ms";
  EXPECT_EQ(mapped.exports, chunks_each);
  EXPECT_EQ(counters.gives_failed.load(), 1u);
  EXPECT_EQ(counters.chunks_given.load(), 0u);
  // The same reclaim request: no give, nothing exported.
  giver.FreeSegment(made[1], kSegment);
  EXPECT_EQ(mapped.exports, chunks_each);
  EXPECT_EQ(counters.gives_failed.load(), 1u);
  std::move(resume).Invoke();
  ask_first.join();
  ASSERT_TRUE(first.ok()) << first.status();

  // 56 MiB in use: 16 more are short by 8, asked of the giver again.
  ASSERT_NO_FATAL_FAILURE(publish_cached(kSegment));
  absl::StatusOr<uint64_t> second;
  std::jthread ask_second([&] { second = asker.AllocateSegment(2 * kSegment); });
  asked = AwaitControl(*giver_client);
  ASSERT_EQ(asked.size(), 1u);
  ASSERT_TRUE(asked[0].has_reclaim());
  giver.FreeSegment(made[2], kSegment);
  EXPECT_EQ(mapped.exports, 2 * chunks_each);
  EXPECT_EQ(counters.chunks_given.load(), chunks_each);
  EXPECT_EQ(counters.gives_failed.load(), 1u);
  ask_second.join();
  ASSERT_TRUE(second.ok()) << second.status();

  EXPECT_EQ(giver.held_bytes(), 0u);
  asker.FreeSegment(*first, 6 * kSegment);
  asker.FreeSegment(*second, 2 * kSegment);
  giver_client->FlushReleases();
  EXPECT_EQ(Status().in_use_bytes(), 0u);
}

// A ChunkMapper on a device with no room left: the process can map what
// the daemon made but can make nothing itself.
class DeviceFullMapper : public CountingMapper {
 public:
  absl::StatusOr<uint64_t> Create(uint64_t, size_t) override {
    ++create_attempts;
    return absl::ResourceExhaustedError("cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY");
  }
  int create_attempts = 0;
};

// Where the process cannot make a chunk, the daemon makes the segment
// (and only it can reclaim other jobs' caches for room); nothing of the
// first grant stays counted.
TEST_F(DaemonTest, WhenTheDeviceHasNoRoomForTheClientsChunksTheDaemonMakesThem) {
  std::unique_ptr<DaemonClient> client = Client("full");
  auto mapper = std::make_unique<DeviceFullMapper>();
  DeviceFullMapper* const full = mapper.get();
  DaemonBackend backend(client.get(), std::move(mapper));
  backend.set_client_creates(true);
  absl::StatusOr<uint64_t> segment = backend.AllocateSegment(9 * kChunk);
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(full->create_attempts, 1);
  EXPECT_EQ(backend.client_create_fallbacks(), 1u);
  std::memset(reinterpret_cast<void*>(*segment), 5, 9 * kChunk);
  v1::StatusResponse status = Status();
  EXPECT_EQ(status.chunks_created_total(), 2u);  // 16 MiB + 2 MiB
  EXPECT_EQ(status.in_use_bytes(), 9 * kChunk);
  EXPECT_EQ(backend.held_bytes(), 9 * kChunk);
  backend.FreeSegment(*segment, 9 * kChunk);
  EXPECT_EQ(Status().free_bytes(), 9 * kChunk);  // the daemon's: cached

  // A failure that is not the device's is the caller's, as before.
  absl::StatusOr<uint64_t> too_big = backend.AllocateSegment(1000 * kChunk);
  EXPECT_FALSE(too_big.ok());
  EXPECT_EQ(backend.client_create_fallbacks(), 1u);
}

TEST_F(DaemonTest, OnlyAdminsMayAdminister) {
  if (getuid() != 0) GTEST_SKIP() << "needs root to act as another uid";
  // Let uid 65534 reach the socket: only the daemon's check stops it.
  ASSERT_EQ(chmod(dir_.path().c_str(), 0755), 0);
  ASSERT_EQ(chmod(socket_.c_str(), 0666), 0);
  Child nobody({"/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
                "--clear-groups", ALLOCCTL_BINARY, "--socket", socket_,
                "status"});
  EXPECT_EQ(nobody.Wait(), 4);  // PERMISSION_DENIED
  Child root({ALLOCCTL_BINARY, "--socket", socket_, "--json", "status"});
  EXPECT_THAT(root.Rest(), HasSubstr("\"backend\": \"sim\""));
  EXPECT_EQ(root.Wait(), 0);
}

TEST_F(DaemonTest, SigtermShutsDownGracefullyAndRemovesTheSockets) {
  std::unique_ptr<DaemonClient> client = Client();
  ASSERT_TRUE(client->Acquire(kChunk).ok());
  const pid_t pid = daemon_->pid();
  kill(pid, SIGTERM);
  const absl::Time start = absl::Now();
  EXPECT_EQ(daemon_->Wait(), 0);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_NE(access(socket_.c_str(), F_OK), 0);
  EXPECT_NE(access((socket_ + ".fds").c_str(), F_OK), 0);
}

}  // namespace
}  // namespace allocd
