// What every allocctl command shares: reaching the daemon's admin socket,
// calling an RPC and printing its answer, and how a command is added to the
// command line (exit status and sizes: tools/common/cli.h).
#ifndef ALLOCD_TOOLS_ALLOCCTL_COMMON_H_
#define ALLOCD_TOOLS_ALLOCCTL_COMMON_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "allocd.grpc.pb.h"
#include "google/protobuf/message.h"
#include "grpcpp/grpcpp.h"
#include "proto/protocol.h"
#include "tools/common/cli.h"

namespace allocd {

// allocctl's own exit status: the caller cannot administer the daemon --
// the daemon refuses it, or its admin socket cannot be reached (missing,
// not this caller's to open, or no daemon behind it).
inline constexpr int kExitNotAdmin = 4;

// The flags of allocctl itself, before or after the subcommand.
struct GlobalOptions {
  std::string socket = kDefaultSocket;
  // Empty: `socket` + ".admin", or `socket` itself when it ends so.
  std::string admin_socket;
  bool json = false;
};

// The admin socket of the daemon `o` names.
std::string AdminSocket(const GlobalOptions& o);

// A channel over the admin socket at `path`. PermissionDenied when the
// socket refuses this caller, Unavailable when it cannot be reached; the
// message says what to do.
absl::StatusOr<std::shared_ptr<grpc::Channel>> Dial(const std::string& path);

// What a command runs with: the channel to the daemon's admin socket, its
// Admin service, and whether to print answers as JSON.
struct AdminContext {
  std::shared_ptr<grpc::Channel> channel;
  v1::Admin::Stub& admin;
  bool json = false;
};

// One subcommand that runs (`status`, `config set`: never a group such as
// `config`) and what it does once the command line is parsed; `run`
// returns the exit status.
struct AdminCommand {
  CLI::App* app;
  std::function<int(const AdminContext&)> run;
};
using AdminCommands = std::vector<AdminCommand>;

// `message` as indented JSON, with the proto's field names.
std::string Json(const google::protobuf::Message& message);

// A time the daemon reports, in local time: "2026-11-28 19:01:20".
std::string Time(int64_t unix_micros);

// Calls `rpc` (a stub's call, given the context and the response to fill)
// with a deadline. On an error prints it and returns kExitNotAdmin when the
// daemon refused the caller, kExitError otherwise; else prints the response
// with `print`, or as JSON with `json`, and returns kExitOk.
template <typename Response, typename Rpc, typename Print>
int Call(bool json, Rpc&& rpc, Print&& print) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  Response response;
  grpc::Status status = rpc(&context, &response);
  if (!status.ok()) {
    std::cerr << "allocctl: " << status.error_message() << "\n";
    return status.error_code() == grpc::StatusCode::PERMISSION_DENIED
               ? kExitNotAdmin
               : kExitError;
  }
  if (json) {
    std::cout << Json(response) << "\n";
  } else {
    print(response);
  }
  return kExitOk;
}

// Call of the Admin RPC `rpc` with `request`.
template <typename Request, typename Response, typename Print>
int CallAdmin(const AdminContext& c,
              grpc::Status (v1::Admin::Stub::*rpc)(grpc::ClientContext*,
                                                   const Request&, Response*),
              const Request& request, Print&& print) {
  return Call<Response>(
      c.json,
      [&](grpc::ClientContext* context, Response* response) {
        return (c.admin.*rpc)(context, request, response);
      },
      print);
}

}  // namespace allocd

#endif  // ALLOCD_TOOLS_ALLOCCTL_COMMON_H_
