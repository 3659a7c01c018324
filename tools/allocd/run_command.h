// `allocd run -- COMMAND...`: starts COMMAND in transparent managed mode:
// PyTorch's own caching allocator, unchanged, on GPU memory from the node
// daemon (liballocd_interpose.so preloaded, see client/interpose/), tuned by
// the daemon's autotuner as with allocd.enable() (client/python/allocd/
// _run/sitecustomize.py).
#ifndef ALLOCD_TOOLS_ALLOCD_RUN_COMMAND_H_
#define ALLOCD_TOOLS_ALLOCD_RUN_COMMAND_H_

#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace allocd {

struct RunCommandOptions {
  // Empty: the environment's ALLOCD_SOCKET / ALLOCD_JOB, else the defaults.
  std::string socket;
  std::string job;
  // The interposer to preload; empty: found next to this program.
  std::string interposer;
  // ALLOCD_READ_AHEAD_MS for the interposer; unset: the environment's.
  std::optional<int> read_ahead_ms;
  // ALLOCD_HANDOVER_MS for the interposer; unset: the environment's.
  std::optional<int> handover_ms;
  // ALLOCD_FEATURES (what the job will do with its CUDA memory, by
  // JobFeatures' field names); empty: the environment's.
  std::string features;
  std::vector<std::string> command;
};

// Where liballocd_interpose.so is: $ALLOCD_LIB_DIR, then next to the
// `allocd` binary as installed (../lib/allocd) and in the build tree. Empty
// when none exists.
std::string FindInterposer();

// Where allocd's Python start is (the folder of allocd/_run/sitecustomize.py:
// $ALLOCD_LIB_DIR/_run, ../lib/allocd/_run as installed, the build tree's
// package). Empty when none exists.
std::string FindPythonStart();

// Replaces this process with `options.command`, the interposer first in
// LD_PRELOAD and ALLOCD_MODE=transparent so that `allocd.enable()` in it
// drives the same sessions. allocd's Python start goes first on PYTHONPATH
// with ALLOCD_AUTOSTART=1 (unless set already): a Python program that
// imports torch is tuned as with allocd.enable(), with no `import allocd`
// (allocd/_autostart.py); other programs run as they would. Without the
// Python start it says so on `err` and runs the command anyway. Returns
// only on failure: 1 with the reason on `err` (no interposer, a command
// that cannot be run).
int RunUnderAllocd(const RunCommandOptions& options, std::ostream& err);

}  // namespace allocd

#endif  // ALLOCD_TOOLS_ALLOCD_RUN_COMMAND_H_
