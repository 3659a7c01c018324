// The JSON forms the C ABI (allocd_client.h) passes, and the Python package
// and the libraries' environment variables with it: what comes in as text
// (autotune preferences, stats) and what goes out (control messages, the
// configs applied).
#ifndef ALLOCD_CLIENT_CAPI_CLIENT_JSON_H_
#define ALLOCD_CLIENT_CAPI_CLIENT_JSON_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "allocd.pb.h"

namespace allocd {

class ConfigApplier;

// A job's autotune preferences as JSON: {"pinned_keys":
// ["expandable_segments"], "allow_memory_fraction": false, "mode":
// "apply"}, every field optional; "" is no preference. InvalidArgument
// naming the field otherwise.
absl::StatusOr<v1::AutotunePreferences> ParseAutotunePreferences(
    absl::string_view json);

// Stats as a JSON object of torch.cuda.memory_stats() names to numbers;
// the integers are kept, anything else left out. InvalidArgument when it
// is no JSON object.
absl::StatusOr<std::map<std::string, int64_t>> ParseStatsJson(
    absl::string_view json);

// A control message as allocd_next_control hands it out:
//   {"type": "config", "version": N, "config": "...", "rollback": bool,
//    "reason": "..."}
//   {"type": "reclaim", "bytes": N, "reason": "..."}
std::string ControlJson(const v1::ControlMessage& m);

// What `applier` has applied, as allocd_applied_config hands it out:
//   {"config": "...", "reason": "...", "applied": N, "rejected": N}
// with the config canonical (FormatAllocatorConfig).
std::string AppliedConfigJson(const ConfigApplier& applier);

}  // namespace allocd

#endif  // ALLOCD_CLIENT_CAPI_CLIENT_JSON_H_
