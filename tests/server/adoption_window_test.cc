#include "server/adoption_window.h"

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

TEST(SessionsFileTest, KeepsASessionPerLineAndReadsBackOnlyLiveProcesses) {
  const std::string path = TempPath();
  ASSERT_TRUE(WriteSessionsFile(path, {{11, 2}, {22, 1}, {33, 1}}).ok());
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(text, "11\n11\n22\n33\n");
  const std::set<pid_t> alive = {11, 33};
  EXPECT_THAT(ReadSessionsFile(path, [&](pid_t p) { return alive.contains(p); }),
              ElementsAre(Pair(11, 2), Pair(33, 1)));
  unlink(path.c_str());
  EXPECT_THAT(ReadSessionsFile(path, [](pid_t) { return true; }), IsEmpty());
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
