#include "client/torch/allocd_torch.h"

#include <cuda.h>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "allocator/cuda/cuda_driver.h"
#include "allocator/stats.h"
#include "client/cuda_daemon_backend.h"
#include "client/daemon_client.h"
#include "client/live_session.h"
#include "nlohmann/json.hpp"

namespace allocd {
namespace {

// Pushed configs and reclaim requests are looked at every this many
// allocator calls (and after an OOM): the fast path stays a hash lookup and
// the engine's own work.
constexpr uint64_t kSafePointCalls = 64;

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
    absl::StatusOr<AllocatorConfig> config =
        ParseAllocatorConfig(config_string);
    if (!config.ok()) return config.status();
    if (config->backend == AllocatorBackend::kCudaMallocAsync) {
      return absl::InvalidArgumentError(
          "backend:cudaMallocAsync is the CUDA driver's pool; allocd runs "
          "PyTorch's native caching allocator");
    }
    absl::StatusOr<cuda::PrimaryContext> context =
        cuda::PrimaryContext::Open(device);
    if (!context.ok()) return context.status();
    absl::StatusOr<std::unique_ptr<DaemonClient>> client =
        DaemonClient::Connect({.socket = socket,
                               .job = job,
                               .device = device,
                               .initial_config = FormatAllocatorConfig(*config),
                               .description = "liballocd_torch (PyTorch)",
                               .autotune = *std::move(preferences)});
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
    if (!deferred_.empty()) CompleteDeferredFrees(/*all_done=*/false);
    if (++calls_ % kSafePointCalls == 0) session_.Poll(*engine_);
    const int64_t syncs = engine_->Stats().num_sync_all_streams;
    // PyTorch asks for 0 bytes now and then; a real block keeps every
    // pointer distinct, as CUDAPluggableAllocator's bookkeeping needs.
    absl::StatusOr<Allocation> a =
        engine_->Malloc(size == 0 ? 1 : size, StreamIdOf(stream));
    if (engine_->Stats().num_sync_all_streams != syncs) {
      // The engine flushed its cache as if every stream were synchronised
      // (PyTorch's synchronize_and_free_events): make it so before any
      // block it completed is used again.
      Check(cuda::Synchronize(), "synchronizing before a cache flush");
      CompleteDeferredFrees(/*all_done=*/true);
    }
    if (!a.ok()) {
      if (absl::IsResourceExhausted(a.status())) {
        session_.ReportOom(size, a.status().message());
        session_.Poll(*engine_);
      }
      throw std::runtime_error(std::string(a.status().message()));
    }
    void* ptr = reinterpret_cast<void*>(a->address);
    const uint64_t id = next_id_++;
    live_[ptr] = Live{.allocation = *a, .stream = stream, .id = id,
                      .requested = size};
    Record(TraceOp::kAlloc, stream, id, size);
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
    Record(TraceOp::kFreeRequested, live.stream, live.id, live.requested);
    if (live.used_on.empty()) {
      Check(engine_->Free(live.allocation), "free");
      Record(TraceOp::kFreeCompleted, live.stream, live.id, live.requested);
    } else {
      // Other streams may still use the block: it returns to the cache
      // once what they queued before now is done.
      Bind();
      Check(engine_->FreeDeferred(live.allocation), "free");
      DeferredFree deferred{.allocation = live.allocation,
                            .stream = live.stream,
                            .id = live.id,
                            .requested = live.requested};
      for (CUstream s : live.used_on) {
        CUevent event = NewEvent();
        Check(cuda::EventRecord(event, s), "recording a free on a stream");
        deferred.events.push_back(event);
      }
      deferred_.push_back(std::move(deferred));
    }
    if (++calls_ % kSafePointCalls == 0) session_.Poll(*engine_);
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
    Bind();
    // PyTorch's empty_cache() waits for every deferred free first.
    Check(cuda::Synchronize(), "synchronizing for empty_cache");
    CompleteDeferredFrees(/*all_done=*/true);
    engine_->EmptyCache();
    session_.Publish(*engine_);
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

 private:
  struct Live {
    Allocation allocation;
    CUstream stream = nullptr;
    // Names the allocation in the event stream the autotuner gets.
    uint64_t id = 0;
    uint64_t requested = 0;
    // Streams record_stream() added.
    std::vector<CUstream> used_on;
  };
  struct DeferredFree {
    Allocation allocation;
    CUstream stream = nullptr;
    uint64_t id = 0;
    uint64_t requested = 0;
    std::vector<CUevent> events;
  };

  // Appends to the client's event record (bounded; drops when full).
  void Record(TraceOp op, CUstream stream, uint64_t id, uint64_t size) {
    if (EventRecorder* events = client_->events()) {
      events->Record(op, reinterpret_cast<uint64_t>(stream), id, size);
    }
  }

  ManagedAllocator(cuda::PrimaryContext context,
                   std::unique_ptr<DaemonClient> client,
                   std::unique_ptr<CudaDaemonBackend> backend,
                   AllocatorConfig config)
      : context_(std::move(context)),
        client_(std::move(client)),
        backend_(std::move(backend)),
        engine_(std::make_unique<CachingAllocator>(config, backend_.get())),
        session_(*client_, config) {
    session_.Publish(*engine_);
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
  StreamId StreamIdOf(CUstream stream) {
    auto [it, added] = streams_.try_emplace(stream, streams_.size());
    return it->second;
  }

  CUevent NewEvent() {
    if (!spare_events_.empty()) {
      CUevent event = spare_events_.back();
      spare_events_.pop_back();
      return event;
    }
    absl::StatusOr<CUevent> event = cuda::EventCreate();
    Check(event.status(), "creating a CUDA event");
    return *event;
  }

  // Returns deferred frees whose events are done (or all of them, when the
  // device was just synchronised) to the engine's cache.
  void CompleteDeferredFrees(bool all_done) {
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
      engine_->CompleteFree(d.allocation);
      Record(TraceOp::kFreeCompleted, d.stream, d.id, d.requested);
      spare_events_.insert(spare_events_.end(), d.events.begin(),
                           d.events.end());
    }
    deferred_ = std::move(pending);
  }

  const cuda::PrimaryContext context_;
  const std::unique_ptr<DaemonClient> client_;
  const std::unique_ptr<CudaDaemonBackend> backend_;
  absl::Mutex mu_;
  // Declared after the backend it allocates from.
  const std::unique_ptr<CachingAllocator> engine_ ABSL_PT_GUARDED_BY(mu_);
  LiveSession session_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<void*, Live> live_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<CUstream, StreamId> streams_ ABSL_GUARDED_BY(mu_);
  std::vector<DeferredFree> deferred_ ABSL_GUARDED_BY(mu_);
  std::vector<CUevent> spare_events_ ABSL_GUARDED_BY(mu_);
  uint64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
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
      allocd::ManagedAllocator::Create(allocd::Or(socket), allocd::Or(job),
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
  if (allocd::managed == nullptr) {
    allocd::last_error = "allocd is not enabled in this process";
    return -1;
  }
  const std::string json = allocd::managed->StatsJson();
  if (json.size() + 1 > len) return static_cast<int64_t>(json.size() + 1);
  std::memcpy(buf, json.c_str(), json.size() + 1);
  return static_cast<int64_t>(json.size());
}

}  // extern "C"
