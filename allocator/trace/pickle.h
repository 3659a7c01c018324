// A restricted unpickler: decodes Python pickles (protocols 0-5) of plain
// data (None, bool, int, float, str, bytes, bytearray, tuple, list, dict,
// set, frozenset) and executes nothing.
//
// Every opcode that imports or calls a Python object (GLOBAL, STACK_GLOBAL,
// REDUCE, BUILD, INST, OBJ, NEWOBJ, NEWOBJ_EX, EXT1/2/4, PERSID, BINPERSID)
// is rejected, as are out-of-band buffers (NEXT_BUFFER, READONLY_BUFFER):
// memory snapshots contain none of them. Python pickles bytes (protocol < 3)
// and sets (protocol < 4) through REDUCE, so those cannot be read at the old
// protocols.
//
// A malformed input is an InvalidArgument status that names the byte offset
// and the opcode. Parsing never recurses, never reads outside the input, and
// allocates O(input size): a length field is checked against the bytes that
// are left before anything is reserved for it.
//
// The result is a flat PickleDocument: 8-byte values in a few large arrays,
// no allocation per object. Strings and bytes are views into the input
// wherever the pickle holds them verbatim, so the input must outlive the
// document. Containers keep Python's reference semantics: the memo (PUT/GET)
// shares one container, a list appended to after it was stored elsewhere
// shows the new items everywhere, and a list may even contain itself. Walk
// values with a depth bound of your own.
#ifndef ALLOCD_ALLOCATOR_TRACE_PICKLE_H_
#define ALLOCD_ALLOCATOR_TRACE_PICKLE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"

namespace allocd {
namespace pickle_internal {

// Implementation of HugePageAllocator; throws std::bad_alloc like operator
// new.
void* AllocateHugePages(size_t bytes);
void FreeHugePages(void* p, size_t bytes);

// An allocator for the large arrays of a document. It asks Linux for
// transparent huge pages for arrays of 2 MiB or more: a snapshot's document
// is about twice the size of the pickle, and first touching fresh memory in
// 4 KiB pages (the kernel zeroes each one in a page fault) costs as much as
// the parse itself, most of all in VMs.
template <typename T>
struct HugePageAllocator {
  using value_type = T;

  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) {}  // NOLINT: rebinding

  T* allocate(size_t n) {
    return static_cast<T*>(AllocateHugePages(n * sizeof(T)));
  }
  void deallocate(T* p, size_t n) { FreeHugePages(p, n * sizeof(T)); }

  friend bool operator==(const HugePageAllocator&, const HugePageAllocator&) {
    return true;
  }
};

template <typename T>
using HugePageVector = std::vector<T, HugePageAllocator<T>>;

}  // namespace pickle_internal

enum class PickleKind : uint8_t {
  kNone,
  kBool,
  kInt,
  // An int outside int64_t; its value is kept (uint_value) only when it is
  // below 2^64, as the unsigned addresses PyTorch writes are.
  kBigInt,
  kFloat,
  kStr,
  kBytes,
  kByteArray,
  kTuple,
  kList,
  kDict,
  kSet,
  kFrozenSet,
};

// Python's name of the type: "int", "str", "NoneType", ... For error messages.
std::string_view PickleKindName(PickleKind kind);

// One decoded object: an 8-byte handle whose content the PickleDocument that
// made it reads out (scalars small enough are held in the handle itself).
class PickleValue {
 public:
  // None.
  PickleValue() = default;

  PickleKind kind() const { return static_cast<PickleKind>(bits_ & kKindMask); }
  bool is_container() const { return kind() >= PickleKind::kTuple; }

  // Whether both name the same container, or are equal scalars held the
  // same way (bit-identical handles).
  bool operator==(const PickleValue&) const = default;

 private:
  friend class PickleDocument;
  friend class Unpickler;

  // Bits 0-3: the kind. Bit 4: the payload is an index into
  // PickleDocument::boxed_. Bits 5-63: the payload, which is
  // - kBool: 0 or 1; kInt: the value, when it fits in 59 bits;
  // - kStr, kBytes, kByteArray: offset into the input (32 bits) and length
  //   (27 bits), when they fit;
  // - containers: index into PickleDocument::containers_.
  static constexpr uint64_t kKindMask = 0xf;
  static constexpr uint64_t kBoxedBit = 0x10;
  static constexpr int kPayloadShift = 5;

  static PickleValue Make(PickleKind kind, uint64_t payload, bool boxed) {
    PickleValue v;
    v.bits_ = static_cast<uint64_t>(kind) | (boxed ? kBoxedBit : 0) |
              payload << kPayloadShift;
    return v;
  }
  bool boxed() const { return (bits_ & kBoxedBit) != 0; }
  uint64_t payload() const { return bits_ >> kPayloadShift; }
  int64_t signed_payload() const {
    return static_cast<int64_t>(bits_) >> kPayloadShift;
  }

  uint64_t bits_ = 0;
};

// The objects decoded from one pickle. Movable, not copyable.
class PickleDocument {
 private:
  struct Chunk;

 public:
  // A key/value pair of a dict.
  struct Entry {
    PickleValue key;
    PickleValue value;
  };

  // Iterates over the items of a tuple, list, set or frozenset
  // (Stride = 1, yielding PickleValue), or the pairs of a dict (Stride = 2,
  // yielding Entry).
  template <int Stride>
  class Iterator {
   public:
    using value_type = std::conditional_t<Stride == 1, PickleValue, Entry>;
    using difference_type = std::ptrdiff_t;

    Iterator() = default;
    value_type operator*() const {
      if constexpr (Stride == 1) {
        return *pos_;
      } else {
        return Entry{pos_[0], pos_[1]};
      }
    }
    Iterator& operator++() {
      pos_ += Stride;
      if (pos_ == end_) Enter(doc_->chunks_[chunk_].next);
      return *this;
    }
    Iterator operator++(int) {
      Iterator old = *this;
      ++*this;
      return old;
    }
    bool operator==(const Iterator& other) const { return pos_ == other.pos_; }

   private:
    friend class PickleDocument;
    Iterator(const PickleDocument* doc, uint32_t chunk) : doc_(doc) {
      Enter(chunk);
    }
    // Moves to the start of `chunk`, or to the end() state for kNoChunk.
    void Enter(uint32_t chunk);

    const PickleDocument* doc_ = nullptr;
    uint32_t chunk_ = 0;
    const PickleValue* pos_ = nullptr;
    const PickleValue* end_ = nullptr;
  };

  template <int Stride>
  class Range {
   public:
    Iterator<Stride> begin() const { return begin_; }
    Iterator<Stride> end() const { return {}; }

   private:
    friend class PickleDocument;
    explicit Range(Iterator<Stride> begin) : begin_(begin) {}
    Iterator<Stride> begin_;
  };

  PickleDocument() = default;
  PickleDocument(PickleDocument&&) = default;
  PickleDocument& operator=(PickleDocument&&) = default;

  // The object the pickle's STOP returned.
  PickleValue root() const { return root_; }

  // Scalars. Each requires the matching kind.
  bool bool_value(PickleValue v) const { return v.payload() != 0; }
  int64_t int_value(PickleValue v) const {
    return v.boxed() ? boxed_[v.payload()].i : v.signed_payload();
  }
  double float_value(PickleValue v) const { return boxed_[v.payload()].f; }
  // A non-negative int below 2^64 (a kInt or a kBigInt); nullopt for any
  // other value.
  std::optional<uint64_t> uint_value(PickleValue v) const {
    if (v.kind() == PickleKind::kInt) {
      const int64_t i = int_value(v);
      if (i >= 0) return static_cast<uint64_t>(i);
    } else if (v.kind() == PickleKind::kBigInt && v.boxed()) {
      return static_cast<uint64_t>(boxed_[v.payload()].i);
    }
    return std::nullopt;
  }
  // kStr (valid UTF-8), kBytes or kByteArray.
  std::string_view str_value(PickleValue v) const {
    if (v.boxed()) {
      const Boxed& b = boxed_[v.payload()];
      return {b.s, b.size};
    }
    return {input_ + (v.payload() & 0xffffffff), v.payload() >> 32};
  }

  // Number of items of a tuple, list, set or frozenset, or of key/value
  // pairs of a dict. Requires a container.
  size_t size(PickleValue container) const;

  // The items of a tuple, list, set or frozenset, in pickle order. Sets keep
  // items as pickled (Python would drop duplicates). Requires such a kind.
  Range<1> items(PickleValue sequence) const;

  // The key/value pairs of a dict in insertion order, including a key set
  // twice (Python keeps the last one, as Find does). Requires kDict.
  Range<2> entries(PickleValue dict) const;

  // The value of the last pair of `dict` whose key is the str `key`;
  // nullopt if none. Requires kDict.
  std::optional<PickleValue> Find(PickleValue dict, std::string_view key) const;

 private:
  friend class Unpickler;

  static constexpr uint32_t kNoChunk = ~uint32_t{0};

  // Items of a container, appended in batches: each APPENDS or SETITEMS
  // adds one run of `count` > 0 values at items_[begin] (or extends the
  // container's last run when that ends at the end of items_).
  struct Chunk {
    uint32_t begin;
    uint32_t count;
    uint32_t next;
  };
  struct Container {
    uint32_t first_chunk = kNoChunk;
    uint32_t last_chunk = kNoChunk;
    // Items, not pairs, for a dict.
    uint32_t size = 0;
    // Whether Python could hash it (a tuple of hashable items).
    bool hashable = true;
  };
  // A scalar that does not fit in a PickleValue.
  struct Boxed {
    union {
      int64_t i;
      double f;
      const char* s;
    };
    uint64_t size;
  };

  const char* input_ = nullptr;
  pickle_internal::HugePageVector<PickleValue> items_;
  pickle_internal::HugePageVector<Chunk> chunks_;
  pickle_internal::HugePageVector<Container> containers_;
  std::vector<Boxed> boxed_;
  // Strings the pickle does not hold verbatim (protocol 0 escapes); a deque
  // so that views stay valid as it grows.
  std::deque<std::string> decoded_;
  PickleValue root_;
};

struct PickleParseOptions {
  // Most MARKs open at once. CPython cannot write deeper nesting than its
  // recursion limit (1000 by default) allows.
  int max_depth = 1000;
};

// Decodes the pickle `bytes` (one pickle: nothing may follow STOP). The
// document refers into `bytes`, which must outlive it.
absl::StatusOr<PickleDocument> ParsePickle(
    std::string_view bytes, const PickleParseOptions& options = {});

template <int Stride>
void PickleDocument::Iterator<Stride>::Enter(uint32_t chunk) {
  // Chunks are never empty, so pos_ == end_ only past the last one.
  if (chunk == kNoChunk) {
    pos_ = end_ = nullptr;
    return;
  }
  chunk_ = chunk;
  const Chunk& c = doc_->chunks_[chunk];
  pos_ = doc_->items_.data() + c.begin;
  end_ = pos_ + c.count;
}

}  // namespace allocd

#endif  // ALLOCD_ALLOCATOR_TRACE_PICKLE_H_
