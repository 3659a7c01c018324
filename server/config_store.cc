#include "server/config_store.h"

#include <algorithm>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "allocator/config.h"
#include "allocator/config_check.h"

namespace allocd {

absl::Status ValidateJobLabel(absl::string_view job) {
  if (job.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("job label is ", job.size(), " bytes; at most 128"));
  }
  for (char c : job) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '_' || c == '.' || c == ':' ||
              c == '/' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job label may hold only [A-Za-z0-9_.:/-]; got byte 0x",
          absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2)));
    }
  }
  return absl::OkStatus();
}

ConfigKey SplitConfigKey(absl::string_view key) {
  const size_t at = key.find('@');
  if (at == absl::string_view::npos) return {.job = key};
  return {.job = key.substr(0, at), .tenant = key.substr(at + 1)};
}

absl::Status ValidateConfigKey(absl::string_view key) {
  const ConfigKey split = SplitConfigKey(key);
  if (absl::Status s = ValidateJobLabel(split.job); !s.ok()) return s;
  if (key.find('@') == absl::string_view::npos) return absl::OkStatus();
  if (split.job.empty()) {
    return absl::InvalidArgumentError(
        "a tenant's config names a job: LABEL@TENANT (the node default is "
        "every tenant's)");
  }
  const bool valid_tenant =
      !split.tenant.empty() && split.tenant.size() <= 128 &&
      absl::c_all_of(split.tenant, [](char c) {
        return absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
               c == '_' || c == '.' || c == ':' || c == '-';
      });
  if (!valid_tenant) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tenant \"", split.tenant,
        "\" is not one: 1-128 bytes of [A-Za-z0-9_.:-], as allocctl "
        "sessions shows them (uid:1001, pod:<pod UID>, node)"));
  }
  return absl::OkStatus();
}

ConfigStore::ConfigStore(size_t history_limit, size_t version_limit,
                         InUse in_use)
    : history_limit_(std::max<size_t>(history_limit, 1)),
      version_limit_(std::max<size_t>(version_limit, 1)),
      in_use_(std::move(in_use)) {}

absl::StatusOr<ConfigRecord> ConfigStore::Set(absl::string_view job,
                                              absl::string_view config,
                                              absl::string_view author,
                                              uint64_t predicted_peak_reserved_bytes) {
  return Store(job, config, author, "set", true, predicted_peak_reserved_bytes);
}

absl::StatusOr<ConfigRecord> ConfigStore::AddVersion(
    absl::string_view job, absl::string_view config, absl::string_view author,
    absl::string_view event, uint64_t predicted_peak_reserved_bytes) {
  return Store(job, config, author, event, false,
               predicted_peak_reserved_bytes);
}

absl::StatusOr<ConfigRecord> ConfigStore::Store(
    absl::string_view job, absl::string_view config, absl::string_view author,
    absl::string_view event, bool effective,
    uint64_t predicted_peak_reserved_bytes) {
  if (absl::Status s = ValidateConfigKey(job); !s.ok()) return s;
  absl::StatusOr<AllocatorConfig> parsed =
      ParseAllocatorConfig(std::string_view(config.data(), config.size()));
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PyTorch 2.11 rejects this config: ",
        ConfigRejection(std::string_view(config.data(), config.size()),
                        parsed.status())));
  }
  ConfigRecord record{.job = std::string(job),
                      .config = FormatAllocatorConfig(*parsed),
                      .set_at = absl::Now(),
                      .author = std::string(author),
                      .predicted_peak_reserved_bytes =
                          predicted_peak_reserved_bytes};
  bool prune = false;
  {
    absl::MutexLock lock(&mu_);
    record.version = ++last_version_;
    if (effective) newest_by_job_[record.job] = record;
    by_version_[record.version] = record;
    history_.push_front({.at = record.set_at,
                         .event = std::string(event),
                         .version = record.version,
                         .job = record.job,
                         .config = record.config,
                         .detail = record.author});
    if (history_.size() > history_limit_) history_.pop_back();
    prune = by_version_.size() > 2 * version_limit_;
  }
  if (prune) Prune();
  return record;
}

bool ConfigStore::Clear(absl::string_view job, absl::string_view author) {
  absl::MutexLock lock(&mu_);
  if (newest_by_job_.erase(job) == 0) return false;
  history_.push_front({.at = absl::Now(),
                       .event = "clear",
                       .job = std::string(job),
                       .detail = std::string(author)});
  if (history_.size() > history_limit_) history_.pop_back();
  return true;
}

std::optional<ConfigRecord> ConfigStore::Effective(absl::string_view job) const {
  absl::MutexLock lock(&mu_);
  if (auto it = newest_by_job_.find(job); it != newest_by_job_.end()) {
    return it->second;
  }
  if (auto it = newest_by_job_.find(""); it != newest_by_job_.end()) {
    return it->second;
  }
  return std::nullopt;
}

std::optional<ConfigRecord> ConfigStore::Find(uint64_t version) const {
  absl::MutexLock lock(&mu_);
  auto it = by_version_.find(version);
  if (it == by_version_.end()) return std::nullopt;
  return it->second;
}

bool ConfigStore::HasOwnConfig(absl::string_view job) const {
  absl::MutexLock lock(&mu_);
  return newest_by_job_.contains(job);
}

size_t ConfigStore::Prune() {
  const absl::flat_hash_set<uint64_t> in_use =
      in_use_ ? in_use_() : absl::flat_hash_set<uint64_t>();
  absl::MutexLock lock(&mu_);
  const uint64_t newest_kept =
      last_version_ > version_limit_ ? last_version_ - version_limit_ : 0;
  absl::flat_hash_set<uint64_t> own;
  for (const auto& [job, record] : newest_by_job_) own.insert(record.version);
  return absl::erase_if(by_version_, [&](const auto& entry) {
    const uint64_t version = entry.first;
    return version <= newest_kept && !own.contains(version) &&
           !in_use.contains(version);
  });
}

size_t ConfigStore::version_count() const {
  absl::MutexLock lock(&mu_);
  return by_version_.size();
}

void ConfigStore::Record(HistoryRecord record) {
  absl::MutexLock lock(&mu_);
  history_.push_front(std::move(record));
  if (history_.size() > history_limit_) history_.pop_back();
}

std::vector<HistoryRecord> ConfigStore::History(absl::string_view job,
                                                size_t limit) const {
  absl::MutexLock lock(&mu_);
  std::vector<HistoryRecord> out;
  for (const HistoryRecord& r : history_) {
    if (out.size() >= limit) break;
    if (job.empty() || r.job == job) out.push_back(r);
  }
  return out;
}

}  // namespace allocd
