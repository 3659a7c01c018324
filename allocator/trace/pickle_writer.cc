#include "allocator/trace/pickle_writer.h"

#include <bit>
#include <cassert>
#include <limits>

#include "allocator/absl_string_view.h"
#include "allocator/trace/pickle_opcodes.h"

namespace allocd {
namespace {

// CPython's pickler writes at most this many list items or dict pairs per
// APPENDS/SETITEMS.
constexpr uint32_t kBatchSize = 1000;

}  // namespace

PickleWriter::PickleWriter() {
  Op(PROTO);
  Op(2);
}

void PickleWriter::LittleEndian(uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) {
    out_ += static_cast<char>(value >> (8 * i));
  }
}

void PickleWriter::BeforeValue() {
  if (!open_.empty() && open_.back().batch == 0) Op(MARK);
}

void PickleWriter::AfterValue() {
  if (open_.empty()) return;
  OpenContainer& c = open_.back();
  ++c.batch;
  if (c.batch == (c.is_dict ? 2 * kBatchSize : kBatchSize)) FlushBatch();
}

void PickleWriter::FlushBatch() {
  OpenContainer& c = open_.back();
  if (c.batch == 0) return;
  assert(!c.is_dict || c.batch % 2 == 0);
  Op(c.is_dict ? SETITEMS : APPENDS);
  c.batch = 0;
}

PickleWriter& PickleWriter::None() {
  BeforeValue();
  Op(NONE);
  AfterValue();
  return *this;
}

PickleWriter& PickleWriter::Bool(bool value) {
  BeforeValue();
  Op(value ? NEWTRUE : NEWFALSE);
  AfterValue();
  return *this;
}

PickleWriter& PickleWriter::Int(int64_t value) {
  BeforeValue();
  if (value >= 0 && value <= 0xff) {
    Op(BININT1);
    LittleEndian(static_cast<uint64_t>(value), 1);
  } else if (value >= 0 && value <= 0xffff) {
    Op(BININT2);
    LittleEndian(static_cast<uint64_t>(value), 2);
  } else if (value >= std::numeric_limits<int32_t>::min() &&
             value <= std::numeric_limits<int32_t>::max()) {
    Op(BININT);
    LittleEndian(static_cast<uint64_t>(value), 4);
  } else {
    // The shortest two's complement: drop top bytes that only repeat the
    // sign of the byte below them.
    const auto bits = static_cast<uint64_t>(value);
    int bytes = 8;
    while (bytes > 1) {
      const auto top = static_cast<uint8_t>(bits >> (8 * (bytes - 1)));
      const bool below_negative = (bits >> (8 * (bytes - 1) - 1) & 1) != 0;
      if (top != (value < 0 ? 0xff : 0x00) || below_negative != (value < 0)) {
        break;
      }
      --bytes;
    }
    Op(LONG1);
    Op(static_cast<uint8_t>(bytes));
    LittleEndian(bits, bytes);
  }
  AfterValue();
  return *this;
}

PickleWriter& PickleWriter::Uint(uint64_t value) {
  if (value <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return Int(static_cast<int64_t>(value));
  }
  // Bit 63 set: nine bytes, the last a zero sign byte.
  BeforeValue();
  Op(LONG1);
  Op(9);
  LittleEndian(value, 8);
  Op(0);
  AfterValue();
  return *this;
}

void PickleWriter::Memo(bool put, uint32_t index) {
  if (index <= 0xff) {
    Op(put ? BINPUT : BINGET);
    LittleEndian(index, 1);
  } else {
    Op(put ? LONG_BINPUT : LONG_BINGET);
    LittleEndian(index, 4);
  }
}

PickleWriter& PickleWriter::Str(std::string_view text) {
  BeforeValue();
  // Heterogeneous lookup wants abseil's string_view.
  const auto [it, fresh] =
      memo_.try_emplace(ToAbsl(text), static_cast<uint32_t>(memo_.size()));
  if (fresh) {
    Op(BINUNICODE);
    LittleEndian(text.size(), 4);
    out_ += text;
  }
  Memo(/*put=*/fresh, it->second);
  AfterValue();
  return *this;
}

PickleWriter& PickleWriter::BeginList() {
  BeforeValue();
  Op(EMPTY_LIST);
  open_.push_back({.is_dict = false});
  return *this;
}

PickleWriter& PickleWriter::EndList() {
  assert(!open_.empty() && !open_.back().is_dict);
  FlushBatch();
  open_.pop_back();
  AfterValue();
  return *this;
}

PickleWriter& PickleWriter::BeginDict() {
  BeforeValue();
  Op(EMPTY_DICT);
  open_.push_back({.is_dict = true});
  return *this;
}

PickleWriter& PickleWriter::EndDict() {
  assert(!open_.empty() && open_.back().is_dict);
  FlushBatch();
  open_.pop_back();
  AfterValue();
  return *this;
}

std::string PickleWriter::Finish() {
  assert(open_.empty());
  Op(STOP);
  return std::move(out_);
}

}  // namespace allocd
