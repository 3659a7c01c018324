// `allocd serve`: runs the node daemon until SIGTERM or SIGINT, then shuts
// down gracefully.
#ifndef ALLOCD_TOOLS_ALLOCD_SERVE_COMMAND_H_
#define ALLOCD_TOOLS_ALLOCD_SERVE_COMMAND_H_

#include <iosfwd>
#include <string>
#include <vector>

#include "server/daemon.h"

namespace allocd {

struct ServeCommandOptions {
  DaemonOptions daemon;
  // Per device, as the user wrote it ("8GiB", "90%"); empty: a GPU's free
  // memory at start minus the headroom, 8GiB per sim device.
  std::string capacity;
  // "5m", "30s", "1h", "inf" (never).
  std::string trim_after = "5m";
  // A size ("16GiB"); empty: no high water.
  std::string cache_high_water;
  // "5s", "30s": how long new memory waits after a restart for surviving
  // clients to re-declare their chunks.
  std::string adopt_window = "5s";
  // --autotune: off, recommend, apply.
  std::string autotune_mode = "recommend";
  // --tenancy: uid, pod, node.
  std::string tenancy = "uid";
  // --cross-tenant-reuse: recreate; scrub, accepted from configs that
  // name it, re-creates too (with a notice).
  std::string cross_tenant_reuse = "recreate";
  // --autotune-memory and --autotune-memory-per-tenant, sizes ("256MiB");
  // the latter empty: DaemonOptions' default.
  std::string autotune_memory = "256MiB";
  std::string autotune_memory_per_tenant;
  // --state-dir, when given (DaemonOptions::state_dir).
  std::string state_dir;
};

// Returns the process exit code: 0 after a clean shutdown, 1 when the
// daemon could not start (the reason is printed to `err`).
int RunServe(const ServeCommandOptions& options, std::ostream& err);

}  // namespace allocd

#endif  // ALLOCD_TOOLS_ALLOCD_SERVE_COMMAND_H_
