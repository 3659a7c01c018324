#include "server/daemon_autotune.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "allocator/bytes.h"
#include "allocator/config.h"
#include "proto/protocol.h"
#include "server/autotune/compatibility.h"
#include "server/log.h"

namespace allocd {
namespace {

JobFeatures FromProto(const v1::JobFeatures& features) {
  return {.cuda_ipc = features.cuda_ipc(),
          .cuda_graphs = features.cuda_graphs(),
          .mem_pool = features.mem_pool(),
          .nccl_registration = features.nccl_registration()};
}

void ToProto(const JobFeatures& features, v1::JobFeatures* out) {
  out->set_cuda_ipc(features.cuda_ipc);
  out->set_cuda_graphs(features.cuda_graphs);
  out->set_mem_pool(features.mem_pool);
  out->set_nccl_registration(features.nccl_registration);
}

// Decisions whose last counted result is remembered (older ones no longer
// change).
constexpr size_t kCountedDecisions = 4096;
constexpr char kAuthor[] = "autotune";

void Fill(const AutotuneDecision& d, v1::AutotuneDecision* out) {
  out->set_id(d.id);
  out->set_unix_micros(absl::ToUnixMicros(d.at));
  out->set_job(d.job);
  out->set_tenant(d.tenant);
  out->set_run_id(d.run);
  out->set_trigger(AutotuneTriggerName(d.trigger));
  out->set_result(AutotuneResultName(d.result));
  out->set_from_config(d.from_config);
  out->set_to_config(d.to_config);
  if (d.memory_fraction) out->set_memory_fraction(*d.memory_fraction);
  out->set_predicted_peak_current(d.predicted_peak_current);
  out->set_predicted_peak_switched(d.predicted_peak_switched);
  out->set_predicted_saving(d.predicted_saving);
  out->set_predicted_peak_allocated(d.predicted_peak_allocated);
  out->set_predicted_peak_requested(d.predicted_peak_requested);
  if (d.predicted_peak_rolled_back) {
    out->set_predicted_peak_rolled_back(*d.predicted_peak_rolled_back);
  }
  if (d.staying_after_push) out->set_staying_after_push(*d.staying_after_push);
  if (d.rollback_after_push) out->set_rollback_after_push(*d.rollback_after_push);
  if (d.keeping_after_push) out->set_keeping_after_push(*d.keeping_after_push);
  out->set_judged_events(d.judged_events);
  if (d.realized_peak) out->set_realized_peak(*d.realized_peak);
  if (d.realized_saving) out->set_realized_saving(*d.realized_saving);
  if (d.realized_peak_requested) out->set_realized_peak_requested(*d.realized_peak_requested);
  if (d.predicted_peak_at_need) out->set_predicted_peak_at_need(*d.predicted_peak_at_need);
  out->set_at_need_basis(d.at_need_basis);
  if (d.trigger_to_ack) out->set_trigger_to_ack_seconds(absl::ToDoubleSeconds(*d.trigger_to_ack));
  if (d.best_reachable_peak) out->set_best_reachable_peak(*d.best_reachable_peak);
  out->set_reviewed_events(d.reviewed_events);
  out->set_window_events(d.window_events);
  out->set_replay_seconds(d.replay_seconds);
  out->set_candidates(d.candidates);
  for (uint64_t s : d.sessions) out->add_sessions(s);
  out->set_version(d.version);
  out->set_why(d.why);
  for (const LeftOutConfig& l : d.left_out) {
    v1::LeftOutConfig* left = out->add_left_out();
    left->set_config(l.config);
    left->set_why(l.why);
  }
}

std::vector<EvidenceEvent> ToEvidence(const v1::EventBatch& b) {
  std::vector<EvidenceEvent> events(b.ops_size());
  for (int i = 0; i < b.ops_size(); ++i) {
    events[i] = {.op = static_cast<TraceOp>(b.ops(i)),
                 .stream = b.streams(i),
                 .id = b.ids(i),
                 .size = b.sizes(i)};
  }
  return events;
}

AllocatorSnapshot ToSnapshot(const v1::AllocatorState& s) {
  AllocatorSnapshot snapshot;
  snapshot.segments.resize(s.segment_addresses_size());
  for (int i = 0; i < s.segment_addresses_size(); ++i) {
    snapshot.segments[i] = {.address = s.segment_addresses(i),
                            .size = s.segment_sizes(i),
                            .stream = s.segment_streams(i),
                            .is_small = (s.segment_flags(i) & kStateSegmentSmall) != 0,
                            .is_expandable = (s.segment_flags(i) & kStateSegmentExpandable) != 0};
  }
  snapshot.blocks.resize(s.block_ids_size());
  for (int i = 0; i < s.block_ids_size(); ++i) {
    snapshot.blocks[i] = {.id = s.block_ids(i),
                          .address = s.block_addresses(i),
                          .size = s.block_sizes(i),
                          .requested_size = s.block_requested(i),
                          .free_requested = (s.block_flags(i) & kStateBlockFreeRequested) != 0};
  }
  return snapshot;
}

}  // namespace

DaemonAutotune::DaemonAutotune(AutotuneOptions options, DaemonCore* core,
                               Metrics* metrics, LearnedConfigs* learned)
    : core_(core),
      metrics_(metrics),
      learned_(learned),
      prior_(options.prior),
      growth_margin_(options.growth_margin),
      flag_mode_(options.default_policy.mode),
      default_mode_(options.default_policy.mode),
      autotuner_(std::make_unique<Autotuner>(std::move(options), this)) {}

DaemonAutotune::~DaemonAutotune() { autotuner_.reset(); }

// ------------------------------------------------------------ sessions

std::optional<DaemonAutotune::Start> DaemonAutotune::StartFor(
    const SessionIdentity& identity, const v1::AutotunePreferences& preferences,
    const v1::JobFeatures& features) {
  JobPolicy policy;
  std::map<std::string, std::string> imported;
  {
    absl::MutexLock lock(&mu_);
    policy = EffectivePolicy({identity.tenant, identity.job}, &preferences);
    imported = file_job_configs_;
  }
  if (policy.mode != AutotuneMode::kApply) return std::nullopt;
  std::optional<LearnedConfig> learned =
      learned_->Find({identity.tenant, identity.job});
  if (!learned.has_value() && prior_.kind == PriorSetting::Kind::kOff) {
    return std::nullopt;
  }
  std::optional<Prior> prior;
  if (!learned.has_value()) {
    std::vector<std::pair<JobKey, LearnedConfig>> settled = learned_->List();
    std::set<std::string> labels;
    for (const auto& [key, l] : settled) labels.insert(key.job);
    // Imported from the ConfigMap: the node's, in no tenant.
    for (const auto& [label, config] : imported) {
      if (!labels.contains(label)) settled.push_back({JobKey{.job = label}, {.config = config}});
    }
    prior = FindPrior(settled, identity.tenant, prior_);
  }
  const StartConfigVeto pinned = KeepsPinnedKeys(identity.initial_config, policy.pinned_keys);
  // What the job's earlier runs under this daemon were seen doing counts as
  // declared: its hooks report a feature only once the process uses it,
  // after its start config is set, so a job that shared CUDA tensors last
  // time would otherwise be started on a config that breaks that again.
  JobFeatures reported = FromProto(features);
  reported |= autotuner_->FeaturesOf(identity.tenant, identity.job);
  absl::StatusOr<AllocatorConfig> own = ParseAllocatorConfig(identity.initial_config);
  const StartConfigVeto veto = [&](const AllocatorConfig& config) -> std::string {
    if (pinned) {
      if (std::string why = pinned(config); !why.empty()) return why;
    }
    if (!own.ok()) return "";
    return ConfigIncompatibility(reported, *own, config, /*live=*/false).value_or("");
  };
  Start start{.chosen = ChooseStartConfig(identity.initial_config, learned, prior, veto)};
  if (start.chosen.source == StartConfigSource::kOwn) {
    if (!start.chosen.why.empty()) {
      LogInfo(absl::StrCat("autotune: job \"", identity.job, "\" starts on its own config: ",
                           start.chosen.why));
    }
    return std::nullopt;
  }
  if (!learned.has_value()) {
    start.author = absl::StrCat(kAuthor, ": ", start.chosen.why);
    return start;
  }
  start.stream_from_reserved = StreamFromReserved(*learned, growth_margin_);
  start.author = absl::StrCat(
      kAuthor, ": learned from decision ", learned->decision_id, " (",
      absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", learned->learned_at,
                       absl::UTCTimeZone()),
      "; it ran ",
      learned->from_config.empty() ? "PyTorch's defaults" : learned->from_config,
      " before",
      // What the job can expect of it: what it did over that whole run.
      learned->realized_peak
          ? absl::StrCat("; the job peaked at ",
                         FormatSize(static_cast<uint64_t>(*learned->realized_peak)),
                         " reserved under it then")
          : std::string(),
      ")");
  return start;
}

std::optional<ConfigPusher::Learned> DaemonAutotune::LearnedConfigFor(
    const SessionIdentity& identity, const v1::AutotunePreferences& preferences,
    const v1::JobFeatures& features) {
  std::optional<Start> start = StartFor(identity, preferences, features);
  if (!start.has_value()) return std::nullopt;
  if (identity.id != 0) {
    absl::MutexLock lock(&mu_);
    chosen_starts_[identity.id] = *start;
  }
  return ConfigPusher::Learned{.config = start->chosen.config,
                               .author = start->author,
                               .source = StartConfigSourceName(start->chosen.source),
                               .stream_from_reserved = start->stream_from_reserved};
}

void DaemonAutotune::SessionStarted(const SessionIdentity& identity,
                                    const AppliedConfig& running,
                                    const std::optional<AppliedConfig>& learned,
                                    const std::optional<AppliedConfig>& pushed,
                                    const v1::AutotunePreferences& preferences) {
  JobKey key;
  std::vector<std::pair<JobKey, JobPolicy>> policies;
  {
    absl::MutexLock lock(&mu_);
    key = KeyOf(identity);
    const bool asks = preferences.pinned_keys_size() > 0 ||
                      preferences.allow_memory_fraction() ||
                      !preferences.mode().empty();
    // The job's newest session speaks for it; one that asks nothing keeps
    // what an earlier one asked.
    if (asks) job_preferences_[key] = preferences;
    if (session_jobs_.emplace(identity.id, SessionOfJob{key, identity.gpu_uuid}).second) {
      if (++live_sessions_[key] == 1) {
        // Started again: its version is a live job's, out of the ended
        // jobs' queue.
        if (auto ended = ended_version_order_.find(key);
            ended != ended_version_order_.end()) {
          ended_versions_.erase(ended->second);
          ended_version_order_.erase(ended);
        }
      }
    }
    // Given before the session, so that the job's window is opened under
    // its own mode (an admin's for the label, or what its tenant asked).
    policied_.insert(key);
    policies.emplace_back(key, EffectivePolicy(key));
  }
  Publish(policies);
  autotuner_->SessionStarted(identity.id, key.job, running.config, running.version,
                             identity.tenant, preferences.marks_steps(), identity.rank);
  if (pushed.has_value()) {
    autotuner_->Handed(identity.id, pushed->version, pushed->config);
  }
  std::optional<Start> start;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = chosen_starts_.find(identity.id); it != chosen_starts_.end()) {
      start = std::move(it->second);
      chosen_starts_.erase(it);
    }
  }
  if (learned.has_value()) {
    // What LearnedConfigFor chose for it: its source and why.
    const bool chosen = start.has_value() && start->chosen.config == learned->config;
    metrics_->AutotuneStartConfig(
        chosen ? StartConfigSourceName(start->chosen.source) : "learned");
    if (chosen && start->chosen.source != StartConfigSource::kLearned) {
      autotuner_->StartedInstead(identity.id, identity.initial_config, start->chosen.why);
    }
    LogInfo(absl::StrCat("session ", identity.id, " of job \"", identity.job,
                         "\" was handed ", chosen ? start->author : "its learned config",
                         ": \"", learned->config, "\" (version ", learned->version, ")"));
  }
}

JobKey DaemonAutotune::KeyOf(const SessionIdentity& identity) const {
  JobKey key{.tenant = identity.tenant, .job = identity.job, .run = identity.rank.run};
  if (key.run.empty()) return key;
  for (const auto& [live, sessions] : live_sessions_) {
    if (live.tenant == key.tenant && live.run == key.run) return live;
  }
  return key;
}

void DaemonAutotune::SessionEnded(SessionId id) {
  {
    absl::MutexLock lock(&mu_);
    next_sequence_.erase(id);
    chosen_starts_.erase(id);
    if (auto session = session_jobs_.find(id); session != session_jobs_.end()) {
      const JobKey key = session->second.job;
      session_jobs_.erase(session);
      auto live = live_sessions_.find(key);
      if (live != live_sessions_.end() && --live->second == 0) {
        live_sessions_.erase(live);
        ForgetEndedJob(key);
      }
    }
  }
  autotuner_->SessionEnded(id);
}

void DaemonAutotune::ForgetEndedJob(const JobKey& key) {
  job_preferences_.erase(key);
  policied_.erase(key);
  QueueEndedJobVersion(key);
}

void DaemonAutotune::QueueEndedJobVersion(const JobKey& key) {
  if (!job_versions_.contains(key) || ended_version_order_.contains(key)) {
    return;
  }
  const uint64_t order = ++endings_;
  ended_versions_.emplace(order, key);
  ended_version_order_[key] = order;
  while (ended_versions_.size() > kEndedJobVersionsKept) {
    auto oldest = ended_versions_.begin();
    job_versions_.erase(oldest->second);
    ended_version_order_.erase(oldest->second);
    ended_versions_.erase(oldest);
  }
}

DaemonAutotune::JobStateSizes DaemonAutotune::JobStateSizesForTest() const {
  absl::MutexLock lock(&mu_);
  return {.live_jobs = live_sessions_.size(),
          .preferences = job_preferences_.size(),
          .policied = policied_.size(),
          .versions = job_versions_.size()};
}

void DaemonAutotune::Events(SessionId id, const v1::EventBatch& batch) {
  uint64_t dropped = batch.dropped();
  {
    absl::MutexLock lock(&mu_);
    auto [next, first] = next_sequence_.try_emplace(id, batch.sequence());
    // A batch that never arrived (a broken stream) is a gap the client
    // could not count.
    const uint64_t expected = next->second + batch.dropped();
    if (!first && batch.sequence() > expected) {
      dropped += batch.sequence() - expected;
    }
    next->second = batch.sequence() + batch.ops_size();
  }
  std::optional<AllocatorSnapshot> state;
  if (batch.has_state_after()) state = ToSnapshot(batch.state_after());
  autotuner_->Events(id, ToEvidence(batch), dropped, state ? &*state : nullptr);
}

void DaemonAutotune::Features(SessionId id, const v1::JobFeatures& features) {
  const JobFeatures reported = FromProto(features);
  autotuner_->Features(id, reported);
  // The job's next runs start on its learned config: not on one that what
  // it does now would break (a feature seen only after the push was kept).
  std::optional<JobKey> key;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = session_jobs_.find(id); it != session_jobs_.end()) key = it->second.job;
  }
  if (!key) return;
  const std::optional<LearnedConfig> known = learned_->Find(*key);
  if (!known) return;
  const absl::StatusOr<AllocatorConfig> from = ParseAllocatorConfig(known->from_config);
  const absl::StatusOr<AllocatorConfig> to = ParseAllocatorConfig(known->config);
  if (!from.ok() || !to.ok()) return;
  const std::optional<std::string> why =
      ConfigIncompatibility(reported, *from, *to, /*live=*/false);
  if (!why) return;
  if (absl::StatusOr<bool> forgot = learned_->Forget(*key, known->config);
      forgot.ok() && *forgot) {
    LogInfo(absl::StrCat("autotune: job \"", key->job, "\" forgets its learned config \"",
                         known->config, "\": ", *why));
  }
}

void DaemonAutotune::Stats(SessionId id,
                           const std::map<std::string, int64_t>& stats,
                           uint64_t config_version) {
  autotuner_->Stats(id, stats, config_version);
}

void DaemonAutotune::Oom(SessionId id, uint64_t config_version) {
  autotuner_->Oom(id, config_version);
}

void DaemonAutotune::Acked(SessionId id, uint64_t version, bool applied,
                           const std::string& error) {
  autotuner_->Acked(id, version, applied, error);
}

// ------------------------------------------------------------- actions

absl::StatusOr<uint64_t> DaemonAutotune::PushToSession(
    SessionId session, const std::string& config,
    const std::string& reason, uint64_t predicted_peak_reserved) {
  return core_->PushToSession(session, config, kAuthor, reason,
                              predicted_peak_reserved);
}

absl::StatusOr<uint64_t> DaemonAutotune::SetJobConfig(
    const JobKey& job, const std::string& config, const std::string& reason,
    uint64_t predicted_peak_reserved) {
  // Not the label's config (core_->SetConfig): that reaches every tenant's
  // sessions of the label. A run's reaches its ranks only, whatever their
  // labels, and not another run's of the label.
  std::vector<SessionId> ranks;
  if (!job.run.empty()) {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, session] : session_jobs_) {
      if (session.job == job) ranks.push_back(id);
    }
  }
  const std::string author = absl::StrCat(kAuthor, ": ", reason);
  absl::StatusOr<uint64_t> version =
      job.run.empty()
          ? core_->PushToTenantJob(job.tenant, job.job, config, author, predicted_peak_reserved)
          : core_->PushToSessions(job.job, ranks, config, author, predicted_peak_reserved);
  if (!version.ok()) return version.status();
  absl::MutexLock lock(&mu_);
  job_versions_[job] = *version;
  // Set as (or after) the job's last session ended: kept as an ended job's.
  if (!live_sessions_.contains(job)) QueueEndedJobVersion(job);
  return *version;
}

std::optional<uint64_t> DaemonAutotune::DeviceRoom(SessionId session) {
  return core_->DeviceRoom(session);
}

absl::Status DaemonAutotune::RollBackSession(SessionId session,
                                             const std::string& config,
                                             const std::string& reason) {
  return core_->RollBackSession(session, config, reason);
}

void DaemonAutotune::OnRun(const std::string& job) {
  metrics_->AutotuneRun(job);
}

void DaemonAutotune::Learn(const AutotuneDecision& d) {
  // What a run learned is its label's: the label's next run starts with it.
  const JobKey key{.tenant = d.tenant, .job = d.job};
  // A push kept for the whole job, once checked as the next runs start on
  // it (AutotuneDecision::learned): that check says what they start on.
  bool kept = false;
  if (d.result == AutotuneResult::kPushed && d.version != 0 && d.learned.has_value()) {
    absl::MutexLock lock(&mu_);
    auto set = job_versions_.find({.tenant = d.tenant, .job = d.job, .run = d.run});
    kept = set != job_versions_.end() && set->second == d.version;
  }
  // A start (the node's prior, a harmful config's replacement) that its
  // review kept on the job's own events is what the job settled on, as a
  // kept push is: its next runs start on it, and it counts toward the prior.
  if (d.trigger == AutotuneTrigger::kStartReview && d.result == AutotuneResult::kKept &&
      !d.to_config.empty()) {
    kept = true;
  }
  absl::Status saved;
  std::optional<LearnedConfig> learned;  // what the job learned now
  if (d.result == AutotuneResult::kRolledBack) {
    absl::StatusOr<bool> forgot = learned_->Forget(key, d.to_config);
    if (forgot.ok() && *forgot) {
      LogInfo(absl::StrCat("autotune: job \"", d.job, "\" forgets its learned config \"",
                           d.to_config, "\": decision ", d.id, " was rolled back"));
    }
    saved = forgot.status();
  } else if (kept && d.learned && d.learned->config != d.to_config) {
    // Replayed from the start, the push peaked above what the run had
    // without it: that is learned, unless the job had learned it already.
    std::optional<LearnedConfig> known = learned_->Find(key);
    if (known.has_value() && known->config == d.learned->config) return;
    learned = LearnedConfig{.config = d.learned->config,
                            .from_config = d.to_config,
                            .decision_id = d.id,
                            .learned_at = absl::Now(),
                            .predicted_peak_current = d.learned->pushed_peak,
                            .predicted_peak_switched = d.learned->peak};
    saved = learned_->Record(key, *learned);
    LogInfo(absl::StrCat("autotune: job \"", d.job, "\" (decision ", d.id, ") ",
                         d.learned->why, ": its next runs start with it"));
  } else if (kept) {
    // Kept: the canary's watch passed and the push became the job's config.
    std::optional<LearnedConfig> known = learned_->Find(key);
    const bool learned_now = !known.has_value() || known->decision_id != d.id ||
                             known->config != d.to_config;
    if (!learned_now && known->realized_peak == d.realized_peak) return;
    learned = LearnedConfig{.config = d.to_config,
                            .from_config = d.from_config,
                            .decision_id = d.id,
                            .learned_at = learned_now ? absl::Now() : known->learned_at,
                            .predicted_peak_current = d.predicted_peak_current,
                            .predicted_peak_switched = d.predicted_peak_switched,
                            .predicted_peak_allocated = d.predicted_peak_allocated,
                            .predicted_peak_requested = d.predicted_peak_requested,
                            .realized_peak = d.realized_peak};
    saved = learned_->Record(key, *learned);
    if (learned_now) {
      LogInfo(absl::StrCat("autotune: job \"", d.job, "\" learned \"", d.to_config,
                           "\" (decision ", d.id, "): its next runs start with it",
                           d.learned ? absl::StrCat(" (", d.learned->why, ")") : ""));
    }
  }
  if (!saved.ok()) {
    LogError(absl::StrCat("autotune: what job \"", d.job,
                          "\" learned is kept until the daemon stops only: ",
                          saved.message()));
  }
  if (learned.has_value()) {
    PauseStreams(d.decided_on, learned->config, StreamFromReserved(*learned, growth_margin_),
                 absl::StrCat("job \"", d.job, "\" learned \"", learned->config,
                              "\" (decision ", learned->decision_id, ")"));
  }
}

void DaemonAutotune::PauseStreams(SessionId decided_on, const std::string& config,
                                  uint64_t from, absl::string_view why) {
  // The session whose stream the decision replayed (another's is read not
  // at all) has nothing to decide until it grows: a stream costs it
  // PyTorch's record of every allocation meanwhile. From the decision, not
  // the autotuner: this runs on the autotuner's worker, which the
  // autotuner's teardown joins.
  if (from == 0 || decided_on == 0) return;
  if (core_->DemandStream(decided_on, config, from,
                          absl::StrCat(why, ": nothing to decide until its reserved memory "
                                       "passes ", FormatSize(from)))) {
    LogInfo(absl::StrCat("autotune: session ", decided_on,
                         " may stop its allocation stream until it passes ", FormatSize(from),
                         " reserved (", why, ")"));
  }
}

void DaemonAutotune::DemandStream(SessionId session, uint64_t from_reserved,
                                  std::string reason) {
  core_->DemandStream(session, std::nullopt, from_reserved, std::move(reason));
}

void DaemonAutotune::OnDecision(const AutotuneDecision& d) {
  Learn(d);
  // A decision that leaves the job on the config it runs (kept, or only
  // recommended) settles it as a learned config does, at the peak it
  // predicted there. A start's review is read as a push: Learn's.
  if ((d.result == AutotuneResult::kKept || d.result == AutotuneResult::kRecommended) &&
      d.trigger != AutotuneTrigger::kStartReview) {
    PauseStreams(d.decided_on, d.from_config,
                 GrownPast(d.predicted_peak_current, growth_margin_), absl::StrCat("decision ", d.id, " keeps \"", d.from_config, "\""));
  }
  bool changed;
  {
    absl::MutexLock lock(&mu_);
    std::optional<AutotuneResult>& counted = counted_[d.id];
    changed = counted != d.result;
    counted = d.result;
    while (counted_.size() > kCountedDecisions) counted_.erase(counted_.begin());
  }
  if (!d.to_config.empty()) {
    metrics_->AutotunePredictedSaving(d.job, d.predicted_saving);
  }
  if (d.realized_saving) metrics_->AutotuneRealizedSaving(d.job, *d.realized_saving);
  if (!changed) return;
  metrics_->AutotuneDecision(d.job, d.result);
  const std::string summary = absl::StrCat(
      "decision ", d.id, " for tenant ", d.tenant, " (", AutotuneTriggerName(d.trigger),
      "): ", AutotuneResultName(d.result),
      d.to_config.empty() ? ""
                          : absl::StrCat(" \"", d.to_config, "\", predicted peak ",
                                         FormatSize(d.predicted_peak_current), " -> ",
                                         FormatSize(d.predicted_peak_switched)),
      "; ", d.why);
  core_->RecordHistory({.at = absl::Now(),
                        .event = "autotune",
                        .version = d.version,
                        .job = d.job,
                        .config = d.to_config.empty() ? d.from_config : d.to_config,
                        .session_id = d.sessions.empty() ? 0 : d.sessions.front(),
                        .detail = summary});
  LogInfo(absl::StrCat("autotune: job \"", d.job, "\" ", summary));
}

// ---------------------------------------------------------------- admin

v1::AutotuneStatusResponse DaemonAutotune::Status() const {
  v1::AutotuneStatusResponse r;
  const std::vector<AutotuneJobStatus> jobs = autotuner_->Status();
  absl::MutexLock lock(&mu_);
  r.set_mode(AutotuneModeName(default_mode_));
  for (const AutotuneJobStatus& s : jobs) {
    v1::AutotuneJob* job = r.add_jobs();
    job->set_job(s.job);
    job->set_tenant(s.tenant);
    job->set_run_id(s.run);
    for (const AutotuneRankStatus& rank : s.ranks) {
      v1::AutotuneRank* out = job->add_ranks();
      out->set_session_id(rank.session);
      if (rank.world_size > 0) {
        out->set_rank(rank.rank);
        out->set_world_size(rank.world_size);
      }
      out->set_config(rank.config);
      out->set_config_version(rank.config_version);
      out->set_canary(rank.canary);
      if (auto session = session_jobs_.find(rank.session); session != session_jobs_.end()) {
        out->set_gpu_uuid(session->second.gpu_uuid);
      }
    }
    job->set_mode(AutotuneModeName(s.policy.mode));
    for (const std::string& k : s.policy.pinned_keys) job->add_pinned_keys(k);
    job->set_allow_memory_fraction(s.policy.allow_memory_fraction);
    job->set_sessions(s.sessions);
    job->set_window_events(s.window_events);
    job->set_dropped_events(s.dropped_events);
    job->set_marks_steps(s.marks_steps);
    ToProto(s.features, job->mutable_features());
    job->set_steps_marked(s.steps_marked);
    job->set_state(AutotuneJobStateName(s.state));
    if (s.last) Fill(*s.last, job->mutable_last());
  }
  return r;
}

v1::AutotuneHistoryResponse DaemonAutotune::History(const std::string& job,
                                                    uint32_t limit) const {
  v1::AutotuneHistoryResponse r;
  for (const AutotuneDecision& d :
       autotuner_->History(job, limit == 0 ? 20 : std::min(limit, 10000u))) {
    Fill(d, r.add_decisions());
  }
  return r;
}

absl::StatusOr<v1::AutotuneRunResponse> DaemonAutotune::Run(
    const std::string& job) {
  absl::StatusOr<uint64_t> id = autotuner_->RunNow(job);
  if (!id.ok()) return id.status();
  v1::AutotuneRunResponse r;
  r.set_decision_id(*id);
  return r;
}

v1::AutotuneLearnedResponse DaemonAutotune::Learned() const {
  v1::AutotuneLearnedResponse r;
  r.set_state_file(learned_->path());
  for (const auto& [key, l] : learned_->List()) {
    v1::LearnedConfig* out = r.add_learned();
    out->set_tenant(key.tenant);
    out->set_job(key.job);
    out->set_config(l.config);
    out->set_from_config(l.from_config);
    out->set_decision_id(l.decision_id);
    out->set_learned_unix_micros(absl::ToUnixMicros(l.learned_at));
    out->set_predicted_peak_current(l.predicted_peak_current);
    out->set_predicted_peak_switched(l.predicted_peak_switched);
    if (l.realized_peak) out->set_realized_peak(*l.realized_peak);
  }
  return r;
}

absl::Status DaemonAutotune::SetMode(const std::string& job,
                                     const std::string& mode) {
  absl::StatusOr<AutotuneMode> parsed = ParseAutotuneMode(mode);
  if (!parsed.ok()) return parsed.status();
  if (!job.empty()) {
    if (absl::Status s = ValidateJobLabel(job); !s.ok()) return s;
  }
  std::vector<std::pair<JobKey, JobPolicy>> policies;
  {
    absl::MutexLock lock(&mu_);
    if (job.empty()) {
      admin_default_mode_ = *parsed;
    } else {
      admin_modes_[job] = *parsed;
    }
    policies = Policies(job.empty() ? std::nullopt : std::optional(job));
  }
  Publish(policies);
  LogInfo(absl::StrCat("autotune mode of ",
                       job.empty() ? "the daemon"
                                   : absl::StrCat("job \"", job, "\" in every tenant"),
                       " set to ", mode, " by an admin"));
  return absl::OkStatus();
}

void DaemonAutotune::SetFileJobConfigs(std::map<std::string, std::string> configs) {
  absl::MutexLock lock(&mu_);
  file_job_configs_ = std::move(configs);
}

void DaemonAutotune::SetFilePolicies(
    std::optional<AutotuneMode> default_mode,
    std::map<std::string, AutotuneFilePolicy> jobs) {
  std::vector<std::pair<JobKey, JobPolicy>> policies;
  {
    absl::MutexLock lock(&mu_);
    // Every known job is given its policy again, so those the old file
    // named lose the file's entry.
    file_policies_ = std::move(jobs);
    file_default_mode_ = default_mode;
    policies = Policies(std::nullopt);
  }
  Publish(policies);
}

JobPolicy DaemonAutotune::EffectivePolicy(const JobKey& job,
                                          const v1::AutotunePreferences* asks) const {
  JobPolicy policy{.mode = default_mode_};
  std::set<std::string> pinned;
  std::optional<AutotuneMode> asked;
  const v1::AutotunePreferences* preferences = nullptr;
  if (asks != nullptr && (asks->pinned_keys_size() > 0 || !asks->mode().empty())) {
    preferences = asks;
  } else if (auto p = job_preferences_.find(job); p != job_preferences_.end()) {
    preferences = &p->second;
  }
  if (preferences != nullptr) {
    // Checked at registration (CheckRegisterRequest): an unknown mode asks nothing.
    if (absl::StatusOr<AutotuneMode> mode = ParseAutotuneMode(preferences->mode()); mode.ok()) {
      asked = *mode;
    }
    pinned.insert(preferences->pinned_keys().begin(), preferences->pinned_keys().end());
  }
  // An admin's mode for the label: the admin's call, else the file's.
  std::optional<AutotuneMode> admin;
  if (auto f = file_policies_.find(job.job); f != file_policies_.end()) {
    admin = f->second.mode;
    pinned.insert(f->second.pinned_keys.begin(), f->second.pinned_keys.end());
  }
  if (auto a = admin_modes_.find(job.job); a != admin_modes_.end()) {
    admin = a->second;
  }
  if (admin.has_value()) {
    // The job may lower it (kOff < kRecommend < kApply), never raise it.
    policy.mode = asked.has_value() ? std::min(*asked, *admin) : *admin;
  } else if (asked.has_value()) {
    policy.mode = *asked;
  }
  policy.pinned_keys.assign(pinned.begin(), pinned.end());
  // allow_memory_fraction stays false whatever the job or the file allow:
  // a push carries a config string only, and PyTorch does not apply a
  // memory fraction given at runtime to an allocator that exists, so a
  // proposed fraction could not be applied as predicted.
  return policy;
}

std::vector<std::pair<JobKey, JobPolicy>> DaemonAutotune::Policies(
    const std::optional<std::string>& label) {
  std::vector<std::pair<JobKey, JobPolicy>> out;
  if (!label.has_value()) {
    default_mode_ = admin_default_mode_.value_or(
        file_default_mode_.value_or(flag_mode_));
    out.emplace_back(JobKey{}, JobPolicy{.mode = default_mode_});
  }
  for (const JobKey& job : policied_) {
    if (!label.has_value() || job.job == *label) {
      out.emplace_back(job, EffectivePolicy(job));
    }
  }
  return out;
}

void DaemonAutotune::Publish(
    const std::vector<std::pair<JobKey, JobPolicy>>& policies) {
  for (const auto& [job, policy] : policies) autotuner_->SetPolicy(job, policy);
}

}  // namespace allocd
