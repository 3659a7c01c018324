#include "client/received_chunks.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace allocd {

absl::StatusOr<std::vector<ReceivedChunks>> SplitGrant(ReceivedChunks grant,
                                                       uint64_t each) {
  const size_t n = grant.ids.size();
  if (each == 0 || grant.fds.size() != n || grant.offsets.size() != n ||
      grant.sizes.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a grant of ", n, " chunks (", grant.fds.size(), " FDs, ",
        grant.offsets.size(), " offsets, ", grant.sizes.size(),
        " sizes) cannot be split into grants of ", each, " bytes"));
  }
  std::vector<ReceivedChunks> grants;
  uint32_t reused = grant.reused;
  const size_t first_made = n - std::min<size_t>(grant.client_made, n);
  uint64_t filled = 0;
  for (size_t i = 0; i < n; ++i) {
    if (filled == 0) grants.push_back(ReceivedChunks{.epoch = grant.epoch});
    ReceivedChunks& part = grants.back();
    part.ids.push_back(grant.ids[i]);
    part.fds.push_back(std::move(grant.fds[i]));
    part.offsets.push_back(grant.offsets[i]);
    part.sizes.push_back(grant.sizes[i]);
    if (i >= first_made) ++part.client_made;
    filled += grant.sizes[i];
    if (filled > each) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk ", grant.ids[i], " of ", grant.sizes[i],
          " bytes crosses the end of a grant of ", each, " bytes"));
    }
    if (filled == each) {
      filled = 0;
      const uint32_t counted =
          std::min<uint32_t>(reused, static_cast<uint32_t>(part.ids.size()));
      part.reused = counted;
      reused -= counted;
    }
  }
  if (filled != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a grant of ", grant.bytes(), " bytes is not whole grants of ", each,
        " bytes"));
  }
  return grants;
}

}  // namespace allocd
