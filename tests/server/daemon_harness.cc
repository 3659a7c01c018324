#include "tests/server/daemon_harness.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <utility>

#include "absl/time/clock.h"
#include "grpcpp/create_channel_posix.h"
#include "gtest/gtest.h"

namespace allocd::harness {

Child::Child(std::vector<std::string> args, bool with_stderr) {
  int out[2];
  EXPECT_EQ(pipe2(out, O_CLOEXEC), 0);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  pid_ = fork();
  if (pid_ == 0) {
    // Only async-signal-safe calls until exec: the test may have threads.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the test died before the prctl
    dup2(out[1], STDOUT_FILENO);
    if (with_stderr) dup2(out[1], STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  EXPECT_GT(pid_, 0) << args[0];
  close(out[1]);
  output_.reset(out[0]);
}

Child::~Child() {
  if (pid_ > 0) Kill();
}

bool Child::running() {
  if (pid_ <= 0 || reaped_) return false;
  if (waitpid(pid_, &status_, WNOHANG) == 0) return true;
  reaped_ = true;
  return false;
}

std::string Child::Line(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    if (size_t nl = buffer_.find('\n'); nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    pollfd p{output_.get(), POLLIN, 0};
    const int left = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    if (left <= 0 || poll(&p, 1, left) <= 0) return "";
    char chunk[4096];
    const ssize_t n = read(output_.get(), chunk, sizeof chunk);
    if (n <= 0) return "";
    buffer_.append(chunk, n);
  }
}

std::string Child::Rest(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string out = std::move(buffer_);
  buffer_.clear();
  for (;;) {
    pollfd p{output_.get(), POLLIN, 0};
    const int left = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    if (left <= 0 || poll(&p, 1, left) <= 0) return out;
    char chunk[4096];
    const ssize_t n = read(output_.get(), chunk, sizeof chunk);
    if (n <= 0) return out;
    out.append(chunk, n);
  }
}

int Child::Wait() {
  if (pid_ > 0 && !reaped_) waitpid(pid_, &status_, 0);
  pid_ = -1;
  return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
}

void Child::Kill() {
  if (pid_ > 0 && !reaped_) kill(pid_, SIGKILL);
  Wait();
}

bool WaitForDaemon(const std::string& socket, absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  while (!ConnectUnix(socket).ok()) {
    if (absl::Now() > deadline) {
      ADD_FAILURE() << "no daemon on " << socket << " after " << limit;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

std::shared_ptr<grpc::Channel> Dial(const std::string& socket) {
  absl::StatusOr<UniqueFd> fd = ConnectUnix(socket);
  if (!fd.ok()) {
    ADD_FAILURE() << fd.status();
    return grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
  }
  fcntl(fd->get(), F_SETFL, fcntl(fd->get(), F_GETFL) | O_NONBLOCK);
  return grpc::CreateInsecureChannelFromFd("allocd", fd->release());
}

std::shared_ptr<grpc::Channel> DialAdmin(const std::string& socket) {
  return Dial(socket + ".admin");
}

v1::StatusResponse PoolStatus(v1::Admin::Stub& admin) {
  grpc::ClientContext context;
  v1::StatusResponse r;
  EXPECT_TRUE(admin.Status(&context, {}, &r).ok());
  return r;
}

absl::Duration WaitForInUse(v1::Admin::Stub& admin, uint64_t bytes,
                            absl::Duration limit) {
  const absl::Time start = absl::Now();
  while (PoolStatus(admin).in_use_bytes() != bytes && absl::Now() - start < limit) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return absl::Now() - start;
}

}  // namespace allocd::harness
