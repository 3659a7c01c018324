#include "server/autotune/learned_configs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace allocd {
namespace {

// The file's format; a file of another version is treated as corrupt.
constexpr int kFormat = 1;

nlohmann::json ToJson(const JobKey& key, const LearnedConfig& l) {
  nlohmann::json j = {
      {"tenant", key.tenant},
      {"job", key.job},
      {"config", l.config},
      {"from_config", l.from_config},
      {"decision_id", l.decision_id},
      {"learned_unix_micros", absl::ToUnixMicros(l.learned_at)},
      {"predicted_peak_current", l.predicted_peak_current},
      {"predicted_peak_switched", l.predicted_peak_switched},
      {"predicted_peak_allocated", l.predicted_peak_allocated},
      {"predicted_peak_requested", l.predicted_peak_requested},
  };
  if (l.realized_peak) j["realized_peak"] = *l.realized_peak;
  return j;
}

// Throws nlohmann::json::exception for a malformed entry.
std::pair<JobKey, LearnedConfig> FromJson(const nlohmann::json& j) {
  LearnedConfig l;
  l.config = j.at("config").get<std::string>();
  l.from_config = j.at("from_config").get<std::string>();
  l.decision_id = j.at("decision_id").get<uint64_t>();
  l.learned_at = absl::FromUnixMicros(j.at("learned_unix_micros").get<int64_t>());
  l.predicted_peak_current = j.at("predicted_peak_current").get<int64_t>();
  l.predicted_peak_switched = j.at("predicted_peak_switched").get<int64_t>();
  l.predicted_peak_allocated = j.at("predicted_peak_allocated").get<int64_t>();
  l.predicted_peak_requested = j.at("predicted_peak_requested").get<int64_t>();
  if (j.contains("realized_peak")) l.realized_peak = j["realized_peak"].get<int64_t>();
  return {JobKey{j.at("tenant").get<std::string>(), j.at("job").get<std::string>()},
          std::move(l)};
}

absl::Status WriteError(const std::string& what, const std::string& path) {
  return absl::FailedPreconditionError(absl::StrCat(
      "cannot ", what, " ", path, ": ", std::strerror(errno),
      "; give allocd serve a writable --state-dir (or --state-dir '' to "
      "keep learned configs in memory only)"));
}

// `text` to `path` whole or not at all: a temporary file beside it,
// flushed to disk, renamed over it.
absl::Status WriteAtomically(const std::string& path, const std::string& text) {
  const std::string temp = path + ".tmp";
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return WriteError("write", temp);
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      absl::Status error = WriteError("write", temp);
      ::close(fd);
      ::unlink(temp.c_str());
      return error;
    }
    written += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    absl::Status error = WriteError("sync", temp);
    ::close(fd);
    ::unlink(temp.c_str());
    return error;
  }
  ::close(fd);
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    absl::Status error = WriteError("replace", path);
    ::unlink(temp.c_str());
    return error;
  }
  return absl::OkStatus();
}

}  // namespace

LearnedConfigs::LearnedConfigs(size_t max_jobs) : LearnedConfigs(max_jobs, "") {}

LearnedConfigs::LearnedConfigs(size_t max_jobs, std::string path)
    : max_jobs_(std::max<size_t>(1, max_jobs)), path_(std::move(path)) {}

absl::StatusOr<std::unique_ptr<LearnedConfigs>> LearnedConfigs::Open(
    const std::string& state_dir, size_t max_jobs, std::string* warning) {
  std::error_code error;
  std::filesystem::create_directories(state_dir, error);
  if (error) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot create the state directory ", state_dir, ": ", error.message(),
        "; give allocd serve a writable --state-dir (or --state-dir '' to keep "
        "learned configs in memory only)"));
  }
  ::chmod(state_dir.c_str(), 0700);
  const std::string path = (std::filesystem::path(state_dir) / kFileName).string();
  std::unique_ptr<LearnedConfigs> store(new LearnedConfigs(max_jobs, path));
  absl::MutexLock lock(&store->mu_);
  if (std::ifstream in(path); in) {
    std::stringstream text;
    text << in.rdbuf();
    try {
      const nlohmann::json j = nlohmann::json::parse(text.str());
      if (j.at("format").get<int>() != kFormat) {
        throw std::runtime_error(absl::StrCat("format ", j.at("format").dump(),
                                              " is not ", kFormat));
      }
      for (const nlohmann::json& entry : j.at("jobs")) {
        store->learned_.insert(FromJson(entry));
      }
    } catch (const std::exception& e) {
      store->learned_.clear();
      const std::string aside = path + ".corrupt";
      std::filesystem::rename(path, aside, error);
      if (warning != nullptr) {
        *warning = absl::StrCat(path, " is not a learned-configs file (", e.what(),
                                "): starting with no learned configs",
                                error ? "" : absl::StrCat("; it was moved to ", aside));
      }
    }
  }
  // Writing now finds a directory that cannot be written at start, not at
  // the first decision.
  if (absl::Status s = store->Save(); !s.ok()) return s;
  return store;
}

absl::Status LearnedConfigs::Record(const JobKey& key, LearnedConfig learned) {
  absl::MutexLock lock(&mu_);
  learned_[key] = std::move(learned);
  while (learned_.size() > max_jobs_) {
    auto oldest = learned_.begin();
    for (auto it = learned_.begin(); it != learned_.end(); ++it) {
      if (it->second.learned_at < oldest->second.learned_at) oldest = it;
    }
    learned_.erase(oldest);
  }
  return Save();
}

absl::StatusOr<bool> LearnedConfigs::Forget(const JobKey& key, const std::string& config) {
  absl::MutexLock lock(&mu_);
  auto it = learned_.find(key);
  if (it == learned_.end() || it->second.config != config) return false;
  learned_.erase(it);
  if (absl::Status s = Save(); !s.ok()) return s;
  return true;
}

std::optional<LearnedConfig> LearnedConfigs::Find(const JobKey& key) const {
  absl::MutexLock lock(&mu_);
  auto it = learned_.find(key);
  if (it == learned_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::pair<JobKey, LearnedConfig>> LearnedConfigs::List() const {
  absl::MutexLock lock(&mu_);
  return {learned_.begin(), learned_.end()};
}

absl::Status LearnedConfigs::Save() const {
  if (path_.empty()) return absl::OkStatus();
  nlohmann::json jobs = nlohmann::json::array();
  for (const auto& [key, learned] : learned_) jobs.push_back(ToJson(key, learned));
  const nlohmann::json file = {{"format", kFormat}, {"jobs", std::move(jobs)}};
  return WriteAtomically(path_, file.dump(2) + "\n");
}

}  // namespace allocd
