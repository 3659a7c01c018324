// What `allocd replay` and `allocd tune` say about a partial snapshot: how
// it is partial, what of the memory its first event found was
// reconstructed, and when the numbers cannot be right.
#ifndef ALLOCD_TOOLS_ALLOCD_PARTIAL_REPORT_H_
#define ALLOCD_TOOLS_ALLOCD_PARTIAL_REPORT_H_

#include <string>

#include "allocator/trace/trace.h"
#include "nlohmann/json.hpp"

namespace allocd {

// {"partial", "reconstructed", "unrecoverable" (null when it was),
// "unmatched_frees", "state_before_first_event", "ring_buffer_wrapped",
// "other_devices", "initial_state": {"segments", "reserved_bytes",
// "live_blocks", "live_bytes", "pending_free_blocks", "pending_free_bytes"}}.
nlohmann::json PartialTraceJson(const Trace& trace);

// Lines in the replay report's "label              text" layout, each ending
// in a newline; "" for a whole trace from a single device. With
// `other_configs` (configs other than the recorded one are replayed), a
// reconstructed trace also says what those figures lack.
std::string PartialTraceText(const Trace& trace, bool other_configs);

// Why `allocd tune` refuses `trace` without --force: a partial trace whose
// state at the first event could not be reconstructed. "" when it may be
// tuned.
std::string TuneRefusal(const Trace& trace);

}  // namespace allocd

#endif  // ALLOCD_TOOLS_ALLOCD_PARTIAL_REPORT_H_
