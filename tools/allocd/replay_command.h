// `allocd replay`: replays a PyTorch memory snapshot under a config and
// prints what PyTorch would have reported.
#ifndef ALLOCD_TOOLS_ALLOCD_REPLAY_COMMAND_H_
#define ALLOCD_TOOLS_ALLOCD_REPLAY_COMMAND_H_

#include <iosfwd>
#include <optional>
#include <string>

namespace allocd {

struct ReplayCommandOptions {
  std::string trace_path;
  std::string config;
  // Sizes as the user wrote them ("80GB"); empty: unlimited.
  std::string capacity;
  std::optional<double> memory_fraction;
  int device = -1;
  bool json = false;
  // Where to write the replay as a snapshot pickle for PyTorch's memory
  // viewer; empty: nowhere.
  std::string export_snapshot;
};

// Runs the command; returns the process exit code (0 ok, 1 an error that
// was printed to `err`).
int RunReplay(const ReplayCommandOptions& options, std::ostream& out,
              std::ostream& err);

}  // namespace allocd

#endif  // ALLOCD_TOOLS_ALLOCD_REPLAY_COMMAND_H_
