#include "ipc/unix_socket.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

using ::testing::HasSubstr;

std::string TempDir() {
  std::string pattern = "/tmp/allocd_ipc_XXXXXX";
  return mkdtemp(pattern.data());
}

std::pair<UniqueFd, UniqueFd> Pair() {
  int sv[2];
  EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  return {UniqueFd(sv[0]), UniqueFd(sv[1])};
}

TEST(UnixSocketTest, FramesRoundTripWithFdsThatReferToTheSameFile) {
  auto [a, b] = Pair();
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  UniqueFd read_end(pipe_fds[0]), write_end(pipe_fds[1]);
  ASSERT_TRUE(SendMessage(a.get(), "hello", {write_end.get()}).ok());
  absl::StatusOr<ReceivedMessage> got = ReceiveMessage(b.get(), 100);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->payload, "hello");
  ASSERT_EQ(got->fds.size(), 1u);
  EXPECT_NE(got->fds[0].get(), write_end.get());  // a new descriptor...
  ASSERT_EQ(write(got->fds[0].get(), "x", 1), 1);  // ...for the same pipe
  char c = 0;
  ASSERT_EQ(read(read_end.get(), &c, 1), 1);
  EXPECT_EQ(c, 'x');
  // Received FDs are close-on-exec.
  EXPECT_TRUE(fcntl(got->fds[0].get(), F_GETFD) & FD_CLOEXEC);
}

TEST(UnixSocketTest, EmptyAndLargeFramesAndManyFds) {
  auto [a, b] = Pair();
  std::string big(1 << 20, 'z');
  std::vector<UniqueFd> files;
  std::vector<int> raw;
  for (size_t i = 0; i < kMaxFdsPerMessage; ++i) {
    files.emplace_back(open("/dev/null", O_RDONLY | O_CLOEXEC));
    raw.push_back(files.back().get());
  }
  // The writer blocks until the reader drains: send from a thread.
  std::thread sender([&, fd = a.get()] {
    EXPECT_TRUE(SendMessage(fd, "").ok());
    EXPECT_TRUE(SendMessage(fd, big, raw).ok());
  });
  absl::StatusOr<ReceivedMessage> empty = ReceiveMessage(b.get(), 10);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->payload, "");
  absl::StatusOr<ReceivedMessage> large = ReceiveMessage(b.get(), big.size());
  sender.join();
  ASSERT_TRUE(large.ok()) << large.status();
  EXPECT_EQ(large->payload, big);
  EXPECT_EQ(large->fds.size(), kMaxFdsPerMessage);
}

TEST(UnixSocketTest, TooManyFdsAreRefusedBeforeSending) {
  auto [a, b] = Pair();
  std::vector<int> fds(kMaxFdsPerMessage + 1, 0);
  EXPECT_EQ(SendMessage(a.get(), "x", fds).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(UnixSocketTest, OversizedFrameIsRejectedWithoutReadingIt) {
  auto [a, b] = Pair();
  ASSERT_TRUE(SendMessage(a.get(), std::string(1000, 'a')).ok());
  absl::StatusOr<ReceivedMessage> got = ReceiveMessage(b.get(), 999);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(got.status().message(), HasSubstr("1000 bytes"));
}

TEST(UnixSocketTest, EofIsUnavailableAndAStalledFrameTimesOut) {
  {
    auto [a, b] = Pair();
    a.reset();
    EXPECT_EQ(ReceiveMessage(b.get(), 10).status().code(),
              absl::StatusCode::kUnavailable);
  }
  {
    auto [a, b] = Pair();
    ASSERT_EQ(write(a.get(), "\x05\x00", 2), 2);  // half a header
    EXPECT_EQ(ReceiveMessage(b.get(), 10, absl::Milliseconds(50))
                  .status()
                  .code(),
              absl::StatusCode::kDeadlineExceeded);
  }
  {
    auto [a, b] = Pair();
    ASSERT_EQ(write(a.get(), "\x05\x00\x00\x00" "ab", 6), 6);  // cut short
    a.reset();
    EXPECT_EQ(ReceiveMessage(b.get(), 10).status().code(),
              absl::StatusCode::kDataLoss);
  }
}

TEST(UnixSocketTest, SendToAClosedPeerIsAnErrorNotSigpipe) {
  auto [a, b] = Pair();
  b.reset();
  EXPECT_FALSE(SendMessage(a.get(), std::string(1 << 16, 'a')).ok());
}

TEST(UnixSocketTest, ListenSetsTheModeAndCredentialsAreTheKernels) {
  const std::string dir = TempDir();
  const std::string path = dir + "/s.sock";
  absl::StatusOr<UniqueFd> listener = ListenUnix(path, 0660);
  ASSERT_TRUE(listener.ok()) << listener.status();
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0660u);

  const pid_t child = fork();
  if (child == 0) {
    absl::StatusOr<UniqueFd> c = ConnectUnix(path);
    char byte;
    if (c.ok()) (void)!read(c->get(), &byte, 1);  // wait for the parent
    _exit(c.ok() ? 0 : 1);
  }
  absl::StatusOr<UniqueFd> accepted = AcceptUnix(listener->get());
  ASSERT_TRUE(accepted.ok());
  absl::StatusOr<PeerCredentials> peer = GetPeerCredentials(accepted->get());
  ASSERT_TRUE(peer.ok());
  EXPECT_EQ(peer->pid, child);
  EXPECT_EQ(peer->uid, getuid());
  EXPECT_EQ(peer->gid, getgid());
  accepted->reset();
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(UnixSocketTest, StaleSocketIsReplacedLiveOneIsRefused) {
  const std::string dir = TempDir();
  const std::string path = dir + "/s.sock";
  {
    absl::StatusOr<UniqueFd> first = ListenUnix(path, 0600);
    ASSERT_TRUE(first.ok());
    absl::StatusOr<UniqueFd> second = ListenUnix(path, 0600);
    EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists);
    EXPECT_THAT(second.status().message(), HasSubstr("another allocd"));
  }
  // The first listener closed but left its file: stale, replaced.
  EXPECT_TRUE(ListenUnix(path, 0600).ok());
  // A regular file is never removed.
  const std::string file = dir + "/not-a-socket";
  close(open(file.c_str(), O_CREAT | O_WRONLY, 0600));
  EXPECT_THAT(ListenUnix(file, 0600).status().message(),
              HasSubstr("not a socket"));
}

TEST(UnixSocketTest, PathErrorsAreClear) {
  EXPECT_EQ(ListenUnix(std::string(200, 'a'), 0600).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ConnectUnix("/nonexistent/dir/s.sock").status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace allocd
