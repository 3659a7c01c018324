#include "client/capi/allocd_client.h"

#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "allocator/config.h"
#include "client/daemon_client.h"
#include "nlohmann/json.hpp"

struct allocd_client {
  // Null when the client is borrowed (allocd::BorrowClient).
  std::unique_ptr<allocd::DaemonClient> owned;
  allocd::DaemonClient* client = nullptr;
  absl::Mutex mu;
  // Taken from the client but not yet handed out (a buffer was too small).
  std::deque<std::string> pending ABSL_GUARDED_BY(mu);
  // Pushed configs handed out and not yet ACKed, by version: an ACK makes
  // one the config the client runs.
  std::map<uint64_t, std::string> pushed ABSL_GUARDED_BY(mu);
};

namespace {

thread_local std::string last_error;

int Fail(std::string message) {
  last_error = std::move(message);
  return -1;
}

int Result(const absl::Status& status) {
  return status.ok() ? 0 : Fail(std::string(status.message()));
}

std::string Or(const char* s) { return s == nullptr ? "" : s; }

std::string ControlJson(const allocd::v1::ControlMessage& m) {
  nlohmann::json j;
  if (m.has_config()) {
    const allocd::v1::ConfigPush& push = m.config();
    j = {{"type", "config"},
         {"version", push.config().version()},
         {"config", push.config().config()},
         {"rollback", push.rollback()},
         {"reason", push.reason()}};
    // What _set_allocator_settings needs to leave exactly this config.
    absl::StatusOr<allocd::AllocatorConfig> parsed =
        allocd::ParseAllocatorConfig(push.config().config());
    j["update"] = parsed.ok() ? allocd::FormatAllocatorConfigUpdate(*parsed)
                              : push.config().config();
  } else {
    j = {{"type", "reclaim"},
         {"bytes", m.reclaim().bytes()},
         {"reason", m.reclaim().reason()}};
  }
  return j.dump();
}

}  // namespace

namespace allocd {

allocd_client* BorrowClient(DaemonClient* client) {
  auto* c = new allocd_client;
  c->client = client;
  return c;
}

}  // namespace allocd

extern "C" {

const char* allocd_last_error(void) { return last_error.c_str(); }

allocd_client* allocd_connect(const char* socket, const char* job,
                              const char* initial_config,
                              const char* description, const char* autotune) {
  return allocd_connect_gpu(socket, job, initial_config, description,
                            autotune, nullptr);
}

allocd_client* allocd_connect_gpu(const char* socket, const char* job,
                                  const char* initial_config,
                                  const char* description,
                                  const char* autotune,
                                  const char* gpu_uuid) {
  absl::StatusOr<allocd::v1::AutotunePreferences> preferences =
      allocd::ParseAutotunePreferences(Or(autotune));
  if (!preferences.ok()) {
    Fail(std::string(preferences.status().message()));
    return nullptr;
  }
  absl::StatusOr<std::unique_ptr<allocd::DaemonClient>> client =
      allocd::DaemonClient::Connect({.socket = Or(socket),
                                     .job = Or(job),
                                     .gpu_uuid = Or(gpu_uuid),
                                     .initial_config = Or(initial_config),
                                     .description = Or(description),
                                     .autotune = *std::move(preferences)});
  if (!client.ok()) {
    Fail(std::string(client.status().message()));
    return nullptr;
  }
  auto* c = new allocd_client;
  c->owned = std::move(*client);
  c->client = c->owned.get();
  return c;
}

void allocd_disconnect(allocd_client* c) { delete c; }

uint64_t allocd_session_id(allocd_client* c) { return c->client->session_id(); }

int allocd_publish_stats(allocd_client* c, const char* stats_json,
                         uint64_t config_version) {
  nlohmann::json j = nlohmann::json::parse(Or(stats_json), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return Fail("stats must be a JSON object of names to integers");
  }
  std::map<std::string, int64_t> stats;
  for (const auto& [key, value] : j.items()) {
    if (value.is_number_integer()) stats[key] = value.get<int64_t>();
  }
  c->client->PublishStats(std::move(stats), config_version);
  return 0;
}

int allocd_flush_telemetry(allocd_client* c) {
  return Result(c->client->FlushTelemetry());
}

int64_t allocd_next_control(allocd_client* c, char* buf, size_t len) {
  absl::MutexLock lock(&c->mu);
  for (allocd::v1::ControlMessage& m : c->client->TakeControl()) {
    if (m.has_config()) {
      c->pushed[m.config().config().version()] = m.config().config().config();
    }
    c->pending.push_back(ControlJson(m));
  }
  if (c->pending.empty()) return 0;
  const std::string& next = c->pending.front();
  if (next.size() + 1 > len) {
    Fail("buffer too small for the next control message");
    return -1;
  }
  std::memcpy(buf, next.c_str(), next.size() + 1);
  const int64_t size = static_cast<int64_t>(next.size());
  c->pending.pop_front();
  return size;
}

int allocd_ack(allocd_client* c, uint64_t version, int applied,
               const char* error) {
  {
    absl::MutexLock lock(&c->mu);
    auto it = c->pushed.find(version);
    if (applied != 0 && it != c->pushed.end()) {
      c->client->SetRunning(it->second, version);
    }
    if (it != c->pushed.end()) c->pushed.erase(it);
  }
  return Result(c->client->Ack(version, applied != 0, Or(error)));
}

int64_t allocd_record_events(allocd_client* c, const uint8_t* ops,
                             const uint64_t* sizes, const uint64_t* ids,
                             const uint64_t* streams, size_t n,
                             uint64_t dropped_before) {
  allocd::EventRecorder* events = c->client->events();
  if (events == nullptr) return Fail("event recording is off");
  for (size_t i = 0; i < n; ++i) {
    if (ops[i] > static_cast<uint8_t>(allocd::TraceOp::kFreeCompleted)) {
      return Fail("ops must be 0 (alloc), 1 (free_requested) or 2 "
                  "(free_completed)");
    }
  }
  events->Drop(dropped_before);
  const uint64_t dropped = events->dropped_total();
  for (size_t i = 0; i < n; ++i) {
    events->Record(static_cast<allocd::TraceOp>(ops[i]), streams[i], ids[i],
                   sizes[i]);
  }
  return static_cast<int64_t>(n - (events->dropped_total() - dropped));
}

uint64_t allocd_events_dropped(allocd_client* c) {
  allocd::EventRecorder* events = c->client->events();
  return events == nullptr ? 0 : events->dropped_total();
}

uint64_t allocd_config_version(allocd_client* c) {
  return c->client->running_version();
}

int allocd_report_oom(allocd_client* c, uint64_t requested_bytes,
                      const char* message, uint64_t config_version) {
  return Result(
      c->client->ReportOom(requested_bytes, Or(message), config_version));
}

}  // extern "C"
