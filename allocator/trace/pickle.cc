#include "allocator/trace/pickle.h"

#include <sys/mman.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <utility>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/trace/pickle_opcodes.h"

namespace allocd {

namespace {

constexpr int kHighestProtocol = 5;

uint64_t LoadLittleEndian(const char* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) {
    v |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  }
  return v;
}

// The int64_t that LONG1/LONG4 encode in `n` little-endian two's complement
// bytes, or nullopt when it does not fit.
std::optional<int64_t> DecodeLong(const char* p, size_t n) {
  if (n == 0) return 0;
  const bool negative = static_cast<unsigned char>(p[n - 1]) & 0x80;
  const unsigned char fill = negative ? 0xff : 0x00;
  // Python writes the shortest encoding, but longer ones are valid.
  while (n > 8 && static_cast<unsigned char>(p[n - 1]) == fill) --n;
  if (n > 8) return std::nullopt;
  uint64_t u = LoadLittleEndian(p, n);
  if (n < 8) {
    if (negative) u |= ~uint64_t{0} << (8 * n);
  } else if (((u >> 63) != 0) != negative) {
    return std::nullopt;
  }
  return static_cast<int64_t>(u);
}

// The uint64_t that LONG1/LONG4 encode in `n` little-endian two's
// complement bytes, or nullopt when it is negative or does not fit.
std::optional<uint64_t> DecodeUnsignedLong(const char* p, size_t n) {
  if (n == 0) return 0;
  if (static_cast<unsigned char>(p[n - 1]) & 0x80) return std::nullopt;
  while (n > 8 && p[n - 1] == 0) --n;
  if (n > 8) return std::nullopt;
  return LoadLittleEndian(p, n);
}

// Whether `s` is UTF-8 that Python would decode to a str without surrogates.
bool IsValidUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  while (p < end) {
    if (end - p >= 8) {
      uint64_t word;
      std::memcpy(&word, p, 8);
      if ((word & 0x8080808080808080ull) == 0) {
        p += 8;
        continue;
      }
    }
    const unsigned char c = *p;
    if (c < 0x80) {
      ++p;
      continue;
    }
    int length;
    uint32_t cp;
    uint32_t min;
    if ((c & 0xe0) == 0xc0) {
      length = 2, cp = c & 0x1f, min = 0x80;
    } else if ((c & 0xf0) == 0xe0) {
      length = 3, cp = c & 0x0f, min = 0x800;
    } else if ((c & 0xf8) == 0xf0) {
      length = 4, cp = c & 0x07, min = 0x10000;
    } else {
      return false;
    }
    if (end - p < length) return false;
    for (int i = 1; i < length; ++i) {
      if ((p[i] & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (p[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
      return false;
    }
    p += length;
  }
  return true;
}

bool IsAscii(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// An input quoted for an error message: short and printable.
std::string Quote(std::string_view s) {
  constexpr size_t kMax = 64;
  std::string out = absl::StrCat("'", absl::CHexEscape(absl::string_view(
                                          s.data(), std::min(s.size(), kMax))));
  if (s.size() > kMax) out += "...";
  out += "'";
  return out;
}

}  // namespace

namespace pickle_internal {

namespace {
constexpr size_t kHugePage = size_t{2} << 20;
}  // namespace

void* AllocateHugePages(size_t bytes) {
  if (bytes < kHugePage) return ::operator new(bytes);
  const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = std::aligned_alloc(kHugePage, rounded);
  if (p == nullptr) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  // Only a hint: without THP support the pages stay small.
  madvise(p, rounded, MADV_HUGEPAGE);
#endif
  return p;
}

void FreeHugePages(void* p, size_t bytes) {
  if (bytes < kHugePage) {
    ::operator delete(p);
  } else {
    std::free(p);
  }
}

}  // namespace pickle_internal

std::string_view PickleKindName(PickleKind kind) {
  switch (kind) {
    case PickleKind::kNone:
      return "NoneType";
    case PickleKind::kBool:
      return "bool";
    case PickleKind::kInt:
    case PickleKind::kBigInt:
      return "int";
    case PickleKind::kFloat:
      return "float";
    case PickleKind::kStr:
      return "str";
    case PickleKind::kBytes:
      return "bytes";
    case PickleKind::kByteArray:
      return "bytearray";
    case PickleKind::kTuple:
      return "tuple";
    case PickleKind::kList:
      return "list";
    case PickleKind::kDict:
      return "dict";
    case PickleKind::kSet:
      return "set";
    case PickleKind::kFrozenSet:
      return "frozenset";
  }
  return "?";
}

size_t PickleDocument::size(PickleValue container) const {
  const uint32_t items = containers_[container.payload()].size;
  return container.kind() == PickleKind::kDict ? items / 2 : items;
}

PickleDocument::Range<1> PickleDocument::items(PickleValue sequence) const {
  return Range<1>(
      Iterator<1>(this, containers_[sequence.payload()].first_chunk));
}

PickleDocument::Range<2> PickleDocument::entries(PickleValue dict) const {
  return Range<2>(Iterator<2>(this, containers_[dict.payload()].first_chunk));
}

std::optional<PickleValue> PickleDocument::Find(PickleValue dict,
                                                std::string_view key) const {
  std::optional<PickleValue> found;
  for (const Entry& e : entries(dict)) {
    if (e.key.kind() == PickleKind::kStr && str_value(e.key) == key) {
      found = e.value;
    }
  }
  return found;
}

// One run of the pickle machine over one input. CPython's Unpickler is the
// reference for what each opcode does; where CPython accepts odd input that
// Python's own pickler never writes (octal INT arguments, leftovers on the
// stack at STOP, bytes after STOP), this one rejects it.
class Unpickler {
 public:
  Unpickler(std::string_view input, const PickleParseOptions& options)
      : in_(input), options_(options) {}

  absl::StatusOr<PickleDocument> Run() {
    if (in_.size() >= std::numeric_limits<uint32_t>::max()) {
      // Items, chunks and string lengths are uint32_t: each comes from at
      // least one input byte.
      return absl::InvalidArgumentError(absl::StrCat(
          "pickle: ", in_.size(), " bytes is more than the 4 GiB supported"));
    }
    doc_.input_ = in_.data();
    // Sized for memory snapshots (per input byte: 0.19 items, 0.03 memo
    // entries, 0.014 containers and chunks), so that the big arrays are not
    // copied as they grow; anything else grows as usual. Only touched memory
    // costs, so the estimates err high, up to a cap that keeps a huge input
    // from reserving more address space than a small machine allows.
    const auto hint = [&](size_t input_bytes_per_entry) {
      return std::min(in_.size() / input_bytes_per_entry, size_t{64} << 20);
    };
    doc_.items_.reserve(hint(4));
    doc_.containers_.reserve(hint(50));
    doc_.chunks_.reserve(hint(50));
    memo_.reserve(hint(25));
    stack_.reserve(64);
    while (true) {
      if (pos_ >= in_.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "pickle: input ends at offset ", pos_, " without STOP"));
      }
      op_offset_ = pos_;
      op_ = static_cast<uint8_t>(in_[pos_++]);
      if (op_ == STOP) break;
      if (!Step()) return std::move(error_);
    }
    if (stack_.size() != 1 || !marks_.empty()) {
      Error(absl::StrCat("expects one object on the stack, not ", stack_.size(),
                         " and ", marks_.size(), " open MARKs"));
      return std::move(error_);
    }
    if (pos_ != in_.size()) {
      Error(absl::StrCat(in_.size() - pos_, " bytes follow STOP"));
      return std::move(error_);
    }
    doc_.root_ = stack_.back();
    return std::move(doc_);
  }

 private:
  bool Step() {
    switch (op_) {
      case MARK:
        if (marks_.size() >= static_cast<size_t>(options_.max_depth)) {
          return Error(
              absl::StrCat("nesting is deeper than ", options_.max_depth));
        }
        marks_.push_back(static_cast<uint32_t>(stack_.size()));
        return true;
      case POP:
        // Like CPython: with nothing above the innermost MARK, POP drops
        // the MARK.
        if (stack_.size() > Fence()) {
          stack_.pop_back();
        } else if (!marks_.empty()) {
          marks_.pop_back();
        } else {
          return Underflow();
        }
        return true;
      case POP_MARK: {
        uint32_t mark = 0;
        if (!PopMark(mark)) return false;
        stack_.resize(mark);
        return true;
      }
      case DUP: {
        if (stack_.size() <= Fence()) return Underflow();
        const PickleValue top = stack_.back();
        stack_.push_back(top);
        return true;
      }

      case NONE:
        return Push(PickleValue());
      case NEWTRUE:
      case NEWFALSE:
        return Push(Bool(op_ == NEWTRUE));
      case BININT1:
      case BININT2:
        return PushUnsigned(op_ == BININT1 ? 1 : 2);
      case BININT: {
        const char* p = nullptr;
        if (!Take(4, p)) return false;
        return Push(Int(static_cast<int32_t>(LoadLittleEndian(p, 4))));
      }
      case LONG1:
      case LONG4:
        return LoadLong();
      case INT:
      case LONG:
        return LoadDecimal();
      case BINFLOAT: {
        const char* p = nullptr;
        if (!Take(8, p)) return false;
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) {
          bits = (bits << 8) | static_cast<unsigned char>(p[i]);
        }
        double value;
        std::memcpy(&value, &bits, sizeof(bits));
        return Push(Float(value));
      }
      case FLOAT:
        return LoadTextFloat();

      case SHORT_BINUNICODE:
        return LoadCounted(1, PickleKind::kStr);
      case BINUNICODE:
        return LoadCounted(4, PickleKind::kStr);
      case BINUNICODE8:
        return LoadCounted(8, PickleKind::kStr);
      case SHORT_BINSTRING:
        return LoadCounted(1, PickleKind::kStr);
      case BINSTRING:
        return LoadCounted(4, PickleKind::kStr);
      case SHORT_BINBYTES:
        return LoadCounted(1, PickleKind::kBytes);
      case BINBYTES:
        return LoadCounted(4, PickleKind::kBytes);
      case BINBYTES8:
        return LoadCounted(8, PickleKind::kBytes);
      case BYTEARRAY8:
        return LoadCounted(8, PickleKind::kByteArray);
      case STRING:
        return LoadQuotedString();
      case UNICODE:
        return LoadRawUnicodeEscape();

      case EMPTY_TUPLE:
        return Push(NewContainer(PickleKind::kTuple));
      case TUPLE1:
      case TUPLE2:
      case TUPLE3: {
        const size_t n = op_ - TUPLE1 + 1;
        if (stack_.size() < Fence() + n) return Underflow();
        return BuildFromTop(PickleKind::kTuple, stack_.size() - n);
      }
      case TUPLE:
      case LIST:
      case DICT:
      case FROZENSET: {
        uint32_t mark = 0;
        if (!PopMark(mark)) return false;
        const PickleKind kind = op_ == TUPLE  ? PickleKind::kTuple
                                : op_ == LIST ? PickleKind::kList
                                : op_ == DICT ? PickleKind::kDict
                                              : PickleKind::kFrozenSet;
        return BuildFromTop(kind, mark);
      }
      case EMPTY_LIST:
        return Push(NewContainer(PickleKind::kList));
      case EMPTY_DICT:
        return Push(NewContainer(PickleKind::kDict));
      case EMPTY_SET:
        return Push(NewContainer(PickleKind::kSet));
      case APPEND:
        if (stack_.size() < Fence() + 2) return Underflow();
        return AddToTarget(PickleKind::kList, stack_.size() - 1);
      case SETITEM:
        if (stack_.size() < Fence() + 3) return Underflow();
        return AddToTarget(PickleKind::kDict, stack_.size() - 2);
      case APPENDS:
      case SETITEMS:
      case ADDITEMS: {
        uint32_t mark = 0;
        if (!PopMark(mark)) return false;
        // The target is the object just below the MARK, within the
        // enclosing MARK's reach.
        if (mark == 0 || mark <= Fence()) return Underflow();
        const PickleKind kind = op_ == APPENDS    ? PickleKind::kList
                                : op_ == SETITEMS ? PickleKind::kDict
                                                  : PickleKind::kSet;
        return AddToTarget(kind, mark);
      }

      case BINPUT:
      case LONG_BINPUT: {
        const char* p = nullptr;
        const size_t n = op_ == BINPUT ? 1 : 4;
        if (!Take(n, p)) return false;
        return MemoPut(LoadLittleEndian(p, n));
      }
      case PUT: {
        uint64_t index = 0;
        if (!ReadMemoIndex(index)) return false;
        return MemoPut(index);
      }
      case MEMOIZE:
        return MemoPut(memo_.size() + sparse_memo_.size());
      case BINGET:
      case LONG_BINGET: {
        const char* p = nullptr;
        const size_t n = op_ == BINGET ? 1 : 4;
        if (!Take(n, p)) return false;
        return MemoGet(LoadLittleEndian(p, n));
      }
      case GET: {
        uint64_t index = 0;
        if (!ReadMemoIndex(index)) return false;
        return MemoGet(index);
      }

      case PROTO: {
        const char* p = nullptr;
        if (!Take(1, p)) return false;
        const int protocol = static_cast<unsigned char>(*p);
        if (protocol > kHighestProtocol) {
          return Error(absl::StrCat("unsupported pickle protocol ", protocol));
        }
        return true;
      }
      case FRAME: {
        // Frames only group opcodes for buffered reading; the whole input
        // is in memory, so only the length is checked.
        const char* p = nullptr;
        if (!Take(8, p)) return false;
        const uint64_t length = LoadLittleEndian(p, 8);
        if (length > Left()) {
          return Error(absl::StrCat("frame of ", length, " bytes exceeds the ",
                                    Left(), " bytes left"));
        }
        return true;
      }

      case GLOBAL:
      case INST:
        return NotAllowed(InlineGlobalName());
      case STACK_GLOBAL:
        return NotAllowed(StackGlobalName());
      case REDUCE:
      case BUILD:
      case OBJ:
      case NEWOBJ:
      case NEWOBJ_EX:
      case EXT1:
      case EXT2:
      case EXT4:
      case PERSID:
      case BINPERSID:
      case NEXT_BUFFER:
      case READONLY_BUFFER:
        return NotAllowed("");
    }
    error_ = absl::InvalidArgumentError(absl::StrCat(
        "pickle: unknown opcode 0x", absl::Hex(unsigned{op_}, absl::kZeroPad2),
        " at offset ", op_offset_));
    return false;
  }

  // Errors. Each sets error_ and returns false, which the opcode's code
  // returns at once: Run() gives error_ back. (Returning absl::Status from
  // each step cost about 10% of the parse time.) The helpers on the hot path
  // are ABSL_ATTRIBUTE_ALWAYS_INLINE because Step is too big for the
  // compiler to inline them on its own.

  ABSL_ATTRIBUTE_NOINLINE bool Error(std::string_view what) {
    error_ = absl::InvalidArgumentError(
        absl::StrFormat("pickle: opcode %s at offset %d: %s", PickleOpcodeName(op_),
                        op_offset_, what));
    return false;
  }
  bool Underflow() {
    return Error("stack underflow (too few objects above the last MARK)");
  }
  // `name`: the global the opcode names, quoted, or empty.
  bool NotAllowed(std::string_view name) {
    error_ = absl::InvalidArgumentError(absl::StrFormat(
        "pickle: opcode %s%s%s at offset %d is not allowed: snapshots contain "
        "plain data only",
        PickleOpcodeName(op_), name.empty() ? "" : " ", name, op_offset_));
    return false;
  }
  // GLOBAL's and INST's "module\nname\n" argument, for the error message.
  std::string InlineGlobalName() {
    std::string_view module, name;
    if (!ReadLine(module) || !ReadLine(name)) return "";
    return Quote(absl::StrFormat("%s %s", module, name));
  }
  // STACK_GLOBAL's module and name strs from the stack, for the message.
  std::string StackGlobalName() const {
    if (stack_.size() < Fence() + 2) return "";
    const PickleValue& module = stack_[stack_.size() - 2];
    const PickleValue& name = stack_.back();
    if (module.kind() != PickleKind::kStr || name.kind() != PickleKind::kStr) {
      return "";
    }
    return Quote(
        absl::StrFormat("%s %s", doc_.str_value(module), doc_.str_value(name)));
  }

  // Input.

  size_t Left() const { return in_.size() - pos_; }

  // Points `p` at the next `n` bytes and moves past them.
  ABSL_ATTRIBUTE_ALWAYS_INLINE bool Take(uint64_t n, const char*& p) {
    if (ABSL_PREDICT_FALSE(n > Left())) return Truncated(n);
    p = in_.data() + pos_;
    pos_ += n;
    return true;
  }
  ABSL_ATTRIBUTE_NOINLINE bool Truncated(uint64_t n) {
    return Error(absl::StrCat("needs ", n, " bytes, ", Left(), " left"));
  }

  // The text up to the next newline, which it moves past.
  bool ReadLine(std::string_view& line) {
    const size_t newline = in_.find('\n', pos_);
    if (newline == std::string_view::npos) {
      return Error("argument is not terminated by a newline");
    }
    line = in_.substr(pos_, newline - pos_);
    pos_ = newline + 1;
    return true;
  }

  // The stack.

  // Where the innermost MARK is: objects below it are out of reach.
  size_t Fence() const { return marks_.empty() ? 0 : marks_.back(); }

  ABSL_ATTRIBUTE_ALWAYS_INLINE bool PopMark(uint32_t& mark) {
    if (marks_.empty()) return Error("no MARK to pop");
    mark = marks_.back();
    marks_.pop_back();
    return true;
  }

  ABSL_ATTRIBUTE_ALWAYS_INLINE bool Push(PickleValue v) {
    stack_.push_back(v);
    return true;
  }

  // Values.

  static PickleValue Bool(bool b) {
    return PickleValue::Make(PickleKind::kBool, b, false);
  }

  ABSL_ATTRIBUTE_ALWAYS_INLINE PickleValue Int(int64_t i) {
    constexpr int64_t kLimit = int64_t{1} << (63 - PickleValue::kPayloadShift);
    if (i >= -kLimit && i < kLimit) {
      return PickleValue::Make(PickleKind::kInt, static_cast<uint64_t>(i),
                               false);
    }
    PickleDocument::Boxed b;
    b.i = i;
    return Box(PickleKind::kInt, b);
  }

  PickleValue Float(double f) {
    PickleDocument::Boxed b;
    b.f = f;
    return Box(PickleKind::kFloat, b);
  }

  // An int outside int64_t, with its value when it is below 2^64.
  PickleValue BigInt(std::optional<uint64_t> value) {
    if (!value) return PickleValue::Make(PickleKind::kBigInt, 0, false);
    PickleDocument::Boxed b;
    b.i = static_cast<int64_t>(*value);
    return Box(PickleKind::kBigInt, b);
  }

  // A str, bytes or bytearray that the input holds.
  ABSL_ATTRIBUTE_ALWAYS_INLINE PickleValue Str(PickleKind kind,
                                               std::string_view data) {
    constexpr uint64_t kMaxInline = uint64_t{1}
                                    << (64 - PickleValue::kPayloadShift - 32);
    if (data.size() < kMaxInline) {
      const uint64_t offset = static_cast<uint64_t>(data.data() - in_.data());
      return PickleValue::Make(kind, offset | uint64_t{data.size()} << 32,
                               false);
    }
    return BoxStr(kind, data);
  }

  PickleValue BoxStr(PickleKind kind, std::string_view data) {
    PickleDocument::Boxed b;
    b.s = data.data();
    b.size = data.size();
    return Box(kind, b);
  }

  PickleValue Box(PickleKind kind, const PickleDocument::Boxed& b) {
    doc_.boxed_.push_back(b);
    return PickleValue::Make(kind, doc_.boxed_.size() - 1, true);
  }

  // Scalars.

  bool PushUnsigned(size_t bytes) {
    const char* p = nullptr;
    if (!Take(bytes, p)) return false;
    return Push(Int(static_cast<int64_t>(LoadLittleEndian(p, bytes))));
  }

  bool LoadLong() {
    const char* p = nullptr;
    uint64_t length;
    if (op_ == LONG1) {
      if (!Take(1, p)) return false;
      length = static_cast<unsigned char>(*p);
    } else {
      if (!Take(4, p)) return false;
      const int32_t signed_length =
          static_cast<int32_t>(LoadLittleEndian(p, 4));
      if (signed_length < 0) return Error("negative byte count");
      length = static_cast<uint64_t>(signed_length);
    }
    if (!Take(length, p)) return false;
    if (const std::optional<int64_t> value = DecodeLong(p, length)) {
      return Push(Int(*value));
    }
    return Push(BigInt(DecodeUnsignedLong(p, length)));
  }

  // INT ("I-12\n", "I01\n" for True) and LONG ("L12L\n").
  bool LoadDecimal() {
    std::string_view text;
    if (!ReadLine(text)) return false;
    if (op_ == INT && (text == "00" || text == "01")) {
      return Push(Bool(text == "01"));
    }
    if (op_ == LONG && !text.empty() && text.back() == 'L') {
      text.remove_suffix(1);
    }
    std::string_view digits = text;
    if (!digits.empty() && (digits[0] == '-' || digits[0] == '+')) {
      digits.remove_prefix(1);
    }
    // CPython reads INT "010" as octal 8; its pickler writes plain decimal.
    const bool well_formed =
        !digits.empty() &&
        digits.find_first_not_of("0123456789") == std::string_view::npos &&
        (digits.size() == 1 || digits[0] != '0');
    if (!well_formed) return Error(absl::StrCat("malformed int ", Quote(text)));
    if (text[0] == '+') text.remove_prefix(1);
    int64_t value;
    const auto [end, error] =
        std::from_chars(text.data(), text.data() + text.size(), value);
    if (error == std::errc()) return Push(Int(value));
    uint64_t unsigned_value;
    const auto [uend, uerror] = std::from_chars(
        text.data(), text.data() + text.size(), unsigned_value);
    return Push(BigInt(uerror == std::errc()
                           ? std::optional<uint64_t>(unsigned_value)
                           : std::nullopt));
  }

  bool LoadTextFloat() {
    std::string_view text;
    if (!ReadLine(text)) return false;
    double value;
    const auto [end, error] =
        std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc() || end != text.data() + text.size()) {
      return Error(absl::StrCat("malformed float ", Quote(text)));
    }
    return Push(Float(value));
  }

  // Strings.

  // A str, bytes or bytearray whose length precedes it in `length_bytes`
  // little-endian bytes.
  bool LoadCounted(size_t length_bytes, PickleKind kind) {
    const char* p = nullptr;
    if (!Take(length_bytes, p)) return false;
    const uint64_t length = LoadLittleEndian(p, length_bytes);
    if (op_ == BINSTRING && static_cast<int32_t>(length) < 0) {
      return Error("negative byte count");
    }
    if (!Take(length, p)) return false;
    const std::string_view data(p, length);
    if (kind == PickleKind::kStr) {
      // Python 3 decodes protocol 0-2 8-bit strings as ASCII.
      const bool binstring = op_ == SHORT_BINSTRING || op_ == BINSTRING;
      if (binstring ? !IsAscii(data) : !IsValidUtf8(data)) {
        return Error(binstring ? "8-bit string is not ASCII"
                               : "string is not valid UTF-8");
      }
    }
    return Push(Str(kind, data));
  }

  // Keeps a string the input does not hold verbatim.
  PickleValue Decoded(std::string text) {
    return BoxStr(PickleKind::kStr,
                  doc_.decoded_.emplace_back(std::move(text)));
  }

  // STRING: a Python 2 str literal, 'quoted' with backslash escapes, read
  // as ASCII like Python 3 does.
  bool LoadQuotedString() {
    std::string_view text;
    if (!ReadLine(text)) return false;
    if (text.size() < 2 || text.front() != text.back() ||
        (text.front() != '\'' && text.front() != '"')) {
      return Error("argument must be quoted");
    }
    text = text.substr(1, text.size() - 2);
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] != '\\') {
        out += text[i];
        continue;
      }
      if (++i == text.size()) return Error("trailing \\ in string");
      const char c = text[i];
      switch (c) {
        case '\\':
        case '\'':
        case '"':
          out += c;
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'v':
          out += '\v';
          break;
        case 'x': {
          const int hi = i + 1 < text.size() ? HexDigit(text[i + 1]) : -1;
          const int lo = i + 2 < text.size() ? HexDigit(text[i + 2]) : -1;
          if (hi < 0 || lo < 0) return Error("invalid \\x escape");
          out += static_cast<char>(hi * 16 + lo);
          i += 2;
          break;
        }
        default:
          if (c >= '0' && c <= '7') {
            int value = 0;
            for (int n = 0;
                 n < 3 && i < text.size() && text[i] >= '0' && text[i] <= '7';
                 ++n, ++i) {
              value = value * 8 + (text[i] - '0');
            }
            --i;
            out += static_cast<char>(value & 0xff);
          } else {
            // An unknown escape stays as written, as in Python.
            out += '\\';
            out += c;
          }
      }
    }
    if (!IsAscii(out)) return Error("8-bit string is not ASCII");
    return Push(Decoded(std::move(out)));
  }

  // UNICODE: Latin-1 text where \uXXXX and \UXXXXXXXX (after an odd number
  // of backslashes) are code points: Python's raw-unicode-escape.
  bool LoadRawUnicodeEscape() {
    std::string_view text;
    if (!ReadLine(text)) return false;
    std::string out;
    out.reserve(text.size());
    size_t i = 0;
    while (i < text.size()) {
      if (text[i] != '\\') {
        AppendUtf8(static_cast<unsigned char>(text[i++]), out);
        continue;
      }
      size_t run = 0;
      while (i < text.size() && text[i] == '\\') ++run, ++i;
      const bool escape =
          run % 2 == 1 && i < text.size() && (text[i] == 'u' || text[i] == 'U');
      out.append(escape ? run - 1 : run, '\\');
      if (!escape) continue;
      const size_t digits = text[i] == 'u' ? 4 : 8;
      ++i;
      uint32_t cp = 0;
      for (size_t n = 0; n < digits; ++n, ++i) {
        const int d = i < text.size() ? HexDigit(text[i]) : -1;
        if (d < 0) return Error("truncated \\uXXXX escape");
        cp = cp << 4 | static_cast<uint32_t>(d);
      }
      if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
        return Error(absl::StrCat("code point 0x", absl::Hex(cp),
                                  " is not a Unicode scalar value"));
      }
      AppendUtf8(cp, out);
    }
    return Push(Decoded(std::move(out)));
  }

  // Containers.

  PickleValue NewContainer(PickleKind kind) {
    doc_.containers_.emplace_back();
    return PickleValue::Make(kind, doc_.containers_.size() - 1, false);
  }

  // Whether Python could use `v` as a dict key or set item.
  bool Hashable(const PickleValue& v) const {
    switch (v.kind()) {
      case PickleKind::kByteArray:
      case PickleKind::kList:
      case PickleKind::kDict:
      case PickleKind::kSet:
        return false;
      case PickleKind::kTuple:
        return doc_.containers_[v.payload()].hashable;
      default:
        return true;
    }
  }

  // Adds stack_[from..] to `container` (dict: key, value, key, value, ...)
  // and pops them.
  bool AddItems(PickleValue container, size_t from) {
    const PickleValue* first = stack_.data() + from;
    const size_t n = stack_.size() - from;
    const PickleKind kind = container.kind();
    if (kind == PickleKind::kDict && n % 2 != 0) {
      return Error("odd number of objects for dict keys and values");
    }
    if (kind == PickleKind::kDict || kind == PickleKind::kSet ||
        kind == PickleKind::kFrozenSet) {
      const size_t stride = kind == PickleKind::kDict ? 2 : 1;
      for (size_t i = 0; i < n; i += stride) {
        if (!Hashable(first[i])) {
          return Error(
              absl::StrFormat("unhashable %s as a dict key or set item",
                              PickleKindName(first[i].kind())));
        }
      }
    }
    if (n > 0) {
      PickleDocument::Container& c = doc_.containers_[container.payload()];
      const auto begin = static_cast<uint32_t>(doc_.items_.size());
      doc_.items_.insert(doc_.items_.end(), first, first + n);
      const auto count = static_cast<uint32_t>(n);
      if (c.last_chunk != PickleDocument::kNoChunk &&
          doc_.chunks_[c.last_chunk].begin + doc_.chunks_[c.last_chunk].count ==
              begin) {
        doc_.chunks_[c.last_chunk].count += count;
      } else {
        const auto chunk = static_cast<uint32_t>(doc_.chunks_.size());
        doc_.chunks_.push_back({begin, count, PickleDocument::kNoChunk});
        if (c.last_chunk == PickleDocument::kNoChunk) {
          c.first_chunk = chunk;
        } else {
          doc_.chunks_[c.last_chunk].next = chunk;
        }
        c.last_chunk = chunk;
      }
      c.size += count;
    }
    stack_.resize(from);
    return true;
  }

  // Replaces stack_[from..] by a new container of `kind` holding them.
  bool BuildFromTop(PickleKind kind, size_t from) {
    const PickleValue container = NewContainer(kind);
    if (kind == PickleKind::kTuple) {
      bool hashable = true;
      for (size_t i = from; i < stack_.size(); ++i) {
        hashable = hashable && Hashable(stack_[i]);
      }
      doc_.containers_[container.payload()].hashable = hashable;
    }
    if (!AddItems(container, from)) return false;
    return Push(container);
  }

  // Adds stack_[from..] to the container at stack_[from - 1], which must be
  // of `kind`.
  bool AddToTarget(PickleKind kind, size_t from) {
    const PickleValue target = stack_[from - 1];
    if (target.kind() != kind) {
      return Error(absl::StrFormat("adds to a %s, expected a %s",
                                   PickleKindName(target.kind()),
                                   PickleKindName(kind)));
    }
    return AddItems(target, from);
  }

  // The memo: what PUT stored, by index. Python's pickler numbers entries
  // 0, 1, 2, ... (MEMOIZE always takes the next one), which the dense vector
  // holds; any other index goes to the map, so that a large index costs no
  // more memory than a small one.

  bool ReadMemoIndex(uint64_t& index) {
    std::string_view text;
    if (!ReadLine(text)) return false;
    const auto [end, error] =
        std::from_chars(text.data(), text.data() + text.size(), index);
    if (text.empty() || error != std::errc() ||
        end != text.data() + text.size()) {
      return Error(absl::StrCat("malformed memo index ", Quote(text)));
    }
    return true;
  }

  ABSL_ATTRIBUTE_ALWAYS_INLINE bool MemoPut(uint64_t index) {
    if (ABSL_PREDICT_FALSE(stack_.size() <= Fence())) return Underflow();
    const PickleValue top = stack_.back();
    if (ABSL_PREDICT_TRUE(index == memo_.size() && sparse_memo_.empty())) {
      memo_.push_back(top);
    } else if (index < memo_.size()) {
      memo_[index] = top;
    } else if (index == memo_.size()) {
      sparse_memo_.erase(index);
      memo_.push_back(top);
    } else {
      sparse_memo_.insert_or_assign(index, top);
    }
    return true;
  }

  ABSL_ATTRIBUTE_ALWAYS_INLINE bool MemoGet(uint64_t index) {
    if (ABSL_PREDICT_TRUE(index < memo_.size())) return Push(memo_[index]);
    return SparseMemoGet(index);
  }
  ABSL_ATTRIBUTE_NOINLINE bool SparseMemoGet(uint64_t index) {
    const auto it = sparse_memo_.find(index);
    if (it == sparse_memo_.end()) {
      return Error(absl::StrCat("memo index ", index, " was never PUT"));
    }
    return Push(it->second);
  }

  const std::string_view in_;
  const PickleParseOptions options_;
  size_t pos_ = 0;
  // The opcode being run and where it starts.
  uint8_t op_ = 0;
  size_t op_offset_ = 0;

  absl::Status error_;
  PickleDocument doc_;
  std::vector<PickleValue> stack_;
  // Stack sizes at each open MARK.
  std::vector<uint32_t> marks_;
  pickle_internal::HugePageVector<PickleValue> memo_;
  absl::flat_hash_map<uint64_t, PickleValue> sparse_memo_;
};

absl::StatusOr<PickleDocument> ParsePickle(std::string_view bytes,
                                           const PickleParseOptions& options) {
  return Unpickler(bytes, options).Run();
}

}  // namespace allocd
