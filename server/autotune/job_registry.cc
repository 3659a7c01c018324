#include "server/autotune/job_registry.h"

#include <algorithm>
#include <memory>
#include <utility>


namespace allocd {

JobRegistry::JobRegistry(const AutotuneOptions& options)
    : options_(options),
      default_policy_(options_.default_policy),
      memory_(options_.memory) {}

AutotuneSession* JobRegistry::FindSession(SessionId id) {
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : &it->second;
}

const AutotuneSession* JobRegistry::FindSession(SessionId id) const {
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : &it->second;
}

JobPolicy JobRegistry::PolicyOf(const AutotuneJob& job) const {
  return job.policy.value_or(default_policy_);
}

AutotuneJobState JobRegistry::StateOf(const AutotuneJob& job) const {
  if (ModeOf(job) == AutotuneMode::kOff) return AutotuneJobState::kOff;
  if (job.queued) return AutotuneJobState::kDeciding;
  if (job.acting) {
    return job.acting->Applied() ? AutotuneJobState::kApplied : AutotuneJobState::kCanary;
  }
  return AutotuneJobState::kWatching;
}

AutotuneJob* JobRegistry::AddSession(SessionId id, const JobKey& key, const std::string& config,
                                     uint64_t config_version, bool marks_steps,
                                     const SessionRank& rank) {
  if (AutotuneSession* known = FindSession(id)) {
    // Declared again: only what it runs can have changed.
    known->config = config;
    known->config_version = config_version;
    return nullptr;
  }
  AutotuneJob& job = jobs_[key];
  AutotuneSession& session = sessions_[id] =
      AutotuneSession{key, next_order_++, config, config_version};
  session.marks_steps = marks_steps;
  session.rank = rank;
  job.lockstep = job.lockstep || rank.OfSeveral();
  job.sessions.push_back(id);
  if (job.recorded == 0) StartRecording(job, id);
  return &job;
}

JobKey JobRegistry::RemoveSession(SessionId id) {
  auto it = sessions_.find(id);
  const JobKey key = it->second.job;
  sessions_.erase(it);
  std::erase(jobs_[key].sessions, id);
  return key;
}

void JobRegistry::StartRecording(AutotuneJob& job, SessionId id) {
  job.recorded = id;
  job.window.reset();
  const AutotuneSession& session = sessions_.at(id);
  if (ModeOf(job) != AutotuneMode::kOff) {
    job.window = std::make_unique<JobWindow>(options_.window_events,
                                             memory_.Open(session.job.tenant, session.job.job));
  }
  job.ResetFirstPassCheck(options_, session.marks_steps);
}

// `off` keeps no window; leaving it starts one on the recorded session. A
// recorded job has a window exactly while it is not off, so a window dropped
// or started is its recorded session switched off or on.
bool JobRegistry::ApplyMode(AutotuneJob& job) {
  if (ModeOf(job) == AutotuneMode::kOff) {
    if (job.window == nullptr) return false;
    job.window.reset();
    return true;
  }
  if (job.window != nullptr || job.recorded == 0) return false;
  StartRecording(job, job.recorded);
  return true;
}

std::vector<AutotuneJob*> JobRegistry::SetPolicy(const JobKey& key, JobPolicy policy) {
  std::vector<AutotuneJob*> switched;
  const auto apply = [&](AutotuneJob& job) {
    if (ApplyMode(job)) switched.push_back(&job);
  };
  if (key.job.empty() && key.run.empty()) {
    default_policy_ = std::move(policy);
    for (auto& [name, job] : jobs_) apply(job);
    return switched;
  }
  AutotuneJob& job = jobs_[key];
  job.policy = std::move(policy);
  apply(job);
  return switched;
}

void JobRegistry::Ended(const JobKey& ended, const AutotuneTaskQueue& tasks) {
  ended_jobs_.push_back(ended);
  while (ended_jobs_.size() > options_.ended_jobs_kept) {
    const JobKey key = std::move(ended_jobs_.front());
    ended_jobs_.pop_front();
    auto it = jobs_.find(key);
    // Gone, live again, or ended again later (dropped from there).
    if (it == jobs_.end() || !it->second.sessions.empty() ||
        std::find(ended_jobs_.begin(), ended_jobs_.end(), key) != ended_jobs_.end()) {
      continue;
    }
    const AutotuneJob& job = it->second;
    // A push still watched, being promoted or rolled back, or a task
    // still to run for it, is seen through first: the job is looked at
    // again when the next one ends. One whose push was applied is history
    // like any other (its learned config, kept by the daemon, stays).
    if ((job.acting && !job.acting->Applied()) || job.review || job.queued ||
        tasks.HasTaskFor(key)) {
      ended_jobs_.push_back(key);
      return;
    }
    // Its policy goes too: the daemon sets it again when a session of
    // the job registers.
    jobs_.erase(it);
  }
}

std::vector<std::pair<JobKey, AutotuneJob*>> JobRegistry::LiveJobs(const std::string& label,
                                                                   const TenantId& tenant) {
  std::vector<std::pair<JobKey, AutotuneJob*>> out;
  for (auto& [key, job] : jobs_) {
    if (key.job == label && (tenant.empty() || key.tenant == tenant) && !job.sessions.empty()) {
      out.emplace_back(key, &job);
    }
  }
  return out;
}

JobFeatures JobRegistry::FeaturesOf(const TenantId& tenant, const std::string& job) const {
  JobFeatures out;
  // Keyed by tenant, label, then run: the label's runs are one range.
  for (auto it = jobs_.lower_bound(JobKey{.tenant = tenant, .job = job});
       it != jobs_.end() && it->first.tenant == tenant && it->first.job == job; ++it) {
    out |= it->second.features;
  }
  return out;
}

std::vector<AutotuneJobStatus> JobRegistry::Status() const {
  std::vector<AutotuneJobStatus> out;
  for (const auto& [name, job] : jobs_) {
    AutotuneJobStatus s;
    s.features = job.features;
    s.job = name.job;
    s.tenant = name.tenant;
    s.run = name.run;
    s.policy = PolicyOf(job);
    s.sessions = job.sessions.size();
    for (SessionId id : job.sessions) {
      const AutotuneSession& session = sessions_.at(id);
      s.ranks.push_back({.session = id,
                         .rank = session.rank.rank,
                         .world_size = session.rank.world_size,
                         .config = session.config,
                         .config_version = session.config_version,
                         .canary = job.acting && job.acting->canary() == id});
    }
    std::sort(s.ranks.begin(), s.ranks.end(),
              [](const AutotuneRankStatus& a, const AutotuneRankStatus& b) {
                return std::pair(a.rank, a.session) < std::pair(b.rank, b.session);
              });
    if (job.window) {
      s.window_events = job.window->size();
      s.dropped_events = job.window->dropped_events();
      s.window_bytes = job.window->MemoryBytes();
      s.steps_marked = job.window->steps_marked();
    }
    if (const AutotuneSession* recorded = FindSession(job.recorded)) {
      s.marks_steps = recorded->marks_steps;
    }
    s.state = StateOf(job);
    if (!job.history.empty()) s.last = job.history.back();
    out.push_back(std::move(s));
  }
  // jobs_ is ordered by tenant: by label, then tenant.
  std::stable_sort(out.begin(), out.end(),
                   [](const AutotuneJobStatus& a, const AutotuneJobStatus& b) {
                     return a.job < b.job;
                   });
  return out;
}

std::vector<AutotuneDecision> JobRegistry::History(const std::string& label,
                                                   size_t limit) const {
  std::vector<AutotuneDecision> out;
  for (const auto& [name, job] : jobs_) {
    if (!label.empty() && name.job != label) continue;
    out.insert(out.end(), job.history.begin(), job.history.end());
  }
  std::sort(out.begin(), out.end(),
            [](const AutotuneDecision& a, const AutotuneDecision& b) { return a.id > b.id; });
  if (out.size() > limit) out.resize(limit);
  return out;
}

}  // namespace allocd
