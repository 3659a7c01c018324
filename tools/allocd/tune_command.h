// `allocd tune`: finds the PYTORCH_CUDA_ALLOC_CONF that fits a job best.
#ifndef ALLOCD_TOOLS_ALLOCD_TUNE_COMMAND_H_
#define ALLOCD_TOOLS_ALLOCD_TUNE_COMMAND_H_

#include <iosfwd>
#include <string>

namespace allocd {

struct TuneCommandOptions {
  std::string trace_path;
  std::string capacity;      // "" : unlimited
  std::string total_memory;  // "" : capacity
  std::string objective = "peak";
  std::string space;
  std::string memory_budget;
  std::string report_dir;
  size_t budget = 200;
  int jobs = 0;  // 0: every core
  int max_retries = 0;
  double max_call_ratio = 2.0;
  double max_peak_ratio = 1.0;
  double cap_threshold_percent = 5.0;
  int device = -1;
  int top = 10;
  bool json = false;
};

// `allocd tune`'s exit status when no candidate fits (0, 1 and 2 are
// tools/common/cli.h's).
inline constexpr int kExitNothingFits = 3;

// Returns the exit code: 0 with a recommendation, 3 when no candidate fits,
// 1 on errors (printed to `err`).
int RunTune(const TuneCommandOptions& options, std::ostream& out,
            std::ostream& err);

}  // namespace allocd

#endif  // ALLOCD_TOOLS_ALLOCD_TUNE_COMMAND_H_
