#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "allocator/bytes.h"
#include "nlohmann/json.hpp"
#include "tools/allocctl/commands.h"

namespace allocd {
namespace {

struct AutotuneOptions {
  std::string job;
  uint32_t limit = 20;
  std::string mode;
  // export --tenant: only this tenant's (nullopt: all).
  std::optional<std::string> tenant;
};

std::string SignedSize(int64_t bytes) {
  return bytes < 0 ? "-" + FormatSize(static_cast<uint64_t>(-bytes))
                   : FormatSize(static_cast<uint64_t>(bytes));
}

// One decision, as `autotune history` and `autotune status` print it.
void PrintDecision(const v1::AutotuneDecision& d, const char* indent) {
  std::printf("%s#%llu %s  %-16s %-14s %-11s %s\n", indent,
              static_cast<unsigned long long>(d.id()),
              Time(d.unix_micros()).c_str(), d.job().c_str(),
              d.tenant().empty() ? "-" : d.tenant().c_str(),
              d.result().c_str(), d.trigger().c_str());
  std::printf("%s  from: %s\n", indent,
              d.from_config().empty() ? "(PyTorch defaults)"
                                      : d.from_config().c_str());
  if (!d.to_config().empty()) {
    std::printf("%s  to:   %s%s\n", indent, d.to_config().c_str(),
                d.has_memory_fraction()
                    ? absl::StrCat(" + memory fraction ", d.memory_fraction()).c_str()
                    : "");
    std::printf("%s  predicted peak reserved %s -> %s (saves %s)\n", indent,
                FormatSize(d.predicted_peak_current()).c_str(),
                FormatSize(d.predicted_peak_switched()).c_str(),
                SignedSize(d.predicted_saving()).c_str());
  }
  if (d.has_realized_peak()) {
    std::printf("%s  realised peak reserved %s (saved %s)\n", indent,
                FormatSize(d.realized_peak()).c_str(),
                SignedSize(d.realized_saving()).c_str());
  }
  if (d.has_predicted_peak_at_need() && d.has_realized_peak_requested() &&
      d.realized_peak_requested() > d.predicted_peak_requested()) {
    std::printf("%s  the job requested up to %s after the push (%s in the window): "
                "predicted %s for that%s%s\n",
                indent, FormatSize(d.realized_peak_requested()).c_str(),
                FormatSize(d.predicted_peak_requested()).c_str(),
                FormatSize(d.predicted_peak_at_need()).c_str(),
                d.at_need_basis().empty() ? "" : ", from ", d.at_need_basis().c_str());
  }
  if (d.has_best_reachable_peak() && d.has_realized_peak()) {
    std::printf("%s  best reachable from the push on the %llu events after it: %s (realised %+.1f%%)\n",
                indent, static_cast<unsigned long long>(d.reviewed_events()),
                FormatSize(d.best_reachable_peak()).c_str(),
                100.0 * (static_cast<double>(d.realized_peak()) /
                             static_cast<double>(std::max<int64_t>(1, d.best_reachable_peak())) -
                         1.0));
  }
  if (d.has_trigger_to_ack_seconds()) {
    std::printf("%s  trigger to the canary's ACK: %.2f s\n", indent, d.trigger_to_ack_seconds());
  }
  std::printf("%s  %llu events, %llu candidates replayed in %.2f s%s\n", indent,
              static_cast<unsigned long long>(d.window_events()),
              static_cast<unsigned long long>(d.candidates()),
              d.replay_seconds(),
              d.version() == 0
                  ? ""
                  : absl::StrCat("; pushed as v", d.version()).c_str());
  if (!d.why().empty()) std::printf("%s  why: %s\n", indent, d.why().c_str());
  for (const v1::LeftOutConfig& l : d.left_out()) {
    std::printf("%s  left out: %s: %s\n", indent, l.config().c_str(), l.why().c_str());
  }
}

// What a job's sessions said they do (JobFeatures), comma-separated; "" for
// none. By the proto's field names, so a feature added there shows here.
std::string FeatureNames(const v1::JobFeatures& f) {
  const google::protobuf::Descriptor* fields = f.GetDescriptor();
  const google::protobuf::Reflection* values = f.GetReflection();
  std::string names;
  for (int i = 0; i < fields->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = fields->field(i);
    if (field->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_BOOL &&
        values->GetBool(f, field)) {
      absl::StrAppend(&names, names.empty() ? "" : ",", field->name());
    }
  }
  return names;
}

void PrintLearned(const v1::AutotuneLearnedResponse& r) {
  std::printf("learned configs %s\n",
              r.state_file().empty()
                  ? "(in the daemon's memory only: allocd serve --state-dir keeps them)"
                  : ("(kept in " + r.state_file() + ")").c_str());
  if (r.learned().empty()) std::printf("none yet\n");
  for (const v1::LearnedConfig& l : r.learned()) {
    std::printf("%-20s %-12s %s\n", l.job().c_str(),
                l.tenant().empty() ? "-" : l.tenant().c_str(), l.config().c_str());
    std::printf("  learned %s from decision #%llu; it ran %s before\n",
                Time(l.learned_unix_micros()).c_str(),
                static_cast<unsigned long long>(l.decision_id()),
                l.from_config().empty() ? "PyTorch's defaults" : l.from_config().c_str());
    std::printf("  predicted peak reserved %s -> %s%s\n",
                FormatSize(l.predicted_peak_current()).c_str(),
                FormatSize(l.predicted_peak_switched()).c_str(),
                l.has_realized_peak()
                    ? absl::StrCat(", realised ", FormatSize(l.realized_peak())).c_str()
                    : "");
  }
}

// The learned configs as the "jobs" of allocd serve's --config file (the
// ConfigMap's config.json). A label learned by several tenants takes the
// newest; the others are named on stderr.
void ExportLearned(const v1::AutotuneLearnedResponse& r,
                   const std::optional<std::string>& tenant) {
  std::map<std::string, const v1::LearnedConfig*> newest;
  for (const v1::LearnedConfig& l : r.learned()) {
    if (tenant.has_value() && l.tenant() != *tenant) continue;
    const v1::LearnedConfig*& kept = newest[l.job()];
    if (kept != nullptr && kept->config() != l.config()) {
      const bool newer = l.learned_unix_micros() > kept->learned_unix_micros();
      const v1::LearnedConfig& left = newer ? *kept : l;
      std::fprintf(stderr,
                   "allocctl: job %s: left out tenant %s's \"%s\" for a newer "
                   "one (--tenant picks a tenant's)\n",
                   l.job().c_str(), left.tenant().c_str(), left.config().c_str());
      if (!newer) continue;
    }
    kept = &l;
  }
  nlohmann::json jobs = nlohmann::json::object();
  for (const auto& [job, l] : newest) jobs[job] = l->config();
  std::printf("%s\n", nlohmann::json{{"jobs", jobs}}.dump(2).c_str());
}

void PrintAutotuneStatus(const v1::AutotuneStatusResponse& r) {
  std::printf("autotune mode %s (jobs without their own)\n", r.mode().c_str());
  std::printf("%-20s %-14s %-9s %-9s %8s %10s %8s %6s %s\n", "JOB", "TENANT",
              "MODE", "STATE", "SESSIONS", "EVENTS", "DROPPED", "STEPS", "PINNED");
  for (const v1::AutotuneJob& j : r.jobs()) {
    std::string pinned;
    for (const std::string& k : j.pinned_keys()) {
      absl::StrAppend(&pinned, pinned.empty() ? "" : ",", k);
    }
    // Steps the client marked; "-" for a client that cannot mark (its
    // steps are found in the stream).
    const std::string steps = j.marks_steps() ? std::to_string(j.steps_marked()) : "-";
    std::printf("%-20s %-14s %-9s %-9s %8llu %10llu %8llu %6s %s\n",
                j.job().empty() ? "-" : j.job().c_str(),
                j.tenant().empty() ? "-" : j.tenant().c_str(), j.mode().c_str(),
                j.state().c_str(), static_cast<unsigned long long>(j.sessions()),
                static_cast<unsigned long long>(j.window_events()),
                static_cast<unsigned long long>(j.dropped_events()), steps.c_str(),
                pinned.empty() ? "-" : pinned.c_str());
    if (const std::string features = FeatureNames(j.features()); !features.empty()) {
      std::printf("    uses %s: configs PyTorch cannot run with them are not pushed\n",
                  features.c_str());
    }
    if (!j.run_id().empty()) std::printf("    run %s\n", j.run_id().c_str());
    // What each session (each rank of a job of several) runs: a push
    // reaches the canary first, then every rank.
    for (const v1::AutotuneRank& rank : j.ranks()) {
      const std::string gpu =
          rank.gpu_uuid().empty() ? std::string() : absl::StrCat(", ", rank.gpu_uuid());
      const std::string who =
          rank.world_size() > 0
              ? absl::StrCat("rank ", rank.rank(), "/", rank.world_size(), " (session ",
                             rank.session_id(), gpu, ")")
              : absl::StrCat("session ", rank.session_id(), gpu);
      std::printf("    %s: %s (version %llu)%s\n", who.c_str(),
                  rank.config().empty() ? "(defaults)" : rank.config().c_str(),
                  static_cast<unsigned long long>(rank.config_version()),
                  rank.canary() ? ", canary" : "");
    }
    if (j.has_last()) PrintDecision(j.last(), "    ");
  }
}

int RunHistory(const AutotuneOptions& o, const AdminContext& c) {
  v1::AutotuneHistoryRequest request;
  request.set_job(o.job);
  request.set_limit(o.limit);
  return CallAdmin(c, &v1::Admin::Stub::AutotuneHistory, request,
                   [](const v1::AutotuneHistoryResponse& r) {
                     if (r.decisions().empty()) {
                       std::printf("no decisions yet\n");
                     }
                     for (const v1::AutotuneDecision& d : r.decisions()) {
                       PrintDecision(d, "");
                     }
                   });
}

int RunRun(const AutotuneOptions& o, const AdminContext& c) {
  v1::AutotuneRunRequest request;
  request.set_job(o.job);
  return CallAdmin(c, &v1::Admin::Stub::AutotuneRun, request,
                   [&](const v1::AutotuneRunResponse& r) {
                     std::printf(
                         "run queued for job %s: decision #%llu (allocctl "
                         "autotune history --job %s)\n",
                         o.job.c_str(),
                         static_cast<unsigned long long>(r.decision_id()),
                         o.job.c_str());
                   });
}

int RunSetMode(const AutotuneOptions& o, const AdminContext& c) {
  v1::AutotuneSetModeRequest request;
  request.set_job(o.job);
  request.set_mode(o.mode);
  return CallAdmin(c, &v1::Admin::Stub::AutotuneSetMode, request,
                   [&](const v1::AutotuneSetModeResponse&) {
                     std::printf(
                         "autotune mode of %s: %s\n",
                         o.job.empty() ? "the daemon (jobs without their own)"
                                       : ("job " + o.job).c_str(),
                         o.mode.c_str());
                   });
}

int RunExport(const AutotuneOptions& o, const AdminContext& c) {
  // In the config file's own format, --json or not.
  AdminContext file_format{c.channel, c.admin, /*json=*/false};
  return CallAdmin(file_format, &v1::Admin::Stub::AutotuneLearned,
                   v1::AutotuneLearnedRequest(),
                   [&](const v1::AutotuneLearnedResponse& r) {
                     ExportLearned(r, o.tenant);
                   });
}

}  // namespace

void AddAutotuneCommand(CLI::App& app, AdminCommands& commands) {
  auto o = std::make_shared<AutotuneOptions>();
  CLI::App* autotune = app.add_subcommand(
      "autotune", "the daemon's autotuner: what it saw, decided and pushed");
  autotune->require_subcommand(1);
  CLI::App* status = autotune->add_subcommand(
      "status", "each job's mode, state, window and newest decision");
  CLI::App* history = autotune->add_subcommand(
      "history", "decisions, newest first: trigger, prediction, result, "
                 "realised saving, and why");
  history->add_option("--job,-j", o->job, "only this job");
  history->add_option("--limit,-n", o->limit, "decisions (default 20)");
  CLI::App* run = autotune->add_subcommand(
      "run", "decide for JOB now (its job in each tenant), whatever the "
             "triggers say");
  run->add_option("JOB", o->job, "job label")->required();
  CLI::App* set = autotune->add_subcommand(
      "set", "a job's mode in every tenant, which a job may lower for "
             "itself but not raise (or, without --job, the daemon's default)");
  set->add_option("--job,-j", o->job, "job label (default: the daemon's "
                                      "default for jobs without their own)");
  set->add_option("--mode,-m", o->mode, "off, recommend or apply")
      ->required()
      ->check(CLI::IsMember({"off", "recommend", "apply"}));
  CLI::App* learned = autotune->add_subcommand(
      "learned", "the configs jobs learned: kept pushes their next runs start "
                 "with (until a rollback undoes one)");
  CLI::App* exported = autotune->add_subcommand(
      "export", "the learned configs as the \"jobs\" of allocd serve's "
                "--config file (the ConfigMap's config.json)");
  exported->add_option("--tenant", o->tenant,
                       "only this tenant's (as allocctl autotune learned "
                       "prints it)");
  commands.push_back({status, [](const AdminContext& c) {
                        return CallAdmin(c, &v1::Admin::Stub::AutotuneStatus,
                                         v1::AutotuneStatusRequest(),
                                         PrintAutotuneStatus);
                      }});
  commands.push_back(
      {history, [o](const AdminContext& c) { return RunHistory(*o, c); }});
  commands.push_back({run, [o](const AdminContext& c) { return RunRun(*o, c); }});
  commands.push_back(
      {set, [o](const AdminContext& c) { return RunSetMode(*o, c); }});
  commands.push_back({learned, [](const AdminContext& c) {
                        return CallAdmin(c, &v1::Admin::Stub::AutotuneLearned,
                                         v1::AutotuneLearnedRequest(),
                                         PrintLearned);
                      }});
  commands.push_back(
      {exported, [o](const AdminContext& c) { return RunExport(*o, c); }});
}

}  // namespace allocd
