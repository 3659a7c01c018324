#include "server/autotune/autotune_memory.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "allocator/bytes.h"

namespace allocd {

AutotuneMemory::AutotuneMemory(AutotuneMemoryOptions options)
    : options_(std::move(options)) {}

std::unique_ptr<AutotuneMemory::Account> AutotuneMemory::Open(
    const TenantId& tenant, const std::string& label) {
  return std::unique_ptr<Account>(new Account(this, tenant, label));
}

bool AutotuneMemory::Move(const TenantId& tenant, uint64_t from,
                          uint64_t to) {
  absl::MutexLock lock(&mu_);
  uint64_t& mine = by_tenant_[tenant];
  if (to > from) {
    const uint64_t grow = to - from;
    if ((options_.total != 0 && used_ + grow > options_.total) ||
        (options_.per_tenant != 0 && mine + grow > options_.per_tenant)) {
      if (mine == 0) by_tenant_.erase(tenant);
      return false;
    }
  }
  used_ = used_ - from + to;
  mine = mine - from + to;
  if (mine == 0) by_tenant_.erase(tenant);
  return true;
}

uint64_t AutotuneMemory::used() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

uint64_t AutotuneMemory::used(const TenantId& tenant) const {
  absl::MutexLock lock(&mu_);
  auto it = by_tenant_.find(tenant);
  return it == by_tenant_.end() ? 0 : it->second;
}

AutotuneMemory::Account::Account(AutotuneMemory* memory, TenantId tenant,
                                 std::string label)
    : memory_(memory), tenant_(std::move(tenant)), label_(std::move(label)) {}

AutotuneMemory::Account::~Account() { (void)Resize(0); }

bool AutotuneMemory::Account::Resize(uint64_t bytes) {
  if (!memory_->Move(tenant_, charged_, bytes)) return false;
  charged_ = bytes;
  return true;
}

void AutotuneMemory::Account::Trimmed(uint64_t events) {
  if (told_ || !memory_->options_.log) return;
  told_ = true;
  const AutotuneMemoryOptions& o = memory_->options_;
  memory_->options_.log(absl::StrCat(
      "autotune: the window of job \"", label_, "\" (", tenant_, ") ",
      events == 0 ? "stopped recording: its live allocations alone"
                  : absl::StrCat("was trimmed to its newest ", events,
                                 " events: it"),
      " would pass ", tenant_, "'s share of the autotuner's memory (",
      o.per_tenant == 0 ? "unbounded" : FormatSize(o.per_tenant),
      ", --autotune-memory-per-tenant; ", FormatSize(memory_->used(tenant_)),
      " in use) or the bound (",
      o.total == 0 ? "unbounded" : FormatSize(o.total),
      ", --autotune-memory; ", FormatSize(memory_->used()), " in use)"));
}

}  // namespace allocd
