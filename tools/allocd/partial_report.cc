#include "tools/allocd/partial_report.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "allocator/bytes.h"

namespace allocd {
namespace {

struct InitialTotals {
  uint64_t reserved = 0;
  uint64_t live_blocks = 0;
  uint64_t live_bytes = 0;
  uint64_t pending_blocks = 0;
  uint64_t pending_bytes = 0;
};

InitialTotals Totals(const PartialTrace& partial) {
  InitialTotals t;
  for (const InitialSegment& s : partial.segments) t.reserved += s.size;
  for (const InitialBlock& b : partial.blocks) {
    if (b.free_requested) {
      ++t.pending_blocks;
      t.pending_bytes += b.size;
    } else {
      ++t.live_blocks;
      t.live_bytes += b.size;
    }
  }
  return t;
}

// Why the snapshot is partial, in a few words.
std::string HowPartial(const Trace& trace) {
  const PartialTrace& p = trace.partial;
  std::vector<std::string> signs;
  if (p.unmatched_frees > 0) {
    signs.push_back(absl::StrCat(p.unmatched_frees,
                                 " frees of blocks the trace never allocated"));
  }
  if (p.state_before_first_event) {
    signs.push_back("memory at the end that no event allocated");
  }
  std::string how = absl::StrCat("recording began after the process allocated (",
                                 absl::StrJoin(signs, "; "), ")");
  if (p.ring_buffer_wrapped) {
    absl::StrAppend(&how, "; it holds a round number of events, as a wrapped "
                          "_record_memory_history(max_entries=N) ring does");
  }
  return how;
}

}  // namespace

nlohmann::json PartialTraceJson(const Trace& trace) {
  const PartialTrace& p = trace.partial;
  const InitialTotals t = Totals(p);
  return {
      {"partial", p.partial()},
      {"reconstructed", p.reconstructed()},
      {"unrecoverable", p.unrecoverable.empty() ? nlohmann::json(nullptr)
                                                : nlohmann::json(p.unrecoverable)},
      {"unmatched_frees", p.unmatched_frees},
      {"state_before_first_event", p.state_before_first_event},
      {"ring_buffer_wrapped", p.ring_buffer_wrapped},
      {"other_devices", p.other_devices},
      {"initial_state",
       {{"segments", p.segments.size()},
        {"reserved_bytes", t.reserved},
        {"live_blocks", t.live_blocks},
        {"live_bytes", t.live_bytes},
        {"pending_free_blocks", t.pending_blocks},
        {"pending_free_bytes", t.pending_bytes}}},
  };
}

std::string PartialTraceText(const Trace& trace, bool other_configs) {
  const PartialTrace& p = trace.partial;
  std::string out;
  if (!p.other_devices.empty()) {
    absl::StrAppend(&out, absl::StrFormat(
        "other devices      %s also have events: this is device %d alone "
        "(--device N for another)\n",
        absl::StrJoin(p.other_devices, ", "), trace.device));
  }
  if (!p.partial()) return out;
  absl::StrAppend(&out, "partial trace      yes: ", HowPartial(trace), "\n");
  if (p.reconstructed()) {
    const InitialTotals t = Totals(p);
    absl::StrAppend(&out, absl::StrFormat(
        "reconstructed      the state at the first event, from the snapshot's "
        "end state: %d segments (%s reserved), %d live blocks (%s)%s; the "
        "replay starts from it and the peaks include it\n",
        p.segments.size(), FormatSize(t.reserved), t.live_blocks,
        FormatSize(t.live_bytes),
        t.pending_blocks == 0
            ? ""
            : absl::StrFormat(", %d blocks waiting on record_stream (%s)",
                              t.pending_blocks, FormatSize(t.pending_bytes))));
    if (other_configs) {
      absl::StrAppend(&out, absl::StrFormat(
          "                   exact under the recorded config (%s); another "
          "config starts from the recorded layout,\n"
          "                   as if switched on when recording began, without "
          "what its own earlier history would have\n"
          "                   left cached (docs/tune.md: \"Partial snapshots\")\n",
          trace.recorded_config.empty() ? "PyTorch defaults"
                                        : trace.recorded_config));
    }
    return out;
  }
  absl::StrAppend(&out, absl::StrFormat(
      "WARNING            the state at the first event cannot be "
      "reconstructed: %s.\n"
      "                   The replay starts from an empty device, so these "
      "numbers miss what was live then\n"
      "                   (peaks too low). Record from the start: see the "
      "docs/tune.md's \"Record a snapshot of your job\".\n",
      p.unrecoverable));
  return out;
}

std::string TuneRefusal(const Trace& trace) {
  const PartialTrace& p = trace.partial;
  if (!p.partial() || p.reconstructed()) return "";
  return absl::StrCat(
      "the snapshot is partial: ", HowPartial(trace),
      ". The state at its first event cannot be reconstructed: ",
      p.unrecoverable,
      ". Tuning it would optimise a job without the memory that was live "
      "then. Record from the start (docs/tune.md: \"Record a snapshot of your job\"), or "
      "pass --force to tune the recorded events as if the device were empty "
      "when they began");
}

}  // namespace allocd
