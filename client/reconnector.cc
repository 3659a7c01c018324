#include "client/reconnector.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "client/thread_name.h"

namespace allocd {

Reconnector::Reconnector(const DaemonClientOptions& options, Parts parts)
    : options_(options), parts_(parts) {
  thread_ = std::thread([this] { Run(); });
}

Reconnector::~Reconnector() { Stop(); }

void Reconnector::Stop() {
  parts_.active.Stop();
  if (thread_.joinable()) thread_.join();
}

void Reconnector::SetRunning(std::string config, uint64_t version) {
  absl::MutexLock lock(&mu_);
  running_ = {.config = std::move(config), .version = version};
  ++running_generation_;
}

uint64_t Reconnector::running_version() const {
  absl::MutexLock lock(&mu_);
  return running_.version;
}

void Reconnector::Run() {
  NameThisThread("allocd-reconnct");
  absl::Duration backoff = options_.reconnect_min;
  while (!parts_.active.stopping()) {
    std::shared_ptr<Connection> c = parts_.active.Current();
    if (c != nullptr) {
      parts_.control.Watch(*c);
      parts_.active.Lost(c);
    } else if (Reconnect()) {
      backoff = options_.reconnect_min;
    } else {
      parts_.active.AwaitStop(backoff);
      backoff = std::min(backoff * 2, options_.reconnect_max);
    }
  }
}

bool Reconnector::Reconnect() {
  RunningConfig declared;
  uint64_t generation;
  {
    absl::MutexLock lock(&mu_);
    declared = running_;
    generation = running_generation_;
  }
  absl::StatusOr<std::shared_ptr<Connection>> fresh =
      Register(options_, parts_.active.epoch() + 1, declared);
  if (!fresh.ok()) return false;
  // The new daemon owns what this process still holds before it hands out
  // anything (Acquire waits for the connection).
  parts_.held.DeclareTo(**fresh, options_.rpc_timeout);
  parts_.control.Clear();
  parts_.telemetry.NewSession();
  {
    absl::MutexLock lock(&mu_);
    if (generation == running_generation_) {
      running_.version = (*fresh)->running_version;
    }
  }
  (void)parts_.active.Serve(*std::move(fresh));
  return true;
}

}  // namespace allocd
