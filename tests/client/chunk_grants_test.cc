// ChunkGrants against the daemon's end of a lease played by the test, so
// that the order in which requests reach the daemon is the test's to set.
#include "client/chunk_grants.h"

#include <fcntl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/protocol.h"

namespace allocd {
namespace {

using ::testing::ElementsAre;

constexpr uint64_t kChunk = uint64_t{2} << 20;

// One session's lease, the daemon's end served by a thread: an acquire is
// granted one new chunk per kChunk asked (ids epoch * 100 + 1, + 2, ...),
// or answered would_wait while a chunk it waits for is not yet released; a
// release, a declaration and a give are taken. Each request goes to the log
// as a line ("acquire", "would_wait", "release 101 102", "declare 201",
// "give 101").
class FakeLease {
 public:
  // gRPC, where the client goes when the lease says would_wait, answers
  // nothing: a socket nobody listens on.
  FakeLease(uint64_t epoch, const std::string& nowhere)
      : connection_(std::make_shared<Connection>()), next_id_(epoch * 100 + 1) {
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    daemon_end_.reset(fds[0]);
    connection_->epoch = epoch;
    connection_->pool = {.chunk_bytes = kChunk, .capacity = 64 * kChunk};
    connection_->lease_acquires = true;
    connection_->adopts_chunks = true;
    connection_->stub = v1::Allocd::NewStub(grpc::CreateChannel(
        "unix:" + nowhere, grpc::InsecureChannelCredentials()));
    {
      absl::MutexLock lock(&connection_->lease_mu);
      connection_->lease.reset(fds[1]);
    }
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeLease() {
    shutdown(daemon_end_.get(), SHUT_RDWR);
    thread_.join();
  }

  const std::shared_ptr<Connection>& connection() const { return connection_; }

  // Releases are answered only once Answer() is called (they still arrive).
  void HoldReleases() {
    absl::MutexLock lock(&mu_);
    holding_ = true;
  }
  void AnswerReleases() {
    absl::MutexLock lock(&mu_);
    holding_ = false;
  }
  // Likewise gives: a daemon that stalls while it is given memory.
  void HoldGives() {
    absl::MutexLock lock(&mu_);
    holding_gives_ = true;
  }
  void AnswerGives() {
    absl::MutexLock lock(&mu_);
    holding_gives_ = false;
  }
  // Acquires are answered would_wait until chunk `id` is released; then
  // `on_refused` runs (on the serving thread, after the answer is sent).
  void WaitFor(uint64_t id, std::function<void()> on_refused) {
    absl::MutexLock lock(&mu_);
    awaited_ = id;
    on_refused_ = std::move(on_refused);
  }
  std::vector<std::string> log() const {
    absl::MutexLock lock(&mu_);
    return log_;
  }
  // Returns once `line` is in the log: the request arrived.
  void AwaitRequest(const std::string& line) const {
    absl::MutexLock lock(&mu_);
    auto arrived = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return std::find(log_.begin(), log_.end(), line) != log_.end();
    };
    mu_.Await(absl::Condition(&arrived));
  }

 private:
  void Serve() {
    for (;;) {
      absl::StatusOr<ReceivedMessage> frame =
          ReceiveMessage(daemon_end_.get(), kMaxSideMessageBytes);
      if (!frame.ok()) return;  // the client end closed
      v1::SideRequest request;
      ASSERT_TRUE(request.ParseFromString(frame->payload));
      v1::SideResponse response;
      std::vector<UniqueFd> memory;
      std::function<void()> after;
      {
        absl::MutexLock lock(&mu_);
        if (request.has_release()) {
          log_.push_back(absl::StrCat(
              "release ", absl::StrJoin(request.release().chunk_ids(), " ")));
          for (uint64_t id : request.release().chunk_ids()) {
            if (id == awaited_) awaited_ = 0;
          }
          mu_.Await(absl::Condition(
              +[](bool* holding) { return !*holding; }, &holding_));
        } else if (request.has_give_memory()) {
          log_.push_back(absl::StrCat(
              "give ", absl::StrJoin(request.give_memory().chunk_ids(), " ")));
          mu_.Await(absl::Condition(
              +[](bool* holding) { return !*holding; }, &holding_gives_));
        } else if (request.has_declare()) {
          log_.push_back(absl::StrCat(
              "declare ", absl::StrJoin(request.declare().chunk_ids(), " ")));
          *response.mutable_adopted_chunk_ids() = request.declare().chunk_ids();
        } else if (request.has_acquire() && awaited_ != 0) {
          log_.push_back("would_wait");
          response.set_would_wait(true);
          after = std::move(on_refused_);
        } else if (request.has_acquire()) {
          log_.push_back("acquire");
          for (uint64_t b = 0; b < request.acquire().bytes(); b += kChunk) {
            response.add_chunk_ids(next_id_++);
            response.add_offsets(0);
            response.add_sizes(kChunk);
            memory.emplace_back(open("/dev/null", O_RDONLY | O_CLOEXEC));
          }
        }
      }
      std::vector<int> fds;
      for (const UniqueFd& fd : memory) fds.push_back(fd.get());
      ASSERT_TRUE(
          SendMessage(daemon_end_.get(), response.SerializeAsString(), fds).ok());
      if (after) after();
    }
  }

  const std::shared_ptr<Connection> connection_;
  UniqueFd daemon_end_;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_);
  bool holding_ ABSL_GUARDED_BY(mu_) = false;
  bool holding_gives_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t awaited_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void()> on_refused_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> log_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// A client's grants releasing in the background over two sessions, the
// first (epoch 1) replaced by the second (epoch 2) after it granted a
// chunk, as when the daemon restarts: a release of that chunk, held on the
// first lease, keeps the releaser busy while the second's wait.
class ChunkGrantsTest : public ::testing::Test {
 protected:
  // Chunk 101 granted by the first session, released, its release in
  // flight and held there; the second session serves.
  void ReleaseInFlightOnTheFirstSession() {
    absl::StatusOr<ReceivedChunks> first = grants_.Acquire(kChunk, kChunk, false);
    ASSERT_TRUE(first.ok()) << first.status();
    ASSERT_THAT(first->ids, ElementsAre(101));
    first_.HoldReleases();
    grants_.ReleaseSoon(first->epoch, first->ids);
    ASSERT_TRUE(active_.Serve(second_.connection()));
  }

  DaemonClientOptions options_{.reconnect_wait = absl::Seconds(1),
                               .rpc_timeout = absl::Seconds(1),
                               .release_in_background = true};
  FakeLease first_{1, "/nonexistent/allocd.sock"};
  FakeLease second_{2, "/nonexistent/allocd.sock"};
  ActiveConnection active_{first_.connection()};
  HeldChunks held_;
  ChunkGrants grants_{options_, active_, held_, [](uint64_t) {}};
};

TEST_F(ChunkGrantsTest, APendingReleaseReachesTheDaemonBeforeAnAcquireItCannotGrantAtOnce) {
  ReleaseInFlightOnTheFirstSession();
  absl::StatusOr<ReceivedChunks> held = grants_.Acquire(kChunk, kChunk, false);
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_THAT(held->ids, ElementsAre(201));
  grants_.ReleaseSoon(held->epoch, held->ids);  // waits behind 101's
  // The pool is full until 201 comes back: the next acquire is answered
  // would_wait, and only then may the first session answer.
  second_.WaitFor(201, [this] { first_.AnswerReleases(); });
  absl::StatusOr<ReceivedChunks> again = grants_.Acquire(kChunk, kChunk, false);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_THAT(again->ids, ElementsAre(202));
  EXPECT_THAT(second_.log(),
              ElementsAre("acquire", "would_wait", "release 201", "acquire"));
  EXPECT_THAT(first_.log(), ElementsAre("acquire", "release 101"));
}

TEST_F(ChunkGrantsTest, ReleasesHandedOverWhileOneIsInFlightGoInOneCall) {
  ReleaseInFlightOnTheFirstSession();
  std::vector<uint64_t> ids;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<ReceivedChunks> got = grants_.Acquire(kChunk, kChunk, false);
    ASSERT_TRUE(got.ok()) << got.status();
    ids.insert(ids.end(), got->ids.begin(), got->ids.end());
  }
  for (uint64_t id : ids) grants_.ReleaseSoon(2, {id});
  EXPECT_TRUE(grants_.ReleasesPending());
  first_.AnswerReleases();
  grants_.FlushReleases();  // (the releaser may have delivered them already)
  EXPECT_THAT(second_.log(), ElementsAre("acquire", "acquire", "acquire",
                                         "release 201 202 203"));
  EXPECT_EQ(grants_.background_release_calls(), 2u);  // 101's, then these
  EXPECT_FALSE(grants_.FlushReleases());
}

TEST_F(ChunkGrantsTest, AChunkReleasedIsNoLongerTheProcesssWhileItsReleaseWaits) {
  ReleaseInFlightOnTheFirstSession();
  absl::StatusOr<ReceivedChunks> kept = grants_.Acquire(2 * kChunk, kChunk, false);
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_THAT(kept->ids, ElementsAre(201, 202));
  grants_.ReleaseSoon(2, {202});
  // The daemon restarts before 202's release is delivered: the new one
  // hears of 201 alone, so it promises 202 to nobody twice.
  FakeLease third(3, "/nonexistent/allocd.sock");
  held_.DeclareTo(*third.connection(), absl::Seconds(1));
  EXPECT_THAT(third.log(), ElementsAre("declare 201"));
  first_.AnswerReleases();
  grants_.FlushReleases();
  EXPECT_FALSE(grants_.ReleasesPending());
  EXPECT_THAT(second_.log(), ElementsAre("acquire", "release 202"));
}

// A give on the free path waits for the daemon no longer than its own
// deadline; the lease stays in step: the give's late answer is read before
// the next call's, which gets its own.
TEST_F(ChunkGrantsTest, AGiveTheDaemonAnswersLateLeavesTheLeaseInStep) {
  absl::StatusOr<ReceivedChunks> made = grants_.Acquire(kChunk, kChunk, false);
  ASSERT_TRUE(made.ok()) << made.status();
  ASSERT_THAT(made->ids, ElementsAre(101));
  UniqueFd memory(open("/dev/null", O_RDONLY | O_CLOEXEC));
  first_.HoldGives();
  const int fds[] = {memory.get()};
  absl::Status given =
      grants_.GiveMemory(made->epoch, made->ids, fds, absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(given)) << given;
  first_.AnswerGives();
  absl::Status released = grants_.Release(made->epoch, made->ids);
  EXPECT_TRUE(released.ok()) << released;
  absl::StatusOr<ReceivedChunks> next = grants_.Acquire(kChunk, kChunk, false);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_THAT(next->ids, ElementsAre(102));
  EXPECT_THAT(first_.log(),
              ElementsAre("acquire", "give 101", "release 101", "acquire"));
}

// A give's deadline counts its wait for its turn on the lease: behind a
// release the daemon is slow to answer, it gives up unsent.
TEST_F(ChunkGrantsTest, AGiveBehindACallTheDaemonHoldsGivesUpUnsent) {
  absl::StatusOr<ReceivedChunks> made = grants_.Acquire(kChunk, kChunk, false);
  ASSERT_TRUE(made.ok()) << made.status();
  absl::StatusOr<ReceivedChunks> freed = grants_.Acquire(kChunk, kChunk, false);
  ASSERT_TRUE(freed.ok()) << freed.status();
  ASSERT_THAT(freed->ids, ElementsAre(102));
  first_.HoldReleases();
  grants_.ReleaseSoon(freed->epoch, freed->ids);
  first_.AwaitRequest("release 102");
  UniqueFd memory(open("/dev/null", O_RDONLY | O_CLOEXEC));
  const int fds[] = {memory.get()};
  absl::Status given =
      grants_.GiveMemory(made->epoch, made->ids, fds, absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(given)) << given;
  first_.AnswerReleases();
  grants_.FlushReleases();
  absl::StatusOr<ReceivedChunks> next = grants_.Acquire(kChunk, kChunk, false);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_THAT(next->ids, ElementsAre(103));
  EXPECT_THAT(first_.log(),
              ElementsAre("acquire", "acquire", "release 102", "acquire"));
}

// A call with no time left asks nothing: a give whose deadline passed
// before it reached the lease sends no request the lease would then owe
// an answer to.
TEST_F(ChunkGrantsTest, AGiveWithNoTimeLeftAsksNothing) {
  absl::StatusOr<ReceivedChunks> made = grants_.Acquire(kChunk, kChunk, false);
  ASSERT_TRUE(made.ok()) << made.status();
  UniqueFd memory(open("/dev/null", O_RDONLY | O_CLOEXEC));
  const int fds[] = {memory.get()};
  absl::Status given =
      grants_.GiveMemory(made->epoch, made->ids, fds, absl::ZeroDuration());
  EXPECT_TRUE(absl::IsDeadlineExceeded(given)) << given;
  absl::StatusOr<ReceivedChunks> next = grants_.Acquire(kChunk, kChunk, false);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_THAT(next->ids, ElementsAre(102));
  EXPECT_THAT(first_.log(), ElementsAre("acquire", "acquire"));
}

}  // namespace
}  // namespace allocd
