#include "client/torch/allocd_torch.h"

#include <cuda.h>

#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "allocator/config_check.h"
#include "allocator/cuda/cuda_driver.h"
#include "allocator/stats.h"
#include "allocator/trace/observed_backend.h"
#include "allocator/trace/snapshot_writer.h"
#include "allocator/trace/trace.h"
#include "client/allocator_target.h"
#include "client/capi/client_json.h"
#include "client/client_env.h"
#include "client/cuda_daemon_backend.h"
#include "client/daemon_client.h"
#include "client/live_session.h"
#include "client/torch/torch_errors.h"
#include "nlohmann/json.hpp"

namespace allocd {
namespace {

// Pushed configs and reclaim requests are looked at every this many
// allocator calls (and after an OOM): the fast path stays a hash lookup and
// the engine's own work.
constexpr uint64_t kSafePointCalls = 64;

// The engine as a LiveSession drives it at a safe point. A pushed config
// or a reclaim releases the cache, and the engine's own release treats
// every stream's work as done (PyTorch's synchronize_and_free_events): the
// device is synchronised and the frees deferred for other streams
// completed first (`before_release`), as empty_cache() does, or a block
// another stream still reads could be handed out again.
class SafePointTarget final : public AllocatorTarget {
 public:
  SafePointTarget(EngineTarget& engine, std::function<void()> before_release)
      : engine_(engine), before_release_(std::move(before_release)) {}

  absl::Status Reconfigure(const AllocatorConfig& config) override {
    return engine_.Reconfigure(config);
  }
  void EmptyCache() override {
    before_release_();
    engine_.EmptyCache();
  }
  void ReleaseCached(uint64_t bytes) override {
    before_release_();
    engine_.ReleaseCached(bytes);
  }
  std::map<std::string, int64_t> Stats() override { return engine_.Stats(); }

 private:
  EngineTarget& engine_;
  const std::function<void()> before_release_;
};

// The engine over daemon memory, with PyTorch's stream rules at the edge.
class ManagedAllocator {
 public:
  static absl::StatusOr<std::unique_ptr<ManagedAllocator>> Create(
      const std::string& socket, const std::string& job,
      const std::string& config_string, int device,
      const std::string& autotune) {
    absl::StatusOr<v1::AutotunePreferences> preferences =
        ParseAutotunePreferences(autotune);
    if (!preferences.ok()) return preferences.status();
    // Its rank in a job of several is its environment's (torchrun's).
    absl::StatusOr<ClientEnv> env = ClientEnv::FromEnvironment();
    if (!env.ok()) return env.status();
    absl::StatusOr<AllocatorConfig> config =
        ParseAllocatorConfig(config_string);
    if (!config.ok()) {
      return absl::InvalidArgumentError(
          ConfigRejection(config_string, config.status()));
    }
    if (config->backend == AllocatorBackend::kCudaMallocAsync) {
      return absl::InvalidArgumentError(
          "backend:cudaMallocAsync is the CUDA driver's pool; allocd runs "
          "PyTorch's native caching allocator");
    }
    absl::StatusOr<cuda::PrimaryContext> context =
        cuda::PrimaryContext::Open(device);
    if (!context.ok()) return context.status();
    absl::StatusOr<std::string> uuid = cuda::DeviceUuid(context->device());
    if (!uuid.ok()) return uuid.status();
    absl::StatusOr<std::unique_ptr<DaemonClient>> client =
        DaemonClient::Connect({.socket = socket,
                               .job = job,
                               .device = device,
                               .gpu_uuid = *std::move(uuid),
                               .initial_config = FormatAllocatorConfig(*config),
                               .description = "liballocd_torch (PyTorch)",
                               .autotune = *std::move(preferences),
                               .rank = RankOf(*env)});
    if (!client.ok()) return client.status();
    absl::StatusOr<std::unique_ptr<CudaDaemonBackend>> backend =
        CudaDaemonBackend::Create(client->get(), device);
    if (!backend.ok()) return backend.status();
    return std::unique_ptr<ManagedAllocator>(
        new ManagedAllocator(*std::move(context), *std::move(client),
                             *std::move(backend), *std::move(config)));
  }

  void* Malloc(size_t size, int device, CUstream stream) {
    CheckDevice(device);
    absl::MutexLock lock(&mu_);
    Bind();
    if (!deferred_.empty()) {
      CompleteDeferredFrees(/*all_done=*/false, /*record=*/true);
    }
    if (++calls_ % kSafePointCalls == 0) session_.Poll(safe_point_target_);
    const int64_t syncs = engine_->Stats().num_sync_all_streams;
    const TraceEvent event{.op = TraceOp::kAlloc,
                           .stream = StreamIdOf(stream),
                           .id = next_id_++,
                           .size = size};
    if (history_) history_->OnEvent(NowMicros(), event);
    // PyTorch asks for 0 bytes now and then; a real block keeps every
    // pointer distinct, as CUDAPluggableAllocator's bookkeeping needs.
    absl::StatusOr<Allocation> a =
        engine_->Malloc(size == 0 ? 1 : size, event.stream);
    if (engine_->Stats().num_sync_all_streams != syncs) {
      // The engine flushed its cache as if every stream were synchronised
      // (PyTorch's synchronize_and_free_events): make it so before any
      // block it completed is used again. The history's OnCacheFlush
      // writes those completions itself.
      if (history_) history_->OnCacheFlush();
      Check(cuda::Synchronize(), "synchronizing before a cache flush");
      CompleteDeferredFrees(/*all_done=*/true, /*record=*/false);
    }
    if (!a.ok()) {
      if (!absl::IsResourceExhausted(a.status())) {
        throw std::runtime_error(std::string(a.status().message()));
      }
      if (history_) history_->OnOutOfMemory(event, backend_->FreeMemory());
      session_.ReportOom(size, a.status().message());
      session_.Poll(safe_point_target_);
      // torch.OutOfMemoryError in Python, as PyTorch's allocator raises.
      ThrowOutOfMemory(std::string(a.status().message()));
    }
    if (history_) history_->OnBlock(event, *a);
    void* ptr = reinterpret_cast<void*>(a->address);
    live_[ptr] = Live{.allocation = *a,
                      .stream = stream,
                      .stream_id = event.stream,
                      .id = event.id,
                      .requested = size};
    Evidence(TraceOp::kAlloc, live_[ptr]);
    return ptr;
  }

  void Free(void* ptr) {
    absl::MutexLock lock(&mu_);
    auto it = live_.find(ptr);
    if (it == live_.end()) {
      throw std::invalid_argument(absl::StrCat(
          "allocd: free of ", reinterpret_cast<uintptr_t>(ptr),
          ", which this allocator did not hand out"));
    }
    Live live = std::move(it->second);
    live_.erase(it);
    Evidence(TraceOp::kFreeRequested, live);
    if (live.used_on.empty()) {
      Check(engine_->Free(live.allocation), "free");
      Record(TraceOp::kFreeRequested, live);
      Record(TraceOp::kFreeCompleted, live);
      Evidence(TraceOp::kFreeCompleted, live);
    } else {
      // Other streams may still use the block: it returns to the cache
      // once what they queued before now is done.
      Bind();
      Check(engine_->FreeDeferred(live.allocation), "free");
      Record(TraceOp::kFreeRequested, live);
      DeferredFree deferred{.live = live};
      for (CUstream s : live.used_on) {
        CUevent event = NewEvent();
        Check(cuda::EventRecord(event, s), "recording a free on a stream");
        deferred.events.push_back(event);
      }
      deferred_.push_back(std::move(deferred));
    }
    if (++calls_ % kSafePointCalls == 0) session_.Poll(safe_point_target_);
  }

  void RecordStream(void* ptr, CUstream stream) {
    absl::MutexLock lock(&mu_);
    auto it = live_.find(ptr);
    if (it == live_.end() || it->second.stream == stream) return;
    for (CUstream s : it->second.used_on) {
      if (s == stream) return;
    }
    it->second.used_on.push_back(stream);
  }

  void EmptyCache() {
    absl::MutexLock lock(&mu_);
    // PyTorch's empty_cache() waits for every deferred free first.
    SynchronizeDeferredFrees();
    engine_->EmptyCache();
    session_.Publish(MemoryStatsDict(engine_->Stats()));
  }

  void SetMemoryFraction(double fraction, int device) {
    CheckDevice(device);
    absl::MutexLock lock(&mu_);
    engine_->SetMemoryFraction(fraction);
  }

  std::string StatsJson() {
    absl::MutexLock lock(&mu_);
    nlohmann::json j(MemoryStatsDict(engine_->Stats()));
    j.update(session_.Report());
    j["device"] = context_.ordinal();
    return j.dump();
  }

  std::string MemoryStatsJson() {
    absl::MutexLock lock(&mu_);
    return nlohmann::json(MemoryStatsDict(engine_->Stats())).dump();
  }

  void ResetPeakStats() {
    absl::MutexLock lock(&mu_);
    engine_->ResetPeakStats();
  }

  void ResetAccumulatedStats() {
    absl::MutexLock lock(&mu_);
    engine_->ResetAccumulatedStats();
  }

  int device() const { return context_.ordinal(); }

  // _record_memory_history: starts (or keeps, unless `clear`) recording the
  // engine's events, the newest `max_entries` of them; `enabled` false stops
  // and drops them, as PyTorch does.
  void RecordHistory(bool enabled, uint64_t max_entries, bool clear) {
    absl::MutexLock lock(&mu_);
    if (!enabled || clear) {
      observed_.Detach();
      history_.reset();
    }
    if (!enabled) return;
    if (!history_) {
      history_ = std::make_unique<SnapshotRecorder>(snapshot_trace_,
                                                    engine_->config());
      observed_.Attach(history_.get());
    }
    // sys.maxsize, PyTorch's default, means every event.
    history_->KeepNewest(
        max_entries > std::numeric_limits<uint32_t>::max() ? 0 : max_entries);
  }

  // torch.cuda.memory._snapshot() as a pickle: the engine's segments and
  // blocks now, and the recorded history if any.
  std::string SnapshotPickle() {
    absl::MutexLock lock(&mu_);
    if (history_) {
      history_->OnEnd(*engine_);
      return history_->Pickle();
    }
    SnapshotRecorder state(snapshot_trace_, engine_->config());
    state.OnEnd(*engine_);
    return state.Pickle();
  }

 private:
  struct Live {
    Allocation allocation;
    CUstream stream = nullptr;
    StreamId stream_id = 0;
    // The allocation's id and requested size in the memory history.
    uint32_t id = 0;
    uint64_t requested = 0;
    // Streams record_stream() added.
    std::vector<CUstream> used_on;
  };
  struct DeferredFree {
    Live live;
    std::vector<CUevent> events;
  };

  // Appends to the client's event record, the autotuner's evidence
  // (bounded; drops when full).
  void Evidence(TraceOp op, const Live& live) {
    if (EventRecorder* events = client_->events()) {
      events->Record(op, reinterpret_cast<uint64_t>(live.stream), live.id,
                     live.requested);
    }
  }

  ManagedAllocator(cuda::PrimaryContext context,
                   std::unique_ptr<DaemonClient> client,
                   std::unique_ptr<CudaDaemonBackend> backend,
                   AllocatorConfig config)
      : context_(std::move(context)),
        client_(std::move(client)),
        backend_(std::move(backend)),
        observed_(*backend_),
        engine_(std::make_unique<CachingAllocator>(config, &observed_)),
        engine_target_(*engine_),
        // Polled only under mu_ (Malloc, Free).
        safe_point_target_(engine_target_,
                           [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
                             mu_.AssertHeld();
                             SynchronizeDeferredFrees();
                           }),
        session_(*client_, config) {
    snapshot_trace_.device = context_.ordinal();
    session_.Publish(MemoryStatsDict(engine_->Stats()));
  }

  static uint64_t NowMicros() {
    return static_cast<uint64_t>(absl::GetCurrentTimeNanos() / 1000);
  }

  // A free of `live` into the memory history, when it is recorded.
  void Record(TraceOp op, const Live& live) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!history_) return;
    const TraceEvent event{.op = op,
                           .stream = live.stream_id,
                           .id = live.id,
                           .size = live.requested};
    history_->OnEvent(NowMicros(), event);
    history_->OnBlock(event, live.allocation);
  }

  void CheckDevice(int device) const {
    if (device != context_.ordinal()) {
      throw std::invalid_argument(absl::StrCat(
          "allocd manages CUDA device ", context_.ordinal(),
          " of this process; device ", device,
          " stays with PyTorch's allocator only when allocd is not enabled"));
    }
  }

  // PyTorch's threads make the primary context current before CUDA work;
  // a thread that never did still gets the right one for our calls.
  void Bind() { Check(context_.Bind(), "making the CUDA context current"); }

  static void Check(const absl::Status& status, const char* what) {
    if (!status.ok()) {
      throw std::runtime_error(
          absl::StrCat("allocd: ", what, ": ", status.message()));
    }
  }

  // Streams get ids in the order they first allocate: the engine keeps
  // each stream's free blocks apart, whatever the ids.
  StreamId StreamIdOf(CUstream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto [it, added] = streams_.try_emplace(stream, streams_.size());
    if (added) {
      snapshot_trace_.streams.push_back(reinterpret_cast<uintptr_t>(stream));
    }
    return it->second;
  }

  CUevent NewEvent() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!spare_events_.empty()) {
      CUevent event = spare_events_.back();
      spare_events_.pop_back();
      return event;
    }
    absl::StatusOr<CUevent> event = cuda::EventCreate();
    Check(event.status(), "creating a CUDA event");
    return *event;
  }

  // Synchronises the device and returns every deferred free to the
  // engine's cache: what a release of the cache must come after.
  void SynchronizeDeferredFrees() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Bind();
    Check(cuda::Synchronize(), "synchronizing before releasing the cache");
    CompleteDeferredFrees(/*all_done=*/true, /*record=*/true);
  }

  // Returns deferred frees whose events are done (or all of them, when the
  // device was just synchronised) to the engine's cache, and writes their
  // completions into the memory history when `record`.
  void CompleteDeferredFrees(bool all_done, bool record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<DeferredFree> pending;
    for (DeferredFree& d : deferred_) {
      bool done = true;
      for (CUevent event : d.events) {
        if (all_done) break;
        absl::StatusOr<bool> event_done = cuda::EventDone(event);
        Check(event_done.status(), "querying a CUDA event");
        if (!*event_done) {
          done = false;
          break;
        }
      }
      if (!done) {
        pending.push_back(std::move(d));
        continue;
      }
      engine_->CompleteFree(d.live.allocation);
      Evidence(TraceOp::kFreeCompleted, d.live);
      if (record) Record(TraceOp::kFreeCompleted, d.live);
      spare_events_.insert(spare_events_.end(), d.events.begin(),
                           d.events.end());
    }
    deferred_ = std::move(pending);
  }

  const cuda::PrimaryContext context_;
  const std::unique_ptr<DaemonClient> client_;
  const std::unique_ptr<CudaDaemonBackend> backend_;
  absl::Mutex mu_;
  // The backend as the engine sees it: its device calls reach the memory
  // history while one is recorded.
  ObservedBackend observed_ ABSL_GUARDED_BY(mu_);
  // Declared after the backend it allocates from.
  const std::unique_ptr<CachingAllocator> engine_ ABSL_PT_GUARDED_BY(mu_);
  EngineTarget engine_target_ ABSL_GUARDED_BY(mu_);
  SafePointTarget safe_point_target_ ABSL_GUARDED_BY(mu_);
  LiveSession session_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<void*, Live> live_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<CUstream, StreamId> streams_ ABSL_GUARDED_BY(mu_);
  std::vector<DeferredFree> deferred_ ABSL_GUARDED_BY(mu_);
  std::vector<CUevent> spare_events_ ABSL_GUARDED_BY(mu_);
  uint64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  // The device and stream handles that snapshots name.
  Trace snapshot_trace_ ABSL_GUARDED_BY(mu_);
  // The memory history (_record_memory_history), when it is recorded.
  std::unique_ptr<SnapshotRecorder> history_ ABSL_GUARDED_BY(mu_);
};

// The process's allocator: created once by allocd_torch_configure and
// never destroyed, since PyTorch frees tensors until the very end of the
// process; the daemon takes the memory back when the process is gone.
ManagedAllocator* managed = nullptr;
absl::Mutex configure_mu;
thread_local std::string last_error;

ManagedAllocator& Managed() {
  if (managed == nullptr) {
    throw std::logic_error(
        "allocd: the allocator is used before allocd_torch_configure(); "
        "call allocd.enable() before the first CUDA tensor");
  }
  return *managed;
}

std::string Or(const char* s) { return s == nullptr ? "" : s; }

bool Enabled() {
  if (managed != nullptr) return true;
  last_error = "allocd is not enabled in this process";
  return false;
}

// Runs `fn` for a caller through ctypes, which cannot take a C++ exception:
// its result, or -1 with the reason in last_error.
template <typename Fn>
int64_t Guarded(Fn fn) {
  if (!Enabled()) return -1;
  try {
    return fn(*managed);
  } catch (const std::exception& e) {
    last_error = e.what();
    return -1;
  }
}

// `data` into `buf` with a NUL after it when it fits (data.size() < len);
// its size either way.
int64_t CopyOut(const std::string& data, char* buf, size_t len) {
  if (data.size() < len) std::memcpy(buf, data.c_str(), data.size() + 1);
  return static_cast<int64_t>(data.size());
}

}  // namespace
}  // namespace allocd

using allocd::Managed;

extern "C" {

int allocd_torch_configure(const char* socket, const char* job,
                           const char* config, int device,
                           const char* autotune) {
  absl::MutexLock lock(&allocd::configure_mu);
  if (allocd::managed != nullptr) {
    allocd::last_error = "allocd is already enabled in this process";
    return -1;
  }
  absl::StatusOr<std::unique_ptr<allocd::ManagedAllocator>> created =
      allocd::ManagedAllocator::Create(allocd::SocketOrDefault(allocd::Or(socket)),
                                       allocd::Or(job),
                                       allocd::Or(config), device,
                                       allocd::Or(autotune));
  if (!created.ok()) {
    allocd::last_error = std::string(created.status().message());
    return -1;
  }
  allocd::managed = created->release();
  return 0;
}

const char* allocd_torch_last_error(void) {
  return allocd::last_error.c_str();
}

void* allocd_torch_malloc(ssize_t size, int device, void* stream) {
  return Managed().Malloc(static_cast<size_t>(size), device,
                          static_cast<CUstream>(stream));
}

void allocd_torch_free(void* ptr, ssize_t, int, void*) {
  Managed().Free(ptr);
}

void allocd_torch_empty_cache(void) {
  if (allocd::managed != nullptr) allocd::managed->EmptyCache();
}

void allocd_torch_set_memory_fraction(double fraction, int device) {
  Managed().SetMemoryFraction(fraction, device);
}

void allocd_torch_record_stream(void* ptr, void* stream) {
  Managed().RecordStream(ptr, static_cast<CUstream>(stream));
}

int64_t allocd_torch_stats_json(char* buf, size_t len) {
  return allocd::Guarded([&](allocd::ManagedAllocator& m) {
    return allocd::CopyOut(m.StatsJson(), buf, len);
  });
}

int64_t allocd_torch_memory_stats_json(char* buf, size_t len) {
  return allocd::Guarded([&](allocd::ManagedAllocator& m) {
    return allocd::CopyOut(m.MemoryStatsJson(), buf, len);
  });
}

int allocd_torch_reset_peak_stats(void) {
  return static_cast<int>(allocd::Guarded([](allocd::ManagedAllocator& m) {
    m.ResetPeakStats();
    return 0;
  }));
}

int allocd_torch_reset_accumulated_stats(void) {
  return static_cast<int>(allocd::Guarded([](allocd::ManagedAllocator& m) {
    m.ResetAccumulatedStats();
    return 0;
  }));
}

int allocd_torch_device(void) {
  return allocd::managed == nullptr ? -1 : allocd::managed->device();
}

int allocd_torch_record_history(int enabled, uint64_t max_entries,
                                int clear) {
  return static_cast<int>(allocd::Guarded([&](allocd::ManagedAllocator& m) {
    m.RecordHistory(enabled != 0, max_entries, clear != 0);
    return 0;
  }));
}

int64_t allocd_torch_snapshot_pickle(char* buf, size_t len) {
  return allocd::Guarded([&](allocd::ManagedAllocator& m) {
    return allocd::CopyOut(m.SnapshotPickle(), buf, len);
  });
}

int allocd_torch_oom_is_torch_error(void) {
  return allocd::TorchOutOfMemoryErrorAvailable() ? 1 : 0;
}

}  // extern "C"
