#include "server/config_watcher.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/log.h"

namespace allocd {
namespace {

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ConfigWatcher>> ConfigWatcher::Start(
    std::string path, absl::Duration period, DaemonCore* core,
    DaemonAutotune* autotune, Metrics* metrics) {
  std::unique_ptr<ConfigWatcher> watcher(
      new ConfigWatcher(std::move(path), period, core, autotune, metrics));
  if (absl::Status s = watcher->Reload(); !s.ok()) {
    // No good file yet: the daemon does not start on a file it cannot use.
    return absl::Status(
        s.code(),
        absl::StrCat("cannot start with --config ", s.message(),
                     ". Fix the file (allocd check-config 'CONFIG' checks "
                     "each config), or start without --config"));
  }
  watcher->thread_ = std::thread([w = watcher.get()] { w->Loop(); });
  return watcher;
}

ConfigWatcher::ConfigWatcher(std::string path, absl::Duration period,
                             DaemonCore* core, DaemonAutotune* autotune,
                             Metrics* metrics)
    : path_(std::move(path)),
      period_(period),
      core_(core),
      autotune_(autotune),
      metrics_(metrics) {}

ConfigWatcher::~ConfigWatcher() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void ConfigWatcher::Loop() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_;
      };
      if (mu_.AwaitWithTimeout(absl::Condition(&stop), period_)) return;
    }
    if (absl::Status s = Reload(); !s.ok()) {
      LogError(absl::StrCat("config file rejected, keeping the last good one: ",
                            s.message()));
    }
  }
}

absl::Status ConfigWatcher::Reload() {
  absl::StatusOr<std::string> text = ReadText(path_);
  absl::MutexLock lock(&mu_);
  // Only once per bad content, not every period: the same text again is
  // no change.
  if (text.ok() && *text == last_text_) return absl::OkStatus();
  absl::StatusOr<NodeConfigFile> parsed =
      text.ok() ? ParseNodeConfigFile(*text, core_->pools().min_capacity(),
                                      core_->tenancy())
                : text.status();
  if (!parsed.ok()) {
    const absl::Status error(parsed.status().code(),
                             absl::StrCat(path_, ": ", parsed.status().message()));
    if (text.ok()) last_text_ = *text;
    metrics_->ConfigReload(false);
    return error;
  }
  last_text_ = *text;
  Apply(*parsed);
  metrics_->ConfigReload(true);
  return absl::OkStatus();
}

void ConfigWatcher::Apply(const NodeConfigFile& next) {
  const std::string author = absl::StrCat("config file ", path_);
  // The file was validated whole, so these cannot fail.
  if (next.default_config != applied_.default_config) {
    if (next.default_config.has_value()) {
      (void)core_->SetConfig("", *next.default_config, author);
    } else {
      core_->ClearConfig("", author);
    }
  }
  for (const auto& [job, config] : next.job_configs) {
    auto old = applied_.job_configs.find(job);
    if (old == applied_.job_configs.end() || old->second != config) {
      (void)core_->SetConfig(job, config, author);
    }
  }
  for (const auto& [job, config] : applied_.job_configs) {
    if (!next.job_configs.contains(job)) core_->ClearConfig(job, author);
  }
  for (const auto& [uid, bytes] : applied_.uid_quotas) {
    if (!next.uid_quotas.contains(uid)) core_->SetUidQuota(uid, std::nullopt);
  }
  for (const auto& [uid, bytes] : next.uid_quotas) {
    core_->SetUidQuota(uid, bytes);
  }
  for (const auto& [tenant, bytes] : applied_.tenant_quotas) {
    if (!next.tenant_quotas.contains(tenant)) {
      core_->SetTenantQuota(tenant, std::nullopt);
    }
  }
  for (const auto& [tenant, bytes] : next.tenant_quotas) {
    core_->SetTenantQuota(tenant, bytes);
  }
  if (autotune_ != nullptr &&
      (next.autotune_mode != applied_.autotune_mode ||
       next.autotune_jobs != applied_.autotune_jobs)) {
    autotune_->SetFilePolicies(next.autotune_mode, next.autotune_jobs);
  }
  if (autotune_ != nullptr && next.job_configs != applied_.job_configs) {
    autotune_->SetFileJobConfigs(next.job_configs);
  }
  applied_ = next;
  LogInfo(absl::StrCat("config file ", path_, " applied: ",
                       next.job_configs.size(), " job configs, ",
                       next.default_config ? "a default, " : "no default, ",
                       next.uid_quotas.size(), " uid quotas, ",
                       next.tenant_quotas.size(), " tenant quotas, ",
                       next.autotune_jobs.size(), " autotune job policies"));
}

}  // namespace allocd
