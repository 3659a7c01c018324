#include "client/spare_segments.h"

#include <iterator>

namespace allocd {

void SpareSegments::Add(const Spare& spare) {
  by_size_.emplace(spare.bytes, spare);
  bytes_ += spare.bytes;
}

std::optional<uint64_t> SpareSegments::Take(uint64_t bytes) {
  auto it = by_size_.find(bytes);
  if (it == by_size_.end()) return std::nullopt;
  const uint64_t address = it->second.address;
  bytes_ -= bytes;
  by_size_.erase(it);
  return address;
}

std::vector<SpareSegments::Spare> SpareSegments::TakeLargestCovering(
    uint64_t bytes) {
  std::vector<Spare> taken;
  uint64_t covered = 0;
  while (!by_size_.empty() && (bytes == 0 || covered < bytes)) {
    auto largest = std::prev(by_size_.end());
    covered += largest->first;
    bytes_ -= largest->first;
    taken.push_back(largest->second);
    by_size_.erase(largest);
  }
  return taken;
}

template <typename Pick>
std::vector<SpareSegments::Spare> SpareSegments::TakeIf(Pick pick) {
  std::vector<Spare> taken;
  for (auto it = by_size_.begin(); it != by_size_.end();) {
    if (!pick(it->second)) {
      ++it;
      continue;
    }
    bytes_ -= it->first;
    taken.push_back(it->second);
    it = by_size_.erase(it);
  }
  return taken;
}

std::vector<SpareSegments::Spare> SpareSegments::TakeAll(Origin origin) {
  return TakeIf([origin](const Spare& s) { return s.origin == origin; });
}

std::vector<SpareSegments::Spare> SpareSegments::TakeSpareSince(
    absl::Time cutoff) {
  return TakeIf([cutoff](const Spare& s) { return s.since <= cutoff; });
}

}  // namespace allocd
