// EventRecorder: a client's bounded record of its allocator event stream
// (alloc, free_requested, free_completed; size, stream, id), the evidence
// the daemon's autotuner replays under candidate configs.
//
// The allocator's hot path appends with Record(): one uncontended lock and
// a store into a buffer reserved up front, never an allocation. The
// telemetry thread takes everything recorded with Take(), which swaps the
// buffer for a fresh one, and encodes and sends it off the hot path. A
// full buffer drops events and counts them, so a client holds at most
// 2 x `capacity` events whatever happens to the daemon; the counts tell the
// daemon exactly where its window has gaps.
//
// The allocator's state (segments and live blocks) may be recorded at a
// point of the stream too (RecordState): the batch taken up to it carries
// it, so the daemon's autotuner knows exactly which events it follows.
//
// Thread-safe.
#ifndef ALLOCD_CLIENT_EVENT_RECORDER_H_
#define ALLOCD_CLIENT_EVENT_RECORDER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "allocator/trace/trace.h"
#include "allocd.pb.h"

namespace allocd {

struct RecordedEvent {
  TraceOp op;
  uint64_t stream;
  uint64_t id;
  uint64_t size;
};

// Contiguous events of the stream: the first is event number `sequence`
// (dropped ones count), and `dropped` events were lost just before it.
// `state_after`, when set: the allocator right after the batch's last event
// (with none, after event `sequence` - 1); a batch ends at a state.
struct RecordedBatch {
  uint64_t sequence = 0;
  uint64_t dropped = 0;
  std::vector<RecordedEvent> events;
  std::shared_ptr<const v1::AllocatorState> state_after;
};

class EventRecorder {
 public:
  // `capacity`: most events held between two Take()s (at least 2).
  // `half_full` (optional) runs once each time the buffer reaches half its
  // capacity, outside the recorder's lock: the taker's cue to come early.
  explicit EventRecorder(size_t capacity,
                         std::function<void()> half_full = nullptr);

  void Record(TraceOp op, uint64_t stream, uint64_t id, uint64_t size);
  // Record() of each of `n` events, in order (ops[i], streams[i], ids[i],
  // sizes[i]), under one lock: a reader that takes the allocator's events
  // in bulk (the Python package's tracker, ~10,000 a step) records them at
  // the cost of copies, not of a lock each. Returns how many were kept
  // (the others were dropped and counted, as Record's).
  size_t RecordMany(const TraceOp* ops, const uint64_t* streams,
                    const uint64_t* ids, const uint64_t* sizes, size_t n);
  // RecordMany() for a caller that may wait, never an allocating thread:
  // allocd_record_events, whose caller (the Python package's advisor)
  // records a round of the tracker's events at once, and a second of a
  // busy job is more than the buffer holds. What does not fit waits, up to
  // `max_wait`, for a Take() to make room (the half_full callback tells the
  // taker at once), and only then is dropped and counted. Once a wait has
  // timed out (a taker that does not take: its daemon gone), calls drop
  // without waiting until the next Take().
  size_t RecordManyWaiting(const TraceOp* ops, const uint64_t* streams,
                           const uint64_t* ids, const uint64_t* sizes, size_t n,
                           absl::Duration max_wait);
  // `events` of the stream were lost here, outside the recorder (e.g.
  // PyTorch's history ring was cleared with events the reader had not
  // seen): a gap between what was recorded and what comes next.
  void Drop(uint64_t events);
  // The allocator's state right after the events recorded so far. Takes a
  // slot of the buffer; when none is left it is not kept (the daemon then
  // predicts from its window, as for a client that sends none).
  void RecordState(std::shared_ptr<const v1::AllocatorState> state);
  // Everything recorded since the last call, split at the gaps. Empty when
  // nothing happened; a trailing gap is reported with the next events.
  std::vector<RecordedBatch> Take();
  // Gives back batches that could not be sent: they become a gap before
  // everything still to be taken.
  void Unsent(const std::vector<RecordedBatch>& batches);

  // Events lost so far (dropped here, Drop()ped, Unsent()).
  uint64_t dropped_total() const;
  size_t capacity() const { return capacity_; }

 private:
  // A gap inside the buffer: `size` events lost there. Not an op a
  // client records.
  static constexpr TraceOp kGap = static_cast<TraceOp>(0xff);
  // A state (RecordState) here: `size` indexes states_.
  static constexpr TraceOp kState = static_cast<TraceOp>(0xfe);

  std::vector<RecordedEvent> FreshBuffer() const;
  // Puts `slot` in the buffer after the marker of a gap before it, if
  // any; false (nothing changed) when the two do not fit.
  bool Push(RecordedEvent slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pushes events i, i + 1, ... of the columns until one does not fit or
  // n is reached; returns where it stopped.
  size_t PushWhileRoom(const TraceOp* ops, const uint64_t* streams, const uint64_t* ids,
                       const uint64_t* sizes, size_t i, size_t n)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the buffer, `before` slots long, has just reached half its
  // capacity: the half_full callback's moment.
  bool ReachedHalf(size_t before) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // `events` lost after everything in the buffer: a gap before the next.
  void Lose(uint64_t events) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t capacity_;
  const std::function<void()> half_full_;
  mutable absl::Mutex mu_;
  std::vector<RecordedEvent> buffer_ ABSL_GUARDED_BY(mu_);
  // Stream position of the buffer's first slot, after `leading_gap_`.
  uint64_t buffer_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  // Lost before the buffer's first event, and after its last one.
  uint64_t leading_gap_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t trailing_gap_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t dropped_total_ ABSL_GUARDED_BY(mu_) = 0;
  // Take()s so far, and whether a RecordManyWaiting() timed out waiting
  // for the next one.
  uint64_t takes_ ABSL_GUARDED_BY(mu_) = 0;
  bool taker_stalled_ ABSL_GUARDED_BY(mu_) = false;
  // The states the buffer's kState slots name.
  std::vector<std::shared_ptr<const v1::AllocatorState>> states_ ABSL_GUARDED_BY(mu_);
  // The buffer the next Take() swaps in: the last one taken, emptied, so
  // that the allocating thread writes to pages it has touched before
  // instead of faulting in a fresh buffer's after every Take()
  // (bench/client_hot_path_bench: ~15% of Record's time).
  std::vector<RecordedEvent> spare_ ABSL_GUARDED_BY(mu_);
};

}  // namespace allocd

#endif  // ALLOCD_CLIENT_EVENT_RECORDER_H_
