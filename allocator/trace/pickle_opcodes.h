// Python's pickle opcodes, named as in CPython's pickletools so that error
// messages and the reader's table read like `python -m pickletools` output:
// what the snapshot reader (pickle.cc) and writer (pickle_writer.cc) share.
#ifndef ALLOCD_ALLOCATOR_TRACE_PICKLE_OPCODES_H_
#define ALLOCD_ALLOCATOR_TRACE_PICKLE_OPCODES_H_

#include <cstdint>

namespace allocd {

// clang-format off
#define ALLOCD_PICKLE_OPCODES(X)                                            \
  X(MARK, '(') X(STOP, '.') X(POP, '0') X(POP_MARK, '1') X(DUP, '2')        \
  X(FLOAT, 'F') X(INT, 'I') X(BININT, 'J') X(BININT1, 'K') X(LONG, 'L')     \
  X(BININT2, 'M') X(NONE, 'N') X(PERSID, 'P') X(BINPERSID, 'Q')             \
  X(REDUCE, 'R') X(STRING, 'S') X(BINSTRING, 'T') X(SHORT_BINSTRING, 'U')   \
  X(UNICODE, 'V') X(BINUNICODE, 'X') X(APPEND, 'a') X(BUILD, 'b')           \
  X(GLOBAL, 'c') X(DICT, 'd') X(EMPTY_DICT, '}') X(APPENDS, 'e')            \
  X(GET, 'g') X(BINGET, 'h') X(INST, 'i') X(LONG_BINGET, 'j') X(LIST, 'l')  \
  X(EMPTY_LIST, ']') X(OBJ, 'o') X(PUT, 'p') X(BINPUT, 'q')                 \
  X(LONG_BINPUT, 'r') X(SETITEM, 's') X(TUPLE, 't') X(EMPTY_TUPLE, ')')     \
  X(SETITEMS, 'u') X(BINFLOAT, 'G') X(PROTO, 0x80) X(NEWOBJ, 0x81)          \
  X(EXT1, 0x82) X(EXT2, 0x83) X(EXT4, 0x84) X(TUPLE1, 0x85)                 \
  X(TUPLE2, 0x86) X(TUPLE3, 0x87) X(NEWTRUE, 0x88) X(NEWFALSE, 0x89)        \
  X(LONG1, 0x8a) X(LONG4, 0x8b) X(BINBYTES, 'B') X(SHORT_BINBYTES, 'C')     \
  X(SHORT_BINUNICODE, 0x8c) X(BINUNICODE8, 0x8d) X(BINBYTES8, 0x8e)         \
  X(EMPTY_SET, 0x8f) X(ADDITEMS, 0x90) X(FROZENSET, 0x91)                   \
  X(NEWOBJ_EX, 0x92) X(STACK_GLOBAL, 0x93) X(MEMOIZE, 0x94)                 \
  X(FRAME, 0x95) X(BYTEARRAY8, 0x96) X(NEXT_BUFFER, 0x97)                   \
  X(READONLY_BUFFER, 0x98)
// clang-format on

enum PickleOpcode : uint8_t {
#define ALLOCD_PICKLE_ENUM(name, code) name = code,
  ALLOCD_PICKLE_OPCODES(ALLOCD_PICKLE_ENUM)
#undef ALLOCD_PICKLE_ENUM
};

// The opcode's pickletools name, "?" for a byte that is none.
inline const char* PickleOpcodeName(uint8_t op) {
  switch (op) {
#define ALLOCD_PICKLE_NAME(name, code) \
  case name:                           \
    return #name;
    ALLOCD_PICKLE_OPCODES(ALLOCD_PICKLE_NAME)
#undef ALLOCD_PICKLE_NAME
  }
  return "?";
}

}  // namespace allocd

#endif  // ALLOCD_ALLOCATOR_TRACE_PICKLE_OPCODES_H_
