#include "tools/allocd/run_command.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

namespace allocd {
namespace {

constexpr const char* kInterposer = "liballocd_interpose.so";

void SetEnv(const char* name, const std::string& value) {
  if (!value.empty()) setenv(name, value.c_str(), /*overwrite=*/1);
}

}  // namespace

std::string FindInterposer() {
  namespace fs = std::filesystem;
  std::vector<fs::path> candidates;
  if (const char* dir = std::getenv("ALLOCD_LIB_DIR")) {
    candidates.push_back(fs::path(dir) / kInterposer);
  }
  std::error_code error;
  const fs::path exe = fs::read_symlink("/proc/self/exe", error);
  if (!error) {
    const fs::path bin = exe.parent_path();
    candidates.push_back(bin / "../lib/allocd" / kInterposer);    // installed
    candidates.push_back(bin / "../client/interpose" / kInterposer);  // build
    candidates.push_back(bin / "../python/allocd" / kInterposer);
  }
  for (const fs::path& candidate : candidates) {
    if (fs::exists(candidate, error)) {
      return fs::weakly_canonical(candidate, error).string();
    }
  }
  return "";
}

int RunUnderAllocd(const RunCommandOptions& options, std::ostream& err) {
  const std::string interposer =
      options.interposer.empty() ? FindInterposer() : options.interposer;
  if (interposer.empty()) {
    err << "allocd run: " << kInterposer
        << " not found (looked in $ALLOCD_LIB_DIR, ../lib/allocd next to "
           "this program and the build tree); it is built with the CUDA "
           "toolkit: set ALLOCD_LIB_DIR to its folder\n";
    return 1;
  }
  std::string preload = interposer;
  if (const char* existing = std::getenv("LD_PRELOAD");
      existing != nullptr && existing[0] != '\0') {
    preload.append(":").append(existing);
  }
  setenv("LD_PRELOAD", preload.c_str(), 1);
  setenv("ALLOCD_MODE", "transparent", 1);
  SetEnv("ALLOCD_SOCKET", options.socket);
  SetEnv("ALLOCD_JOB", options.job);
  if (options.read_ahead_ms.has_value()) {
    SetEnv("ALLOCD_READ_AHEAD_MS", std::to_string(*options.read_ahead_ms));
  }
  if (options.handover_ms.has_value()) {
    SetEnv("ALLOCD_HANDOVER_MS", std::to_string(*options.handover_ms));
  }
  std::vector<char*> argv;
  for (const std::string& arg : options.command) {
    argv.push_back(const_cast<char*>(arg.c_str()));
  }
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  err << "allocd run: cannot run " << options.command[0] << ": "
      << std::strerror(errno) << "\n";
  return 1;
}

}  // namespace allocd
