#include "server/autotune/job_window.h"

#include <algorithm>
#include <utility>

namespace allocd {
namespace {

template <typename States>
size_t StatesBytes(const States& states) {
  size_t bytes = 0;
  for (const auto& state : states) {
    bytes += sizeof(state) + state.segments.capacity() * sizeof(state.segments[0]) +
             state.blocks.capacity() * sizeof(state.blocks[0]);
  }
  return bytes;
}

}  // namespace

JobWindow::JobWindow(size_t max_events, std::unique_ptr<AutotuneMemory::Account> account)
    : max_events_(std::max<size_t>(1, max_events)), account_(std::move(account)) {
  FitMemory();
}

void JobWindow::Add(const std::vector<EvidenceEvent>& events, uint64_t dropped_before) {
  if (stopped_) return;
  if (dropped_before > 0) {
    dropped_events_ += dropped_before;
    last_gap_seq_ = next_seq_;
    any_gap_ = true;
  }
  for (const EvidenceEvent& e : events) {
    if (stopped_) return;
    AddOne(e);
  }
  FitMemory();
}

void JobWindow::FitMemory() {
  if (account_ == nullptr || account_->Resize(MemoryBytes())) return;
  // The oldest events go first, an eighth of them at a time: a shorter
  // window still decides.
  while (!events_.empty()) {
    const size_t drop = std::max<size_t>(events_.size() / 8, 1);
    for (size_t i = 0; i < drop; ++i) DropOldest();
    events_.shrink_to_fit();
    max_events_ = std::max<size_t>(events_.size(), 1);
    if (account_->Resize(MemoryBytes())) {
      account_->Trimmed(events_.size());
      return;
    }
  }
  // What is still allocated is more than it may hold: nothing it kept
  // would replay consistently without it.
  account_->Trimmed(0);
  Stop();
}

void JobWindow::Stop() {
  stopped_ = true;
  events_ = {};
  live_ids_ = {};
  prelude_ = {};
  outside_ = {};
  outside_bytes_ = 0;
  step_ends_ = {};
  states_ = {};
  if (account_ != nullptr) (void)account_->Resize(MemoryBytes());
}

void JobWindow::AddOne(const EvidenceEvent& e) {
  if (e.op == kStepMark) {
    MarkStep();
    return;
  }
  const uint16_t stream = StreamIndex(e.stream);
  auto it = live_ids_.find(e.id);
  // A block a state showed held outside the stream ends with any event of
  // its id: its free, or a new allocation at its address.
  if (it == live_ids_.end() && !outside_.empty()) {
    if (auto held = outside_.find(e.id); held != outside_.end()) {
      outside_bytes_ -= held->second;
      outside_.erase(held);
    }
  }
  switch (e.op) {
    case TraceOp::kAlloc: {
      if (e.size > kMaxEventBytes ||
          held_requested_bytes() > kMaxHeldBytes - static_cast<int64_t>(e.size)) {
        Stop();
        return;
      }
      if (it != live_ids_.end()) {
        // The id is reused, so its free was lost: free the old allocation.
        if (!it->second.free_requested) RequestFree(it->second);
        Append(TraceOp::kFreeCompleted, 0, it->second.id, 0);
        live_ids_.erase(it);
      }
      const uint32_t id = next_id_++;
      live_ids_.emplace(e.id, LiveId{id, false, e.size});
      Append(TraceOp::kAlloc, stream, id, e.size);
      requested_bytes_ += static_cast<int64_t>(e.size);
      peak_requested_bytes_ = std::max(peak_requested_bytes_, requested_bytes_);
      peak_held_requested_bytes_ = std::max(peak_held_requested_bytes_, held_requested_bytes());
      if (requested_bytes_ > max_requested_bytes_) {
        if (trough_bytes_ <= max_requested_bytes_ / 2) largest_request_start_ = trough_at_;
        max_requested_bytes_ = requested_bytes_;
        max_requested_at_ = next_seq_;
        trough_bytes_ = requested_bytes_;
        trough_at_ = next_seq_;
      }
      return;
    }
    case TraceOp::kFreeRequested:
      if (it == live_ids_.end() || it->second.free_requested) {
        ++unmatched_frees_;
        return;
      }
      RequestFree(it->second);
      return;
    case TraceOp::kFreeCompleted:
      if (it == live_ids_.end()) {
        ++unmatched_frees_;
        return;
      }
      // A plain free (no record_stream) may come as free_completed alone.
      if (!it->second.free_requested) RequestFree(it->second);
      Append(TraceOp::kFreeCompleted, 0, it->second.id, 0);
      live_ids_.erase(it);
      return;
  }
}

void JobWindow::MarkStep() {
  if (!step_ends_.empty() && step_ends_.back() == next_seq_) return;
  step_ends_.push_back(next_seq_);
  ++steps_marked_;
}

std::vector<uint64_t> JobWindow::StepEnds() const {
  std::vector<uint64_t> ends;
  ends.reserve(step_ends_.size());
  for (uint64_t seq : step_ends_) ends.push_back(seq - window_start_);
  return ends;
}

void JobWindow::RequestFree(LiveId& live) {
  live.free_requested = true;
  Append(TraceOp::kFreeRequested, 0, live.id, 0);
  requested_bytes_ -= static_cast<int64_t>(live.size);
  if (requested_bytes_ < trough_bytes_) {
    trough_bytes_ = requested_bytes_;
    trough_at_ = next_seq_;
  }
}

uint16_t JobWindow::StreamIndex(uint64_t handle) {
  // A job's first few streams are found without hashing.
  const size_t first = std::min<size_t>(stream_handles_.size(), kStreamsScanned);
  for (size_t i = 0; i < first; ++i) {
    if (stream_handles_[i] == handle) return static_cast<uint16_t>(i);
  }
  if (auto it = stream_indices_.find(handle); it != stream_indices_.end()) return it->second;
  // A program has a handful of streams; past 2^16 they share the last index.
  if (stream_handles_.size() > UINT16_MAX) return UINT16_MAX;
  const auto index = static_cast<uint16_t>(stream_handles_.size());
  stream_handles_.push_back(handle);
  if (index >= kStreamsScanned) stream_indices_.emplace(handle, index);
  return index;
}

void JobWindow::Append(TraceOp op, uint16_t stream, uint32_t id, uint64_t size) {
  if (events_.size() == max_events_) DropOldest();
  events_.push_back(Event{size, id, stream, op});
  ++next_seq_;
}

void JobWindow::DropOldest() {
  const Event& e = events_.front();
  switch (e.op) {
    case TraceOp::kAlloc:
      prelude_.emplace(e.id, Live{window_start_, e.size, e.stream, false});
      break;
    case TraceOp::kFreeRequested:
      prelude_[e.id].free_requested = true;
      break;
    case TraceOp::kFreeCompleted:
      prelude_.erase(e.id);
      break;
  }
  events_.pop_front();
  ++window_start_;
  // A mark at the window's start still ends a step inside it; a state
  // there still has its events.
  while (!step_ends_.empty() && step_ends_.front() < window_start_) step_ends_.pop_front();
  while (!states_.empty() && states_.front().seq < window_start_) states_.pop_front();
}

bool JobWindow::has_gap() const { return any_gap_ && last_gap_seq_ > window_start_; }

size_t JobWindow::MemoryBytes() const {
  return sizeof(*this) + events_.size() * sizeof(Event) +
         live_ids_.capacity() * (sizeof(std::pair<uint64_t, LiveId>) + 1) +
         prelude_.capacity() * (sizeof(std::pair<uint32_t, Live>) + 1) +
         outside_.capacity() * (sizeof(std::pair<uint64_t, int64_t>) + 1) +
         stream_handles_.capacity() * sizeof(uint64_t) +
         stream_indices_.capacity() * (sizeof(std::pair<uint64_t, uint16_t>) + 1) +
         step_ends_.size() * sizeof(uint64_t) +
         StatesBytes(states_);
}

std::vector<uint16_t> JobWindow::SortStreams(Trace& trace) const {
  // Streams in ascending handle order, as PyTorch orders them.
  trace.streams = stream_handles_;
  std::sort(trace.streams.begin(), trace.streams.end());
  std::vector<uint16_t> stream_index(stream_handles_.size());
  for (size_t i = 0; i < stream_handles_.size(); ++i) {
    stream_index[i] = static_cast<uint16_t>(
        std::lower_bound(trace.streams.begin(), trace.streams.end(), stream_handles_[i]) -
        trace.streams.begin());
  }
  return stream_index;
}

Trace JobWindow::ToTrace() const {
  Trace trace;
  const std::vector<uint16_t> stream_index = SortStreams(trace);

  absl::flat_hash_map<uint32_t, uint32_t> dense;
  dense.reserve(prelude_.size() + events_.size() / 2);
  trace.events.reserve(prelude_.size() * 2 + events_.size());
  auto alloc = [&](uint32_t id, uint16_t stream, uint64_t size) {
    const uint32_t d = static_cast<uint32_t>(dense.size());
    dense.emplace(id, d);
    trace.events.push_back(TraceEvent{TraceOp::kAlloc, stream_index[stream], d, size});
  };

  std::vector<std::pair<uint64_t, uint32_t>> prelude_order;  // (seq, id)
  prelude_order.reserve(prelude_.size());
  for (const auto& [id, live] : prelude_) prelude_order.emplace_back(live.seq, id);
  std::sort(prelude_order.begin(), prelude_order.end());
  for (const auto& [seq, id] : prelude_order) {
    const Live& live = prelude_.at(id);
    alloc(id, live.stream, live.size);
    // Freed but still held for another stream: not allocated any more.
    if (live.free_requested) {
      trace.events.push_back(TraceEvent{TraceOp::kFreeRequested, 0, dense.at(id), 0});
    }
  }

  for (const Event& e : events_) {
    if (e.op == TraceOp::kAlloc) {
      alloc(e.id, e.stream, e.size);
    } else {
      trace.events.push_back(TraceEvent{e.op, 0, dense.at(e.id), 0});
    }
  }
  trace.num_ids = static_cast<uint32_t>(dense.size());
  trace.omitted.unmatched_frees = unmatched_frees_;
  return trace;
}

bool JobWindow::AddState(const AllocatorSnapshot& snapshot) {
  if (stopped_) return false;
  State state{.seq = next_seq_, .segments = {}, .blocks = {}};
  state.segments.reserve(snapshot.segments.size());
  for (const AllocatorSnapshot::Segment& s : snapshot.segments) {
    if (s.size == 0 || s.size > kMaxEventBytes || s.address + s.size < s.address) return false;
    state.segments.push_back(
        StateSegment{s.address, s.size, StreamIndex(s.stream), s.is_small, s.is_expandable});
  }
  std::sort(state.segments.begin(), state.segments.end(),
            [](const StateSegment& a, const StateSegment& b) { return a.address < b.address; });
  for (size_t i = 1; i < state.segments.size(); ++i) {
    const StateSegment& before = state.segments[i - 1];
    if (before.address + before.size > state.segments[i].address) return false;
  }
  state.blocks.reserve(snapshot.blocks.size());
  for (const AllocatorSnapshot::Block& b : snapshot.blocks) {
    if (b.size == 0 || b.size > kMaxEventBytes || b.requested_size > b.size ||
        b.address + b.size < b.address) {
      return false;
    }
    auto live = live_ids_.find(b.id);
    const bool known = live != live_ids_.end();
    state.blocks.push_back(StateBlock{b.address, b.size, b.requested_size,
                                      known ? live->second.id : 0, known, b.free_requested});
  }
  std::sort(state.blocks.begin(), state.blocks.end(),
            [](const StateBlock& a, const StateBlock& b) { return a.address < b.address; });
  auto segment = state.segments.begin();
  uint64_t taken_to = 0;  // where the previous block ends
  for (const StateBlock& b : state.blocks) {
    while (segment != state.segments.end() && segment->address + segment->size <= b.address) {
      ++segment;
    }
    if (segment == state.segments.end() || b.address < segment->address ||
        b.address + b.size > segment->address + segment->size || b.address < taken_to) {
      return false;
    }
    taken_to = b.address + b.size;
  }
  int64_t outside_added = 0;  // bounded as it grows: each block is at most kMaxEventBytes
  for (const AllocatorSnapshot::Block& b : snapshot.blocks) {
    if (b.free_requested || live_ids_.contains(b.id) || outside_.contains(b.id)) continue;
    if (static_cast<int64_t>(b.requested_size) >
        kMaxHeldBytes - held_requested_bytes() - outside_added) {
      return false;
    }
    outside_added += static_cast<int64_t>(b.requested_size);
  }
  for (const AllocatorSnapshot::Block& b : snapshot.blocks) {
    if (!b.free_requested && !live_ids_.contains(b.id) &&
        outside_.emplace(b.id, static_cast<int64_t>(b.requested_size)).second) {
      outside_bytes_ += static_cast<int64_t>(b.requested_size);
    }
  }
  peak_held_requested_bytes_ = std::max(peak_held_requested_bytes_, held_requested_bytes());
  // A second state at one point replaces the first.
  if (!states_.empty() && states_.back().seq == state.seq) states_.pop_back();
  states_.push_back(std::move(state));
  while (states_.size() > kMaxStates) states_.pop_front();
  FitMemory();
  return true;
}

bool JobWindow::RestartAtStateAfterGap() {
  // A state at the gap's own seq may have been taken before the events
  // were lost (the loss is told with the events after it).
  if (!has_gap() || states_.empty() || states_.back().seq <= last_gap_seq_) return false;
  const uint64_t start = states_.back().seq;
  while (window_start_ < start) DropOldest();
  return true;
}

std::vector<uint64_t> JobWindow::StateSeqs() const {
  std::vector<uint64_t> seqs;
  seqs.reserve(states_.size());
  for (const State& state : states_) seqs.push_back(state.seq);
  return seqs;
}

Trace JobWindow::ToTraceFromState(uint64_t seq) const {
  Trace trace;
  auto state = std::find_if(states_.begin(), states_.end(),
                            [seq](const State& s) { return s.seq == seq; });
  if (state == states_.end()) return trace;
  const std::vector<uint16_t> stream_index = SortStreams(trace);

  absl::flat_hash_map<uint32_t, uint32_t> dense;  // the window's id -> the trace's
  uint32_t next = 0;
  for (const StateSegment& s : state->segments) {
    trace.partial.segments.push_back(
        InitialSegment{s.address, s.size, stream_index[s.stream], s.is_small, s.is_expandable});
  }
  for (const StateBlock& b : state->blocks) {
    const uint32_t id = next++;
    if (b.known) dense.emplace(b.id, id);
    trace.partial.blocks.push_back(
        InitialBlock{id, b.address, b.size, b.requested_size, b.free_requested});
  }
  // The replay adopts it (PartialTrace::reconstructed()).
  trace.partial.state_before_first_event = true;

  uint64_t unmatched = 0;
  for (auto e = events_.begin() + static_cast<std::ptrdiff_t>(seq - window_start_);
       e != events_.end(); ++e) {
    if (e->op == TraceOp::kAlloc) {
      const uint32_t id = next++;
      dense[e->id] = id;
      trace.events.push_back(TraceEvent{TraceOp::kAlloc, stream_index[e->stream], id, e->size});
      continue;
    }
    auto it = dense.find(e->id);
    if (it == dense.end()) {
      ++unmatched;
      continue;
    }
    trace.events.push_back(TraceEvent{e->op, 0, it->second, 0});
  }
  trace.num_ids = next;
  trace.omitted.unmatched_frees = unmatched;
  trace.partial.unmatched_frees = unmatched;
  return trace;
}

}  // namespace allocd
