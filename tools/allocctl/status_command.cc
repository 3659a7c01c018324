#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "allocator/bytes.h"
#include "tools/allocctl/commands.h"

namespace allocd {
namespace {

void PrintStatus(const v1::StatusResponse& r) {
  std::printf("allocd %s, backend %s, up since %s\n", r.version().c_str(),
              r.backend().c_str(), Time(r.started_unix_micros()).c_str());
  std::vector<std::string> sizes;
  for (uint64_t size : r.chunk_classes()) sizes.push_back(FormatSize(size));
  if (sizes.empty()) sizes.push_back(FormatSize(r.chunk_bytes()));
  std::printf("pool: %s in use, %s cached free, capacity %s (chunks of %s)\n",
              FormatSize(r.in_use_bytes()).c_str(),
              FormatSize(r.free_bytes()).c_str(),
              FormatSize(r.capacity_bytes()).c_str(),
              absl::StrJoin(sizes, ", ").c_str());
  std::printf(
      "chunks handed out: %llu created, %llu reused, %llu made by their "
      "clients; %u sessions\n",
      static_cast<unsigned long long>(r.chunks_created_total()),
      static_cast<unsigned long long>(r.chunks_reused_total()),
      static_cast<unsigned long long>(r.chunks_client_made_total()),
      r.sessions());
  std::printf("given back to the device since start: %s\n",
              FormatSize(r.trimmed_bytes_total()).c_str());
  if (r.adopting() || r.adopted_bytes_total() > 0) {
    std::printf("adopted from the daemon before (a restart): %s%s\n",
                FormatSize(r.adopted_bytes_total()).c_str(),
                r.adopting() ? "; still waiting for its jobs to re-declare "
                               "their chunks (new memory waits)"
                             : "");
  }
  // One row per device's pool: the lines above are their sums.
  std::printf("\n%-4s %-40s %-24s %10s %10s %10s %10s %8s\n", "DEV",
              "GPU UUID", "NAME", "IN USE", "FREE", "CAPACITY", "TRIMMED",
              "SESSIONS");
  for (const v1::DeviceStatus& d : r.devices()) {
    std::printf("%-4d %-40s %-24s %10s %10s %10s %10s %8u\n", d.node_device(),
                d.gpu_uuid().c_str(), d.name().c_str(),
                FormatSize(d.in_use_bytes()).c_str(),
                FormatSize(d.free_bytes()).c_str(),
                FormatSize(d.capacity_bytes()).c_str(),
                FormatSize(d.trimmed_bytes_total()).c_str(), d.sessions());
  }
}

}  // namespace

void AddStatusCommand(CLI::App& app, AdminCommands& commands) {
  CLI::App* status = app.add_subcommand("status", "the node pool and daemon");
  commands.push_back({status, [](const AdminContext& c) {
                        return CallAdmin(c, &v1::Admin::Stub::Status,
                                         v1::StatusRequest(), PrintStatus);
                      }});
}

}  // namespace allocd
