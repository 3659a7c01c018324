// JobWindow: the most recent allocation events of one session, bounded, and
// turned into a Trace the engine can replay.
//
// Clients name an allocation by a handle or an address that can be reused
// once it is free_completed, and streams by CUDA handles. The window keeps
// ~16 bytes per event: its own dense id, a stream index, the op and the
// size. When it is full it drops its oldest events but remembers what was
// still allocated at its new start (the prelude), so that ToTrace replays
// consistently: the prelude's allocations first, in their original order,
// then the window.
//
// Step marks (kStepMark events: the job's optimizer stepped) are no
// allocations: the window keeps where they fell in its stream, not as
// events.
//
// A client may also send its allocator's real state at a point of the
// stream (AddState): segments made under earlier configs, fragmentation
// and allocations from before recording are in it, and no window rebuilds
// them. The window keeps the newest few, and ToTraceFromState replays from
// one.
#ifndef ALLOCD_SERVER_AUTOTUNE_JOB_WINDOW_H_
#define ALLOCD_SERVER_AUTOTUNE_JOB_WINDOW_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "allocator/trace/trace.h"
#include "proto/protocol.h"
#include "server/autotune/autotune_memory.h"
#include "server/autotune/autotune_types.h"

namespace allocd {

class JobWindow {
 public:
  // Keeps at most `max_events` events (at least 1), and, given an
  // `account`, no more than it may charge (AutotuneMemory): a window over
  // its tenant's share or the daemon's bound trims its oldest events to
  // fit, and keeps no more than that from then on; one whose live
  // allocations alone do not fit stops recording (stopped()).
  //
  // So does one that an allocation would take past kMaxHeldBytes held, or
  // that is sent one of more than kMaxEventBytes (proto/protocol.h): no
  // device holds that much, and the sums the window keeps stay exact.
  static constexpr int64_t kMaxHeldBytes = int64_t{1} << 60;
  explicit JobWindow(size_t max_events,
                     std::unique_ptr<AutotuneMemory::Account> account = nullptr);

  // Appends `events` in order. `dropped_before`: events the client lost just
  // before them (a gap). A step mark records where the job's step ended. A
  // free of an id the window never saw allocated (it
  // was allocated before recording began, or in a gap) is left out and
  // counted; an alloc of an id still live means its free was lost: the
  // window frees the old allocation first.
  void Add(const std::vector<EvidenceEvent>& events, uint64_t dropped_before);

  // Events in the window (the prelude not counted).
  size_t size() const { return events_.size(); }
  // Events ever added (after the repairs above), and events clients lost.
  uint64_t total_events() const { return next_seq_; }
  uint64_t dropped_events() const { return dropped_events_; }
  // Whether events were lost after the window's first event: its replay
  // would then miss allocations.
  bool has_gap() const;
  // Bytes this window holds (events, live ids, prelude).
  size_t MemoryBytes() const;
  // It ran out of memory to record in (see the constructor): it holds
  // nothing and takes no more events.
  bool stopped() const { return stopped_; }

  // The bytes the session's allocations held (sizes as asked, from an
  // alloc to its free_requested, as PyTorch's requested_bytes), counting
  // only allocations recorded, and the most they held since the window
  // began or the last ResetPeakRequested. Unlike PyTorch's own peak, no
  // job can reset it.
  int64_t requested_bytes() const { return requested_bytes_; }
  int64_t peak_requested_bytes() const { return peak_requested_bytes_; }
  // The same with the blocks a state showed held that the stream never
  // allocated (held before recording began, or allocated in a gap), from
  // the state to their free: what the client holds, as a replay from a
  // state counts it. What a push's watch measures growth with.
  int64_t held_requested_bytes() const { return requested_bytes_ + outside_bytes_; }
  int64_t peak_held_requested_bytes() const { return peak_held_requested_bytes_; }
  void ResetPeakRequested() {
    peak_requested_bytes_ = requested_bytes_;
    peak_held_requested_bytes_ = held_requested_bytes();
  }
  // The most requested since the window began (never reset), and the
  // total_events() count when it was reached: how long ago the job's
  // largest request so far peaked.
  int64_t max_requested_bytes() const { return max_requested_bytes_; }
  uint64_t max_requested_at() const { return max_requested_at_; }
  // Where the request that reached that most began, as a total_events()
  // count: where the stream last fell to half the previous most or lower
  // before climbing to it (a job whose resident state is most of its
  // memory never falls that low: then where its first request began, 0).
  // A replay switched there sees the whole of the largest request.
  uint64_t largest_request_start() const { return largest_request_start_; }

  // Step marks ever added (a mark right after another one, with no event
  // between them, counts once: two optimizers stepping together end one
  // step).
  uint64_t steps_marked() const { return steps_marked_; }
  // Where the marks inside the window fell, ascending: each the index in
  // the window's events (the prelude not counted) of the first event after
  // the mark (size() for a mark after the last one).
  std::vector<uint64_t> StepEnds() const;

  // The prelude then the window, with dense ids and streams indexed in
  // ascending handle order. Frees the window left out are counted in
  // Trace::omitted.unmatched_frees.
  Trace ToTrace() const;

  // The client's allocator right after the events added so far: kept
  // (the newest kMaxStates) until the window's start passes it. False,
  // and not kept, when it cannot be replayed from: segments that overlap,
  // a block outside every segment or on top of another, an empty one, a
  // segment or block of more than kMaxEventBytes, a block that requested
  // more than its size, or blocks that would take what the session holds
  // past kMaxHeldBytes.
  static constexpr size_t kMaxStates = 4;
  bool AddState(const AllocatorSnapshot& state);
  // When events were lost inside the window (has_gap()) and its newest
  // state was taken after them, drops the events before that state, so
  // that the window starts at it and holds no gap: a replay from the state
  // misses nothing the gap lost, where otherwise the window would wait for
  // the gap to leave it (max_events later). As at any start, the prelude
  // holds what the stream left live there; the marks and states before it
  // go. Returns whether it did.
  bool RestartAtStateAfterGap();
  // The total_events() counts at which the kept states were taken,
  // ascending.
  std::vector<uint64_t> StateSeqs() const;
  // The state taken at `seq` (one of StateSeqs()), then the window's events
  // from there on: the trace's `partial` holds the state, at the client's
  // addresses, and its event i is the window's event number seq + i
  // (streams and ids as ToTrace). A block the window never saw allocated
  // (before recording began, or in a gap) stays live; a free of an
  // allocation the state does not hold is left out and counted. An empty
  // trace for a `seq` not kept.
  Trace ToTraceFromState(uint64_t seq) const;

 private:
  struct Event {
    uint64_t size;
    uint32_t id;  // the window's own id, increasing (wraps after 2^32)
    uint16_t stream;
    TraceOp op;
  };
  struct Live {
    uint64_t seq;  // when it was allocated
    uint64_t size;
    uint16_t stream;
    bool free_requested = false;
  };
  struct LiveId {
    uint32_t id;
    bool free_requested;
    uint64_t size;
  };

  // A state as kept: streams as window indices, blocks by window id.
  struct StateSegment {
    uint64_t address;
    uint64_t size;
    uint16_t stream;
    bool is_small;
    bool is_expandable;
  };
  struct StateBlock {
    uint64_t address;
    uint64_t size;
    uint64_t requested_size;
    uint32_t id;  // the window's; unused unless `known`
    bool known;   // the window saw it allocated
    bool free_requested;
  };
  struct State {
    uint64_t seq;
    std::vector<StateSegment> segments;  // by address
    std::vector<StateBlock> blocks;      // by address
  };

  void AddOne(const EvidenceEvent& event);
  // Fills Trace::streams (ascending handles); returns the window's stream
  // index -> its index there.
  std::vector<uint16_t> SortStreams(Trace& trace) const;
  // Trims or stops the window until what it holds fits its account.
  void FitMemory();
  void MarkStep();
  // Appends the free_requested of a live id, which no longer counts as
  // requested.
  void RequestFree(LiveId& live);
  // Drops everything it holds and takes no more events (stopped()).
  void Stop();
  void Append(TraceOp op, uint16_t stream, uint32_t id, uint64_t size);
  uint16_t StreamIndex(uint64_t handle);
  void DropOldest();

  size_t max_events_;
  std::unique_ptr<AutotuneMemory::Account> account_;
  bool stopped_ = false;
  std::deque<Event> events_;
  uint64_t next_seq_ = 0;        // sequence number of the next event
  uint64_t window_start_ = 0;    // sequence number of events_.front()
  uint32_t next_id_ = 0;
  uint64_t dropped_events_ = 0;
  uint64_t last_gap_seq_ = 0;    // events lost just before this one
  bool any_gap_ = false;
  uint64_t unmatched_frees_ = 0;
  // Client id -> window id, from alloc to free_completed.
  absl::flat_hash_map<uint64_t, LiveId> live_ids_;
  // Window id -> what the allocation was, for those allocated before the
  // window's start and not yet free_completed at it.
  absl::flat_hash_map<uint32_t, Live> prelude_;
  // The window's stream index -> CUDA handle, in order of first use, and
  // back: a lookup per event, which a client naming a new stream in each
  // must not make cost the daemon the streams seen.
  std::vector<uint64_t> stream_handles_;
  static constexpr size_t kStreamsScanned = 4;
  absl::flat_hash_map<uint64_t, uint16_t> stream_indices_;  // past the first kStreamsScanned
  int64_t requested_bytes_ = 0;
  // Client id -> bytes asked for, of the blocks states showed held that
  // the stream never allocated, until their free; and their total.
  absl::flat_hash_map<uint64_t, int64_t> outside_;
  int64_t outside_bytes_ = 0;
  int64_t peak_held_requested_bytes_ = 0;
  int64_t peak_requested_bytes_ = 0;
  int64_t max_requested_bytes_ = 0;
  uint64_t max_requested_at_ = 0;
  uint64_t largest_request_start_ = 0;
  // The least requested since the most was last raised, and where.
  int64_t trough_bytes_ = 0;
  uint64_t trough_at_ = 0;
  // Sequence numbers of the step marks at or after window_start_.
  std::deque<uint64_t> step_ends_;
  uint64_t steps_marked_ = 0;
  std::deque<State> states_;  // by seq
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_AUTOTUNE_JOB_WINDOW_H_
