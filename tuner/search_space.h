// SearchSpace: every PyTorch allocator knob that changes device memory, and
// the values the tuner tries for each. Declared here and nowhere else.
#ifndef ALLOCD_TUNER_SEARCH_SPACE_H_
#define ALLOCD_TUNER_SEARCH_SPACE_H_

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/config.h"
#include "tuner/candidate.h"

namespace allocd {

using RoundupDivisions = std::array<size_t, kRoundupPower2Intervals>;

// Garbage collection needs a memory fraction to act. The tuner expresses the
// fraction as headroom over the job's peak allocated memory (so that the
// same space fits a 4 GB and a 40 GB job) and turns it into
// set_per_process_memory_fraction(F) for the device at hand.
struct GcSetting {
  double threshold = 0;  // 0: off (no fraction either)
  double headroom = 0;   // the cap is (1 + headroom) x peak allocated

  bool operator==(const GcSetting&) const = default;
};

struct SearchSpace {
  // What candidates hold for the keys the space does not vary, and for
  // garbage collection where it is off (PyTorch's defaults, or the config a
  // running job holds).
  AllocatorConfig base;
  // Each list holds the values tried; the first is the value the coarse
  // sweep holds the dimension at while it varies the others (PyTorch's
  // default where that is in the list).
  std::vector<std::optional<size_t>> max_split_size_mb;  // nullopt: unset
  std::vector<size_t> max_non_split_rounding_mb;
  std::vector<RoundupDivisions> roundup_power2_divisions;
  std::vector<bool> expandable_segments;
  std::vector<GcSetting> garbage_collection;

  // How many candidates the full grid has.
  size_t GridSize() const;
};

// The default space: max_split_size_mb unset and 20..4096, rounding 20..1024,
// roundup divisions 1..16 and three per-interval lists, expandable segments
// off/on, and GC thresholds 0.5..0.9 at three headrooms.
SearchSpace DefaultSearchSpace();

// Narrows or widens `space` from a spec such as
//   "max_split_size_mb=64..1024,expandable_segments=True,roundup_power2_divisions=1|4|[256:1,>:8]"
// Dimensions are separated by commas outside brackets; each is KEY=VALUES
// where VALUES is a |-separated list, a range LO..HI (every power of two in
// it, and both ends), or "unset". A dimension named replaces its list; the
// others stay. Keys: max_split_size_mb, max_non_split_rounding_mb,
// roundup_power2_divisions, expandable_segments,
// garbage_collection_threshold (thresholds, at the space's headrooms),
// gc_headroom. Values are checked with PyTorch's own rules.
absl::StatusOr<SearchSpace> ApplySpaceSpec(SearchSpace space,
                                           std::string_view spec);

// The candidate with the given value index in each dimension; the memory
// fraction for GC is computed from `peak_allocated` and `total_memory`.
struct SpacePoint {
  size_t max_split = 0;
  size_t rounding = 0;
  size_t roundup = 0;
  size_t expandable = 0;
  size_t gc = 0;

  bool operator==(const SpacePoint&) const = default;
};
inline constexpr int kSpaceDimensions = 5;

// The index of `dimension` (0..4) in `point`.
size_t& PointIndex(SpacePoint& point, int dimension);
// How many values `dimension` has in `space`.
size_t DimensionSize(const SearchSpace& space, int dimension);
// The dimension's name as in --space.
const char* DimensionName(int dimension);

Candidate MakeCandidate(const SearchSpace& space, const SpacePoint& point,
                        int64_t peak_allocated, uint64_t total_memory);

// A human label of a roundup setting: "4", "[256:1,>:8]", "unset".
std::string RoundupLabel(const RoundupDivisions& divisions);

}  // namespace allocd

#endif  // ALLOCD_TUNER_SEARCH_SPACE_H_
