// The real traces shipped in traces/, read once per benchmark process.
#ifndef ALLOCD_BENCH_SHIPPED_TRACES_H_
#define ALLOCD_BENCH_SHIPPED_TRACES_H_

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "allocator/trace/snapshot_reader.h"

namespace allocd {

// traces/NAME.pickle.gz; aborts with the reader's message if it fails.
inline const Trace& ShippedTrace(const std::string& name) {
  static auto* traces = new std::map<std::string, Trace>();
  auto it = traces->find(name);
  if (it == traces->end()) {
    absl::StatusOr<Trace> trace = ReadSnapshotFile(
        std::string(ALLOCD_SOURCE_DIR) + "/traces/" + name + ".pickle.gz");
    if (!trace.ok()) {
      std::fprintf(stderr, "%s\n", std::string(trace.status().message()).c_str());
      std::abort();
    }
    it = traces->emplace(name, *std::move(trace)).first;
  }
  return it->second;
}

}  // namespace allocd

#endif  // ALLOCD_BENCH_SHIPPED_TRACES_H_
