// No memory crosses tenants (node_pool.h, "Tenants"): every path the pool
// hands cached memory out by. The processes that map chunks are real ones
// (forked holders), some of which the pool never gave the chunk to.
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ipc/unix_socket.h"
#include "server/metrics.h"
#include "server/pool/device_pools.h"
#include "server/pool/node_pool.h"
#include "server/pool_metrics.h"
#include "tests/server/pool/node_pool_fixture.h"

namespace allocd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Contains;

constexpr char kTenantA[] = "uid:1001";
constexpr char kTenantB[] = "uid:1002";
constexpr char kMarker[] = "tenant A's secret";

// A process that maps the chunks it is sent and keeps them mapped until it
// exits: a client that holds on to memory after releasing it. It reads and
// writes the start of its latest mapping on request.
class Holder {
 public:
  Holder() {
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    pid_ = fork();
    if (pid_ == 0) {
      close(fds[0]);
      Serve(fds[1]);
    }
    close(fds[1]);
    socket_.reset(fds[0]);
  }
  ~Holder() { Exit(); }
  pid_t pid() const { return pid_; }

  // Maps `chunk` whole, shared, and keeps it mapped.
  void Map(const ChunkFd& chunk) {
    ASSERT_TRUE(SendMessage(socket_.get(), absl::StrCat("map ", chunk.bytes),
                            {chunk.fd.get()})
                    .ok());
    Answer();
  }
  // What its latest mapping starts with (up to the first NUL).
  std::string Read() {
    EXPECT_TRUE(SendMessage(socket_.get(), "read").ok());
    return Answer();
  }
  void Write(absl::string_view text) {
    ASSERT_TRUE(SendMessage(socket_.get(), absl::StrCat("write ", text)).ok());
    Answer();
  }
  // Ends it (its mappings go with it) and reaps it; with `kill9`, SIGKILL.
  void Exit(bool kill9 = false) {
    if (pid_ <= 0) return;
    if (kill9) kill(pid_, SIGKILL);
    socket_.reset();
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = 0;
  }

 private:
  std::string Answer() {
    absl::StatusOr<ReceivedMessage> answer =
        ReceiveMessage(socket_.get(), 4096, absl::Seconds(30));
    EXPECT_TRUE(answer.ok()) << answer.status();
    return answer.ok() ? answer->payload : "";
  }
  [[noreturn]] static void Serve(int socket) {
    char* mapping = nullptr;
    for (;;) {
      absl::StatusOr<ReceivedMessage> m = ReceiveMessage(socket, 4096);
      if (!m.ok()) _exit(0);
      std::string reply = "ok";
      if (absl::StartsWith(m->payload, "map ") && m->fds.size() == 1) {
        const size_t bytes = std::stoull(m->payload.substr(4));
        void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                       m->fds[0].get(), 0);
        if (p == MAP_FAILED) _exit(2);
        mapping = static_cast<char*>(p);  // kept mapped; the FD closes
      } else if (m->payload == "read" && mapping != nullptr) {
        reply = std::string(mapping, strnlen(mapping, 256));
      } else if (absl::StartsWith(m->payload, "write ") &&
                 mapping != nullptr) {
        std::strcpy(mapping, m->payload.c_str() + 6);
      }
      if (!SendMessage(socket, reply).ok()) _exit(0);
    }
  }

  pid_t pid_ = 0;
  UniqueFd socket_;
};

// What a claimed chunk starts with (up to the first NUL), and whether all
// of it is zero.
std::string Head(const ChunkFd& chunk) {
  char* p = Map(chunk);
  std::string head(p, strnlen(p, 256));
  munmap(p, chunk.bytes);
  return head;
}
bool AllZero(const ChunkFd& chunk) {
  char* p = Map(chunk);
  bool zero = true;
  for (uint64_t i = 0; i < chunk.bytes && zero; ++i) zero = p[i] == 0;
  munmap(p, chunk.bytes);
  return zero;
}
void Write(const ChunkFd& chunk, absl::string_view text) {
  char* p = Map(chunk);
  std::memcpy(p, text.data(), text.size());
  std::memcpy(p + chunk.bytes - text.size(), text.data(), text.size());
  munmap(p, chunk.bytes);
}

class ChunkTenancyTest : public NodePoolTest {
 protected:

  // Session 1 of tenant A, run by `holder`, gets one chunk, maps it in the
  // holder and fills it with the marker; returns the chunk's id.
  uint64_t FillAsTenantA(NodePool& pool, Holder& holder) {
    EXPECT_TRUE(pool.AddSession(1, 1001, holder.pid(), kTenantA).ok());
    absl::StatusOr<Grant> a = pool.Acquire(1, kChunk);
    EXPECT_TRUE(a.ok()) << a.status();
    absl::StatusOr<std::vector<ChunkFd>> fds =
        ClaimAll(pool, a->token, holder.pid());
    EXPECT_TRUE(fds.ok()) << fds.status();
    Write((*fds)[0], kMarker);
    holder.Map((*fds)[0]);
    EXPECT_EQ(holder.Read(), kMarker);
    return a->chunk_ids[0];
  }
  // FillAsTenantA, then the chunk released and its holder exited: A's
  // cached memory, which no live process maps.
  uint64_t FilledReleasedAndLeftByTenantA(NodePool& pool) {
    Holder holder;
    const uint64_t a = FillAsTenantA(pool, holder);
    EXPECT_TRUE(pool.Release(1, {a}).ok());
    holder.Exit();
    return a;
  }
  // Session `id` of `tenant` (this process) acquires `chunks` chunks and
  // claims them.
  std::vector<ChunkFd> AcquireAs(NodePool& pool, SessionId id,
                                 const TenantId& tenant, uint64_t chunks) {
    if (!pool.Stats().sessions.contains(id)) {
      EXPECT_TRUE(pool.AddSession(id, 1002, getpid(), tenant).ok());
    }
    absl::StatusOr<Grant> grant = pool.Acquire(id, chunks * kChunk);
    EXPECT_TRUE(grant.ok()) << grant.status();
    if (!grant.ok()) return {};
    absl::StatusOr<std::vector<ChunkFd>> fds =
        ClaimAll(pool, grant->token, getpid());
    EXPECT_TRUE(fds.ok()) << fds.status();
    return fds.ok() ? *std::move(fds) : std::vector<ChunkFd>{};
  }
};

std::vector<uint64_t> Ids(const std::vector<ChunkFd>& fds) {
  std::vector<uint64_t> ids;
  for (const ChunkFd& fd : fds) ids.push_back(fd.id);
  return ids;
}

TEST_F(ChunkTenancyTest, AnotherTenantsCachedChunkIsDestroyedAndCreatedAgain) {
  auto pool = MakePool(1);
  const uint64_t a = FilledReleasedAndLeftByTenantA(*pool);

  std::vector<ChunkFd> b = AcquireAs(*pool, 2, kTenantB, 1);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_NE(b[0].id, a);
  EXPECT_TRUE(AllZero(b[0]));
  const PoolStats stats = pool->Stats();
  EXPECT_EQ(stats.chunks_reused_total, 0u);
  EXPECT_EQ(stats.trimmed_bytes_total, kChunk);
  EXPECT_EQ(source_.created.load(), 2);
  // The same tenant still reuses its own as it was.
  ASSERT_TRUE(pool->Release(2, Ids(b)).ok());
  std::vector<ChunkFd> again = AcquireAs(*pool, 3, kTenantB, 1);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].id, b[0].id);
}

TEST_F(ChunkTenancyTest, AKilledTenantsChunksNeverGoToAnotherTenant) {
  auto pool = MakePool(4);
  Holder holder;
  const uint64_t a = FillAsTenantA(*pool, holder);
  holder.Exit(/*kill9=*/true);
  EXPECT_EQ(pool->EndSession(1), kChunk);  // what the daemon does on kill -9

  std::vector<ChunkFd> b = AcquireAs(*pool, 2, kTenantB, 1);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_NE(b[0].id, a);
  EXPECT_TRUE(AllZero(b[0]));
}

TEST_F(ChunkTenancyTest, TheSameTenantsChunkComesBackAsItWas) {
  auto pool = MakePool(4);
  Holder holder;
  const uint64_t a = FillAsTenantA(*pool, holder);
  ASSERT_TRUE(pool->Release(1, {a}).ok());
  // Even while its releaser still maps it: one tenant, one trust domain.
  std::vector<ChunkFd> again = AcquireAs(*pool, 2, kTenantA, 1);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].id, a);
  EXPECT_EQ(Head(again[0]), kMarker);
}

TEST_F(ChunkTenancyTest, AChunkItsLiveReleaserMapsNeverGoesToAnotherTenant) {
  auto pool = MakePool(2);
  Holder holder;
  const uint64_t a = FillAsTenantA(*pool, holder);
  ASSERT_TRUE(pool->Release(1, {a}).ok());

  // B asks for two chunks while the releaser still maps A's: the pool has
  // room for one more and destroys A's cached chunk for the other, rather
  // than hand it over.
  std::vector<ChunkFd> b = AcquireAs(*pool, 2, kTenantB, 2);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_THAT(Ids(b), Not(Contains(a)));
  for (const ChunkFd& chunk : b) Write(chunk, "tenant B's secret");
  EXPECT_EQ(holder.Read(), kMarker);  // its own old memory, not B's
  holder.Write("tenant A writes on");
  for (const ChunkFd& chunk : b) EXPECT_EQ(Head(chunk), "tenant B's secret");
  const PoolStats stats = pool->Stats();
  EXPECT_EQ(stats.created_bytes, 2 * kChunk);
  EXPECT_EQ(stats.chunks_reused_total, 0u);
  EXPECT_EQ(stats.trimmed_bytes_total, kChunk);
}

TEST_F(ChunkTenancyTest, AChunkNeverCrossesEvenOnceItsReleaserHasExited) {
  auto pool = MakePool(4);
  const uint64_t a = FilledReleasedAndLeftByTenantA(*pool);

  // No process the pool knows of maps A's chunk any more; one it does not
  // know of (a fork child, an FD passed on) still may: B never gets it.
  std::vector<ChunkFd> b = AcquireAs(*pool, 2, kTenantB, 4);
  ASSERT_EQ(b.size(), 4u);
  EXPECT_THAT(Ids(b), Not(Contains(a)));
  for (const ChunkFd& chunk : b) EXPECT_TRUE(AllZero(chunk));
  EXPECT_EQ(pool->Stats().chunks_reused_total, 0u);
}

TEST_F(ChunkTenancyTest, ReadAheadServesOnlyItsTenantsCachedChunks) {
  auto pool = MakePool(4);
  const uint64_t a = FilledReleasedAndLeftByTenantA(*pool);

  ASSERT_TRUE(pool->AddSession(2, 1002, getpid(), kTenantB).ok());
  absl::StatusOr<Grant> ahead = pool->AcquireCached(2, kChunk, kChunk, 4);
  ASSERT_TRUE(ahead.ok()) << ahead.status();
  EXPECT_TRUE(ahead->chunk_ids.empty());
  // Made by the client, then: none of them A's.
  ahead = pool->AcquireCached(2, kChunk, kChunk, 4, /*client_creates=*/true);
  ASSERT_TRUE(ahead.ok()) << ahead.status();
  EXPECT_EQ(ahead->reused_chunks, 0u);
  EXPECT_THAT(ahead->chunk_ids, Not(Contains(a)));

  ASSERT_TRUE(pool->AddSession(3, 1001, getpid(), kTenantA).ok());
  ahead = pool->AcquireCached(3, kChunk, kChunk, 4);
  ASSERT_TRUE(ahead.ok()) << ahead.status();
  ASSERT_EQ(ahead->chunk_ids, std::vector<uint64_t>{a});
  absl::StatusOr<std::vector<ChunkFd>> fds =
      ClaimAll(*pool, ahead->token, getpid());
  ASSERT_TRUE(fds.ok()) << fds.status();
  EXPECT_EQ(Head((*fds)[0]), kMarker);
}

TEST_F(ChunkTenancyTest, GivenMemoryNeverCrosses) {
  auto pool = MakePool(2);
  Holder giver;
  ASSERT_TRUE(pool->AddSession(1, 1001, giver.pid(), kTenantA).ok());
  absl::StatusOr<Grant> made =
      pool->Acquire(1, kChunk, UINT64_MAX, /*client_creates=*/true);
  ASSERT_TRUE(made.ok()) << made.status();
  ASSERT_EQ(made->client_made, 1u);
  // The client makes the chunk, maps it, writes, and gives it to the pool.
  absl::StatusOr<ChunkMemory> memory = source_.memfd.CreateChunk(kChunk);
  ASSERT_TRUE(memory.ok());
  ChunkFd own{.id = made->chunk_ids[0],
              .fd = *DuplicateFd(memory->file->get()),
              .bytes = kChunk};
  Write(own, kMarker);
  giver.Map(own);
  std::vector<UniqueFd> given;
  given.push_back(*DuplicateFd(memory->file->get()));
  ASSERT_TRUE(pool->GiveMemory(1, made->chunk_ids, std::move(given)).ok());
  ASSERT_TRUE(pool->Release(1, made->chunk_ids).ok());
  giver.Exit();

  std::vector<ChunkFd> b = AcquireAs(*pool, 2, kTenantB, 2);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_THAT(Ids(b), Not(Contains(made->chunk_ids[0])));
  for (const ChunkFd& chunk : b) EXPECT_TRUE(AllZero(chunk));
}

TEST_F(ChunkTenancyTest, AnAdoptedChunkIsItsDeclarersTenants) {
  auto pool = MakePool(2);
  Holder declarer;
  ASSERT_TRUE(pool->AddSession(1, 1001, declarer.pid(), kTenantA).ok());
  absl::StatusOr<ChunkMemory> memory = source_.memfd.CreateChunk(kChunk);
  ASSERT_TRUE(memory.ok());
  ChunkFd held{.id = 77, .fd = *DuplicateFd(memory->file->get()),
               .bytes = kChunk};
  Write(held, kMarker);
  declarer.Map(held);
  std::vector<DeclaredChunk> declared;
  declared.push_back(DeclaredChunk{
      .id = 77, .bytes = kChunk, .fd = *DuplicateFd(memory->file->get())});
  absl::StatusOr<AdoptOutcome> adopted = pool->Adopt(1, std::move(declared));
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  ASSERT_EQ(adopted->adopted, std::vector<uint64_t>{77});
  ASSERT_TRUE(pool->Release(1, {77}).ok());
  declarer.Exit();

  std::vector<ChunkFd> b = AcquireAs(*pool, 2, kTenantB, 2);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_THAT(Ids(b), Not(Contains(77u)));
}

TEST_F(ChunkTenancyTest, SharesDoNotCrossTenants) {
  auto pool = MakePool(4);
  ASSERT_TRUE(pool->AddSession(1, 1001, getpid(), kTenantA).ok());
  ASSERT_TRUE(pool->AddSession(2, 1002, getpid(), kTenantB).ok());
  ASSERT_TRUE(pool->AddSession(3, 1001, getpid(), kTenantA).ok());
  absl::StatusOr<Grant> a = pool->Acquire(1, kChunk);
  ASSERT_TRUE(a.ok());
  absl::StatusOr<std::string> share = pool->Share(1, a->chunk_ids);
  ASSERT_TRUE(share.ok()) << share.status();

  absl::StatusOr<Grant> other = pool->OpenShare(2, *share);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(other.status().message(), HasSubstr("--tenancy node"));
  absl::StatusOr<Grant> same = pool->OpenShare(3, *share);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->chunk_ids, a->chunk_ids);
}

TEST_F(ChunkTenancyTest, UnderOneTenantEveryChunkIsReusedAsItWas) {
  auto pool = MakePool(4);
  Holder holder;
  ASSERT_TRUE(pool->AddSession(1, 1001, holder.pid(), "node").ok());
  absl::StatusOr<Grant> a = pool->Acquire(1, kChunk);
  ASSERT_TRUE(a.ok());
  absl::StatusOr<std::vector<ChunkFd>> fds =
      ClaimAll(*pool, a->token, holder.pid());
  ASSERT_TRUE(fds.ok());
  Write((*fds)[0], kMarker);
  ASSERT_TRUE(pool->Release(1, a->chunk_ids).ok());
  std::vector<ChunkFd> b = AcquireAs(*pool, 2, "node", 1);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(Head(b[0]), kMarker);
}

TEST_F(ChunkTenancyTest, ClientMadeGrantsTakeNoneOfAnotherTenantsChunks) {
  auto pool = MakePool(2);
  const uint64_t a = FilledReleasedAndLeftByTenantA(*pool);

  ASSERT_TRUE(pool->AddSession(2, 1002, getpid(), kTenantB).ok());
  absl::StatusOr<Grant> b =
      pool->Acquire(2, 2 * kChunk, UINT64_MAX, /*client_creates=*/true);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->chunk_ids.size(), 2u);
  EXPECT_THAT(b->chunk_ids, Not(Contains(a)));
  EXPECT_EQ(b->reused_chunks, 0u);
  EXPECT_EQ(b->client_made, 2u);
}

TEST_F(ChunkTenancyTest, AProcessTheReleaserPassedItsChunkToNeverSeesAnotherTenant) {
  auto pool = MakePool(1);
  // Started first: a holder forked later would hold the releaser's socket
  // open, and the releaser would never see it close.
  Holder accomplice;
  Holder releaser;
  ASSERT_TRUE(pool->AddSession(1, 1001, releaser.pid(), kTenantA).ok());
  absl::StatusOr<Grant> a = pool->Acquire(1, kChunk);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<std::vector<ChunkFd>> fds =
      ClaimAll(*pool, a->token, releaser.pid());
  ASSERT_TRUE(fds.ok()) << fds.status();
  Write((*fds)[0], kMarker);
  releaser.Map((*fds)[0]);
  // The releaser hands the chunk on to a process the pool never gave it
  // to (its FD over SCM_RIGHTS, or a fork child's inherited mapping), then
  // releases it and exits.
  accomplice.Map((*fds)[0]);
  fds->clear();
  ASSERT_TRUE(pool->Release(1, {a->chunk_ids[0]}).ok());
  releaser.Exit();

  std::vector<ChunkFd> b = AcquireAs(*pool, 2, kTenantB, 1);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_TRUE(AllZero(b[0]));
  Write(b[0], "tenant B's secret");
  // The accomplice keeps A's old memory: B's is other memory.
  EXPECT_EQ(accomplice.Read(), kMarker);
  accomplice.Write("tenant A writes on");
  EXPECT_EQ(Head(b[0]), "tenant B's secret");
}

TEST_F(ChunkTenancyTest, AnEmptyTenantIsRefused) {
  auto pool = MakePool(1);
  EXPECT_EQ(pool->AddSession(1, 1001, getpid(), "").code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace allocd
