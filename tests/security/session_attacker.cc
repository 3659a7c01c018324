// What an attacker on the node runs against `allocd serve` (the security
// suite starts it under another uid): raw requests naming sessions and
// chunks it does not hold. Each line it prints is "<what> <code> <message>".
//
//   session_attacker SOCKET take SESSION_ID SECRET_HEX
//       every request naming the session, with its id and secret;
//   session_attacker SOCKET release CHUNK_ID...
//       from a session of its own, a release of each chunk id;
//   session_attacker SOCKET forge COUNT BYTES
//       from a session of its own, on its lease, a declaration of COUNT
//       memfds it made itself as the daemon makes chunks (name, seals,
//       size), in frames of 250; prints "declared ADOPTED REFUSED" (the
//       totals).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/time/time.h"
#include "allocd.grpc.pb.h"
#include "grpcpp/create_channel_posix.h"
#include "grpcpp/grpcpp.h"
#include "ipc/unix_socket.h"

namespace {

void Print(const char* what, const grpc::Status& s) {
  std::printf("%s %d %s\n", what, static_cast<int>(s.error_code()),
              s.error_message().c_str());
}

std::unique_ptr<allocd::v1::Allocd::Stub> Stub(const char* socket) {
  absl::StatusOr<allocd::UniqueFd> fd = allocd::ConnectUnix(socket);
  if (!fd.ok()) {
    std::printf("connect %s\n", std::string(fd.status().message()).c_str());
    std::exit(2);
  }
  fcntl(fd->get(), F_SETFL, fcntl(fd->get(), F_GETFL) | O_NONBLOCK);
  return allocd::v1::Allocd::NewStub(
      grpc::CreateInsecureChannelFromFd("allocd", fd->release()));
}

template <typename Request>
void Name(Request& r, uint64_t id, const std::string& secret) {
  r.set_session_id(id);
  r.set_session_secret(secret);
}

// Registers a session of this process's own; false, printed, on a refusal.
bool RegisterOwn(allocd::v1::Allocd::Stub& stub,
                 allocd::v1::RegisterResponse& own) {
  grpc::ClientContext c;
  allocd::v1::RegisterRequest hello;
  hello.set_protocol_version(1);
  grpc::Status s = stub.Register(&c, hello, &own);
  if (!s.ok()) Print("register", s);
  return s.ok();
}

int Take(const char* socket, uint64_t id, const std::string& secret) {
  std::unique_ptr<allocd::v1::Allocd::Stub> stub = Stub(socket);
  {
    grpc::ClientContext c;
    allocd::v1::AcquireChunksRequest r;
    Name(r, id, secret);
    r.set_bytes(2 << 20);
    allocd::v1::AcquireChunksResponse response;
    Print("acquire", stub->AcquireChunks(&c, r, &response));
  }
  {
    grpc::ClientContext c;
    allocd::v1::ReleaseChunksRequest r;
    Name(r, id, secret);
    allocd::v1::ReleaseChunksResponse response;
    Print("release", stub->ReleaseChunks(&c, r, &response));
  }
  {
    grpc::ClientContext c;
    allocd::v1::ConfigAck r;
    Name(r, id, secret);
    allocd::v1::AckResponse response;
    Print("ack", stub->AckConfig(&c, r, &response));
  }
  {
    grpc::ClientContext c;
    allocd::v1::OomReport r;
    Name(r, id, secret);
    allocd::v1::OomResponse response;
    Print("oom", stub->ReportOom(&c, r, &response));
  }
  {
    grpc::ClientContext c;
    allocd::v1::TelemetryAck ack;
    auto writer = stub->StreamTelemetry(&c, &ack);
    allocd::v1::TelemetryReport r;
    Name(r, id, secret);
    writer->Write(r);
    writer->WritesDone();
    Print("telemetry", writer->Finish());
  }
  {
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    allocd::v1::WatchConfigRequest r;
    Name(r, id, secret);
    auto reader = stub->WatchConfig(&c, r);
    allocd::v1::ControlMessage m;
    while (reader->Read(&m)) {
    }
    Print("watch", reader->Finish());
  }
  // The lease: the side socket, as the attacker's own process.
  allocd::v1::RegisterResponse own;
  RegisterOwn(*stub, own);
  absl::StatusOr<allocd::UniqueFd> side = allocd::ConnectUnix(own.fd_socket());
  if (!side.ok()) return 2;
  allocd::v1::SideRequest lease;
  lease.set_lease_session_id(id);
  lease.set_session_secret(secret);
  if (!allocd::SendMessage(side->get(), lease.SerializeAsString()).ok()) {
    return 2;
  }
  absl::StatusOr<allocd::ReceivedMessage> frame =
      allocd::ReceiveMessage(side->get(), 1 << 20, absl::Seconds(5));
  if (!frame.ok()) return 2;
  allocd::v1::SideResponse answer;
  answer.ParseFromString(frame->payload);
  std::printf("lease %d %s\n", answer.code(), answer.error().c_str());
  return 0;
}

int Release(const char* socket, int count, char** chunks) {
  std::unique_ptr<allocd::v1::Allocd::Stub> stub = Stub(socket);
  allocd::v1::RegisterResponse own;
  if (!RegisterOwn(*stub, own)) return 2;
  for (int i = 0; i < count; ++i) {
    grpc::ClientContext c;
    allocd::v1::ReleaseChunksRequest r;
    Name(r, own.session_id(), own.session_secret());
    r.add_chunk_ids(std::strtoull(chunks[i], nullptr, 10));
    allocd::v1::ReleaseChunksResponse response;
    Print("release", stub->ReleaseChunks(&c, r, &response));
  }
  return 0;
}

// A memfd as MemfdChunkSource makes one, by a process that is not the
// daemon.
allocd::UniqueFd ForgedChunk(uint64_t bytes) {
  allocd::UniqueFd fd(
      memfd_create("allocd-chunk", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid() || ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0 ||
      fcntl(fd.get(), F_ADD_SEALS,
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    std::printf("memfd failed\n");
    std::exit(2);
  }
  return fd;
}

int Forge(const char* socket, uint64_t count, uint64_t bytes) {
  std::unique_ptr<allocd::v1::Allocd::Stub> stub = Stub(socket);
  allocd::v1::RegisterResponse own;
  if (!RegisterOwn(*stub, own)) return 2;
  absl::StatusOr<allocd::UniqueFd> side = allocd::ConnectUnix(own.fd_socket());
  if (!side.ok()) return 2;
  auto ask = [&](const allocd::v1::SideRequest& request,
                 std::vector<allocd::UniqueFd> fds) {
    std::vector<int> raw;
    for (const allocd::UniqueFd& fd : fds) raw.push_back(fd.get());
    allocd::v1::SideResponse answer;
    if (!allocd::SendMessage(side->get(), request.SerializeAsString(), raw)
             .ok()) {
      std::exit(2);
    }
    absl::StatusOr<allocd::ReceivedMessage> frame =
        allocd::ReceiveMessage(side->get(), 1 << 20, absl::Seconds(30));
    if (!frame.ok()) std::exit(2);
    answer.ParseFromString(frame->payload);
    return answer;
  };
  allocd::v1::SideRequest lease;
  lease.set_lease_session_id(own.session_id());
  lease.set_session_secret(own.session_secret());
  if (ask(lease, {}).code() != 0) return 2;
  uint64_t adopted = 0, refused = 0;
  constexpr uint64_t kFrame = 250;
  for (uint64_t first = 0; first < count; first += kFrame) {
    allocd::v1::SideRequest declare;
    std::vector<allocd::UniqueFd> fds;
    for (uint64_t i = first; i < count && i < first + kFrame; ++i) {
      declare.mutable_declare()->add_chunk_ids(i + 1);
      declare.mutable_declare()->add_sizes(bytes);
      fds.push_back(ForgedChunk(bytes));
    }
    declare.mutable_declare()->set_more(first + kFrame < count);
    const allocd::v1::SideResponse answer = ask(declare, std::move(fds));
    adopted += answer.adopted_chunk_ids_size();
    refused += answer.refused_chunk_ids_size();
  }
  std::printf("declared %llu %llu\n", static_cast<unsigned long long>(adopted),
              static_cast<unsigned long long>(refused));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc == 5 && std::string(argv[2]) == "take") {
    return Take(argv[1], std::strtoull(argv[3], nullptr, 10),
                absl::HexStringToBytes(argv[4]));
  }
  if (argc >= 4 && std::string(argv[2]) == "release") {
    return Release(argv[1], argc - 3, argv + 3);
  }
  if (argc == 5 && std::string(argv[2]) == "forge") {
    return Forge(argv[1], std::strtoull(argv[3], nullptr, 10),
                 std::strtoull(argv[4], nullptr, 10));
  }
  return 64;
}
