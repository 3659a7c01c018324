#include "client/capi/allocd_client.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "allocator/config.h"
#include "client/allocator_target.h"
#include "client/capi/client_json.h"
#include "client/client_env.h"
#include "client/daemon_client.h"
#include "client/live_session.h"
#include "proto/protocol.h"

namespace {

// The config the process started with, as the applier checks pushes
// against it and stats() names it: the one the daemon named before PyTorch
// read its config (its learned config, the node's prior) when it started
// on that, else its own. One the parser does not know (a PyTorch other
// than the one it follows took it) counts as the default: the native
// backend.
allocd::AllocatorConfig StartingConfig(const allocd::DaemonClient& client) {
  const allocd::DaemonClientOptions& o = client.options();
  return allocd::ParseAllocatorConfig(o.started_on_learned.empty() ? o.initial_config
                                                                   : o.started_on_learned)
      .value_or(allocd::AllocatorConfig{});
}

}  // namespace

struct allocd_client {
  allocd_client(allocd::DaemonClient* c,
                std::unique_ptr<allocd::DaemonClient> own = nullptr)
      : owned(std::move(own)),
        client(c),
        session(*c, StartingConfig(*c), absl::ZeroDuration()) {}

  // Null when the client is borrowed (allocd::BorrowClient).
  std::unique_ptr<allocd::DaemonClient> owned;
  allocd::DaemonClient* client = nullptr;
  // Held by a round and by what reads the session's state; not by
  // AtStepMark and ReportOom, which are thread-safe and come from the
  // job's thread.
  absl::Mutex poll_mu;
  // Every round publishes: the caller paces the rounds.
  allocd::LiveSession session;
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

// `text` and its NUL into `buf`: its length, or -1 when `len` is too small
// for `what`.
int64_t CopyOut(const std::string& text, char* buf, size_t len,
                const char* what) {
  if (text.size() + 1 > len) {
    return Fail(std::string("buffer too small for ") + what);
  }
  std::memcpy(buf, text.c_str(), text.size() + 1);
  return static_cast<int64_t>(text.size());
}

// What a target writes when it refuses an update, at the most.
constexpr size_t kMaxTargetError = 4096;
// The stats' JSON fits this first, nearly always.
constexpr size_t kStatsBuffer = 1 << 16;

// The allocator behind an allocd_target's functions.
class CallbackTarget final : public allocd::AllocatorTarget {
 public:
  explicit CallbackTarget(const allocd_target& target) : target_(target) {}

  absl::Status Reconfigure(const allocd::AllocatorConfig& config) override {
    std::string error(kMaxTargetError, '\0');
    if (target_.reconfigure(allocd::FormatAllocatorConfigUpdate(config).c_str(),
                            error.data(), error.size() - 1,
                            target_.context) == 0) {
      return absl::OkStatus();
    }
    error.resize(std::strlen(error.c_str()));
    return absl::FailedPreconditionError(
        error.empty() ? "the allocator refused the config" : error);
  }

  void EmptyCache() override { target_.empty_cache(target_.context); }
  void ReleaseCached(uint64_t bytes) override {
    if (target_.release_cached == nullptr) {
      EmptyCache();
    } else {
      target_.release_cached(bytes, target_.context);
    }
  }

  // Stats that do not parse count as none.
  std::map<std::string, int64_t> Stats() override {
    std::string buf(kStatsBuffer, '\0');
    int64_t size = target_.stats(buf.data(), buf.size(), target_.context);
    if (size >= static_cast<int64_t>(buf.size())) {
      buf.assign(static_cast<size_t>(size) + 1, '\0');
      size = target_.stats(buf.data(), buf.size(), target_.context);
    }
    if (size < 0 || size >= static_cast<int64_t>(buf.size())) return {};
    buf.resize(static_cast<size_t>(size));
    return allocd::ParseStatsJson(buf).value_or(
        std::map<std::string, int64_t>{});
  }

 private:
  const allocd_target& target_;
};

}  // namespace

namespace allocd {

allocd_client* BorrowClient(DaemonClient* client) {
  return new allocd_client(client);
}

}  // namespace allocd

extern "C" {

const char* allocd_last_error(void) { return last_error.c_str(); }

const char* allocd_default_socket(void) { return allocd::kDefaultSocket; }

allocd_client* allocd_connect(const char* socket, const char* job,
                              const char* initial_config,
                              const char* description, const char* autotune) {
  return allocd_connect_gpu(socket, job, initial_config, description,
                            autotune, nullptr);
}

int allocd_start_on_learned_config(const char* socket, const char* job,
                                   char* out, size_t size) {
  absl::StatusOr<std::string> learned =
      allocd::StartOnLearnedConfig(allocd::SocketOrDefault(Or(socket)), Or(job),
                                   absl::Seconds(5));
  if (!learned.ok()) return Result(learned.status());
  if (size > 0) {
    const size_t n = std::min(size - 1, learned->size());
    std::memcpy(out, learned->data(), n);
    out[n] = '\0';
  }
  return 0;
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
  // The process's rank is its environment's (torchrun's), whoever calls.
  absl::StatusOr<allocd::ClientEnv> env = allocd::ClientEnv::FromEnvironment();
  if (!env.ok()) {
    Fail(std::string(env.status().message()));
    return nullptr;
  }
  absl::StatusOr<std::unique_ptr<allocd::DaemonClient>> client =
      allocd::DaemonClient::Connect({.socket = allocd::SocketOrDefault(Or(socket)),
                                     .job = Or(job),
                                     .gpu_uuid = Or(gpu_uuid),
                                     .initial_config = Or(initial_config),
                                     .description = Or(description),
                                     .autotune = *std::move(preferences),
                                     .features = allocd::StartFeatures(),

                                     .rank = allocd::RankOf(*env)});
  if (!client.ok()) {
    Fail(std::string(client.status().message()));
    return nullptr;
  }
  allocd::DaemonClient* borrowed = client->get();
  return new allocd_client(borrowed, *std::move(client));
}

void allocd_disconnect(allocd_client* c) { delete c; }

uint64_t allocd_session_id(allocd_client* c) { return c->client->session_id(); }

int allocd_flush_telemetry(allocd_client* c) {
  return Result(c->client->FlushTelemetry());
}

int allocd_poll(allocd_client* c, const allocd_target* target) {
  CallbackTarget allocator(*target);
  absl::MutexLock lock(&c->poll_mu);
  c->session.Poll(allocator);
  return 0;
}

int allocd_mark_step(allocd_client* c, const allocd_target* target) {
  CallbackTarget allocator(*target);
  c->session.AtStepMark(allocator);
  return 0;
}

int allocd_wait_control(allocd_client* c, uint32_t timeout_ms) {
  return c->client->AwaitControl(absl::Milliseconds(timeout_ms)) ? 1 : 0;
}

void allocd_stop_waiting_control(allocd_client* c) { c->client->StopAwaitingControl(); }

int64_t allocd_session_stats(allocd_client* c, char* buf, size_t len) {
  absl::MutexLock lock(&c->poll_mu);
  return CopyOut(c->session.Report().dump(), buf, len, "the session's stats");
}

int64_t allocd_record_events(allocd_client* c, const uint8_t* ops,
                             const uint64_t* sizes, const uint64_t* ids,
                             const uint64_t* streams, size_t n,
                             uint64_t dropped_before) {
  allocd::EventRecorder* events = c->client->events();
  if (events == nullptr) return Fail("event recording is off");
  for (size_t i = 0; i < n; ++i) {
    if (ops[i] > allocd::kEventOpStep) {
      return Fail("ops must be 0 (alloc), 1 (free_requested), 2 "
                  "(free_completed) or 3 (step)");
    }
  }
  events->Drop(dropped_before);
  static_assert(sizeof(allocd::TraceOp) == sizeof(uint8_t));
  // The caller is no allocating thread (the Python package's advisor, with
  // a round of events): what does not fit waits for the telemetry thread's
  // next send rather than being dropped. Half a second is several of its
  // sends; past it, the daemon is taken to be gone.
  return static_cast<int64_t>(events->RecordManyWaiting(
      reinterpret_cast<const allocd::TraceOp*>(ops), streams, ids, sizes, n,
      absl::Milliseconds(500)));
}

int allocd_record_state(allocd_client* c, const uint64_t* segment_addresses,
                        const uint64_t* segment_sizes, const uint64_t* segment_streams,
                        const uint32_t* segment_flags, size_t num_segments,
                        const uint64_t* block_ids, const uint64_t* block_addresses,
                        const uint64_t* block_sizes, const uint64_t* block_requested,
                        const uint32_t* block_flags, size_t num_blocks) {
  allocd::EventRecorder* events = c->client->events();
  if (events == nullptr) return Fail("event recording is off");
  if (num_segments > allocd::kMaxStateSegments || num_blocks > allocd::kMaxStateBlocks) {
    return Fail(absl::StrCat("the allocator holds ", num_segments, " segments and ",
                             num_blocks, " blocks; a state holds at most ",
                             allocd::kMaxStateSegments, " and ", allocd::kMaxStateBlocks));
  }
  auto state = std::make_shared<allocd::v1::AllocatorState>();
  state->mutable_segment_addresses()->Add(segment_addresses, segment_addresses + num_segments);
  state->mutable_segment_sizes()->Add(segment_sizes, segment_sizes + num_segments);
  state->mutable_segment_streams()->Add(segment_streams, segment_streams + num_segments);
  state->mutable_segment_flags()->Add(segment_flags, segment_flags + num_segments);
  state->mutable_block_ids()->Add(block_ids, block_ids + num_blocks);
  state->mutable_block_addresses()->Add(block_addresses, block_addresses + num_blocks);
  state->mutable_block_sizes()->Add(block_sizes, block_sizes + num_blocks);
  state->mutable_block_requested()->Add(block_requested, block_requested + num_blocks);
  state->mutable_block_flags()->Add(block_flags, block_flags + num_blocks);
  events->RecordState(std::move(state));
  return 0;
}

int allocd_report_oom(allocd_client* c, uint64_t requested_bytes,
                      const char* message) {
  c->session.ReportOom(requested_bytes, Or(message));
  return 0;
}

int allocd_report_features(allocd_client* c, uint32_t features) {
  constexpr uint32_t kKnown = ALLOCD_FEATURE_CUDA_IPC | ALLOCD_FEATURE_CUDA_GRAPHS |
                              ALLOCD_FEATURE_MEM_POOL | ALLOCD_FEATURE_NCCL_REGISTRATION;
  if ((features & ~kKnown) != 0) {
    Fail("allocd_report_features: unknown feature bits");
    return -1;
  }
  allocd::v1::JobFeatures f;
  f.set_cuda_ipc((features & ALLOCD_FEATURE_CUDA_IPC) != 0);
  f.set_cuda_graphs((features & ALLOCD_FEATURE_CUDA_GRAPHS) != 0);
  f.set_mem_pool((features & ALLOCD_FEATURE_MEM_POOL) != 0);
  f.set_nccl_registration((features & ALLOCD_FEATURE_NCCL_REGISTRATION) != 0);
  c->client->PublishFeatures(f);
  return 0;
}

}  // extern "C"
