// allocctl: the node daemon's admin tool. Talks to the Admin service of
// `allocd serve` over its admin socket (SOCKET.admin: the clients' socket
// refuses Admin calls); the daemon allows it to root, its own uid, the uids
// given to it with --admin-uid and the members of --admin-group. Each
// command lives in its own file (commands.h); this one parses the command
// line and runs the command given.
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "tools/allocctl/commands.h"
#include "tools/allocctl/common.h"
#include "tools/common/cli.h"

int main(int argc, char** argv) {
  using namespace allocd;
  GlobalOptions o;
  CLI::App app{
      "allocctl: administer the allocd node daemon (sessions, configs per "
      "job, quotas) over its admin socket.\nAllowed to root, the daemon's "
      "uid, its --admin-uid uids and its --admin-group.",
      "allocctl"};
  app.require_subcommand(1);
  // --socket and --json also after the subcommand: `allocctl sessions --json`.
  app.fallthrough();
  app.footer(absl::StrCat(
      "Global flags, before or after the subcommand: --socket PATH, --json, "
      "--admin-socket PATH.\n\n",
      ExitStatusHelp("  4: the daemon does not allow this caller to administer it, "
                     "or its admin socket cannot be reached\n")));
  app.add_option("--admin-socket", o.admin_socket,
                 "the daemon's admin socket, when not SOCKET.admin (allocd "
                 "serve --admin-socket; default $ALLOCCTL_ADMIN_SOCKET)")
      ->envname("ALLOCCTL_ADMIN_SOCKET");
  app.add_option("--socket,-s", o.socket,
                 std::string("the daemon's socket (default ") +
                     kDefaultSocket +
                     "); allocctl talks to its admin socket, SOCKET.admin; "
                     "before or after the subcommand");
  app.add_flag("--json", o.json,
               "print the daemon's answer as JSON; before or after the "
               "subcommand");

  AdminCommands commands;
  AddStatusCommand(app, commands);
  AddHealthCommand(app, commands);
  AddSessionsCommand(app, commands);
  AddConfigCommand(app, commands);
  AddQuotaCommand(app, commands);
  AddAutotuneCommand(app, commands);
  AddPoolCommand(app, commands);

  if (std::optional<int> exit_code =
          ParseCommandLine(app, argc, argv, std::cout, std::cerr)) {
    return *exit_code;
  }

  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      Dial(AdminSocket(o));
  if (!channel.ok()) {
    std::cerr << "allocctl: " << channel.status().message() << "\n";
    return kExitNotAdmin;
  }
  std::unique_ptr<v1::Admin::Stub> admin = v1::Admin::NewStub(*channel);
  const AdminContext context{*channel, *admin, o.json};
  for (const AdminCommand& command : commands) {
    if (command.app->parsed()) return command.run(context);
  }
  return kExitError;  // require_subcommand: one of them was parsed
}
