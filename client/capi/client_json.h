// The JSON forms the C ABI (allocd_client.h) takes, and the Python package
// and the libraries' environment variables with it: autotune preferences
// and stats.
#ifndef ALLOCD_CLIENT_CAPI_CLIENT_JSON_H_
#define ALLOCD_CLIENT_CAPI_CLIENT_JSON_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "allocd.pb.h"

namespace allocd {

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

}  // namespace allocd

#endif  // ALLOCD_CLIENT_CAPI_CLIENT_JSON_H_
