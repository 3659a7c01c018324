// A second process for daemon_test: does one thing as a client of the
// daemon and prints what happened, so the test can check what another pid
// can and cannot do.
//   test_client hold SOCKET BYTES            acquire, write, print, sleep
//   test_client read SOCKET BYTES            acquire, print reuse + bytes
//   test_client claim FD_SOCKET TOKEN        claim another pid's token
//   test_client release SOCKET SESSION CHUNK release another's chunk
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "allocd.grpc.pb.h"
#include "client/daemon_client.h"
#include "grpcpp/create_channel_posix.h"
#include "grpcpp/grpcpp.h"
#include "ipc/unix_socket.h"

namespace {

using allocd::DaemonClient;

std::unique_ptr<DaemonClient> Connect(const char* socket) {
  auto client = DaemonClient::Connect({.socket = socket, .job = "other"});
  if (!client.ok()) {
    std::printf("connect-error %s\n", std::string(client.status().message()).c_str());
    std::exit(2);
  }
  return std::move(*client);
}

char* Map(const allocd::ReceivedChunks& chunks, size_t i) {
  void* p = mmap(nullptr, chunks.sizes[i], PROT_READ | PROT_WRITE, MAP_SHARED,
                 chunks.fds[i].get(), static_cast<off_t>(chunks.offsets[i]));
  if (p == MAP_FAILED) std::exit(3);
  return static_cast<char*>(p);
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IONBF, 0);
  if (argc < 4) return 64;
  const std::string mode = argv[1];
  if (mode == "hold" || mode == "read") {
    std::unique_ptr<DaemonClient> client = Connect(argv[2]);
    auto chunks = client->Acquire(std::strtoull(argv[3], nullptr, 10));
    if (!chunks.ok()) {
      std::printf("acquire-error %d\n", static_cast<int>(chunks.status().code()));
      return 1;
    }
    if (mode == "hold") {
      for (size_t i = 0; i < chunks->ids.size(); ++i) Map(*chunks, i)[0] = 'h';
      std::printf("ready %llu\n",
                  static_cast<unsigned long long>(client->session_id()));
      for (;;) pause();
    }
    std::printf("reused %u first-byte %c\n", chunks->reused, Map(*chunks, 0)[0]);
    return 0;
  }
  if (mode == "claim") {
    auto side = allocd::ConnectUnix(argv[2]);
    if (!side.ok()) return 2;
    allocd::v1::SideRequest request;
    request.set_claim_token(argv[3]);
    if (!allocd::SendMessage(side->get(), request.SerializeAsString()).ok()) return 2;
    auto frame = allocd::ReceiveMessage(side->get(), 1 << 20, absl::Seconds(5));
    if (!frame.ok()) return 2;
    allocd::v1::SideResponse response;
    response.ParseFromString(frame->payload);
    std::printf("code %d fds %zu\n", response.code(), frame->fds.size());
    return 0;
  }
  if (mode == "release" && argc == 5) {
    auto fd = allocd::ConnectUnix(argv[2]);
    if (!fd.ok()) return 2;
    fcntl(fd->get(), F_SETFL, fcntl(fd->get(), F_GETFL) | O_NONBLOCK);
    auto stub = allocd::v1::Allocd::NewStub(
        grpc::CreateInsecureChannelFromFd("allocd", fd->release()));
    // A session of its own (its lease unopened: it lives the grace period).
    allocd::v1::RegisterResponse own;
    {
      grpc::ClientContext context;
      allocd::v1::RegisterRequest hello;
      hello.set_protocol_version(1);
      if (!stub->Register(&context, hello, &own).ok()) return 2;
    }
    const uint64_t victim = std::strtoull(argv[3], nullptr, 10);
    const uint64_t chunk = std::strtoull(argv[4], nullptr, 10);
    // With the victim's session id (and its own secret: the victim's it
    // does not know), and with its own session.
    for (uint64_t session : {victim, own.session_id()}) {
      grpc::ClientContext context;
      allocd::v1::ReleaseChunksRequest request;
      request.set_session_id(session);
      request.set_session_secret(own.session_secret());
      request.add_chunk_ids(chunk);
      allocd::v1::ReleaseChunksResponse response;
      std::printf("code %d\n",
                  static_cast<int>(stub->ReleaseChunks(&context, request, &response)
                                       .error_code()));
    }
    return 0;
  }
  return 64;
}
