// Builds traces event by event for tests; ids are handed out in order of
// allocation, and every event is on stream 0 unless Alloc says otherwise.
#ifndef ALLOCD_TESTS_TRACE_TRACE_BUILDER_H_
#define ALLOCD_TESTS_TRACE_TRACE_BUILDER_H_

#include <cstdint>

#include "allocator/trace/trace.h"

namespace allocd {

class TraceBuilder {
 public:
  uint32_t Alloc(uint64_t size, uint16_t stream = 0) {
    trace_.events.push_back({TraceOp::kAlloc, stream, trace_.num_ids, size});
    return trace_.num_ids++;
  }
  TraceBuilder& Request(uint32_t id) {
    trace_.events.push_back({TraceOp::kFreeRequested, 0, id, 0});
    return *this;
  }
  TraceBuilder& Complete(uint32_t id) {
    trace_.events.push_back({TraceOp::kFreeCompleted, 0, id, 0});
    return *this;
  }
  TraceBuilder& Free(uint32_t id) { return Request(id).Complete(id); }
  Trace Build() {
    trace_.streams = {0};
    return trace_;
  }

 private:
  Trace trace_;
};

}  // namespace allocd

#endif  // ALLOCD_TESTS_TRACE_TRACE_BUILDER_H_
