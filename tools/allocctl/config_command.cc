#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "allocator/bytes.h"
#include "proto/protocol.h"
#include "tools/allocctl/commands.h"

namespace allocd {
namespace {

struct ConfigOptions {
  std::string job;
  // get and set --tenant: the tenant the job's config is of.
  std::optional<std::string> tenant;
  std::string config;
  std::string predicted_peak;
  uint32_t limit = 20;
};

void PrintConfig(const v1::ConfigVersion& c) {
  if (c.version() == 0) {
    std::printf("no config set: sessions keep their own\n");
    return;
  }
  std::printf("version %llu for %s: %s\n  set %s by %s\n",
              static_cast<unsigned long long>(c.version()),
              c.job().empty() ? "every job (default)"
                              : ("job " + c.job()).c_str(),
              c.config().empty() ? "(PyTorch defaults)" : c.config().c_str(),
              Time(c.set_unix_micros()).c_str(), c.author().c_str());
  if (c.predicted_peak_reserved_bytes() > 0) {
    std::printf("  predicted peak reserved: %s\n",
                FormatSize(c.predicted_peak_reserved_bytes()).c_str());
  }
}

void PrintHistory(const v1::HistoryResponse& r) {
  for (const v1::HistoryEntry& e : r.entries()) {
    std::printf("%s  %-8s v%-4llu %-16s %s%s%s\n", Time(e.unix_micros()).c_str(),
                e.event().c_str(), static_cast<unsigned long long>(e.version()),
                e.job().empty() ? "(default)" : e.job().c_str(),
                e.session_id() == 0
                    ? ""
                    : absl::StrCat("session ", e.session_id(), " ").c_str(),
                e.config().c_str(),
                e.detail().empty() ? "" : ("  # " + e.detail()).c_str());
  }
}

// --predicted-peak-reserved: printed by `allocd tune` in bytes, so a bare
// number is bytes there.
const SizeContext kPredictedPeak{.bare_number_is_bytes = true};

int RunGet(const ConfigOptions& o, const AdminContext& c) {
  v1::GetConfigRequest request;
  request.set_job(TenantJobKey(o.job, o.tenant.value_or("")));
  return CallAdmin(c, &v1::Admin::Stub::GetConfig, request,
                   [](const v1::GetConfigResponse& r) {
                     PrintConfig(r.config());
                   });
}

int RunSet(const ConfigOptions& o, const AdminContext& c) {
  if (o.tenant.has_value() && o.job.empty()) {
    std::fprintf(stderr,
                 "allocctl: config set --tenant needs --job: the default "
                 "config is every tenant's\n");
    return kExitUsage;
  }
  v1::SetConfigRequest request;
  request.set_job(TenantJobKey(o.job, o.tenant.value_or("")));
  request.set_config(o.config);
  if (!o.predicted_peak.empty()) {
    // SizeSyntax checked it.
    request.set_predicted_peak_reserved_bytes(
        *ParseSize(o.predicted_peak, kPredictedPeak));
  }
  return CallAdmin(c, &v1::Admin::Stub::SetConfig, request,
                   [](const v1::SetConfigResponse& r) {
                     PrintConfig(r.config());
                     std::printf("pushed to %u sessions\n", r.pushed_to());
                   });
}

int RunHistory(const ConfigOptions& o, const AdminContext& c) {
  v1::HistoryRequest request;
  request.set_job(o.job);
  request.set_limit(o.limit);
  return CallAdmin(c, &v1::Admin::Stub::History, request, PrintHistory);
}

}  // namespace

void AddConfigCommand(CLI::App& app, AdminCommands& commands) {
  auto o = std::make_shared<ConfigOptions>();
  CLI::App* config = app.add_subcommand("config", "allocator configs per job");
  config->require_subcommand(1);
  CLI::App* get = config->add_subcommand(
      "get", "the config sessions of a job get (its own, else the default)");
  get->add_option("--job,-j", o->job, "job label (default: every job)");
  get->add_option("--tenant", o->tenant,
                  "the job's tenant, as `allocctl sessions` shows it "
                  "(uid:1001, pod:<pod UID>): what that tenant's sessions of "
                  "the job get");
  CLI::App* set = config->add_subcommand(
      "set", "push a config to every session of a job; they ACK or NACK it");
  set->add_option("CONFIG", o->config,
                  "a PYTORCH_CUDA_ALLOC_CONF, e.g. expandable_segments:True")
      ->required();
  set->add_option("--job,-j", o->job, "job label (default: every job without "
                                      "its own config)");
  set->add_option("--tenant", o->tenant,
                  "set the job's config in this tenant alone (uid:1001, "
                  "pod:<pod UID>, as `allocctl sessions` shows it); it wins "
                  "over the job's config for every tenant. Needs --job");
  set->add_option("--predicted-peak-reserved", o->predicted_peak,
                  "the job's peak reserved memory `allocd tune` predicted "
                  "under CONFIG: bytes as tune prints it, or a size such as "
                  "4.8GB; exported for dashboards to set against the "
                  "realised peak")
      ->check(SizeSyntax(kPredictedPeak));
  CLI::App* history = config->add_subcommand(
      "history", "config sets, ACKs, NACKs and rollbacks, newest first");
  history->add_option("--job,-j", o->job, "only this job");
  history->add_option("--limit,-n", o->limit, "entries (default 20)");
  commands.push_back({get, [o](const AdminContext& c) { return RunGet(*o, c); }});
  commands.push_back({set, [o](const AdminContext& c) { return RunSet(*o, c); }});
  commands.push_back(
      {history, [o](const AdminContext& c) { return RunHistory(*o, c); }});
}

}  // namespace allocd
