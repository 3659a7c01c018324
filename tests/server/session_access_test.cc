#include "server/session_access.h"

#include <unistd.h>

#include <memory>

#include "gtest/gtest.h"
#include "server/session_registry.h"

namespace allocd {
namespace {

TEST(SessionAccessTest, ASessionBelongsToTheProcessThatRegisteredIt) {
  SessionRegistry sessions;
  SessionAccess access(&sessions, {});
  std::shared_ptr<Session> session =
      sessions.Create({.pid = 4242, .uid = 1000});
  absl::StatusOr<std::shared_ptr<Session>> owned =
      access.OwnedSession({.pid = 4242, .uid = 1000}, session->id());
  ASSERT_TRUE(owned.ok()) << owned.status();
  EXPECT_EQ(*owned, session);
  // The same uid from another process is not the session's owner.
  EXPECT_TRUE(absl::IsPermissionDenied(
      access.OwnedSession({.pid = 4243, .uid = 1000}, session->id())
          .status()));
  EXPECT_TRUE(absl::IsNotFound(
      access.OwnedSession({.pid = 4242, .uid = 1000}, session->id() + 1)
          .status()));
  sessions.Remove(session->id());
  EXPECT_TRUE(absl::IsNotFound(
      access.OwnedSession({.pid = 4242, .uid = 1000}, session->id())
          .status()));
}

TEST(SessionAccessTest, RootTheDaemonsUidAndAdminUidsMayAdminister) {
  SessionRegistry sessions;
  SessionAccess access(&sessions, {4000});
  EXPECT_TRUE(access.CheckAdmin({.pid = 1, .uid = 0}).ok());
  EXPECT_TRUE(access.CheckAdmin({.pid = 1, .uid = geteuid()}).ok());
  EXPECT_TRUE(access.CheckAdmin({.pid = 1, .uid = 4000}).ok());
  const uid_t stranger = geteuid() == 4001 ? 4002 : 4001;
  EXPECT_TRUE(absl::IsPermissionDenied(
      access.CheckAdmin({.pid = 1, .uid = stranger})));
}

}  // namespace
}  // namespace allocd
