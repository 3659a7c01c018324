#include "server/autotune/task_queue.h"

#include <algorithm>
#include <iterator>
#include <utility>

namespace allocd {

bool AutotuneTaskQueue::HasTaskFor(const JobKey& job) const {
  return std::any_of(tasks_.begin(), tasks_.end(),
                     [&](const AutotuneTask& t) { return t.job == job; });
}

AutotuneTask AutotuneTaskQueue::Pop() {
  auto started = [&](const AutotuneTask& t) {
    auto it = started_by_tenant_.find(t.job.tenant);
    return it == started_by_tenant_.end() ? uint64_t{0} : it->second;
  };
  auto next = tasks_.begin();
  for (auto it = std::next(tasks_.begin()); it != tasks_.end(); ++it) {
    if (started(*it) < started(*next)) next = it;
  }
  AutotuneTask task = std::move(*next);
  tasks_.erase(next);
  if (started_by_tenant_.size() > kTenantsRemembered) started_by_tenant_.clear();
  started_by_tenant_[task.job.tenant] = ++tasks_started_;
  return task;
}

}  // namespace allocd
