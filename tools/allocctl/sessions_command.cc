#include <cstdint>
#include <cstdio>
#include <string>

#include "allocator/bytes.h"
#include "tools/allocctl/commands.h"

namespace allocd {
namespace {

int64_t Stat(const v1::SessionInfo& s, const std::string& key) {
  auto it = s.stats().find(key);
  return it == s.stats().end() ? 0 : it->second;
}

void PrintSessions(const v1::ListSessionsResponse& r) {
  // DEV is the node's device (allocctl status), GPU UUID names it; the
  // client's own CUDA ordinal is in --json (device). TENANT is what
  // `allocctl quota set --tenant` takes.
  // START: where the config it started on came from (own, learned, prior,
  // replaced: decided before its first allocation).
  std::printf("%-8s %-8s %-6s %-14s %-20s %-4s %-40s %10s %10s %10s %5s %-8s %s\n",
              "SESSION", "PID", "UID", "TENANT", "JOB", "DEV", "GPU UUID",
              "HELD", "RESERVED", "ALLOCATED", "OOMS", "START", "CONFIG");
  for (const v1::SessionInfo& s : r.sessions()) {
    std::printf(
        "%-8llu %-8d %-6u %-14s %-20s %-4d %-40s %10s %10s %10s %5llu %-8s "
        "v%llu %s\n",
        static_cast<unsigned long long>(s.session_id()), s.pid(), s.uid(),
        s.tenant().empty() ? "-" : s.tenant().c_str(),
        s.job().empty() ? "-" : s.job().c_str(), s.node_device(),
        s.gpu_uuid().c_str(),
        FormatSize(s.held_bytes()).c_str(),
        FormatSize(Stat(s, "reserved_bytes.all.current")).c_str(),
        FormatSize(Stat(s, "allocated_bytes.all.current")).c_str(),
        static_cast<unsigned long long>(s.ooms()),
        s.start_config_source().empty() ? "own" : s.start_config_source().c_str(),
        static_cast<unsigned long long>(s.config_version()),
        s.config().empty() ? "(defaults)" : s.config().c_str());
  }
}

}  // namespace

void AddSessionsCommand(CLI::App& app, AdminCommands& commands) {
  CLI::App* sessions = app.add_subcommand(
      "sessions", "client sessions: pid, job, memory held, config, OOMs");
  commands.push_back({sessions, [](const AdminContext& c) {
                        return CallAdmin(c, &v1::Admin::Stub::ListSessions,
                                         v1::ListSessionsRequest(),
                                         PrintSessions);
                      }});
}

}  // namespace allocd
