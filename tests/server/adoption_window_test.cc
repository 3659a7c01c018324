#include "server/adoption_window.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;

std::string TempPath() {
  std::string pattern = "/tmp/allocd_sessions_XXXXXX";
  const int fd = mkstemp(pattern.data());
  close(fd);
  return pattern;
}

TEST(SessionsFileTest, KeepsSessionsAndChunksAndReadsBackOnlyLiveProcesses) {
  const std::string path = TempPath();
  const SessionsFile written{
      .sessions = {{11, 2}, {22, 1}, {33, 1}},
      .chunks = {{"uid:1001", {{.device = "GPU-a", .id = 7, .bytes = 2 << 20},
                               {.device = "GPU-b", .id = 9, .bytes = 16 << 20}}},
                 {"pod:x-y", {{.device = "GPU-a", .id = 8, .bytes = 2 << 20}}}}};
  ASSERT_TRUE(WriteSessionsFile(path, written).ok());
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(text,
            "session 11\nsession 11\nsession 22\nsession 33\n"
            "chunk pod:x-y GPU-a 8 2097152\n"
            "chunk uid:1001 GPU-a 7 2097152\n"
            "chunk uid:1001 GPU-b 9 16777216\n");
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  const std::set<pid_t> alive = {11, 33};
  absl::StatusOr<SessionsFile> read =
      ReadSessionsFile(path, [&](pid_t p) { return alive.contains(p); });
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_THAT(read->sessions, ElementsAre(Pair(11, 2), Pair(33, 1)));
  EXPECT_EQ(read->chunks, written.chunks);
  unlink(path.c_str());
  EXPECT_TRUE(absl::IsNotFound(
      ReadSessionsFile(path, [](pid_t) { return true; }).status()));
}

// Grants are appended to the file as it was last written, and read back
// with the rest.
TEST(SessionsFileTest, AppendedChunksAreReadBack) {
  const std::string path = TempPath();
  absl::StatusOr<UniqueFd> file = WriteSessionsFile(
      path, {.sessions = {{11, 1}},
             .chunks = {{"uid:1", {{.device = "GPU-a", .id = 1, .bytes = 2}}}}});
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE(AppendHandedChunks(file->get(), "uid:2",
                                 {{.device = "GPU-a", .id = 5, .bytes = 4},
                                  {.device = "GPU-b", .id = 6, .bytes = 4}})
                  .ok());
  absl::StatusOr<SessionsFile> read =
      ReadSessionsFile(path, [](pid_t) { return true; });
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_THAT(read->sessions, ElementsAre(Pair(11, 1)));
  EXPECT_EQ(read->chunks.at("uid:1").size(), 1u);
  EXPECT_EQ(read->chunks.at("uid:2"),
            (std::vector<HandedChunk>{{.device = "GPU-a", .id = 5, .bytes = 4},
                                      {.device = "GPU-b", .id = 6, .bytes = 4}}));
  unlink(path.c_str());
}

// A file others may write, or a link, is not the daemon's: a client that
// could write it could name chunks it never got.
TEST(SessionsFileTest, AFileOthersMayWriteOrALinkIsNotBelieved) {
  const std::string path = TempPath();
  ASSERT_TRUE(WriteSessionsFile(path, {.sessions = {{11, 1}}}).ok());
  auto read = [&](const std::string& p) {
    return ReadSessionsFile(p, [](pid_t) { return true; }).status();
  };
  EXPECT_TRUE(read(path).ok());
  ASSERT_EQ(chmod(path.c_str(), 0622), 0);
  EXPECT_TRUE(absl::IsPermissionDenied(read(path)));
  ASSERT_EQ(chmod(path.c_str(), 0600), 0);
  const std::string link = path + ".link";
  ASSERT_EQ(symlink(path.c_str(), link.c_str()), 0);
  EXPECT_TRUE(absl::IsPermissionDenied(read(link)));
  unlink(link.c_str());
  unlink(path.c_str());
}

TEST(SessionsFileTest, ThisProcessIsAliveAndAReapedOneIsNot) {
  EXPECT_TRUE(ProcessAlive(getpid()));
  const pid_t child = fork();
  if (child == 0) _exit(0);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_FALSE(ProcessAlive(child));
}

TEST(AdoptionWindowTest, ClosesWhenEverySessionOfEveryProcessReturned) {
  AdoptionWindow window({{11, 2}, {22, 1}}, absl::Now() + absl::Hours(1),
                        [](pid_t) { return true; });
  EXPECT_TRUE(window.open());
  window.Returned(11);
  window.Returned(99);  // not awaited: changes nothing
  EXPECT_THAT(window.pending(), ElementsAre(Pair(11, 1), Pair(22, 1)));
  window.Returned(22);
  EXPECT_TRUE(window.open());
  window.Returned(11);
  EXPECT_FALSE(window.open());
  EXPECT_THAT(window.pending(), IsEmpty());
  window.Wait();  // returns at once
}

TEST(AdoptionWindowTest, StopsWaitingForProcessesThatDied) {
  std::set<pid_t> alive = {11, 22};
  AdoptionWindow window({{11, 1}, {22, 1}}, absl::Now() + absl::Hours(1),
                        [&](pid_t p) { return alive.contains(p); });
  window.Returned(11);
  alive.erase(22);
  EXPECT_TRUE(window.open());
  window.Tick(absl::Now());
  EXPECT_FALSE(window.open());
}

TEST(AdoptionWindowTest, WithNothingToAwaitThereIsNoWindow) {
  AdoptionWindow window({}, absl::Now() + absl::Hours(1));
  EXPECT_FALSE(window.open());
  window.Wait();
}

TEST(AdoptionWindowTest, WaitEndsWhenTheLastProcessReturnsOrAtTheDeadline) {
  AdoptionWindow window({{11, 1}}, absl::Now() + absl::Hours(1),
                        [](pid_t) { return true; });
  absl::Notification waited;
  std::thread waiter([&] {
    window.Wait();
    waited.Notify();
  });
  EXPECT_FALSE(waited.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  window.Returned(11);
  waiter.join();
  EXPECT_TRUE(waited.HasBeenNotified());

  AdoptionWindow late({{11, 1}}, absl::Now() + absl::Milliseconds(20),
                      [](pid_t) { return true; });
  late.Wait();  // nobody returns: the deadline ends it
  EXPECT_FALSE(late.open());
}

}  // namespace
}  // namespace allocd
