#include "allocator/stats.h"

#include "absl/strings/string_view.h"

#include "absl/strings/str_cat.h"

namespace allocd {
namespace {

constexpr std::array<absl::string_view, kNumStatPools> kPoolNames = {
    "all", "small_pool", "large_pool"};

void AddStat(std::map<std::string, int64_t>& out, absl::string_view prefix,
             const Stat& stat) {
  out[absl::StrCat(prefix, ".current")] = stat.current;
  out[absl::StrCat(prefix, ".peak")] = stat.peak;
  out[absl::StrCat(prefix, ".allocated")] = stat.allocated;
  out[absl::StrCat(prefix, ".freed")] = stat.freed;
}

void AddStatArray(std::map<std::string, int64_t>& out, absl::string_view name,
                  const StatArray& array) {
  for (int pool = 0; pool < kNumStatPools; ++pool) {
    AddStat(out, absl::StrCat(name, ".", kPoolNames[pool]),
            array.by_pool[pool]);
  }
}

template <typename Fn>
void ForEachStatArray(DeviceStats& s, Fn fn) {
  for (StatArray* a :
       {&s.allocation, &s.segment, &s.active, &s.inactive_split,
        &s.allocated_bytes, &s.reserved_bytes, &s.active_bytes,
        &s.inactive_split_bytes, &s.requested_bytes}) {
    for (Stat& stat : a->by_pool) fn(stat);
  }
  fn(s.oversize_allocations);
  fn(s.oversize_segments);
}

}  // namespace

void DeviceStats::ResetPeaks() {
  ForEachStatArray(*this, [](Stat& s) { s.ResetPeak(); });
}

void DeviceStats::ResetAccumulated() {
  ForEachStatArray(*this, [](Stat& s) { s.ResetAccumulated(); });
  num_alloc_retries = num_ooms = num_sync_all_streams = 0;
  num_device_alloc = num_device_free = 0;
}

std::map<std::string, int64_t> MemoryStatsDict(const DeviceStats& s) {
  std::map<std::string, int64_t> out;
  AddStatArray(out, "allocation", s.allocation);
  AddStatArray(out, "segment", s.segment);
  AddStatArray(out, "active", s.active);
  AddStatArray(out, "inactive_split", s.inactive_split);
  AddStatArray(out, "allocated_bytes", s.allocated_bytes);
  AddStatArray(out, "reserved_bytes", s.reserved_bytes);
  AddStatArray(out, "active_bytes", s.active_bytes);
  AddStatArray(out, "inactive_split_bytes", s.inactive_split_bytes);
  AddStatArray(out, "requested_bytes", s.requested_bytes);
  AddStat(out, "oversize_allocations", s.oversize_allocations);
  AddStat(out, "oversize_segments", s.oversize_segments);
  out["num_alloc_retries"] = s.num_alloc_retries;
  out["num_ooms"] = s.num_ooms;
  out["num_sync_all_streams"] = s.num_sync_all_streams;
  out["num_device_alloc"] = s.num_device_alloc;
  out["num_device_free"] = s.num_device_free;
  out["max_split_size"] = s.max_split_size;
  return out;
}

}  // namespace allocd
