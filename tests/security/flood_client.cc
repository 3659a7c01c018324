// A peer that floods `allocd serve` (the limits tests start it under
// another uid than the legitimate client's):
//
//   flood_client SOCKET register N
//       N registrations over one connection, none of them leased; prints
//       "registered K refused R" and then the first refusal's code and
//       message, "refusal CODE MESSAGE", when there was one.
#include <fcntl.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

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

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[2]) == "register") {
    return Register(argv[1], std::atoi(argv[3]));
  }
  std::fprintf(stderr, "usage: flood_client SOCKET register N\n");
  return 2;
}
