#include "ipc/unix_socket.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/scoped_temp_dir.h"

namespace allocd {
namespace {

using ::testing::HasSubstr;

std::pair<UniqueFd, UniqueFd> Pair() {
  absl::StatusOr<std::pair<UniqueFd, UniqueFd>> pair = UnixSocketPair();
  EXPECT_TRUE(pair.ok()) << pair.status();
  return std::move(*pair);
}

bool IsOpen(int fd) { return fcntl(fd, F_GETFD) != -1; }

// How many descriptors this process has open.
int OpenFds() {
  int count = 0;
  DIR* dir = opendir("/proc/self/fd");
  while (readdir(dir) != nullptr) ++count;
  closedir(dir);
  return count - 3;  // ".", ".." and the directory's own FD
}

UniqueFd Memfd(const std::string& contents = "") {
  UniqueFd fd(memfd_create("test", MFD_CLOEXEC));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(write(fd.get(), contents.data(), contents.size()),
            static_cast<ssize_t>(contents.size()));
  return fd;
}

std::string ReadAll(int fd) {
  char buffer[256];
  const ssize_t n = pread(fd, buffer, sizeof buffer, 0);
  return n > 0 ? std::string(buffer, n) : "";
}

// Forks; the child runs `body` and exits with what it returns. Returns the
// child's pid.
template <typename F>
pid_t Fork(F body) {
  const pid_t child = fork();
  if (child == 0) _exit(body());
  return child;
}

int Wait(pid_t child) {
  int status = 0;
  EXPECT_EQ(waitpid(child, &status, 0), child);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(UniqueFdTest, OwnsClosesMovesAndReleases) {
  int raw;
  {
    UniqueFd fd(memfd_create("t", MFD_CLOEXEC));
    raw = fd.get();
    ASSERT_TRUE(fd.valid());
    UniqueFd moved(std::move(fd));
    EXPECT_FALSE(fd.valid());  // NOLINT: checking the moved-from state
    EXPECT_EQ(moved.get(), raw);
    moved.reset(raw);  // the same FD: stays open
    EXPECT_TRUE(IsOpen(raw));
    UniqueFd other;
    other = std::move(moved);
    EXPECT_EQ(other.get(), raw);
  }
  EXPECT_FALSE(IsOpen(raw));  // closed with its owner

  UniqueFd fd(memfd_create("t", MFD_CLOEXEC));
  raw = fd.release();
  EXPECT_EQ(fd.get(), -1);
  EXPECT_TRUE(IsOpen(raw));  // the caller's now
  fd.reset(raw);
  fd.reset();
  EXPECT_FALSE(IsOpen(raw));
}

TEST(UnixSocketTest, PassedFdsAreNewDescriptorsOfTheSameFile) {
  auto [a, b] = Pair();
  UniqueFd file = Memfd("before");
  ASSERT_TRUE(SendMessage(a.get(), "hello", {file.get()}).ok());
  absl::StatusOr<ReceivedMessage> got = ReceiveMessage(b.get(), 100);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->payload, "hello");
  ASSERT_EQ(got->fds.size(), 1u);
  const int received = got->fds[0].get();
  EXPECT_NE(received, file.get());
  EXPECT_EQ(ReadAll(received), "before");
  // Written through the received FD, read through the original one.
  ASSERT_EQ(pwrite(received, "after!", 6, 0), 6);
  EXPECT_EQ(ReadAll(file.get()), "after!");
  EXPECT_TRUE(fcntl(received, F_GETFD) & FD_CLOEXEC);
}

TEST(UnixSocketTest, EmptyLargeAndMaximalFrames) {
  auto [a, b] = Pair();
  const std::string big(4 << 20, 'z');  // far over the socket buffer
  std::vector<UniqueFd> files;
  std::vector<int> raw;
  for (size_t i = 0; i < kMaxFdsPerMessage; ++i) {
    files.push_back(Memfd(absl::StrCat(i)));
    raw.push_back(files.back().get());
  }
  // The writer blocks until the reader drains: send from a thread.
  std::thread sender([&, fd = a.get()] {
    EXPECT_TRUE(SendMessage(fd, "").ok());
    EXPECT_TRUE(SendMessage(fd, big, raw).ok());
    EXPECT_TRUE(SendMessage(fd, "after", {raw[0], raw[1]}).ok());
  });
  absl::StatusOr<ReceivedMessage> empty = ReceiveMessage(b.get(), 0);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->payload, "");
  EXPECT_TRUE(empty->fds.empty());
  absl::StatusOr<ReceivedMessage> large = ReceiveMessage(b.get(), big.size());
  ASSERT_TRUE(large.ok()) << large.status();
  EXPECT_EQ(large->payload, big);
  ASSERT_EQ(large->fds.size(), kMaxFdsPerMessage);
  for (size_t i = 0; i < kMaxFdsPerMessage; ++i) {  // in order
    EXPECT_EQ(ReadAll(large->fds[i].get()), absl::StrCat(i));
  }
  absl::StatusOr<ReceivedMessage> after = ReceiveMessage(b.get(), 10);
  sender.join();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->payload, "after");
  EXPECT_EQ(after->fds.size(), 2u);
}

TEST(UnixSocketTest, FramesSurviveArbitrarySplitsAndCoalescing) {
  auto [a, b] = Pair();
  // Two frames written one byte at a time, then two in one write.
  const std::string frames = std::string("\x03\x00\x00\x00" "abc", 7) +
                             std::string("\x02\x00\x00\x00" "de", 6);
  std::thread writer([&, fd = a.get()] {
    for (char c : frames) {
      ASSERT_EQ(write(fd, &c, 1), 1);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    ASSERT_EQ(write(fd, frames.data(), frames.size()),
              static_cast<ssize_t>(frames.size()));
  });
  std::vector<std::string> got;
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<ReceivedMessage> m =
        ReceiveMessage(b.get(), 10, absl::Seconds(10));
    ASSERT_TRUE(m.ok()) << m.status();
    got.push_back(m->payload);
  }
  writer.join();
  EXPECT_EQ(got, (std::vector<std::string>{"abc", "de", "abc", "de"}));
}

TEST(UnixSocketTest, NonBlockingSocketsSendAndReceiveWholeFrames) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0,
                       sv),
            0);
  UniqueFd a(sv[0]), b(sv[1]);
  const std::string big(2 << 20, 'q');
  std::thread sender([&] { EXPECT_TRUE(SendMessage(a.get(), big).ok()); });
  absl::StatusOr<ReceivedMessage> got = ReceiveMessage(b.get(), big.size());
  sender.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->payload, big);
}

TEST(UnixSocketTest, TooManyFdsAreRefusedBeforeAnythingIsSent) {
  auto [a, b] = Pair();
  std::vector<int> fds(kMaxFdsPerMessage + 1, 0);
  absl::Status s = SendMessage(a.get(), "x", fds);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("at most 253"));
  char byte;
  EXPECT_EQ(recv(b.get(), &byte, 1, MSG_DONTWAIT), -1);
  EXPECT_EQ(errno, EAGAIN);
}

TEST(UnixSocketTest, OversizedFrameIsRefusedAndItsFdsClosed) {
  auto [a, b] = Pair();
  UniqueFd file = Memfd();
  const int before = OpenFds();
  ASSERT_TRUE(SendMessage(a.get(), std::string(1000, 'a'), {file.get()}).ok());
  absl::StatusOr<ReceivedMessage> got = ReceiveMessage(b.get(), 999);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(got.status().message(),
              HasSubstr("message of 1000 bytes is over the limit of 999"));
  EXPECT_EQ(OpenFds(), before);  // the FD that came with it is closed
  // The payload was not read.
  char buffer[2000];
  EXPECT_EQ(recv(b.get(), buffer, sizeof buffer, MSG_DONTWAIT), 1000);
}

TEST(UnixSocketTest, EofTruncationAndTimeouts) {
  {
    auto [a, b] = Pair();
    a.reset();
    absl::Status s = ReceiveMessage(b.get(), 10).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(s.message(), "peer closed");
  }
  {
    auto [a, b] = Pair();
    absl::Status s = ReceiveMessage(b.get(), 10, absl::Milliseconds(20)).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(s.message(), HasSubstr("no message"));
  }
  {
    auto [a, b] = Pair();
    ASSERT_EQ(write(a.get(), "\x05\x00", 2), 2);  // half a header
    const absl::Time start = absl::Now();
    absl::Status s = ReceiveMessage(b.get(), 10, absl::Milliseconds(50)).status();
    EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(s.message(), HasSubstr("stalled after 2 of 4 bytes"));
  }
  {
    // Cut short after the header, with an FD: DataLoss, and the FD closed.
    auto [a, b] = Pair();
    UniqueFd file = Memfd();
    const int before = OpenFds();
    const std::string partial("\x05\x00\x00\x00" "ab", 6);
    iovec io{const_cast<char*>(partial.data()), partial.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr message{};
    message.msg_iov = &io;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&message);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    const int raw = file.get();
    std::memcpy(CMSG_DATA(c), &raw, sizeof raw);
    ASSERT_EQ(sendmsg(a.get(), &message, 0), 6);
    a.reset();
    absl::Status s = ReceiveMessage(b.get(), 10).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(s.message(), HasSubstr("got 6 of 9 bytes"));
    EXPECT_EQ(OpenFds(), before - 1);  // `a` closed; the FD that came too
  }
}

TEST(UnixSocketTest, FdsTheKernelHadToDropAreAnErrorAndNoneLeak) {
  auto [a, b] = Pair();
  UniqueFd file = Memfd();
  ASSERT_TRUE(SendMessage(a.get(), "x", {file.get(), file.get()}).ok());
  const pid_t child = Fork([fd = b.get()] {
    // No descriptor can be opened: every slot below the limit is taken.
    const int lowest_free = dup(0);
    if (lowest_free < 0) return 10;
    close(lowest_free);
    rlimit limit{};
    getrlimit(RLIMIT_NOFILE, &limit);
    limit.rlim_cur = static_cast<rlim_t>(lowest_free);
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) return 11;
    absl::StatusOr<ReceivedMessage> got = ReceiveMessage(fd, 10);
    if (got.ok()) return 12;
    if (got.status().code() != absl::StatusCode::kResourceExhausted) return 13;
    if (got.status().message().find("MSG_CTRUNC") == std::string::npos) {
      return 14;
    }
    return 0;
  });
  EXPECT_EQ(Wait(child), 0);
}

TEST(UnixSocketTest, SendToAClosedPeerIsUnavailableNotSigpipe) {
  auto [a, b] = Pair();
  b.reset();
  // SIGPIPE would kill the test.
  absl::Status s = SendMessage(a.get(), std::string(1 << 16, 'a'));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "peer closed");
}

TEST(UnixSocketTest, CredentialsOfASocketPairAreOurs) {
  auto [a, b] = Pair();
  absl::StatusOr<PeerCredentials> peer = GetPeerCredentials(a.get());
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_EQ(peer->pid, getpid());
  EXPECT_EQ(peer->uid, getuid());
  EXPECT_EQ(peer->gid, getgid());
  EXPECT_FALSE(GetPeerCredentials(-1).ok());
}

TEST(UnixSocketTest, ListenSetsTheExactModeWhateverTheUmask) {
  const ScopedTempDir dir("allocd_ipc_");
  const mode_t old_umask = umask(0077);
  absl::StatusOr<UniqueFd> listener = ListenUnix(dir.path() + "/s.sock", 0660);
  umask(old_umask);
  ASSERT_TRUE(listener.ok()) << listener.status();
  struct stat st;
  ASSERT_EQ(stat((dir.path() + "/s.sock").c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0660u);
  EXPECT_TRUE(fcntl(listener->get(), F_GETFD) & FD_CLOEXEC);
}

TEST(UnixSocketTest, AForkedClientsCredentialsAndFdsCrossProcesses) {
  const ScopedTempDir dir("allocd_ipc_");
  const std::string path = dir.path() + "/s.sock";
  absl::StatusOr<UniqueFd> listener = ListenUnix(path, 0600);
  ASSERT_TRUE(listener.ok()) << listener.status();
  const pid_t child = Fork([&path] {
    absl::StatusOr<UniqueFd> c = ConnectUnix(path);
    if (!c.ok()) return 1;
    absl::StatusOr<ReceivedMessage> m = ReceiveMessage(c->get(), 100);
    if (!m.ok() || m->fds.size() != 1) return 2;
    // Write into the parent's memfd through our copy, mapped.
    void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED,
                   m->fds[0].get(), 0);
    if (p == MAP_FAILED) return 3;
    std::strcpy(static_cast<char*>(p), m->payload.c_str());
    munmap(p, 4096);
    return SendMessage(c->get(), "done").ok() ? 0 : 4;
  });
  absl::StatusOr<UniqueFd> accepted = AcceptUnix(listener->get());
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_TRUE(fcntl(accepted->get(), F_GETFD) & FD_CLOEXEC);
  absl::StatusOr<PeerCredentials> peer = GetPeerCredentials(accepted->get());
  ASSERT_TRUE(peer.ok());
  EXPECT_EQ(peer->pid, child);
  EXPECT_EQ(peer->uid, getuid());
  EXPECT_EQ(peer->gid, getgid());

  UniqueFd file = Memfd();
  ASSERT_EQ(ftruncate(file.get(), 4096), 0);
  ASSERT_TRUE(
      SendMessage(accepted->get(), "written by the child", {file.get()}).ok());
  absl::StatusOr<ReceivedMessage> done =
      ReceiveMessage(accepted->get(), 100, absl::Seconds(10));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(Wait(child), 0);
  EXPECT_EQ(std::string(ReadAll(file.get()).c_str()), "written by the child");
}

// The daemon drains a non-blocking listener's backlog: an empty one says
// so, and is no error to log.
TEST(UnixSocketTest, AcceptOnAnEmptyNonBlockingBacklogIsUnavailable) {
  const ScopedTempDir dir("allocd_ipc_");
  const std::string path = dir.path() + "/s.sock";
  absl::StatusOr<UniqueFd> listener = ListenUnix(path, 0600);
  ASSERT_TRUE(listener.ok()) << listener.status();
  ASSERT_EQ(fcntl(listener->get(), F_SETFL,
                  fcntl(listener->get(), F_GETFL) | O_NONBLOCK),
            0);
  EXPECT_TRUE(absl::IsUnavailable(AcceptUnix(listener->get()).status()));
  absl::StatusOr<UniqueFd> client = ConnectUnix(path);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<UniqueFd> accepted = AcceptUnix(listener->get());
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_TRUE(fcntl(accepted->get(), F_GETFD) & FD_CLOEXEC);
  EXPECT_TRUE(absl::IsUnavailable(AcceptUnix(listener->get()).status()));
}

TEST(UnixSocketTest, StaleSocketIsReplacedLiveOneIsRefused) {
  const ScopedTempDir dir("allocd_ipc_");
  const std::string path = dir.path() + "/s.sock";
  {
    absl::StatusOr<UniqueFd> first = ListenUnix(path, 0600);
    ASSERT_TRUE(first.ok());
    absl::StatusOr<UniqueFd> second = ListenUnix(path, 0600);
    EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists);
    EXPECT_EQ(second.status().message(),
              absl::StrCat("another allocd is listening on ", path));
    // The live socket is still served.
    EXPECT_TRUE(ConnectUnix(path).ok());
  }
  // The first listener closed and left its file: stale, replaced.
  absl::Status stale = ConnectUnix(path).status();
  EXPECT_EQ(stale.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(stale.message(), HasSubstr("nothing listens on"));
  absl::StatusOr<UniqueFd> replaced = ListenUnix(path, 0600);
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  EXPECT_TRUE(ConnectUnix(path).ok());
}

TEST(UnixSocketTest, SocketOfAKilledDaemonIsReplaced) {
  const ScopedTempDir dir("allocd_ipc_");
  const std::string path = dir.path() + "/s.sock";
  const pid_t child = Fork([&path] {
    absl::StatusOr<UniqueFd> l = ListenUnix(path, 0600);
    if (!l.ok()) return 1;
    raise(SIGKILL);  // dies holding it, never unlinks
    return 2;
  });
  EXPECT_EQ(Wait(child), 128 + SIGKILL);
  struct stat st;
  ASSERT_EQ(lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(ListenUnix(path, 0600).ok());
}

TEST(UnixSocketTest, NonSocketsAreNeverRemoved) {
  const ScopedTempDir dir("allocd_ipc_");
  const std::string file = dir.path() + "/not-a-socket";
  close(open(file.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
  absl::Status s = ListenUnix(file, 0600).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("is not a socket"));
  struct stat st;
  EXPECT_EQ(stat(file.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
}

TEST(UnixSocketTest, PathErrorsAreClear) {
  absl::Status s = ListenUnix("/tmp/" + std::string(120, 'a'), 0600).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("must be 1 to 107 bytes"));
  EXPECT_EQ(ListenUnix("", 0600).status().code(),
            absl::StatusCode::kInvalidArgument);

  s = ListenUnix("/nonexistent-allocd-dir/s.sock", 0600).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(),
              HasSubstr("directory /nonexistent-allocd-dir does not exist"));

  s = ConnectUnix("/nonexistent-allocd-dir/s.sock").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("no socket at /nonexistent-allocd-dir/s.sock"));
}

TEST(UnixSocketTest, RaiseOpenFileLimitReachesTheHardLimit) {
  rlimit before{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &before), 0);
  absl::StatusOr<uint64_t> now = RaiseOpenFileLimit();
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(*now, before.rlim_max);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &before), 0);
}

// The kernel's own view of the table: /proc/self/status "FDSize:".
int FdTableSize() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("FDSize:", 0) == 0) return std::atoi(line.c_str() + 7);
  }
  return -1;
}

int OpenDescriptors() {
  return static_cast<int>(std::distance(
      std::filesystem::directory_iterator("/proc/self/fd"),
      std::filesystem::directory_iterator()));
}

TEST(UnixSocketTest, ReserveFdTableGrowsTheTableAndOpensNothing) {
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  const int before = FdTableSize();
  ASSERT_GT(before, 0);
  const int want =
      static_cast<int>(std::min<rlim_t>(limit.rlim_cur, 4 * before));
  if (want <= before) GTEST_SKIP() << "RLIMIT_NOFILE leaves no room to grow";
  const int open_before = OpenDescriptors();
  absl::StatusOr<int> size = ReserveFdTable(4 * before);
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(*size, want);
  EXPECT_GE(FdTableSize(), want);
  EXPECT_EQ(OpenDescriptors(), open_before);
  // Descriptors still come from the bottom.
  UniqueFd next(open("/dev/null", O_RDONLY | O_CLOEXEC));
  EXPECT_LT(next.get(), 64);
  // Asking again (or for less) is the table it has.
  EXPECT_EQ(ReserveFdTable(16).value(), 16);
  EXPECT_GE(FdTableSize(), want);
}

}  // namespace
}  // namespace allocd

namespace allocd {
namespace {

// A frame's bytes as SendMessage writes them.
std::string Frame(const std::string& payload) {
  std::string frame(4, '\0');
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>(payload.size() >> (8 * i));
  return frame + payload;
}

TEST(FrameAssemblerTest, AssemblesAFrameSentAByteAtATimeWithoutWaiting) {
  auto [a, b] = Pair();
  FrameAssembler assembler(1024);
  const std::string frame = Frame("hello");
  for (size_t i = 0; i < frame.size(); ++i) {
    absl::StatusOr<std::optional<ReceivedMessage>> got = assembler.ReadReady(b.get());
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_FALSE(got->has_value()) << "nothing whole before byte " << i;
    EXPECT_EQ(assembler.partial(), i > 0);
    ASSERT_EQ(write(a.get(), &frame[i], 1), 1);
  }
  absl::StatusOr<std::optional<ReceivedMessage>> got = assembler.ReadReady(b.get());
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->payload, "hello");
  EXPECT_FALSE(assembler.partial());
}

TEST(FrameAssemblerTest, StopsAtEachFrameKeepingItsDescriptors) {
  auto [a, b] = Pair();
  auto [x, y] = Pair();
  ASSERT_TRUE(SendMessage(a.get(), "one", {x.get()}).ok());
  ASSERT_TRUE(SendMessage(a.get(), "").ok());
  ASSERT_TRUE(SendMessage(a.get(), "three", {x.get(), y.get()}).ok());
  FrameAssembler assembler(1024);
  std::vector<std::pair<std::string, size_t>> frames;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::optional<ReceivedMessage>> got = assembler.ReadReady(b.get());
    ASSERT_TRUE(got.ok() && got->has_value()) << i;
    frames.emplace_back((*got)->payload, (*got)->fds.size());
  }
  EXPECT_THAT(frames, ::testing::ElementsAre(std::pair<std::string, size_t>("one", 1),
                                             std::pair<std::string, size_t>("", 0),
                                             std::pair<std::string, size_t>("three", 2)));
}

TEST(FrameAssemblerTest, RefusesAnOversizedFrameAndReportsEof) {
  auto [a, b] = Pair();
  ASSERT_TRUE(SendMessage(a.get(), std::string(100, 'x')).ok());
  FrameAssembler small(10);
  EXPECT_TRUE(absl::IsInvalidArgument(small.ReadReady(b.get()).status()));
  auto [c, d] = Pair();
  ASSERT_EQ(write(c.get(), "\x05\0", 2), 2);
  c.reset();
  FrameAssembler cut(10);
  EXPECT_TRUE(absl::IsDataLoss(cut.ReadReady(d.get()).status()));
}

TEST(FrameQueueTest, QueuesWhatTheSocketDoesNotTakeAndSendsItLater) {
  auto [a, b] = Pair();
  auto [x, y] = Pair();
  FrameQueue queue;
  // Far more than a socket buffer: the rest waits, nothing blocks.
  const std::string big(1 << 20, 'z');
  ASSERT_TRUE(queue.Send(a.get(), "first", {}).ok());
  ASSERT_TRUE(queue.Send(a.get(), big).ok());
  std::vector<UniqueFd> fds;
  fds.push_back(*DuplicateFd(x.get()));
  ASSERT_TRUE(queue.Send(a.get(), "last", std::move(fds)).ok());
  EXPECT_TRUE(queue.pending());
  EXPECT_GT(queue.pending_bytes(), 0u);
  std::thread reader([&, fd = b.get()] {
    EXPECT_EQ(ReceiveMessage(fd, 2 << 20)->payload, "first");
    EXPECT_EQ(ReceiveMessage(fd, 2 << 20)->payload.size(), big.size());
    absl::StatusOr<ReceivedMessage> last = ReceiveMessage(fd, 2 << 20);
    EXPECT_EQ(last->payload, "last");
    EXPECT_EQ(last->fds.size(), 1u);
  });
  while (queue.pending()) {
    pollfd p{a.get(), POLLOUT, 0};
    poll(&p, 1, 1000);
    ASSERT_TRUE(queue.Flush(a.get()).ok());
  }
  reader.join();
  EXPECT_EQ(queue.pending_bytes(), 0u);
}

TEST(FrameQueueTest, SaysWhenThePeerHasGone) {
  auto [a, b] = Pair();
  b.reset();
  FrameQueue queue;
  EXPECT_TRUE(absl::IsUnavailable(queue.Send(a.get(), "anyone?")));
}

}  // namespace
}  // namespace allocd
