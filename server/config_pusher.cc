#include "server/config_pusher.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "allocator/bytes.h"
#include "allocator/config.h"
#include "allocator/config_check.h"
#include "server/request_limits.h"

namespace allocd {
namespace {

// A config in canonical form; as given when it does not parse (then it
// equals no canonical config).
std::string Canonical(absl::string_view config) {
  return CanonicalAllocatorConfig(std::string_view(config.data(), config.size()))
      .value_or(std::string(config));
}

}  // namespace

absl::StatusOr<std::string> CanonicalClientConfig(absl::string_view field,
                                                  const std::string& config) {
  absl::StatusOr<AllocatorConfig> parsed = ParseAllocatorConfig(config);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is not a config PyTorch 2.11 accepts: ",
                     ConfigRejection(config, parsed.status())));
  }
  return FormatAllocatorConfig(*parsed);
}

void FillConfigVersion(const ConfigRecord& record, v1::ConfigVersion* out) {
  out->set_version(record.version);
  out->set_job(record.job);
  out->set_config(record.config);
  out->set_set_unix_micros(absl::ToUnixMicros(record.set_at));
  out->set_author(record.author);
  out->set_predicted_peak_reserved_bytes(record.predicted_peak_reserved_bytes);
}

ConfigPusher::ConfigPusher(const SessionRegistry* sessions, Metrics* metrics)
    : sessions_(sessions),
      metrics_(metrics),
      configs_(kHistoryLimit, kVersionLimit, [this] {
        absl::flat_hash_set<uint64_t> in_use;
        for (const std::shared_ptr<Session>& s : sessions_->List()) {
          for (uint64_t version : s->AppliedVersions()) in_use.insert(version);
        }
        return in_use;
      }) {}

ConfigPusher::AtRegistration ConfigPusher::Register(
    Session& session, const std::string& current_config,
    uint64_t current_version, const std::optional<Learned>& learned,
    bool started_on_learned) {
  const std::string& job = session.identity().job;
  const TenantId& tenant = session.identity().tenant;
  AtRegistration at{.running = session.Current()};
  if (current_version != 0) {
    at.running =
        AdoptRunningConfig(job, current_config, current_version, session.id());
    session.Acked(at.running);
  }
  at.config = EffectiveIn(tenant, job);
  if (learned.has_value() && !HasOwnConfig(job, tenant)) {
    if (at.running.config == learned->config) {
      // It runs the learned config already (a client that reconnected):
      // the default is not pushed over it.
      at.learned = at.running;
      at.config.reset();
      return at;
    }
    absl::StatusOr<ConfigRecord> record =
        configs_.AddVersion(job, learned->config, learned->author, learned->source);
    // A learned config PyTorch would refuse (a file edited by hand) is not
    // handed; the job gets what it would get without one.
    if (record.ok()) {
      at.config = *record;
      at.learned = AppliedConfig{.version = record->version,
                                 .config = record->config};
      if (started_on_learned && current_config == record->config) {
        // It started on it (allocd run asked before the job allocated):
        // it runs that version, and its initial config stays the job's
        // own, where a rollback returns.
        at.running = *at.learned;
        session.Acked(at.running);
        at.config.reset();
        return at;
      }
    }
  }
  if (started_on_learned && current_version == 0) {
    // What it started on is no longer what this daemon hands the job: it
    // is known as what the session runs, so that the job's config is
    // pushed over it (or, with none, it stays on it).
    absl::StatusOr<ConfigRecord> adopted = configs_.AddVersion(
        job, current_config,
        absl::StrCat("session ", session.id(),
                     " started on it as the job's learned config"),
        "adopt");
    if (adopted.ok()) {
      at.running = {.version = adopted->version, .config = adopted->config};
      session.Acked(at.running);
    }
  }
  // The client applies it at start and ACKs like any push; a client that
  // runs it already (it reconnected) is not pushed it twice.
  if (at.config.has_value() && at.config->config != at.running.config) {
    Push(session, *at.config, false,
         !learned.has_value() || !at.learned ? std::string("config for this job at registration")
         : learned->source == "learned"
             ? absl::StrCat("the config this job learned in an earlier run (", learned->author, ")")
             : absl::StrCat("the config chosen for this job before its first allocation (",
                            learned->author, ")"));
  }
  return at;
}

bool ConfigPusher::HasOwnConfig(absl::string_view job,
                                const TenantId& tenant) const {
  return configs_.HasOwnConfig(job) ||
         (!job.empty() && configs_.HasOwnConfig(TenantJobKey({job.data(), job.size()}, tenant)));
}

bool ConfigPusher::JobKeyReaches(const ConfigKey& key,
                                 const Session& session) const {
  const SessionIdentity& who = session.identity();
  if (who.job != key.job) return false;
  return key.tenant.empty()
             ? !configs_.HasOwnConfig(TenantJobKey(
                   {key.job.data(), key.job.size()}, who.tenant))
             : who.tenant == key.tenant;
}

std::optional<ConfigRecord> ConfigPusher::EffectiveIn(
    const TenantId& tenant, absl::string_view job) const {
  if (const std::string own = TenantJobKey({job.data(), job.size()}, tenant);
      !job.empty() && configs_.HasOwnConfig(own)) {
    return configs_.Effective(own);
  }
  return configs_.Effective(job);
}

AppliedConfig ConfigPusher::AdoptRunningConfig(absl::string_view job,
                                               const std::string& config,
                                               uint64_t declared_version,
                                               SessionId id) {
  if (std::optional<ConfigRecord> known = configs_.Find(declared_version);
      known.has_value() && known->config == config) {
    return {.version = known->version, .config = known->config};
  }
  // Validated at registration, so this cannot fail.
  absl::StatusOr<ConfigRecord> adopted = configs_.AddVersion(
      job, config,
      absl::StrCat("session ", id, " runs it (version ", declared_version,
                   " of the daemon it was connected to before)"),
      "adopt");
  return {.version = adopted->version, .config = adopted->config};
}

absl::Status ConfigPusher::Ack(Session& session, const v1::ConfigAck& r) {
  std::string config;
  if (r.version() == 0) {
    config = session.identity().initial_config;
  } else if (std::optional<ConfigRecord> record =
                 configs_.Find(r.version())) {
    config = record->config;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("no config version ", r.version()));
  }
  if (absl::Status s = CheckNackError(r.error()); !s.ok()) return s;
  if (!session.MayAnswer(r.version())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config version ", r.version(), " was never pushed to session ", session.id()));
  }
  configs_.Record({.at = absl::Now(),
                   .event = r.applied() ? "ack" : "nack",
                   .version = r.version(),
                   .job = session.identity().job,
                   .config = config,
                   .session_id = session.id(),
                   .detail = r.error()});
  if (!r.applied()) {
    session.Refused(r.version());
    metrics_->ConfigPushResult("nack");
    return absl::OkStatus();
  }
  const bool was_rollback = session.rolling_back();
  session.Acked({.version = r.version(), .config = config});
  if (!was_rollback) metrics_->ConfigPushResult("ack");
  metrics_->ConfigPushed(session.id(), r.version());
  return absl::OkStatus();
}

bool ConfigPusher::RollBackAfterOom(Session& session,
                                    uint64_t requested_bytes) {
  // Only an OOM the config caused is a reason to take the config back: not
  // one that followed a refusal of the node pool or a quota, which any
  // config would have met.
  if (session.TakeAcquireRefused()) return false;
  const AppliedConfig current = session.Current();
  std::optional<AppliedConfig> target = session.RollBackTarget();
  if (!target.has_value()) return false;
  session.StartRollBack();
  PushRollBack(session,
               {.version = target->version,
                .job = session.identity().job,
                .config = target->config,
                .set_at = absl::Now(),
                .author = "rollback"},
               absl::StrCat("OOM (", FormatSize(requested_bytes),
                            ") under pushed version ", current.version,
                            "; back to version ", target->version));
  return true;
}

v1::GetConfigResponse ConfigPusher::Get(absl::string_view key) const {
  v1::GetConfigResponse r;
  const ConfigKey split = SplitConfigKey(key);
  if (std::optional<ConfigRecord> record =
          EffectiveIn(TenantId(split.tenant), split.job)) {
    FillConfigVersion(*record, r.mutable_config());
  }
  return r;
}

absl::StatusOr<v1::SetConfigResponse> ConfigPusher::Set(
    absl::string_view job, absl::string_view config, absl::string_view author,
    uint64_t predicted_peak_reserved_bytes) {
  absl::MutexLock fanout(&fanout_mu_);
  absl::StatusOr<ConfigRecord> record =
      configs_.Set(job, config, author, predicted_peak_reserved_bytes);
  if (!record.ok()) return record.status();
  metrics_->ConfigPrediction(job, predicted_peak_reserved_bytes);
  v1::SetConfigResponse r;
  FillConfigVersion(*record, r.mutable_config());
  const ConfigKey key = SplitConfigKey(job);
  uint32_t pushed = 0;
  for (const std::shared_ptr<Session>& s : sessions_->List()) {
    const bool applies =
        job.empty() ? !HasOwnConfig(s->identity().job, s->identity().tenant)
                    : JobKeyReaches(key, *s);
    if (!applies) continue;
    Push(*s, *record, false, absl::StrCat("set by ", author));
    ++pushed;
  }
  r.set_pushed_to(pushed);
  return r;
}

void ConfigPusher::Clear(absl::string_view job, absl::string_view author) {
  absl::MutexLock fanout(&fanout_mu_);
  if (!configs_.Clear(job, author)) return;
  metrics_->ConfigPrediction(job, 0);
  if (job.empty()) return;
  const ConfigKey key = SplitConfigKey(job);
  for (const std::shared_ptr<Session>& s : sessions_->List()) {
    if (!JobKeyReaches(key, *s)) continue;
    std::optional<ConfigRecord> fallback =
        EffectiveIn(s->identity().tenant, key.job);
    if (fallback.has_value()) {
      Push(*s, *fallback, false,
           absl::StrCat("job config removed by ", author, "; what applies "
                        "to the job now"));
    }
  }
}

absl::StatusOr<uint64_t> ConfigPusher::PushToSession(
    SessionId id, absl::string_view config, absl::string_view author,
    std::string reason, uint64_t predicted_peak_reserved_bytes) {
  std::shared_ptr<Session> session = sessions_->Find(id);
  if (session == nullptr) {
    return absl::NotFoundError(absl::StrCat("no session ", id));
  }
  absl::StatusOr<ConfigRecord> record =
      configs_.AddVersion(session->identity().job, config, author, "push",
                          predicted_peak_reserved_bytes);
  if (!record.ok()) return record.status();
  Push(*session, *record, false, std::move(reason));
  return record->version;
}

absl::StatusOr<uint64_t> ConfigPusher::PushToTenantJob(
    const TenantId& tenant, absl::string_view job, absl::string_view config,
    absl::string_view author, uint64_t predicted_peak_reserved_bytes) {
  return PushToJob(job, config, author, predicted_peak_reserved_bytes,
                   [&](const Session& s) {
                     return s.identity().tenant == tenant && s.identity().job == job;
                   });
}

absl::StatusOr<uint64_t> ConfigPusher::PushToSessions(
    absl::string_view job, const std::vector<SessionId>& sessions,
    absl::string_view config, absl::string_view author,
    uint64_t predicted_peak_reserved_bytes) {
  return PushToJob(job, config, author, predicted_peak_reserved_bytes,
                   [&](const Session& s) {
                     return std::find(sessions.begin(), sessions.end(), s.id()) !=
                            sessions.end();
                   });
}

absl::StatusOr<uint64_t> ConfigPusher::PushToJob(
    absl::string_view job, absl::string_view config, absl::string_view author,
    uint64_t predicted_peak_reserved_bytes,
    absl::FunctionRef<bool(const Session&)> of_job) {
  absl::MutexLock fanout(&fanout_mu_);
  absl::StatusOr<ConfigRecord> record = configs_.AddVersion(
      job, config, author, "push", predicted_peak_reserved_bytes);
  if (!record.ok()) return record.status();
  for (const std::shared_ptr<Session>& s : sessions_->List()) {
    if (!of_job(*s) || s->Current().config == record->config) continue;
    Push(*s, *record, false, absl::StrCat("set by ", author));
  }
  return record->version;
}

bool ConfigPusher::DemandStream(SessionId id, std::optional<absl::string_view> running,
                                uint64_t from_reserved, std::string reason) {
  std::shared_ptr<Session> session = sessions_->Find(id);
  if (session == nullptr ||
      (running.has_value() && Canonical(session->Current().config) != Canonical(*running))) {
    return false;
  }
  v1::ControlMessage message;
  v1::StreamDemand* demand = message.mutable_stream();
  demand->set_from_reserved(from_reserved);
  demand->set_reason(std::move(reason));
  session->Push(std::move(message));
  return true;
}

absl::Status ConfigPusher::RollBackSession(SessionId id,
                                           absl::string_view config,
                                           std::string reason) {
  std::shared_ptr<Session> session = sessions_->Find(id);
  if (session == nullptr) {
    return absl::NotFoundError(absl::StrCat("no session ", id));
  }
  // An OOM rolled it back already: once is enough, whether or not its
  // client has ACKed that rollback yet (then it runs `config`, and nothing
  // pushed to it waits for an answer).
  if (session->rolling_back()) return absl::OkStatus();
  const std::string canonical = Canonical(config);
  if (Canonical(session->Current().config) == canonical && !session->awaits_answer()) {
    return absl::OkStatus();
  }
  ConfigRecord target{.job = session->identity().job,
                      .config = canonical,
                      .set_at = absl::Now(),
                      .author = "rollback"};
  if (std::optional<AppliedConfig> back = session->RollBackTarget();
      back.has_value() && back->config == canonical) {
    target.version = back->version;
  } else {
    absl::StatusOr<ConfigRecord> added = configs_.AddVersion(
        target.job, canonical, "autotune rollback", "push");
    if (!added.ok()) return added.status();
    target.version = added->version;
  }
  session->StartRollBack();
  PushRollBack(*session, target, std::move(reason));
  return absl::OkStatus();
}

v1::HistoryResponse ConfigPusher::History(absl::string_view job,
                                          uint32_t limit) const {
  v1::HistoryResponse r;
  for (const HistoryRecord& h :
       configs_.History(job, limit == 0 ? 100 : std::min(limit, 10000u))) {
    v1::HistoryEntry* e = r.add_entries();
    e->set_unix_micros(absl::ToUnixMicros(h.at));
    e->set_event(h.event);
    e->set_version(h.version);
    e->set_job(h.job);
    e->set_config(h.config);
    e->set_session_id(h.session_id);
    e->set_detail(h.detail);
  }
  return r;
}

void ConfigPusher::Push(Session& session, const ConfigRecord& record,
                        bool rollback, std::string reason) {
  v1::ControlMessage message;
  v1::ConfigPush* push = message.mutable_config();
  FillConfigVersion(record, push->mutable_config());
  push->set_rollback(rollback);
  push->set_reason(std::move(reason));
  session.Push(std::move(message));
}

void ConfigPusher::PushRollBack(Session& session, const ConfigRecord& target,
                                std::string reason) {
  configs_.Record({.at = absl::Now(),
                   .event = "rollback",
                   .version = target.version,
                   .job = session.identity().job,
                   .config = target.config,
                   .session_id = session.id(),
                   .detail = reason});
  metrics_->ConfigPushResult("rollback");
  Push(session, target, true, std::move(reason));
}

}  // namespace allocd
