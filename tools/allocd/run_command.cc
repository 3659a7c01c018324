#include "tools/allocd/run_command.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

#include "client/client_env.h"

#ifdef ALLOCD_WITH_SERVER  // the client library, gRPC's
#include "absl/time/time.h"
#include "client/daemon_connection.h"
#endif

namespace allocd {
namespace {

constexpr const char* kInterposer = "liballocd_interpose.so";
// The Python start of a job under `allocd run` (a folder with a
// sitecustomize.py), in the package and installed beside the interposer.
constexpr const char* kPythonStart = "_run";

void SetEnv(const char* name, const std::string& value) {
  if (!value.empty()) setenv(name, value.c_str(), /*overwrite=*/1);
}

// `first` then the variable's old value, ':'-separated.
void Prepend(const char* name, const std::string& first) {
  std::string value = first;
  if (const char* existing = std::getenv(name);
      existing != nullptr && existing[0] != '\0') {
    value.append(":").append(existing);
  }
  setenv(name, value.c_str(), /*overwrite=*/1);
}

// The first of $ALLOCD_LIB_DIR/NAME and, next to this program, its
// installed place (../lib/allocd) and the build tree's that exists; "" if
// none does.
std::string FindNextToProgram(const std::string& name) {
  namespace fs = std::filesystem;
  std::vector<fs::path> candidates;
  if (const char* dir = std::getenv(env::kLibDir)) {
    candidates.push_back(fs::path(dir) / name);
  }
  std::error_code error;
  const fs::path exe = fs::read_symlink("/proc/self/exe", error);
  if (!error) {
    const fs::path bin = exe.parent_path();
    candidates.push_back(bin / "../lib/allocd" / name);       // installed
    candidates.push_back(bin / "../client/interpose" / name);  // build
    candidates.push_back(bin / "../python/allocd" / name);
  }
  for (const fs::path& candidate : candidates) {
    if (fs::exists(candidate, error)) {
      return fs::weakly_canonical(candidate, error).string();
    }
  }
  return "";
}

#ifdef ALLOCD_WITH_SERVER
// Starts the job on the config its tenant's job learned, if any
// (StartOnLearnedConfig). Without an answer the job starts on its own
// config and is handed the learned one at registration.
void StartJobOnLearnedConfig(const std::string& socket,
                             const std::string& job, std::ostream& err) {
  absl::StatusOr<std::string> learned =
      StartOnLearnedConfig(socket, job, absl::Seconds(5));
  // No daemon: the interposer says so. A daemon that does not know the
  // call hands the learned config at registration.
  if (!learned.ok() && !absl::IsUnavailable(learned.status()) &&
      !absl::IsUnimplemented(learned.status())) {
    err << "allocd run: " << learned.status().message()
        << "; the job starts on its own config\n";
  }
}
#endif

}  // namespace

std::string FindInterposer() { return FindNextToProgram(kInterposer); }

std::string FindPythonStart() {
  const std::string file =
      FindNextToProgram(std::string(kPythonStart) + "/sitecustomize.py");
  return file.empty() ? ""
                      : std::filesystem::path(file).parent_path().string();
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
  Prepend("LD_PRELOAD", interposer);
  setenv(env::kMode, "transparent", 1);
  // A Python program is tuned as with allocd.enable(): the package takes
  // over once it imports torch (ALLOCD_AUTOSTART=0 leaves it to the script).
  if (const std::string start = FindPythonStart(); start.empty()) {
    err << "allocd run: allocd's Python start (" << kPythonStart
        << "/sitecustomize.py) not found next to this program or in "
           "$ALLOCD_LIB_DIR: a PyTorch script runs on the daemon's memory but "
           "is tuned only if it calls allocd.enable()\n";
  } else {
    Prepend("PYTHONPATH", start);
    setenv(env::kAutostart, "1", /*overwrite=*/0);
  }
  SetEnv(env::kSocket, options.socket);
  SetEnv(env::kJob, options.job);
  // Declared before the start config is asked for: it must not break them.
  SetEnv(env::kFeatures, options.features);
  if (absl::StatusOr<v1::JobFeatures> features = DeclaredFeatures(); !features.ok()) {
    err << "allocd run: " << features.status().message() << "\n";
    return 2;
  }
#ifdef ALLOCD_WITH_SERVER
  const char* socket = std::getenv(env::kSocket);
  const char* job = std::getenv(env::kJob);
  StartJobOnLearnedConfig(socket != nullptr ? socket : kDefaultSocket,
                          job != nullptr ? job : "", err);
#endif
  if (options.read_ahead_ms.has_value()) {
    SetEnv(env::kReadAheadMs, std::to_string(*options.read_ahead_ms));
  }
  if (options.handover_ms.has_value()) {
    SetEnv(env::kHandoverMs, std::to_string(*options.handover_ms));
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
