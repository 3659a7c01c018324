#include "client/event_recorder.h"

#include <algorithm>
#include <utility>

namespace allocd {

EventRecorder::EventRecorder(size_t capacity, std::function<void()> half_full)
    : capacity_(std::max<size_t>(capacity, 2)),
      half_full_(std::move(half_full)) {
  absl::MutexLock lock(&mu_);
  buffer_ = FreshBuffer();
}

std::vector<RecordedEvent> EventRecorder::FreshBuffer() const {
  std::vector<RecordedEvent> buffer;
  buffer.reserve(capacity_);
  return buffer;
}

void EventRecorder::Record(TraceOp op, uint64_t stream, uint64_t id,
                           uint64_t size) {
  (void)RecordMany(&op, &stream, &id, &size, 1);
}

size_t EventRecorder::RecordMany(const TraceOp* ops, const uint64_t* streams,
                                 const uint64_t* ids, const uint64_t* sizes,
                                 size_t n) {
  size_t kept;
  bool half_full;
  {
    absl::MutexLock lock(&mu_);
    const size_t before = buffer_.size();
    kept = PushWhileRoom(ops, streams, ids, sizes, 0, n);
    Lose(n - kept);
    half_full = ReachedHalf(before);
  }
  if (half_full && half_full_) half_full_();
  return kept;
}

size_t EventRecorder::RecordManyWaiting(const TraceOp* ops, const uint64_t* streams,
                                        const uint64_t* ids, const uint64_t* sizes,
                                        size_t n, absl::Duration max_wait) {
  const absl::Time deadline = absl::Now() + max_wait;
  size_t i = 0;
  size_t kept = 0;
  for (;;) {
    bool cue;
    uint64_t takes;
    {
      absl::MutexLock lock(&mu_);
      const size_t before = buffer_.size();
      const size_t stopped = PushWhileRoom(ops, streams, ids, sizes, i, n);
      kept += stopped - i;
      i = stopped;
      if (i < n && taker_stalled_) {
        Lose(n - i);
        i = n;
      }
      cue = i < n || ReachedHalf(before);
      takes = takes_;
    }
    if (cue && half_full_) half_full_();
    if (i == n) return kept;
    absl::MutexLock lock(&mu_);
    auto taken = [this, takes]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return takes_ != takes; };
    if (!mu_.AwaitWithDeadline(absl::Condition(&taken), deadline)) taker_stalled_ = true;
  }
}

size_t EventRecorder::PushWhileRoom(const TraceOp* ops, const uint64_t* streams,
                                    const uint64_t* ids, const uint64_t* sizes, size_t i,
                                    size_t n) {
  for (; i < n; ++i) {
    if (!Push({.op = ops[i], .stream = streams[i], .id = ids[i], .size = sizes[i]})) break;
  }
  return i;
}

bool EventRecorder::ReachedHalf(size_t before) const {
  return before < capacity_ / 2 && buffer_.size() >= capacity_ / 2;
}

bool EventRecorder::Push(RecordedEvent slot) {
  // After a gap the buffer needs a marker and the slot: two slots.
  const size_t needed = trailing_gap_ > 0 && !buffer_.empty() ? 2 : 1;
  if (buffer_.size() + needed > capacity_) return false;
  if (trailing_gap_ > 0) {
    if (buffer_.empty()) {
      leading_gap_ += trailing_gap_;
      buffer_sequence_ += trailing_gap_;
    } else {
      buffer_.push_back({.op = kGap, .stream = 0, .id = 0,
                         .size = trailing_gap_});
    }
    trailing_gap_ = 0;
  }
  buffer_.push_back(slot);
  return true;
}

void EventRecorder::Lose(uint64_t events) {
  trailing_gap_ += events;
  dropped_total_ += events;
}

void EventRecorder::Drop(uint64_t events) {
  absl::MutexLock lock(&mu_);
  Lose(events);
}

void EventRecorder::RecordState(std::shared_ptr<const v1::AllocatorState> state) {
  absl::MutexLock lock(&mu_);
  if (Push({.op = kState, .stream = 0, .id = 0, .size = states_.size()})) {
    states_.push_back(std::move(state));
  }
}

std::vector<RecordedBatch> EventRecorder::Take() {
  std::vector<RecordedEvent> fresh;
  {
    absl::MutexLock lock(&mu_);
    fresh = std::move(spare_);
  }
  // Never allocated under the lock: the first Take() makes the spare.
  if (fresh.capacity() < capacity_) fresh = FreshBuffer();
  std::vector<RecordedEvent> taken;
  std::vector<std::shared_ptr<const v1::AllocatorState>> states;
  uint64_t sequence;
  uint64_t gap;
  {
    absl::MutexLock lock(&mu_);
    ++takes_;
    taker_stalled_ = false;
    if (buffer_.empty()) {
      spare_ = std::move(fresh);
      return {};
    }
    taken = std::exchange(buffer_, std::move(fresh));
    states = std::exchange(states_, {});
    sequence = buffer_sequence_;
    gap = leading_gap_;
    // What follows the taken events starts after them and their gaps.
    uint64_t span = 0;
    for (const RecordedEvent& e : taken) {
      span += e.op == kGap ? e.size : e.op == kState ? 0 : 1;
    }
    buffer_sequence_ += span + trailing_gap_;
    leading_gap_ = trailing_gap_;
    trailing_gap_ = 0;
  }
  std::vector<RecordedBatch> batches(1);
  batches.back().sequence = sequence;
  batches.back().dropped = gap;
  batches.back().events.reserve(taken.size());
  for (const RecordedEvent& e : taken) {
    if (e.op == kGap) {
      const uint64_t next = batches.back().sequence +
                            batches.back().events.size() + e.size;
      batches.push_back({.sequence = next, .dropped = e.size});
      continue;
    }
    if (e.op == kState) {
      batches.back().state_after = std::move(states[e.size]);
      const uint64_t next = batches.back().sequence + batches.back().events.size();
      batches.push_back({.sequence = next, .dropped = 0});
      continue;
    }
    batches.back().events.push_back(e);
  }
  // A state at the buffer's end leaves an empty batch after it.
  if (batches.size() > 1 && batches.back().events.empty() && batches.back().dropped == 0) {
    batches.pop_back();
  }
  taken.clear();
  {
    absl::MutexLock lock(&mu_);
    spare_ = std::move(taken);
  }
  return batches;
}

void EventRecorder::Unsent(const std::vector<RecordedBatch>& batches) {
  uint64_t lost = 0;
  for (const RecordedBatch& b : batches) lost += b.dropped + b.events.size();
  if (lost == 0) return;
  absl::MutexLock lock(&mu_);
  for (const RecordedBatch& b : batches) dropped_total_ += b.events.size();
  // They all came before whatever waits now.
  leading_gap_ += lost;
}

uint64_t EventRecorder::dropped_total() const {
  absl::MutexLock lock(&mu_);
  return dropped_total_;
}

}  // namespace allocd
