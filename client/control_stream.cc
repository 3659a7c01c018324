#include "client/control_stream.h"

#include <iterator>
#include <memory>
#include <string>
#include <utility>

#include "absl/time/clock.h"

namespace allocd {

ControlStream::ControlStream(ActiveConnection& active,
                             absl::Duration rpc_timeout,
                             std::function<uint64_t()> give_back)
    : active_(active),
      rpc_timeout_(rpc_timeout),
      give_back_(std::move(give_back)) {}

void ControlStream::Watch(Connection& c) {
  grpc::ClientContext context;
  if (!active_.Watch(&context)) return;
  v1::WatchConfigRequest request;
  NameSession(c, request);
  std::unique_ptr<grpc::ClientReader<v1::ControlMessage>> reader =
      c.stub->WatchConfig(&context, request);
  v1::ControlMessage message;
  while (reader->Read(&message)) {
    if (message.has_stream()) {
      absl::MutexLock lock(&mu_);
      ++stream_demands_.count;
      stream_demands_.from_reserved = message.stream().from_reserved();
      stream_demands_.reason = std::move(*message.mutable_stream()->mutable_reason());
      continue;
    }
    if (message.has_reclaim()) {
      last_reclaim_ns_.store(absl::GetCurrentTimeNanos(), std::memory_order_relaxed);
      ++reclaims_;
      if (!GiveBackFirst(*message.mutable_reclaim())) continue;
    }
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(message));
  }
  (void)reader->Finish();
  active_.Unwatch();
}

bool ControlStream::GiveBackFirst(v1::ReclaimRequest& reclaim) {
  // Memory read ahead is the first to go back (it is no segment's), with
  // the releases on their way; then what the hook holds (a working set
  // handed over and not taken: mapped, but no segment's either).
  const uint64_t asked = reclaim.bytes();
  uint64_t given = give_back_();
  if (asked != 0 && given >= asked) return false;
  {
    absl::MutexLock hook(&reclaim_mu_);
    if (on_reclaim_) given += on_reclaim_(asked == 0 ? 0 : asked - given);
  }
  if (asked == 0) return true;
  if (given >= asked) return false;
  reclaim.set_bytes(asked - given);
  return true;
}

void ControlStream::Clear() {
  absl::MutexLock lock(&mu_);
  queue_.clear();
}

std::vector<v1::ControlMessage> ControlStream::Take() {
  absl::MutexLock lock(&mu_);
  std::vector<v1::ControlMessage> out(std::make_move_iterator(queue_.begin()),
                                      std::make_move_iterator(queue_.end()));
  queue_.clear();
  return out;
}

ControlStream::StreamDemands ControlStream::stream_demands() const {
  absl::MutexLock lock(&mu_);
  return stream_demands_;
}

bool ControlStream::AwaitMessage(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto queued_or_stopped = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !queue_.empty() || waiting_stopped_;
  };
  mu_.AwaitWithTimeout(absl::Condition(&queued_or_stopped), timeout);
  return !queue_.empty();
}

void ControlStream::StopWaiting() {
  absl::MutexLock lock(&mu_);
  waiting_stopped_ = true;
}

absl::Status ControlStream::Ack(uint64_t version, bool applied,
                                absl::string_view error) {
  v1::ConfigAck request;
  request.set_version(version);
  request.set_applied(applied);
  request.set_error(std::string(error));
  return active_.Call(rpc_timeout_, &v1::Allocd::Stub::AckConfig,
                      std::move(request));
}

absl::Status ControlStream::ReportOom(uint64_t requested_bytes,
                                      absl::string_view message,
                                      uint64_t config_version) {
  v1::OomReport request;
  request.set_requested_bytes(requested_bytes);
  request.set_message(std::string(message.substr(0, 4096)));
  request.set_config_version(config_version);
  return active_.Call(rpc_timeout_, &v1::Allocd::Stub::ReportOom,
                      std::move(request));
}

void ControlStream::OnReclaim(std::function<uint64_t(uint64_t)> drop) {
  absl::MutexLock lock(&reclaim_mu_);
  on_reclaim_ = std::move(drop);
}

}  // namespace allocd
