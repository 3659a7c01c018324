#include "ipc/background_fd_closer.h"

#include <poll.h>
#include <unistd.h>

#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace allocd {
namespace {

// A pipe whose write end is handed to the closer: the read end sees EOF
// exactly when the write end is closed.
struct Pipe {
  Pipe() {
    int fds[2];
    EXPECT_EQ(pipe(fds), 0);
    read_end = UniqueFd(fds[0]);
    write_end = UniqueFd(fds[1]);
  }
  bool WriteEndClosed() const {
    pollfd p{.fd = read_end.get(), .events = POLLIN, .revents = 0};
    if (poll(&p, 1, 0) != 1) return false;
    char c;
    return read(read_end.get(), &c, 1) == 0;
  }
  UniqueFd read_end, write_end;
};

TEST(BackgroundFdCloserTest, FlushReturnsOnceEveryHandedDescriptorIsClosed) {
  BackgroundFdCloser closer;
  std::vector<Pipe> pipes(64);
  for (Pipe& p : pipes) closer.Close(std::move(p.write_end));
  closer.Flush();
  for (const Pipe& p : pipes) EXPECT_TRUE(p.WriteEndClosed());
}

TEST(BackgroundFdCloserTest, ClosesInlineWhenTooManyWait) {
  BackgroundFdCloser closer(/*max_pending=*/0);
  Pipe p;
  closer.Close(std::move(p.write_end));
  EXPECT_TRUE(p.WriteEndClosed());  // no Flush: it was closed in Close()
}

TEST(BackgroundFdCloserTest, DestructionClosesWhatIsPending) {
  Pipe p;
  {
    BackgroundFdCloser closer;
    closer.Close(std::move(p.write_end));
  }
  EXPECT_TRUE(p.WriteEndClosed());
}

}  // namespace
}  // namespace allocd
