// PickleWriter: encodes plain data (None, bool, int, str, list, dict) as a
// protocol 2 pickle, the way CPython's pickler does, so that Python's
// pickle.load and our restricted unpickler (pickle.h) both read it.
//
// Ints take Python's shortest encoding (BININT1, BININT2, BININT, LONG1);
// strs are BINUNICODE and memoized (BINPUT/BINGET), so the keys every
// snapshot event repeats cost two bytes after their first use; list items
// and dict pairs go in batches of at most 1000 (MARK ... APPENDS/SETITEMS),
// as CPython batches them, which keeps a reader's stack short. Every Python 3
// reads protocol 2.
//
// Values are written in document order: a container's items between its
// Begin and End, a dict's as key, value, key, value. Misuse (an End that does
// not match, a dict with a dangling key, Finish with open containers) is a
// programming error, checked by assert.
#ifndef ALLOCD_ALLOCATOR_TRACE_PICKLE_WRITER_H_
#define ALLOCD_ALLOCATOR_TRACE_PICKLE_WRITER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"

namespace allocd {

class PickleWriter {
 public:
  PickleWriter();

  PickleWriter& None();
  PickleWriter& Bool(bool value);
  PickleWriter& Int(int64_t value);
  // A non-negative int: addresses and sizes may pass 2^63.
  PickleWriter& Uint(uint64_t value);
  // `text` must be valid UTF-8.
  PickleWriter& Str(std::string_view text);

  PickleWriter& BeginList();
  PickleWriter& EndList();
  PickleWriter& BeginDict();
  PickleWriter& EndDict();

  // The pickle: what was written, then STOP. The writer is spent.
  std::string Finish();

 private:
  struct OpenContainer {
    bool is_dict;
    // Values written since the last APPENDS/SETITEMS (keys count too).
    uint32_t batch = 0;
  };

  // Every value calls BeforeValue first and AfterValue once it is complete.
  void BeforeValue();
  void AfterValue();
  void FlushBatch();
  void Op(uint8_t opcode) { out_ += static_cast<char>(opcode); }
  void LittleEndian(uint64_t value, int bytes);
  void Memo(bool put, uint32_t index);

  std::string out_;
  std::vector<OpenContainer> open_;
  absl::flat_hash_map<std::string, uint32_t> memo_;
};

}  // namespace allocd

#endif  // ALLOCD_ALLOCATOR_TRACE_PICKLE_WRITER_H_
