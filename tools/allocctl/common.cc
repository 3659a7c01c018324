#include "tools/allocctl/common.h"

#include <fcntl.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/create_channel_posix.h"
#include "ipc/unix_socket.h"

namespace allocd {

std::string AdminSocket(const GlobalOptions& o) {
  if (!o.admin_socket.empty()) return o.admin_socket;
  if (absl::EndsWith(o.socket, ".admin")) return o.socket;
  return o.socket + ".admin";
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> Dial(const std::string& path) {
  absl::StatusOr<UniqueFd> fd = ConnectUnix(path);
  if (absl::IsPermissionDenied(fd.status())) {
    return absl::PermissionDeniedError(absl::StrCat(
        "cannot reach allocd's admin socket: ", fd.status().message(),
        ". It admits root, the daemon's uid, the daemon's --admin-uid uids "
        "and the members of its --admin-group; in Kubernetes, run allocctl "
        "in allocd's pod (kubectl exec)"));
  }
  if (!fd.ok()) {
    // The message names the path and, where it fits, asks whether allocd
    // runs; what is left to say is how to point allocctl elsewhere.
    return absl::UnavailableError(absl::StrCat(
        "cannot reach allocd's admin socket: ", fd.status().message(),
        "; --socket names the daemon's socket (allocctl talks to "
        "SOCKET.admin), --admin-socket another admin socket"));
  }
  fcntl(fd->get(), F_SETFL, fcntl(fd->get(), F_GETFL) | O_NONBLOCK);
  return grpc::CreateInsecureChannelFromFd("allocd", fd->release());
}

std::string Json(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

std::string Time(int64_t unix_micros) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S",
                          absl::FromUnixMicros(unix_micros),
                          absl::LocalTimeZone());
}

}  // namespace allocd
