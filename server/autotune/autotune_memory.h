// AutotuneMemory: the bound on what the autotuner keeps, its job windows'
// events (--autotune-memory), and each tenant's share of it
// (--autotune-memory-per-tenant), so that no flood of job labels and
// events grows the daemon past its container's memory limit, and no tenant
// takes the whole bound from the others.
//
// Each window holds an Account, charged with what the window holds
// (JobWindow::MemoryBytes) as it grows. A charge that would pass its
// tenant's share or the bound is refused: the window then trims its oldest
// events to fit, or, when even its live allocations do not fit, stops
// recording (JobWindow). Either is logged once per window.
//
// Thread-safe.
#ifndef ALLOCD_SERVER_AUTOTUNE_AUTOTUNE_MEMORY_H_
#define ALLOCD_SERVER_AUTOTUNE_AUTOTUNE_MEMORY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "server/tenant_id.h"

namespace allocd {

struct AutotuneMemoryOptions {
  // Bytes all windows hold together; 0: no bound.
  uint64_t total = 0;
  // Bytes one tenant's windows hold together; 0: no bound of its own.
  uint64_t per_tenant = 0;
  // Where a trimmed or stopped window is told (the daemon's log); empty:
  // nowhere.
  std::function<void(const std::string&)> log;
};

class AutotuneMemory {
 public:
  explicit AutotuneMemory(AutotuneMemoryOptions options);

  // One window's charge. Thread-compatible (its window's owner calls it);
  // gives its charge back when destroyed.
  class Account {
   public:
    ~Account();
    Account(const Account&) = delete;
    Account& operator=(const Account&) = delete;

    // Charges `bytes` in place of what was charged: true, or false (the
    // charge unchanged) when growing to it would pass the tenant's share
    // or the bound. Shrinking always succeeds.
    bool Resize(uint64_t bytes);
    uint64_t charged() const { return charged_; }
    // Logs (once per account) that the window was trimmed to `events`, or
    // (`events` 0) stopped recording, to fit.
    void Trimmed(uint64_t events);

   private:
    friend class AutotuneMemory;
    Account(AutotuneMemory* memory, TenantId tenant, std::string label);

    AutotuneMemory* const memory_;
    const TenantId tenant_;
    const std::string label_;
    uint64_t charged_ = 0;
    bool told_ = false;
  };

  // An account, charged nothing yet, for the window of `label` (a job,
  // for the log) of `tenant`.
  std::unique_ptr<Account> Open(const TenantId& tenant,
                                const std::string& label);

  uint64_t used() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t used(const TenantId& tenant) const ABSL_LOCKS_EXCLUDED(mu_);
  const AutotuneMemoryOptions& options() const { return options_; }

 private:
  // Moves `tenant`'s charge from `from` to `to` bytes, unless growing
  // passes a bound.
  bool Move(const TenantId& tenant, uint64_t from, uint64_t to)
      ABSL_LOCKS_EXCLUDED(mu_);

  const AutotuneMemoryOptions options_;
  mutable absl::Mutex mu_;
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  // Tenants charged nothing are not kept.
  absl::flat_hash_map<TenantId, uint64_t> by_tenant_ ABSL_GUARDED_BY(mu_);
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_AUTOTUNE_AUTOTUNE_MEMORY_H_
