// allocctl: the node daemon's admin tool. Talks to the Admin service of
// `allocd serve` over its admin socket (SOCKET.admin: the clients' socket
// refuses Admin calls); the daemon allows it to root, its own uid, the uids
// given to it with --admin-uid and the members of --admin-group.
#include <fcntl.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "allocator/bytes.h"
#include "allocd.grpc.pb.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel_posix.h"
#include "grpcpp/grpcpp.h"
#include "ipc/unix_socket.h"
#include "proto/protocol.h"
#include "nlohmann/json.hpp"
#include "tools/common/cli.h"

namespace allocd {
namespace {

struct Options {
  std::string socket = kDefaultSocket;
  // Empty: `socket` + ".admin", or `socket` itself when it ends so.
  std::string admin_socket;
  bool json = false;
  std::string job;
  std::string config;
  uint32_t limit = 20;
  std::optional<uint64_t> session;
  std::optional<uint32_t> uid;
  std::string quota;
  std::string predicted_peak;
  std::string mode;
  // allocctl pool trim --device: a UUID or node index; empty: every device.
  std::string device;
  // allocctl autotune export --tenant: only this tenant's (empty: all);
  // allocctl quota set --tenant: the tenant whose quota it is.
  std::optional<std::string> tenant;
};

// The admin socket of the daemon `o` names.
std::string AdminSocket(const Options& o) {
  if (!o.admin_socket.empty()) return o.admin_socket;
  if (absl::EndsWith(o.socket, ".admin")) return o.socket;
  return o.socket + ".admin";
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> Dial(const std::string& path) {
  absl::StatusOr<UniqueFd> fd = ConnectUnix(path);
  if (absl::IsPermissionDenied(fd.status())) {
    return absl::PermissionDeniedError(absl::StrCat(
        "cannot reach allocd's admin socket: ", fd.status().message(),
        ". It admits root, the daemon's uid, the daemon's --admin-uid uids "
        "and the members of its --admin-group; in Kubernetes, run allocctl "
        "in allocd's pod (kubectl exec)"));
  }
  if (!fd.ok()) {
    // The message names the path and, where it fits, asks whether allocd
    // runs; what is left to say is how to point allocctl elsewhere.
    return absl::UnavailableError(absl::StrCat(
        "cannot reach allocd's admin socket: ", fd.status().message(),
        "; --socket names the daemon's socket (allocctl talks to "
        "SOCKET.admin), --admin-socket another admin socket"));
  }
  fcntl(fd->get(), F_SETFL, fcntl(fd->get(), F_GETFL) | O_NONBLOCK);
  return grpc::CreateInsecureChannelFromFd("allocd", fd->release());
}

std::string Json(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

std::string Time(int64_t unix_micros) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S",
                          absl::FromUnixMicros(unix_micros),
                          absl::LocalTimeZone());
}

// Calls `rpc` with a deadline; prints the error and returns 1, or prints
// the response with `print` (or as JSON) and returns 0.
template <typename Response, typename Rpc, typename Print>
int Call(const Options& o, Rpc&& rpc, Print&& print) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  Response response;
  grpc::Status status = rpc(&context, &response);
  if (!status.ok()) {
    std::cerr << "allocctl: " << status.error_message() << "\n";
    return status.error_code() == grpc::StatusCode::PERMISSION_DENIED ? 4 : 1;
  }
  if (o.json) {
    std::cout << Json(response) << "\n";
  } else {
    print(response);
  }
  return 0;
}

void PrintStatus(const v1::StatusResponse& r) {
  std::printf("allocd %s, backend %s, up since %s\n", r.version().c_str(),
              r.backend().c_str(), Time(r.started_unix_micros()).c_str());
  std::vector<std::string> sizes;
  for (uint64_t size : r.chunk_classes()) sizes.push_back(FormatSize(size));
  if (sizes.empty()) sizes.push_back(FormatSize(r.chunk_bytes()));
  std::printf("pool: %s in use, %s cached free, capacity %s (chunks of %s)\n",
              FormatSize(r.in_use_bytes()).c_str(),
              FormatSize(r.free_bytes()).c_str(),
              FormatSize(r.capacity_bytes()).c_str(),
              absl::StrJoin(sizes, ", ").c_str());
  std::printf(
      "chunks handed out: %llu created, %llu reused, %llu made by their "
      "clients; %u sessions\n",
      static_cast<unsigned long long>(r.chunks_created_total()),
      static_cast<unsigned long long>(r.chunks_reused_total()),
      static_cast<unsigned long long>(r.chunks_client_made_total()),
      r.sessions());
  std::printf("given back to the device since start: %s\n",
              FormatSize(r.trimmed_bytes_total()).c_str());
  if (r.adopting() || r.adopted_bytes_total() > 0) {
    std::printf("adopted from the daemon before (a restart): %s%s\n",
                FormatSize(r.adopted_bytes_total()).c_str(),
                r.adopting() ? "; still waiting for its jobs to re-declare "
                               "their chunks (new memory waits)"
                             : "");
  }
  // One row per device's pool: the lines above are their sums.
  std::printf("\n%-4s %-40s %-24s %10s %10s %10s %10s %8s\n", "DEV",
              "GPU UUID", "NAME", "IN USE", "FREE", "CAPACITY", "TRIMMED",
              "SESSIONS");
  for (const v1::DeviceStatus& d : r.devices()) {
    std::printf("%-4d %-40s %-24s %10s %10s %10s %10s %8u\n", d.node_device(),
                d.gpu_uuid().c_str(), d.name().c_str(),
                FormatSize(d.in_use_bytes()).c_str(),
                FormatSize(d.free_bytes()).c_str(),
                FormatSize(d.capacity_bytes()).c_str(),
                FormatSize(d.trimmed_bytes_total()).c_str(), d.sessions());
  }
}

int64_t Stat(const v1::SessionInfo& s, const std::string& key) {
  auto it = s.stats().find(key);
  return it == s.stats().end() ? 0 : it->second;
}

void PrintSessions(const v1::ListSessionsResponse& r) {
  // DEV is the node's device (allocctl status), GPU UUID names it; the
  // client's own CUDA ordinal is in --json (device). TENANT is what
  // `allocctl quota set --tenant` takes.
  std::printf("%-8s %-8s %-6s %-14s %-20s %-4s %-40s %10s %10s %10s %5s %s\n",
              "SESSION", "PID", "UID", "TENANT", "JOB", "DEV", "GPU UUID",
              "HELD", "RESERVED", "ALLOCATED", "OOMS", "CONFIG");
  for (const v1::SessionInfo& s : r.sessions()) {
    std::printf(
        "%-8llu %-8d %-6u %-14s %-20s %-4d %-40s %10s %10s %10s %5llu v%llu "
        "%s\n",
        static_cast<unsigned long long>(s.session_id()), s.pid(), s.uid(),
        s.tenant().empty() ? "-" : s.tenant().c_str(),
        s.job().empty() ? "-" : s.job().c_str(), s.node_device(),
        s.gpu_uuid().c_str(),
        FormatSize(s.held_bytes()).c_str(),
        FormatSize(Stat(s, "reserved_bytes.all.current")).c_str(),
        FormatSize(Stat(s, "allocated_bytes.all.current")).c_str(),
        static_cast<unsigned long long>(s.ooms()),
        static_cast<unsigned long long>(s.config_version()),
        s.config().empty() ? "(defaults)" : s.config().c_str());
  }
}

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
    if (j.has_last()) PrintDecision(j.last(), "    ");
  }
}

// --predicted-peak-reserved: printed by `allocd tune` in bytes, so a bare
// number is bytes there.
const SizeContext kPredictedPeak{.bare_number_is_bytes = true};

// What a quota of "N%" is a percentage of: a quota limits what is held on
// one GPU, so the smallest device pool's capacity (a daemon before per-GPU
// pools reports only the one capacity).
absl::StatusOr<uint64_t> PoolCapacity(v1::Admin::Stub& admin) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  v1::StatusResponse status;
  if (grpc::Status s = admin.Status(&context, v1::StatusRequest(), &status);
      !s.ok()) {
    return absl::UnavailableError(s.error_message());
  }
  uint64_t smallest = status.capacity_bytes();
  for (const v1::DeviceStatus& d : status.devices()) {
    smallest = std::min(smallest, d.capacity_bytes());
  }
  return smallest;
}

int Health(const Options& o, const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::health::v1::HealthCheckRequest request;
  return Call<grpc::health::v1::HealthCheckResponse>(
      o,
      [&](grpc::ClientContext* c, grpc::health::v1::HealthCheckResponse* r) {
        return stub->Check(c, request, r);
      },
      [](const grpc::health::v1::HealthCheckResponse& r) {
        std::printf("%s\n",
                    grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
                        r.status())
                        .c_str());
      });
}

}  // namespace
}  // namespace allocd

int main(int argc, char** argv) {
  using namespace allocd;
  Options o;
  CLI::App app{
      "allocctl: administer the allocd node daemon (sessions, configs per "
      "job, quotas) over its admin socket.\nAllowed to root, the daemon's "
      "uid, its --admin-uid uids and its --admin-group.",
      "allocctl"};
  app.require_subcommand(1);
  // --socket and --json also after the subcommand: `allocctl sessions --json`.
  app.fallthrough();
  app.footer(absl::StrCat(
      "Global flags, before or after the subcommand: --socket PATH, --json, "
      "--admin-socket PATH.\n\n",
      ExitStatusHelp("  4: the daemon does not allow this caller to administer it\n")));
  app.add_option("--admin-socket", o.admin_socket,
                 "the daemon's admin socket, when not SOCKET.admin (allocd "
                 "serve --admin-socket; default $ALLOCCTL_ADMIN_SOCKET)")
      ->envname("ALLOCCTL_ADMIN_SOCKET");
  app.add_option("--socket,-s", o.socket,
                 std::string("the daemon's socket (default ") +
                     kDefaultSocket +
                     "); allocctl talks to its admin socket, SOCKET.admin; "
                     "before or after the subcommand");
  app.add_flag("--json", o.json,
               "print the daemon's answer as JSON; before or after the "
               "subcommand");

  CLI::App* status = app.add_subcommand("status", "the node pool and daemon");
  CLI::App* health = app.add_subcommand(
      "health", "grpc.health.v1 check: prints SERVING; exit 0 only then");
  CLI::App* sessions = app.add_subcommand(
      "sessions", "client sessions: pid, job, memory held, config, OOMs");
  CLI::App* config = app.add_subcommand("config", "allocator configs per job");
  config->require_subcommand(1);
  CLI::App* get = config->add_subcommand(
      "get", "the config sessions of a job get (its own, else the default)");
  get->add_option("--job,-j", o.job, "job label (default: every job)");
  get->add_option("--tenant", o.tenant,
                  "the job's tenant, as `allocctl sessions` shows it "
                  "(uid:1001, pod:<pod UID>): what that tenant's sessions of "
                  "the job get");
  CLI::App* set = config->add_subcommand(
      "set", "push a config to every session of a job; they ACK or NACK it");
  set->add_option("CONFIG", o.config,
                  "a PYTORCH_CUDA_ALLOC_CONF, e.g. expandable_segments:True")
      ->required();
  set->add_option("--job,-j", o.job, "job label (default: every job without "
                                     "its own config)");
  set->add_option("--tenant", o.tenant,
                  "set the job's config in this tenant alone (uid:1001, "
                  "pod:<pod UID>, as `allocctl sessions` shows it); it wins "
                  "over the job's config for every tenant. Needs --job");
  set->add_option("--predicted-peak-reserved", o.predicted_peak,
                  "the job's peak reserved memory `allocd tune` predicted "
                  "under CONFIG: bytes as tune prints it, or a size such as "
                  "4.8GB; exported for dashboards to set against the "
                  "realised peak")
      ->check(SizeSyntax(kPredictedPeak));
  CLI::App* history = config->add_subcommand(
      "history", "config sets, ACKs, NACKs and rollbacks, newest first");
  history->add_option("--job,-j", o.job, "only this job");
  history->add_option("--limit,-n", o.limit, "entries (default 20)");
  CLI::App* quota =
      app.add_subcommand("quota", "per-session, per-uid and per-tenant quotas");
  quota->require_subcommand(1);
  CLI::App* quota_set = quota->add_subcommand(
      "set", "most memory a session, a uid or a tenant may hold; 'none' "
             "clears it");
  quota_set->add_option("SIZE", o.quota,
                        "e.g. 20GiB, 20Gi, 25% of a GPU pool's capacity, or none "
                        "(a quota holds on each GPU)")
      ->required()
      ->check(CLI::Validator(
          [size = SizeSyntax()](std::string& value) {
            return value == "none" ? std::string() : size(value);
          },
          "SIZE|none"));
  auto* target = quota_set->add_option_group("target");
  target->add_option("--session", o.session, "session id");
  target->add_option("--uid", o.uid, "uid");
  target->add_option("--tenant", o.tenant,
                     "tenant, as `allocctl sessions` shows it: uid:1001, "
                     "pod:<pod UID> or node");
  target->require_option(1);

  CLI::App* autotune = app.add_subcommand(
      "autotune", "the daemon's autotuner: what it saw, decided and pushed");
  autotune->require_subcommand(1);
  CLI::App* at_status = autotune->add_subcommand(
      "status", "each job's mode, state, window and newest decision");
  CLI::App* at_history = autotune->add_subcommand(
      "history", "decisions, newest first: trigger, prediction, result, "
                 "realised saving, and why");
  at_history->add_option("--job,-j", o.job, "only this job");
  at_history->add_option("--limit,-n", o.limit, "decisions (default 20)");
  CLI::App* at_run = autotune->add_subcommand(
      "run", "decide for JOB now (its job in each tenant), whatever the "
             "triggers say");
  at_run->add_option("JOB", o.job, "job label")->required();
  CLI::App* at_set = autotune->add_subcommand(
      "set", "a job's mode in every tenant, which a job may lower for "
             "itself but not raise (or, without --job, the daemon's default)");
  at_set->add_option("--job,-j", o.job, "job label (default: the daemon's "
                                        "default for jobs without their own)");
  at_set->add_option("--mode,-m", o.mode, "off, recommend or apply")
      ->required()
      ->check(CLI::IsMember({"off", "recommend", "apply"}));
  CLI::App* at_learned = autotune->add_subcommand(
      "learned", "the configs jobs learned: kept pushes their next runs start "
                 "with (until a rollback undoes one)");
  CLI::App* at_export = autotune->add_subcommand(
      "export", "the learned configs as the \"jobs\" of allocd serve's "
                "--config file (the ConfigMap's config.json)");
  at_export->add_option("--tenant", o.tenant,
                        "only this tenant's (as allocctl autotune learned "
                        "prints it)");

  CLI::App* pool = app.add_subcommand("pool", "the node pool's memory");
  pool->require_subcommand(1);
  CLI::App* pool_trim = pool->add_subcommand(
      "trim",
      "give every cached chunk back to the device now (held chunks stay)");
  pool_trim->add_option("--device,-d", o.device,
                        "only this device: its GPU UUID or its index in "
                        "allocctl status (default: every device)");

  if (std::optional<int> exit_code =
          ParseCommandLine(app, argc, argv, std::cout, std::cerr)) {
    return *exit_code;
  }

  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      Dial(AdminSocket(o));
  if (!channel.ok()) {
    std::cerr << "allocctl: " << channel.status().message() << "\n";
    return absl::IsPermissionDenied(channel.status()) ? 4 : 1;
  }
  if (health->parsed()) {
    return Health(o, *channel);
  }
  std::unique_ptr<v1::Admin::Stub> admin = v1::Admin::NewStub(*channel);
  if (status->parsed()) {
    return Call<v1::StatusResponse>(
        o,
        [&](grpc::ClientContext* c, v1::StatusResponse* r) {
          return admin->Status(c, v1::StatusRequest(), r);
        },
        PrintStatus);
  }
  if (sessions->parsed()) {
    return Call<v1::ListSessionsResponse>(
        o,
        [&](grpc::ClientContext* c, v1::ListSessionsResponse* r) {
          return admin->ListSessions(c, v1::ListSessionsRequest(), r);
        },
        PrintSessions);
  }
  if (get->parsed()) {
    v1::GetConfigRequest request;
    request.set_job(allocd::TenantJobKey(o.job, o.tenant.value_or("")));
    return Call<v1::GetConfigResponse>(
        o,
        [&](grpc::ClientContext* c, v1::GetConfigResponse* r) {
          return admin->GetConfig(c, request, r);
        },
        [](const v1::GetConfigResponse& r) { PrintConfig(r.config()); });
  }
  if (set->parsed()) {
    if (o.tenant.has_value() && o.job.empty()) {
      std::fprintf(stderr,
                   "allocctl: config set --tenant needs --job: the default "
                   "config is every tenant's\n");
      return 2;
    }
    v1::SetConfigRequest request;
    request.set_job(allocd::TenantJobKey(o.job, o.tenant.value_or("")));
    request.set_config(o.config);
    if (!o.predicted_peak.empty()) {
      // SizeSyntax checked it.
      request.set_predicted_peak_reserved_bytes(
          *ParseSize(o.predicted_peak, kPredictedPeak));
    }
    return Call<v1::SetConfigResponse>(
        o,
        [&](grpc::ClientContext* c, v1::SetConfigResponse* r) {
          return admin->SetConfig(c, request, r);
        },
        [](const v1::SetConfigResponse& r) {
          PrintConfig(r.config());
          std::printf("pushed to %u sessions\n", r.pushed_to());
        });
  }
  if (pool_trim->parsed()) {
    return Call<v1::TrimPoolResponse>(
        o,
        [&](grpc::ClientContext* c, v1::TrimPoolResponse* r) {
          v1::TrimPoolRequest request;
          request.set_device(o.device);
          return admin->TrimPool(c, request, r);
        },
        [&](const v1::TrimPoolResponse& r) {
          std::printf("gave %s of cached chunks back to the %s\n",
                      FormatSize(r.trimmed_bytes()).c_str(),
                      o.device.empty() ? "devices"
                                       : ("device " + o.device).c_str());
        });
  }
  if (at_status->parsed()) {
    return Call<v1::AutotuneStatusResponse>(
        o,
        [&](grpc::ClientContext* c, v1::AutotuneStatusResponse* r) {
          return admin->AutotuneStatus(c, v1::AutotuneStatusRequest(), r);
        },
        PrintAutotuneStatus);
  }
  if (at_history->parsed()) {
    v1::AutotuneHistoryRequest request;
    request.set_job(o.job);
    request.set_limit(o.limit);
    return Call<v1::AutotuneHistoryResponse>(
        o,
        [&](grpc::ClientContext* c, v1::AutotuneHistoryResponse* r) {
          return admin->AutotuneHistory(c, request, r);
        },
        [](const v1::AutotuneHistoryResponse& r) {
          if (r.decisions().empty()) std::printf("no decisions yet\n");
          for (const v1::AutotuneDecision& d : r.decisions()) PrintDecision(d, "");
        });
  }
  if (at_run->parsed()) {
    v1::AutotuneRunRequest request;
    request.set_job(o.job);
    return Call<v1::AutotuneRunResponse>(
        o,
        [&](grpc::ClientContext* c, v1::AutotuneRunResponse* r) {
          return admin->AutotuneRun(c, request, r);
        },
        [&](const v1::AutotuneRunResponse& r) {
          std::printf("run queued for job %s: decision #%llu (allocctl "
                      "autotune history --job %s)\n",
                      o.job.c_str(),
                      static_cast<unsigned long long>(r.decision_id()),
                      o.job.c_str());
        });
  }
  if (at_set->parsed()) {
    v1::AutotuneSetModeRequest request;
    request.set_job(o.job);
    request.set_mode(o.mode);
    return Call<v1::AutotuneSetModeResponse>(
        o,
        [&](grpc::ClientContext* c, v1::AutotuneSetModeResponse* r) {
          return admin->AutotuneSetMode(c, request, r);
        },
        [&](const v1::AutotuneSetModeResponse&) {
          std::printf("autotune mode of %s: %s\n",
                      o.job.empty() ? "the daemon (jobs without their own)"
                                    : ("job " + o.job).c_str(),
                      o.mode.c_str());
        });
  }
  if (at_learned->parsed() || at_export->parsed()) {
    const auto rpc = [&](grpc::ClientContext* c, v1::AutotuneLearnedResponse* r) {
      return admin->AutotuneLearned(c, v1::AutotuneLearnedRequest(), r);
    };
    if (at_learned->parsed()) {
      return Call<v1::AutotuneLearnedResponse>(o, rpc, PrintLearned);
    }
    // In the config file's own format, --json or not.
    Options file_format = o;
    file_format.json = false;
    return Call<v1::AutotuneLearnedResponse>(
        file_format, rpc, [&](const v1::AutotuneLearnedResponse& r) {
          ExportLearned(r, o.tenant);
        });
  }
  if (history->parsed()) {
    v1::HistoryRequest request;
    request.set_job(o.job);
    request.set_limit(o.limit);
    return Call<v1::HistoryResponse>(
        o,
        [&](grpc::ClientContext* c, v1::HistoryResponse* r) {
          return admin->History(c, request, r);
        },
        PrintHistory);
  }
  v1::SetQuotaRequest request;
  if (o.session) request.set_session_id(*o.session);
  if (o.uid) request.set_uid(*o.uid);
  if (o.tenant) request.set_tenant(*o.tenant);
  if (o.quota != "none") {
    SizeContext of_pool;
    if (absl::EndsWith(o.quota, "%")) {
      absl::StatusOr<uint64_t> capacity = PoolCapacity(*admin);
      if (!capacity.ok()) {
        std::cerr << "allocctl: " << capacity.status().message() << "\n";
        return kExitError;
      }
      of_pool.percent_of = *capacity;
    }
    // SizeSyntax checked the form.
    request.set_bytes(*ParseSize(o.quota, of_pool));
  }
  return Call<v1::SetQuotaResponse>(
      o,
      [&](grpc::ClientContext* c, v1::SetQuotaResponse* r) {
        return admin->SetQuota(c, request, r);
      },
      [&](const v1::SetQuotaResponse&) {
        const std::string target =
            o.session ? absl::StrCat("session ", *o.session)
            : o.uid   ? absl::StrCat("uid ", *o.uid)
                      : absl::StrCat("tenant ", *o.tenant);
        std::printf("quota of %s: %s\n", target.c_str(), o.quota.c_str());
      });
}
