#include "server/session_access.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "server/session_registry.h"

namespace allocd {
namespace {

TEST(SessionAccessTest, ASessionIsProvenByItsProcessAndItsSecret) {
  SessionRegistry sessions;
  SessionAccess access(&sessions, {});
  std::shared_ptr<Session> session =
      sessions.Create({.pid = 4242, .uid = 1000, .tenant = "uid:1000"});
  const std::string& secret = session->secret();
  absl::StatusOr<std::shared_ptr<Session>> owned =
      access.OwnedSession({.pid = 4242, .uid = 1000}, session->id(), secret);
  ASSERT_TRUE(owned.ok()) << owned.status();
  EXPECT_EQ(*owned, session);
}

// Every way of not holding a session gets the one answer an unknown session
// gets: a caller learns nothing of sessions it does not hold.
TEST(SessionAccessTest, ASessionNotHeldIsAnsweredAsOneThatNeverWas) {
  SessionRegistry sessions;
  SessionAccess access(&sessions, {});
  std::shared_ptr<Session> session =
      sessions.Create({.pid = 4242, .uid = 1000, .tenant = "uid:1000"});
  const SessionId id = session->id();
  const std::string secret = session->secret();
  std::string guessed = secret;
  guessed.back() ^= 1;
  const PeerCredentials owner{.pid = 4242, .uid = 1000};
  const absl::Status never =
      access.OwnedSession(owner, id + 1, secret).status();
  // The same answer for an unknown id as for the session under this id, so
  // the text does not name the id: compare with it swapped in.
  auto same_as_never = [&](const absl::Status& s) {
    EXPECT_TRUE(absl::IsNotFound(s)) << s;
    EXPECT_EQ(std::string(s.message()), std::string(never.message()).replace(
        never.message().find(std::to_string(id + 1)),
        std::to_string(id + 1).size(), std::to_string(id)));
  };
  ASSERT_TRUE(absl::IsNotFound(never)) << never;
  same_as_never(access.OwnedSession(owner, id, guessed).status());
  same_as_never(access.OwnedSession(owner, id, "").status());
  // The right secret from another process, or another uid, is not enough.
  same_as_never(
      access.OwnedSession({.pid = 4243, .uid = 1000}, id, secret).status());
  same_as_never(
      access.OwnedSession({.pid = 4242, .uid = 1001}, id, secret).status());
  sessions.Remove(id);
  same_as_never(access.OwnedSession(owner, id, secret).status());
}

TEST(SessionAccessTest, SecretsAreFreshAndLong) {
  SessionRegistry sessions;
  std::shared_ptr<Session> a = sessions.Create({.pid = 1});
  std::shared_ptr<Session> b = sessions.Create({.pid = 1});
  EXPECT_GE(a->secret().size() * 8, 128u);
  EXPECT_NE(a->secret(), b->secret());
  EXPECT_TRUE(a->ProvenBy(a->secret()));
  EXPECT_FALSE(a->ProvenBy(b->secret()));
  EXPECT_FALSE(a->ProvenBy(a->secret().substr(1)));
}

// In another pod without hostPID, SO_PEERCRED says pid 0 for every client:
// they all look alike, so none may register but in one trust domain.
TEST(SessionAccessTest, APeerWhosePidIsHiddenHasNoTenantButUnderNodeTenancy) {
  SessionRegistry sessions;
  for (Tenancy tenancy : {Tenancy::kUid, Tenancy::kPod}) {
    SessionAccess access(&sessions, {.tenancy = tenancy});
    absl::StatusOr<TenantId> tenant = access.TenantOf({.pid = 0, .uid = 1001});
    ASSERT_TRUE(absl::IsFailedPrecondition(tenant.status()))
        << TenancyName(tenancy) << ": " << tenant.status();
    EXPECT_NE(tenant.status().message().find("hostPID: true"),
              std::string::npos);
    EXPECT_NE(tenant.status().message().find("--tenancy node"),
              std::string::npos);
  }
  SessionAccess node(&sessions, {.tenancy = Tenancy::kNode});
  EXPECT_EQ(node.TenantOf({.pid = 0, .uid = 1001}).value(), "node");
  EXPECT_EQ(node.TenantOf({.pid = 7, .uid = 1002}).value(), "node");
}

TEST(SessionAccessTest, UnderUidTenancyEachUidIsATenant) {
  SessionRegistry sessions;
  SessionAccess access(&sessions, {});
  EXPECT_EQ(access.TenantOf({.pid = 7, .uid = 1001}).value(), "uid:1001");
  EXPECT_EQ(access.TenantOf({.pid = 8, .uid = 1002}).value(), "uid:1002");
}

TEST(SessionAccessTest, RootTheDaemonsUidAdminUidsAndTheAdminGroupAdminister) {
  SessionRegistry sessions;
  SessionAccess access(&sessions, {.admin_uids = {4000}, .admin_gid = 5000});
  EXPECT_TRUE(access.CheckAdmin({.pid = 1, .uid = 0}).ok());
  EXPECT_TRUE(access.CheckAdmin({.pid = 1, .uid = geteuid()}).ok());
  EXPECT_TRUE(access.CheckAdmin({.pid = 1, .uid = 4000}).ok());
  const uid_t stranger = geteuid() == 4001 ? 4002 : 4001;
  EXPECT_TRUE(access.CheckAdmin({.pid = 0, .uid = stranger, .gid = 5000}).ok());
  EXPECT_TRUE(absl::IsPermissionDenied(
      access.CheckAdmin({.pid = 0, .uid = stranger, .gid = 5001})));
}

// A supplementary group counts: read from /proc/PID/status.
TEST(SessionAccessTest, ASupplementaryAdminGroupCounts) {
  const std::filesystem::path proc =
      std::filesystem::path(testing::TempDir()) / "session_access_proc";
  std::filesystem::create_directories(proc / "77");
  std::ofstream(proc / "77" / "status")
      << "Name:\tpython\nUid:\t4001\t4001\t4001\t4001\n"
         "Groups:\t27 5000 5002 \n";
  SessionRegistry sessions;
  SessionAccess access(&sessions, {.admin_gid = 5000, .proc = proc.string()});
  const uid_t stranger = geteuid() == 4001 ? 4002 : 4001;
  EXPECT_TRUE(access.CheckAdmin({.pid = 77, .uid = stranger, .gid = 4001}).ok());
  EXPECT_TRUE(absl::IsPermissionDenied(
      access.CheckAdmin({.pid = 78, .uid = stranger, .gid = 4001})));
}

}  // namespace
}  // namespace allocd
