// A peer that floods `allocd serve` (the limits tests start it under
// another uid than the legitimate client's), or the load program that
// measures the rate it accepts connections at:
//
//   flood_client SOCKET register N
//       N registrations over one connection, none of them leased; prints
//       "registered K refused R" and then the first refusal's code and
//       message, "refusal CODE MESSAGE", when there was one.
//   flood_client SOCKET churn HOLD THREADS SECONDS
//       opens connections until the daemon keeps HOLD of them open (or 30 s
//       went), then connects and closes as fast as it can from THREADS
//       threads for SECONDS; prints "held H connects N seconds S". A
//       connect returns once the daemon's backlog has room, so past the
//       first few thousand N/S is the rate the daemon accepts at.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "allocd.grpc.pb.h"
#include "grpcpp/create_channel_posix.h"
#include "grpcpp/grpcpp.h"
#include "ipc/unix_socket.h"

namespace {

int Register(const char* socket, int count) {
  absl::StatusOr<allocd::UniqueFd> fd = allocd::ConnectUnix(socket);
  if (!fd.ok()) {
    std::printf("connect %s\n", std::string(fd.status().message()).c_str());
    return 2;
  }
  fcntl(fd->get(), F_SETFL, fcntl(fd->get(), F_GETFL) | O_NONBLOCK);
  std::unique_ptr<allocd::v1::Allocd::Stub> stub = allocd::v1::Allocd::NewStub(
      grpc::CreateInsecureChannelFromFd("allocd", fd->release()));
  int registered = 0;
  int refused = 0;
  grpc::Status first_refusal;
  for (int i = 0; i < count; ++i) {
    grpc::ClientContext c;
    allocd::v1::RegisterRequest hello;
    hello.set_protocol_version(1);
    hello.set_job("flood");
    allocd::v1::RegisterResponse response;
    const grpc::Status s = stub->Register(&c, hello, &response);
    if (s.ok()) {
      ++registered;
    } else if (refused++ == 0) {
      first_refusal = s;
    }
  }
  std::printf("registered %d refused %d\n", registered, refused);
  if (refused > 0) {
    std::printf("refusal %d %s\n", static_cast<int>(first_refusal.error_code()),
                first_refusal.error_message().c_str());
  }
  return 0;
}

// Whether the daemon has closed `fd` (what it sent first to a connection
// it keeps, gRPC's settings, is read and dropped).
bool Closed(int fd) {
  char buffer[4096];
  for (;;) {
    const ssize_t n = recv(fd, buffer, sizeof buffer, MSG_DONTWAIT);
    if (n > 0) continue;
    return n == 0 || errno != EAGAIN;
  }
}

int Churn(const char* socket, int hold, int threads, int seconds) {
  // Opened again and again until the daemon keeps `hold` of them (it closes
  // those past its pace at once), or for at most 30 s.
  std::vector<allocd::UniqueFd> held;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (static_cast<int>(held.size()) < hold &&
         std::chrono::steady_clock::now() < give_up) {
    while (static_cast<int>(held.size()) < hold) {
      absl::StatusOr<allocd::UniqueFd> fd = allocd::ConnectUnix(socket);
      if (!fd.ok()) {
        std::printf("connect %s\n", std::string(fd.status().message()).c_str());
        return 2;
      }
      held.push_back(*std::move(fd));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::erase_if(held, [](const allocd::UniqueFd& fd) { return Closed(fd.get()); });
  }
  const int kept = static_cast<int>(held.size());
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, socket, sizeof address.sun_path - 1);
  std::atomic<bool> stop{false};
  std::atomic<long> connects{0};
  std::vector<std::thread> churners;
  const auto start = std::chrono::steady_clock::now();
  for (int t = 0; t < threads; ++t) {
    churners.emplace_back([&] {
      long mine = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (connect(fd, reinterpret_cast<const sockaddr*>(&address),
                    sizeof address) == 0) {
          ++mine;
        }
        close(fd);
      }
      connects += mine;
    });
  }
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  stop = true;
  for (std::thread& t : churners) t.join();
  const double elapsed = std::chrono::duration<double>(
                             std::chrono::steady_clock::now() - start)
                             .count();
  std::printf("held %d connects %ld seconds %.2f\n", kept, connects.load(),
              elapsed);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[2]) == "register") {
    return Register(argv[1], std::atoi(argv[3]));
  }
  if (argc == 6 && std::string(argv[2]) == "churn") {
    return Churn(argv[1], std::atoi(argv[3]), std::atoi(argv[4]),
                 std::atoi(argv[5]));
  }
  std::fprintf(stderr,
               "usage: flood_client SOCKET register N\n"
               "       flood_client SOCKET churn HOLD THREADS SECONDS\n");
  return 2;
}
