#include "server/session_limits.h"

#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/daemon_core.h"
#include "server/metrics.h"
#include "server/pool/memfd_chunk_source.h"
#include "server/pool/node_pool.h"

namespace allocd {
namespace {

using ::testing::HasSubstr;

TEST(SessionLimitsTest, UnleasedSessionsAreBoundedPerTenantAndInTotal) {
  SessionLimits limits({.sessions = {.per_tenant = 10, .total = 20},
                        .unleased = {.per_tenant = 2, .total = 3}});
  EXPECT_TRUE(limits.Admit(1, "uid:1", "pid 1").ok());
  EXPECT_TRUE(limits.Admit(2, "uid:1", "pid 1").ok());
  absl::Status third = limits.Admit(3, "uid:1", "pid 1");
  EXPECT_TRUE(absl::IsResourceExhausted(third));
  EXPECT_THAT(third.message(),
              HasSubstr("--max-unleased-sessions-per-tenant=2"));
  EXPECT_TRUE(limits.Admit(4, "uid:2", "pid 2").ok());
  absl::Status total = limits.Admit(5, "uid:3", "pid 3");
  EXPECT_THAT(total.message(), HasSubstr("--max-unleased-sessions=3"));
  // A lease makes room; the leased session still counts as a session.
  limits.Leased(1);
  limits.Leased(1);  // once is enough
  EXPECT_TRUE(limits.Admit(3, "uid:1", "pid 1").ok());
  EXPECT_EQ(limits.sessions().held("uid:1"), 3u);
  EXPECT_EQ(limits.unleased().held("uid:1"), 2u);
  limits.Ended(1);
  limits.Ended(2);
  limits.Ended(99);  // never admitted
  EXPECT_EQ(limits.sessions().held("uid:1"), 1u);
  EXPECT_EQ(limits.unleased().held("uid:1"), 1u);
  EXPECT_EQ(limits.sessions().total(), 2u);
}

TEST(SessionLimitsTest, SessionsAreBoundedPerTenant) {
  SessionLimits limits({.sessions = {.per_tenant = 2, .total = 0},
                        .unleased = {}});
  EXPECT_TRUE(limits.Admit(1, "pod:a", "pid 1").ok());
  limits.Leased(1);
  EXPECT_TRUE(limits.Admit(2, "pod:a", "pid 1").ok());
  absl::Status refused = limits.Admit(3, "pod:a", "pid 1");
  EXPECT_THAT(refused.message(), HasSubstr("--max-sessions-per-tenant=2"));
  EXPECT_EQ(limits.unleased().held("pod:a"), 1u)
      << "a refused session counts nowhere";
}

class CoreLimitsTest : public ::testing::Test {
 protected:
  v1::RegisterRequest Hello(const std::string& current = "",
                            uint64_t current_version = 0) {
    v1::RegisterRequest r;
    r.set_protocol_version(1);
    r.set_job("flood");
    r.set_current_config(current);
    r.set_current_config_version(current_version);
    return r;
  }

  const PeerCredentials peer_{.pid = getpid(), .uid = getuid(),
                              .gid = getgid()};
  MemfdChunkSource source_;
  NodePool pool_{&source_, uint64_t{1} << 30};
  Metrics metrics_;
};

TEST_F(CoreLimitsTest, RegistrationsPastTheUnleasedBoundAreRefusedUntilLeased) {
  DaemonCore core({.session_limits = {.sessions = {.per_tenant = 100},
                                      .unleased = {.per_tenant = 3}}},
                  &pool_, &metrics_);
  std::vector<v1::RegisterResponse> sessions;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<v1::RegisterResponse> r = core.Register(peer_, Hello());
    ASSERT_TRUE(r.ok()) << r.status();
    sessions.push_back(*r);
  }
  absl::StatusOr<v1::RegisterResponse> refused = core.Register(peer_, Hello());
  ASSERT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  EXPECT_THAT(refused.status().message(),
              HasSubstr("--max-unleased-sessions-per-tenant=3"));
  EXPECT_EQ(core.session_count(), 3u) << "a refused registration leaves none";
  ASSERT_TRUE(core.Lease(peer_, sessions[0].session_id(),
                         sessions[0].session_secret())
                  .ok());
  EXPECT_TRUE(core.Register(peer_, Hello()).ok());
  core.EndSession(sessions[1].session_id(), "test");
  EXPECT_TRUE(core.Register(peer_, Hello()).ok());
}

TEST_F(CoreLimitsTest, DeclaredConfigsOfEndedSessionsArePruned) {
  DaemonCore core({}, &pool_, &metrics_);
  // A session that lives on keeps the version it runs however many come
  // after it.
  absl::StatusOr<v1::RegisterResponse> keeper =
      core.Register(peer_, Hello("max_split_size_mb:64", 7));
  ASSERT_TRUE(keeper.ok());
  const uint64_t kept = keeper->current_config_version();
  // 20,000 registrations, each declaring a config this daemon does not
  // know (a version each), each ended before the next.
  for (int i = 0; i < 20000; ++i) {
    absl::StatusOr<v1::RegisterResponse> r = core.Register(
        peer_, Hello(absl::StrCat("max_split_size_mb:", 100 + i), 1));
    ASSERT_TRUE(r.ok()) << r.status();
    core.EndSession(r->session_id(), "test");
  }
  EXPECT_LE(core.configs().version_count(), 2 * 1024 + 1);
  std::optional<ConfigRecord> still = core.configs().Find(kept);
  ASSERT_TRUE(still.has_value()) << "a live session's version was pruned";
  EXPECT_EQ(still->config, "max_split_size_mb:64");
}

}  // namespace
}  // namespace allocd
