// allocctl's commands, each in its own file (status_command.cc for
// `allocctl status`, and so on). Each Add*Command adds its subcommand, with
// its flags, to `app`, and to `commands` what each of its subcommands that
// runs does; the flags' values live as long as `commands`.
#ifndef ALLOCD_TOOLS_ALLOCCTL_COMMANDS_H_
#define ALLOCD_TOOLS_ALLOCCTL_COMMANDS_H_

#include "CLI/CLI.hpp"
#include "tools/allocctl/common.h"

namespace allocd {

// `allocctl status`: the node pool, per device, and the daemon.
void AddStatusCommand(CLI::App& app, AdminCommands& commands);
// `allocctl health`: the grpc.health.v1 check; exit 0 only when SERVING.
void AddHealthCommand(CLI::App& app, AdminCommands& commands);
// `allocctl sessions`: the client sessions.
void AddSessionsCommand(CLI::App& app, AdminCommands& commands);
// `allocctl config get|set|history`: allocator configs per job.
void AddConfigCommand(CLI::App& app, AdminCommands& commands);
// `allocctl quota set`: per-session, per-uid and per-tenant quotas.
void AddQuotaCommand(CLI::App& app, AdminCommands& commands);
// `allocctl autotune status|history|run|set|learned|export`: the daemon's
// autotuner.
void AddAutotuneCommand(CLI::App& app, AdminCommands& commands);
// `allocctl pool trim`: the node pool's cached memory.
void AddPoolCommand(CLI::App& app, AdminCommands& commands);

}  // namespace allocd

#endif  // ALLOCD_TOOLS_ALLOCCTL_COMMANDS_H_
