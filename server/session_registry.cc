#include "server/session_registry.h"

#include <algorithm>
#include <utility>

namespace allocd {

Session::Session(SessionIdentity identity, std::string secret)
    : identity_(std::move(identity)), secret_(std::move(secret)) {
  applied_.push_back({.version = 0, .config = identity_.initial_config});
}

bool Session::ProvenBy(absl::string_view secret) const {
  return SameSecret(secret_, secret);
}

void Session::Push(v1::ControlMessage message) {
  absl::MutexLock lock(&mu_);
  if (closed_) return;
  if (message.has_config()) {
    offered_.push_back(message.config().config().version());
    if (offered_.size() > kMaxOffered) offered_.pop_front();
  }
  queue_.push_back(std::move(message));
}

bool Session::WaitNext(v1::ControlMessage* message, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return closed_ || !queue_.empty();
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  if (queue_.empty() || closed_) return false;
  *message = std::move(queue_.front());
  queue_.pop_front();
  return true;
}

void Session::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  queue_.clear();
}

bool Session::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

void Session::MarkLeased() {
  absl::MutexLock lock(&mu_);
  leased_ = true;
}

bool Session::leased() const {
  absl::MutexLock lock(&mu_);
  return leased_;
}

void Session::BeginAcquire() {
  absl::MutexLock lock(&mu_);
  ++acquiring_;
}

void Session::EndAcquire() {
  absl::MutexLock lock(&mu_);
  --acquiring_;
}

bool Session::acquiring() const {
  absl::MutexLock lock(&mu_);
  return acquiring_ > 0;
}

void Session::NoteAcquireRefused() {
  absl::MutexLock lock(&mu_);
  acquire_refused_ = true;
}

bool Session::TakeAcquireRefused() {
  absl::MutexLock lock(&mu_);
  return std::exchange(acquire_refused_, false);
}

bool Session::MayAnswer(uint64_t version) const {
  absl::MutexLock lock(&mu_);
  return std::find(offered_.begin(), offered_.end(), version) != offered_.end() ||
         std::any_of(applied_.begin(), applied_.end(),
                     [&](const AppliedConfig& a) { return a.version == version; });
}

bool Session::awaits_answer() const {
  absl::MutexLock lock(&mu_);
  return !offered_.empty();
}

void Session::Refused(uint64_t version) {
  absl::MutexLock lock(&mu_);
  std::erase(offered_, version);
}

void Session::Acked(AppliedConfig config) {
  absl::MutexLock lock(&mu_);
  std::erase(offered_, config.version);
  rolling_back_ = false;
  // Acking a config already in the stack (a rollback) returns to it.
  auto it = std::find_if(applied_.begin(), applied_.end(),
                         [&](const AppliedConfig& a) {
                           return a.version == config.version;
                         });
  if (it != applied_.end()) {
    applied_.erase(it + 1, applied_.end());
    return;
  }
  applied_.push_back(std::move(config));
}

AppliedConfig Session::Current() const {
  absl::MutexLock lock(&mu_);
  return applied_.back();
}

std::vector<uint64_t> Session::AppliedVersions() const {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> versions;
  versions.reserve(applied_.size());
  for (const AppliedConfig& a : applied_) versions.push_back(a.version);
  return versions;
}

std::optional<AppliedConfig> Session::RollBackTarget() const {
  absl::MutexLock lock(&mu_);
  if (rolling_back_ || applied_.size() < 2) return std::nullopt;
  return applied_[applied_.size() - 2];
}

void Session::StartRollBack() {
  absl::MutexLock lock(&mu_);
  rolling_back_ = true;
}

bool Session::rolling_back() const {
  absl::MutexLock lock(&mu_);
  return rolling_back_;
}

void Session::SetStats(std::map<std::string, int64_t> stats) {
  absl::MutexLock lock(&mu_);
  stats_ = std::move(stats);
  ++stats_version_;
}

uint64_t Session::stats_version() const {
  absl::MutexLock lock(&mu_);
  return stats_version_;
}

std::map<std::string, int64_t> Session::Stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void Session::SetWorkingSet(std::vector<uint64_t> segment_bytes) {
  absl::MutexLock lock(&mu_);
  working_set_ = std::move(segment_bytes);
}

std::vector<uint64_t> Session::WorkingSet() const {
  absl::MutexLock lock(&mu_);
  return working_set_;
}

void Session::SetStartConfigSource(std::string source) {
  absl::MutexLock lock(&mu_);
  start_config_source_ = std::move(source);
}

std::string Session::start_config_source() const {
  absl::MutexLock lock(&mu_);
  return start_config_source_;
}

uint64_t Session::CountOom() {
  absl::MutexLock lock(&mu_);
  return ++ooms_;
}

uint64_t Session::ooms() const {
  absl::MutexLock lock(&mu_);
  return ooms_;
}

std::shared_ptr<Session> SessionRegistry::Create(SessionIdentity identity) {
  absl::MutexLock lock(&mu_);
  identity.id = ++last_id_;
  auto session = std::make_shared<Session>(std::move(identity));
  sessions_[session->id()] = session;
  return session;
}

std::shared_ptr<Session> SessionRegistry::Find(SessionId id) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : it->second;
}

std::shared_ptr<Session> SessionRegistry::Remove(SessionId id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return nullptr;
  std::shared_ptr<Session> session = std::move(it->second);
  sessions_.erase(it);
  return session;
}

std::vector<std::shared_ptr<Session>> SessionRegistry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Session>> out;
  out.reserve(sessions_.size());
  for (const auto& [id, session] : sessions_) out.push_back(session);
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a->id() < b->id(); });
  return out;
}

size_t SessionRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
}

}  // namespace allocd
