// The restricted unpickler against CPython's pickle: opcode by opcode, the
// memo, framing, and what a corrupt or malicious pickle gets.
#include "allocator/trace/pickle.h"

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/trace/pickle_opcodes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace allocd {
namespace {

using namespace std::string_view_literals;

using ::testing::HasSubstr;
using ::testing::StartsWith;

// Python's repr() of `v`, for the kinds of objects these tests use (strs
// without quotes or escapes). Containers deeper than `depth` print as "...",
// so a list that contains itself prints as [[[...]]].
std::string Repr(const PickleDocument& doc, PickleValue v, int depth = 32) {
  if (depth == 0) return "...";
  const auto join = [&](std::string_view open, std::string_view close) {
    std::string out(open);
    bool first = true;
    if (v.kind() == PickleKind::kDict) {
      for (const PickleDocument::Entry& e : doc.entries(v)) {
        absl::StrAppend(&out, first ? "" : ", ", Repr(doc, e.key, depth - 1),
                        ": ", Repr(doc, e.value, depth - 1));
        first = false;
      }
    } else {
      for (PickleValue item : doc.items(v)) {
        absl::StrAppend(&out, first ? "" : ", ", Repr(doc, item, depth - 1));
        first = false;
      }
    }
    return out.append(close);
  };
  const auto bytes_repr = [&] {
    std::string out = "b'";
    for (char c : doc.str_value(v)) {
      if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
        out += c;
      } else {
        absl::StrAppend(
            &out, "\\x",
            absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
      }
    }
    return out + "'";
  };
  switch (v.kind()) {
    case PickleKind::kNone:
      return "None";
    case PickleKind::kBool:
      return doc.bool_value(v) ? "True" : "False";
    case PickleKind::kInt:
      return absl::StrCat(doc.int_value(v));
    case PickleKind::kBigInt:
      return "<bigint>";
    case PickleKind::kFloat: {
      char buffer[32];
      const auto [end, error] =
          std::to_chars(buffer, buffer + sizeof(buffer), doc.float_value(v));
      std::string out(buffer, end);
      if (out.find_first_of(".ein") == std::string::npos) out += ".0";
      return out;
    }
    case PickleKind::kStr:
      return absl::StrCat("'", std::string(doc.str_value(v)), "'");
    case PickleKind::kBytes:
      return bytes_repr();
    case PickleKind::kByteArray:
      return absl::StrCat("bytearray(", bytes_repr(), ")");
    case PickleKind::kTuple:
      return doc.size(v) == 1 ? join("(", ",)") : join("(", ")");
    case PickleKind::kList:
      return join("[", "]");
    case PickleKind::kDict:
      return join("{", "}");
    case PickleKind::kSet:
      return doc.size(v) == 0 ? "set()" : join("{", "}");
    case PickleKind::kFrozenSet:
      return doc.size(v) == 0 ? "frozenset()" : join("frozenset({", "})");
  }
  return "?";
}

// repr() of what `pickle` decodes to, or the error message.
std::string Load(std::string_view pickle) {
  absl::StatusOr<PickleDocument> doc = ParsePickle(pickle);
  if (!doc.ok()) return std::string(doc.status().message());
  return Repr(*doc, doc->root());
}

// The error message for `pickle`, which must not parse.
std::string Error(std::string_view pickle,
                  const PickleParseOptions& options = {}) {
  absl::StatusOr<PickleDocument> doc = ParsePickle(pickle, options);
  if (doc.ok()) return "parsed: " + Repr(*doc, doc->root());
  EXPECT_EQ(doc.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(doc.status().message());
}

std::string FromHex(std::string_view hex) {
  return absl::HexStringToBytes(std::string(hex));
}

// ---------------------------------------------------------------------------
// CPython's own output, protocols 0 to 5.

struct PythonVector {
  int protocol;
  std::string_view hex;
  std::string_view repr;
};

// Made with CPython 3.11:
//   for obj in [None, True, False, [0, 1, 255, ...], ...]:
//     for p in range(first_protocol(obj), 6):
//       print(p, pickle.dumps(obj, protocol=p).hex(), repr(obj))
// Bytes need protocol 3, sets 4 and bytearray 5: before those, Python
// pickles them with REDUCE, which this reader refuses.
constexpr PythonVector kPythonVectors[] = {
    {0, "4e2e", "None"},
    {1, "4e2e", "None"},
    {2, "80024e2e", "None"},
    {3, "80034e2e", "None"},
    {4, "80044e2e", "None"},
    {5, "80054e2e", "None"},
    {0, "4930310a2e", "True"},
    {1, "4930310a2e", "True"},
    {2, "8002882e", "True"},
    {3, "8003882e", "True"},
    {4, "8004882e", "True"},
    {5, "8005882e", "True"},
    {0, "4930300a2e", "False"},
    {1, "4930300a2e", "False"},
    {2, "8002892e", "False"},
    {3, "8003892e", "False"},
    {4, "8004892e", "False"},
    {5, "8005892e", "False"},
    {0,
     "286c70300a49300a6149310a61493235350a61493235360a614936353533350a614936353"
     "533360a61492d310a61492d3132390a6149323134373438333634370a61492d3231343734"
     "38333634380a614c323134373438333634384c0a614c32383832333033373631353137313"
     "13734344c0a614c2d3238383233303337363135313731313734354c0a614c393232333337"
     "323033363835343737353830374c0a614c2d3932323333373230333638353437373538303"
     "84c0a612e",
     "[0, 1, 255, 256, 65535, 65536, -1, -129, 2147483647, -2147483648, "
     "2147483648, 288230376151711744, -288230376151711745, "
     "9223372036854775807, -9223372036854775808]"},
    {1,
     "5d7100284b004b014bff4d00014dffff4a000001004affffffff4a7fffffff4affffff7f4"
     "a000000804c323134373438333634384c0a4c323838323330333736313531373131373434"
     "4c0a4c2d3238383233303337363135313731313734354c0a4c39323233333732303336383"
     "5343737353830374c0a4c2d393232333337323033363835343737353830384c0a652e",
     "[0, 1, 255, 256, 65535, 65536, -1, -129, 2147483647, -2147483648, "
     "2147483648, 288230376151711744, -288230376151711745, "
     "9223372036854775807, -9223372036854775808]"},
    {2,
     "80025d7100284b004b014bff4d00014dffff4a000001004affffffff4a7fffffff4afffff"
     "f7f4a000000808a0500000080008a0800000000000000048a08fffffffffffffffb8a08ff"
     "ffffffffffff7f8a080000000000000080652e",
     "[0, 1, 255, 256, 65535, 65536, -1, -129, 2147483647, -2147483648, "
     "2147483648, 288230376151711744, -288230376151711745, "
     "9223372036854775807, -9223372036854775808]"},
    {3,
     "80035d7100284b004b014bff4d00014dffff4a000001004affffffff4a7fffffff4afffff"
     "f7f4a000000808a0500000080008a0800000000000000048a08fffffffffffffffb8a08ff"
     "ffffffffffff7f8a080000000000000080652e",
     "[0, 1, 255, 256, 65535, 65536, -1, -129, 2147483647, -2147483648, "
     "2147483648, 288230376151711744, -288230376151711745, "
     "9223372036854775807, -9223372036854775808]"},
    {4,
     "80049559000000000000005d94284b004b014bff4d00014dffff4a000001004affffffff4"
     "a7fffffff4affffff7f4a000000808a0500000080008a0800000000000000048a08ffffff"
     "fffffffffb8a08ffffffffffffff7f8a080000000000000080652e",
     "[0, 1, 255, 256, 65535, 65536, -1, -129, 2147483647, -2147483648, "
     "2147483648, 288230376151711744, -288230376151711745, "
     "9223372036854775807, -9223372036854775808]"},
    {5,
     "80059559000000000000005d94284b004b014bff4d00014dffff4a000001004affffffff4"
     "a7fffffff4affffff7f4a000000808a0500000080008a0800000000000000048a08ffffff"
     "fffffffffb8a08ffffffffffffff7f8a080000000000000080652e",
     "[0, 1, 255, 256, 65535, 65536, -1, -129, 2147483647, -2147483648, "
     "2147483648, 288230376151711744, -288230376151711745, "
     "9223372036854775807, -9223372036854775808]"},
    {0,
     "286c70300a46312e350a61462d302e32350a6146302e300a614631652b3130300a612e",
     "[1.5, -0.25, 0.0, 1e+100]"},
    {1,
     "5d710028473ff800000000000047bfd00000000000004700000000000000004754b249ad2"
     "594c37d652e",
     "[1.5, -0.25, 0.0, 1e+100]"},
    {2,
     "80025d710028473ff800000000000047bfd00000000000004700000000000000004754b24"
     "9ad2594c37d652e",
     "[1.5, -0.25, 0.0, 1e+100]"},
    {3,
     "80035d710028473ff800000000000047bfd00000000000004700000000000000004754b24"
     "9ad2594c37d652e",
     "[1.5, -0.25, 0.0, 1e+100]"},
    {4,
     "80049529000000000000005d9428473ff800000000000047bfd0000000000000470000000"
     "0000000004754b249ad2594c37d652e",
     "[1.5, -0.25, 0.0, 1e+100]"},
    {5,
     "80059529000000000000005d9428473ff800000000000047bfd0000000000000470000000"
     "0000000004754b249ad2594c37d652e",
     "[1.5, -0.25, 0.0, 1e+100]"},
    {0,
     "286c70300a5668656c6c6f0a70310a61560a70320a6156e95c75363565355c75363732635"
     "c5530303031663630300a70330a612e",
     "['hello', '', 'é日本😀']"},
    {1,
     "5d710028580500000068656c6c6f710158000000007102580c000000c3a9e697a5e69cacf"
     "09f98807103652e",
     "['hello', '', 'é日本😀']"},
    {2,
     "80025d710028580500000068656c6c6f710158000000007102580c000000c3a9e697a5e69"
     "cacf09f98807103652e",
     "['hello', '', 'é日本😀']"},
    {3,
     "80035d710028580500000068656c6c6f710158000000007102580c000000c3a9e697a5e69"
     "cacf09f98807103652e",
     "['hello', '', 'é日本😀']"},
    {4,
     "8004951f000000000000005d94288c0568656c6c6f948c00948c0cc3a9e697a5e69cacf09"
     "f988094652e",
     "['hello', '', 'é日本😀']"},
    {5,
     "8005951f000000000000005d94288c0568656c6c6f948c00948c0cc3a9e697a5e69cacf09"
     "f988094652e",
     "['hello', '', 'é日本😀']"},
    {3, "80035d710028430071014304000161627102430378797a7103652e",
     "[b'', b'\\x00\\x01ab', b'xyz']"},
    {4, "80049515000000000000005d942843009443040001616294430378797a94652e",
     "[b'', b'\\x00\\x01ab', b'xyz']"},
    {5, "80059515000000000000005d942843009443040001616294430378797a94652e",
     "[b'', b'\\x00\\x01ab', b'xyz']"},
    {0,
     "286470300a56610a70310a286c70320a49310a6149320a612849330a56780a70330a74703"
     "40a617356620a70350a286470360a56630a70370a4e737356640a70380a286c70390a732"
     "e",
     "{'a': [1, 2, (3, 'x')], 'b': {'c': None}, 'd': []}"},
    {1,
     "7d71002858010000006171015d7102284b014b02284b03580100000078710374710465580"
     "10000006271057d710658010000006371074e7358010000006471085d7109752e",
     "{'a': [1, 2, (3, 'x')], 'b': {'c': None}, 'd': []}"},
    {2,
     "80027d71002858010000006171015d7102284b014b024b035801000000787103867104655"
     "8010000006271057d710658010000006371074e7358010000006471085d7109752e",
     "{'a': [1, 2, (3, 'x')], 'b': {'c': None}, 'd': []}"},
    {3,
     "80037d71002858010000006171015d7102284b014b024b035801000000787103867104655"
     "8010000006271057d710658010000006371074e7358010000006471085d7109752e",
     "{'a': [1, 2, (3, 'x')], 'b': {'c': None}, 'd': []}"},
    {4,
     "8004952b000000000000007d94288c0161945d94284b014b024b038c0178948694658c016"
     "2947d948c0163944e738c0164945d94752e",
     "{'a': [1, 2, (3, 'x')], 'b': {'c': None}, 'd': []}"},
    {5,
     "8005952b000000000000007d94288c0161945d94284b014b024b038c0178948694658c016"
     "2947d948c0163944e738c0164945d94752e",
     "{'a': [1, 2, (3, 'x')], 'b': {'c': None}, 'd': []}"},
    {0, "286c70300a286c70310a49310a616167310a612e", "[[1], [1]]"},
    {1, "5d7100285d71014b01616801652e", "[[1], [1]]"},
    {2, "80025d7100285d71014b01616801652e", "[[1], [1]]"},
    {3, "80035d7100285d71014b01616801652e", "[[1], [1]]"},
    {4, "8004950c000000000000005d94285d944b01616801652e", "[[1], [1]]"},
    {5, "8005950c000000000000005d94285d944b01616801652e", "[[1], [1]]"},
    {0,
     "286c70300a2874612849310a7470310a612849310a49320a7470320a612849310a49320a4"
     "9330a7470330a612849310a49320a49330a49340a7470340a612e",
     "[(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)]"},
    {1,
     "5d71002829284b01747101284b014b02747102284b014b024b03747103284b014b024b034"
     "b04747104652e",
     "[(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)]"},
    {2,
     "80025d710028294b018571014b014b028671024b014b024b03877103284b014b024b034b0"
     "4747104652e",
     "[(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)]"},
    {3,
     "80035d710028294b018571014b014b028671024b014b024b03877103284b014b024b034b0"
     "4747104652e",
     "[(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)]"},
    {4,
     "80049523000000000000005d9428294b0185944b014b0286944b014b024b038794284b014"
     "b024b034b047494652e",
     "[(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)]"},
    {5,
     "80059523000000000000005d9428294b0185944b014b0286944b014b024b038794284b014"
     "b024b034b047494652e",
     "[(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)]"},
    {4,
     "80049518000000000000005d94288f94284b014b024b0390284b014b0291948f94652e",
     "[{1, 2, 3}, frozenset({1, 2}), set()]"},
    {5,
     "80059518000000000000005d94288f94284b014b024b0390284b014b0291948f94652e",
     "[{1, 2, 3}, frozenset({1, 2}), set()]"},
    {5, "8005950d000000000000009602000000000000006162942e", "bytearray(b'ab')"},
};

TEST(PickleOpcodesTest, NamedAsPickletoolsNamesThem) {
  EXPECT_EQ(MARK, '(');
  EXPECT_EQ(BINUNICODE, 'X');
  EXPECT_EQ(PROTO, 0x80);
  EXPECT_STREQ(PickleOpcodeName(PROTO), "PROTO");
  EXPECT_STREQ(PickleOpcodeName(SHORT_BINUNICODE), "SHORT_BINUNICODE");
  EXPECT_STREQ(PickleOpcodeName(READONLY_BUFFER), "READONLY_BUFFER");
  // A byte no protocol defines.
  EXPECT_STREQ(PickleOpcodeName(0xff), "?");
}

TEST(PickleTest, DecodesWhatPythonWritesAtEveryProtocol) {
  for (const PythonVector& v : kPythonVectors) {
    SCOPED_TRACE(absl::StrFormat("protocol %d: %s", v.protocol, v.hex));
    EXPECT_EQ(Load(FromHex(v.hex)), v.repr);
  }
}

// ---------------------------------------------------------------------------
// Opcodes one by one (pickletools names; "\x80\x02" is PROTO 2).

TEST(PickleTest, Scalars) {
  EXPECT_EQ(Load("N."), "None");
  EXPECT_EQ(Load("\x80\x02\x88."), "True");
  EXPECT_EQ(Load("\x80\x02\x89."), "False");
  EXPECT_EQ(Load("I42\n."), "42");
  EXPECT_EQ(Load("I-7\n."), "-7");
  EXPECT_EQ(Load("I+7\n."), "7");
  EXPECT_EQ(Load("I01\n."), "True");
  EXPECT_EQ(Load("I00\n."), "False");
  EXPECT_EQ(Load("I99999999999999999999\n."), "<bigint>");
  EXPECT_EQ(Load("L-3L\n."), "-3");
  EXPECT_EQ(Load("L12345678901234567890L\n."), "<bigint>");
  EXPECT_EQ(Load("J\xff\xff\xff\xff."), "-1");
  EXPECT_EQ(Load("K\x07."), "7");
  EXPECT_EQ(Load("M\x00\x01."sv), "256");
  EXPECT_EQ(Load("F1.5\n."), "1.5");
  EXPECT_EQ(Load("F-inf\n."), "-inf");
  EXPECT_EQ(Load("G?\xf8\x00\x00\x00\x00\x00\x00."sv), "1.5");
}

TEST(PickleTest, LongEncodingsAndTheInt64Boundary) {
  EXPECT_EQ(Load("\x8a\x00."sv), "0");
  EXPECT_EQ(Load("\x8a\x01\xff."), "-1");
  EXPECT_EQ(Load("\x8a\x01\x80."), "-128");
  // 2^63 - 1 and -2^63: the int64_t edges, boxed outside the handle.
  EXPECT_EQ(Load("\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f."),
            "9223372036854775807");
  EXPECT_EQ(Load("\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80."sv),
            "-9223372036854775808");
  // 2^63 and 2^64 - 1 do not fit.
  EXPECT_EQ(Load("\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00."sv),
            "<bigint>");
  EXPECT_EQ(Load("\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00."sv),
            "<bigint>");
  // Redundant sign bytes are fine.
  EXPECT_EQ(Load("\x8a\x0a\x05\x00\x00\x00\x00\x00\x00\x00\x00\x00."sv), "5");
  EXPECT_EQ(Load("\x8b\x02\x00\x00\x00\x00\x01."sv), "256");
}

TEST(PickleTest, Strings) {
  EXPECT_EQ(Load("X\x03\x00\x00\x00"
                 "abc."sv),
            "'abc'");
  EXPECT_EQ(Load("\x8c\x03"
                 "abc."),
            "'abc'");
  EXPECT_EQ(Load("\x8d\x02\x00\x00\x00\x00\x00\x00\x00"
                 "hi."sv),
            "'hi'");
  EXPECT_EQ(Load("\x8c\x02\xc3\xa9."), "'\xc3\xa9'");
  EXPECT_EQ(Load("T\x03\x00\x00\x00"
                 "abc."sv),
            "'abc'");
  EXPECT_EQ(Load("U\x03"
                 "abc."),
            "'abc'");
  EXPECT_EQ(Load("C\x02\x00\x01."sv), "b'\\x00\\x01'");
  EXPECT_EQ(Load("B\x01\x00\x00\x00"
                 "z."sv),
            "b'z'");
  EXPECT_EQ(Load("\x8e\x01\x00\x00\x00\x00\x00\x00\x00"
                 "z."sv),
            "b'z'");
  EXPECT_EQ(Load("\x96\x01\x00\x00\x00\x00\x00\x00\x00"
                 "z."sv),
            "bytearray(b'z')");
  // Longer than 255 bytes: BINUNICODE, as Python writes it.
  const std::string long_text(300, 'a');
  EXPECT_EQ(Load(absl::StrCat("X", std::string("\x2c\x01\x00\x00"sv), long_text,
                              ".")),
            absl::StrCat("'", long_text, "'"));
}

TEST(PickleTest, ProtocolZeroStringEscapes) {
  const auto str = [](std::string_view pickle) -> std::string {
    absl::StatusOr<PickleDocument> doc = ParsePickle(pickle);
    if (!doc.ok()) return std::string(doc.status().message());
    return std::string(doc->str_value(doc->root()));
  };
  // STRING: a quoted Python 2 literal, read as ASCII.
  EXPECT_EQ(str("S'a\\x41\\101\\n\\'\\q'\n."), "aAA\n'\\q");
  EXPECT_EQ(str("S\"x\"\n."), "x");
  // UNICODE: raw-unicode-escape. What CPython writes for
  // 'a\\u0041\u00e9\u65e5\n\\' at protocol 0, then \U escapes and a lone
  // backslash pair.
  EXPECT_EQ(str("Va\\u005cu0041\xe9\\u65e5\\u000a\\u005c\n."),
            "a\\u0041\xc3\xa9\xe6\x97\xa5\n\\");
  EXPECT_EQ(str("V\\U0001F600\n."), "\xf0\x9f\x98\x80");
  EXPECT_EQ(str("V\\\\u0041\n."), "\\\\u0041");
}

TEST(PickleTest, Containers) {
  EXPECT_EQ(Load(")."), "()");
  EXPECT_EQ(Load("\x80\x02K\x01\x85."), "(1,)");
  EXPECT_EQ(Load("\x80\x02K\x01K\x02\x86."), "(1, 2)");
  EXPECT_EQ(Load("\x80\x02K\x01K\x02K\x03\x87."), "(1, 2, 3)");
  EXPECT_EQ(Load("(K\x01K\x02K\x03K\x04t."), "(1, 2, 3, 4)");
  EXPECT_EQ(Load("]."), "[]");
  EXPECT_EQ(Load("(K\x01K\x02l."), "[1, 2]");
  EXPECT_EQ(Load("]K\x01"
                 "a."),
            "[1]");
  EXPECT_EQ(Load("](K\x01K\x02"
                 "eK\x03"
                 "a(K\x04"
                 "e."),
            "[1, 2, 3, 4]");
  EXPECT_EQ(Load("}."), "{}");
  EXPECT_EQ(Load("(K\x01K\x02"
                 "d."),
            "{1: 2}");
  EXPECT_EQ(Load("}K\x01K\x02s."), "{1: 2}");
  EXPECT_EQ(Load("}(K\x01K\x02K\x03K\x04u."), "{1: 2, 3: 4}");
  EXPECT_EQ(Load("\x8f."), "set()");
  EXPECT_EQ(Load("\x8f(K\x01K\x02\x90."), "{1, 2}");
  EXPECT_EQ(Load("(K\x01\x91."), "frozenset({1})");
  // A tuple of hashables is a fine key.
  EXPECT_EQ(Load("}K\x01K\x02\x86K\x03s."), "{(1, 2): 3}");
}

TEST(PickleTest, DictFindTakesTheLastOfARepeatedKey) {
  absl::StatusOr<PickleDocument> doc =
      ParsePickle("}(\x8c\x01kK\x01\x8c\x01kK\x02u.");
  ASSERT_TRUE(doc.ok()) << doc.status();
  EXPECT_EQ(doc->size(doc->root()), 2u);
  const std::optional<PickleValue> k = doc->Find(doc->root(), "k");
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(doc->int_value(*k), 2);
  EXPECT_FALSE(doc->Find(doc->root(), "missing").has_value());
}

TEST(PickleTest, StackOpcodes) {
  EXPECT_EQ(Load("K\x01K\x02"
                 "0."),
            "1");  // POP
  EXPECT_EQ(Load("K\x01(K\x02K\x03"
                 "1."),
            "1");  // POP_MARK
  EXPECT_EQ(Load("K\x01"
                 "2\x86."),
            "(1, 1)");  // DUP
  // With nothing above the innermost MARK, POP drops the MARK (CPython).
  EXPECT_EQ(Load("K\x01(0."), "1");
}

TEST(PickleTest, FramesAndProtocolHeaders) {
  // PROTO 4, FRAME of 3 bytes, K 1 STOP.
  EXPECT_EQ(Load("\x80\x04\x95\x03\x00\x00\x00\x00\x00\x00\x00K\x01."sv), "1");
  EXPECT_EQ(Load("\x80\x05N."), "None");
  EXPECT_THAT(
      Error("\x80\x06N."),
      HasSubstr("opcode PROTO at offset 0: unsupported pickle protocol 6"));
  EXPECT_THAT(Error("\x80\x04\x95\xff\x00\x00\x00\x00\x00\x00\x00K\x01."sv),
              HasSubstr("opcode FRAME at offset 2: frame of 255 bytes exceeds "
                        "the 3 bytes left"));
}

// ---------------------------------------------------------------------------
// The memo.

TEST(PickleTest, MemoOpcodes) {
  EXPECT_EQ(Load("K\x05p0\n0g0\n."), "5");  // PUT, GET
  EXPECT_EQ(Load("K\x05q\x03"
                 "0h\x03."),
            "5");  // BINPUT, BINGET
  EXPECT_EQ(Load("K\x05r\x00\x01\x00\x00"
                 "0j\x00\x01\x00\x00."sv),
            "5");
  EXPECT_EQ(Load("\x80\x04K\x05\x94"
                 "0h\x00."sv),
            "5");  // MEMOIZE
  EXPECT_THAT(
      Error("h\x00."sv),
      HasSubstr("opcode BINGET at offset 0: memo index 0 was never PUT"));
}

TEST(PickleTest, MemoSharesContainersLikePython) {
  // a = []; root = [a, a]; then a.append(7) through the memo.
  const std::string pickle(
      "]q\x00"
      "0"sv  // a, PUT 0, POP
      "]q\x01(h\x00h\x00"
      "e"sv  // root = [a, a]
      "h\x00K\x07"
      "a0"sv  // a.append(7), POP a
      ".");
  absl::StatusOr<PickleDocument> doc = ParsePickle(pickle);
  ASSERT_TRUE(doc.ok()) << doc.status();
  EXPECT_EQ(Repr(*doc, doc->root()), "[[7], [7]]");
  std::vector<PickleValue> items;
  for (PickleValue v : doc->items(doc->root())) items.push_back(v);
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[0], items[1]);  // The same list object.
}

TEST(PickleTest, AListThatContainsItself) {
  absl::StatusOr<PickleDocument> doc = ParsePickle(
      "]q\x00h\x00"
      "a."sv);
  ASSERT_TRUE(doc.ok()) << doc.status();
  EXPECT_EQ(Repr(*doc, doc->root(), 3), "[[[...]]]");
  EXPECT_EQ(*doc->items(doc->root()).begin(), doc->root());
}

TEST(PickleTest, LargeMemoIndicesCostNoMemory) {
  // LONG_BINPUT 2^32 - 1 and PUT 10^18: CPython's C unpickler would size its
  // memo array by the index.
  EXPECT_EQ(Load("K\x01r\xff\xff\xff\xff"
                 "0j\xff\xff\xff\xff."),
            "1");
  EXPECT_EQ(Load("K\x01p1000000000000000000\n0g1000000000000000000\n."), "1");
  // MEMOIZE takes the number of entries as its index, PUTs out of order
  // included: 1 goes to 5, 2 to 1.
  EXPECT_EQ(Load("\x80\x04(K\x01q\x05K\x02\x94h\x05h\x01t."), "(1, 2, 1, 2)");
}

// ---------------------------------------------------------------------------
// Malicious and corrupt input.

TEST(PickleTest, RefusesGlobalsAndCalls) {
  // pickle.dumps of a class whose __reduce__ returns (os.system, ('echo',)).
  EXPECT_EQ(Error("\x80\x02"
                  "cos\nsystem\nq\x00X\x04\x00\x00\x00"
                  "echoq\x01\x85q\x02Rq\x03."sv),
            "pickle: opcode GLOBAL 'os system' at offset 2 is not allowed: "
            "snapshots contain plain data only");
  EXPECT_EQ(Error("\x80\x04\x8c\x02os\x8c\x06system\x93."),
            "pickle: opcode STACK_GLOBAL 'os system' at offset 14 is not "
            "allowed: snapshots contain plain data only");
  EXPECT_EQ(Error("(S'ls'\nios\nsystem\n."),
            "pickle: opcode INST 'os system' at offset 7 is not allowed: "
            "snapshots contain plain data only");
  // Each opcode that builds or calls objects, even on plain data.
  for (std::string_view op :
       {"R"sv, "b"sv, "o"sv, "\x81"sv, "\x92"sv, "\x82\x01"sv, "\x83\x01\x00"sv,
        "\x84\x01\x00\x00\x00"sv, "P1\n"sv, "Q"sv, "\x97"sv, "\x98"sv}) {
    const std::string pickle = absl::StrCat("\x80\x05)N", std::string(op), ".");
    SCOPED_TRACE(absl::CHexEscape(pickle));
    EXPECT_THAT(Error(pickle),
                HasSubstr("at offset 4 is not allowed: snapshots contain plain "
                          "data only"));
  }
}

TEST(PickleTest, LyingLengthsAreBoundedByTheInput) {
  EXPECT_EQ(Error("\x80\x03X\xff\xff\xff\xff"
                  "abc."),
            "pickle: opcode BINUNICODE at offset 2: needs 4294967295 bytes, 4 "
            "left");
  EXPECT_THAT(Error("\x8d\xff\xff\xff\xff\xff\xff\xff\xff"
                    "abc."),
              HasSubstr("opcode BINUNICODE8 at offset 0: needs "
                        "18446744073709551615 bytes, 4 left"));
  EXPECT_THAT(Error("\x8e\xff\xff\xff\xff\xff\xff\xff\x7f."),
              HasSubstr("opcode BINBYTES8 at offset 0: needs"));
  EXPECT_THAT(
      Error("\x96\x10\x00\x00\x00\x00\x00\x00\x00."sv),
      HasSubstr("opcode BYTEARRAY8 at offset 0: needs 16 bytes, 1 left"));
  EXPECT_THAT(Error("\x8b\xff\xff\xff\x7f."),
              HasSubstr("opcode LONG4 at offset 0: needs 2147483647 bytes"));
  EXPECT_THAT(Error("\x8b\xff\xff\xff\xff."),
              HasSubstr("opcode LONG4 at offset 0: negative byte count"));
  EXPECT_THAT(Error("T\xff\xff\xff\xff."),
              HasSubstr("opcode BINSTRING at offset 0: negative byte count"));
  EXPECT_THAT(Error("\x8c\x05"
                    "ab."),
              HasSubstr("opcode SHORT_BINUNICODE at offset 0: needs 5 bytes, 3 "
                        "left"));
}

TEST(PickleTest, RejectsMalformedPickles) {
  EXPECT_EQ(Error(""), "pickle: input ends at offset 0 without STOP");
  EXPECT_EQ(Error("K\x01"), "pickle: input ends at offset 2 without STOP");
  EXPECT_EQ(Error("\x80\x02\xff."), "pickle: unknown opcode 0xff at offset 2");
  EXPECT_THAT(Error("."), HasSubstr("opcode STOP at offset 0: expects one "
                                    "object on the stack, not 0"));
  EXPECT_THAT(Error("K\x01K\x02."), HasSubstr("not 2 and 0 open MARKs"));
  EXPECT_THAT(Error("(K\x01."), HasSubstr("not 1 and 1 open MARKs"));
  EXPECT_THAT(Error("N.N"), HasSubstr("opcode STOP at offset 1: 1 bytes "
                                      "follow STOP"));
  EXPECT_THAT(Error("K\x01\x8c\x02\xc3(."),
              HasSubstr("opcode SHORT_BINUNICODE at offset 2: string is not "
                        "valid UTF-8"));
  // A UTF-8-encoded surrogate (Python's surrogatepass would take it).
  EXPECT_THAT(Error("\x8c\x03\xed\xa0\x80."), HasSubstr("not valid UTF-8"));
  EXPECT_THAT(Error("U\x01\xe9."), HasSubstr("8-bit string is not ASCII"));
  EXPECT_THAT(Error("I0x10\n."), HasSubstr("opcode INT at offset 0: malformed "
                                           "int '0x10'"));
  EXPECT_THAT(Error("I010\n."), HasSubstr("malformed int '010'"));
  EXPECT_THAT(Error("Fabc\n."), HasSubstr("malformed float 'abc'"));
  EXPECT_THAT(Error("I12"), HasSubstr("opcode INT at offset 0: argument is "
                                      "not terminated by a newline"));
  EXPECT_THAT(Error("p-1\n."), HasSubstr("malformed memo index '-1'"));
  EXPECT_THAT(Error("Sabc\n."), HasSubstr("argument must be quoted"));
  EXPECT_THAT(Error("S'a\\'\n."), HasSubstr("trailing \\ in string"));
  EXPECT_THAT(Error("S'\\x4'\n."), HasSubstr("invalid \\x escape"));
  EXPECT_THAT(Error("V\\u12\n."), HasSubstr("truncated \\uXXXX escape"));
  EXPECT_THAT(Error("V\\U00110000\n."),
              HasSubstr("code point 0x110000 is not a Unicode scalar value"));
  EXPECT_THAT(Error("V\\ud800\n."), HasSubstr("code point 0xd800"));
}

TEST(PickleTest, RejectsStackMisuse) {
  EXPECT_THAT(Error("a."), HasSubstr("opcode APPEND at offset 0: stack "
                                     "underflow"));
  // An opcode cannot reach below the innermost MARK.
  EXPECT_THAT(Error("]K\x01(a."), HasSubstr("opcode APPEND at offset 4: stack "
                                            "underflow"));
  EXPECT_THAT(Error("(2."),
              HasSubstr("opcode DUP at offset 1: stack underflow"));
  EXPECT_THAT(Error("(e."), HasSubstr("opcode APPENDS at offset 1: stack "
                                      "underflow"));
  EXPECT_THAT(Error("0."),
              HasSubstr("opcode POP at offset 0: stack underflow"));
  EXPECT_THAT(Error("1."), HasSubstr("opcode POP_MARK at offset 0: no MARK"));
  EXPECT_THAT(Error("t."), HasSubstr("opcode TUPLE at offset 0: no MARK"));
  EXPECT_THAT(Error("\x86."), HasSubstr("opcode TUPLE2 at offset 0: stack "
                                        "underflow"));
  EXPECT_THAT(Error("}K\x01"
                    "a."),
              HasSubstr("opcode APPEND at offset 3: adds to a dict, expected a "
                        "list"));
  EXPECT_THAT(Error("](K\x01u."),
              HasSubstr("opcode SETITEMS at offset 4: adds to a list, expected "
                        "a dict"));
  EXPECT_THAT(Error("}(K\x01u."),
              HasSubstr("odd number of objects for dict keys and values"));
  EXPECT_THAT(Error("}]K\x01s."),
              HasSubstr("opcode SETITEM at offset 4: unhashable list as a dict "
                        "key or set item"));
  EXPECT_THAT(Error("}]\x85K\x01s."), HasSubstr("unhashable tuple"));
  EXPECT_THAT(Error("\x8f(}\x90."), HasSubstr("unhashable dict"));
  EXPECT_THAT(Error("q\x00."sv), HasSubstr("opcode BINPUT at offset 0: stack "
                                           "underflow"));
}

TEST(PickleTest, LimitsMarkNesting) {
  EXPECT_THAT(Error(std::string(1001, '(') + "."),
              HasSubstr("opcode MARK at offset 1000: nesting is deeper than "
                        "1000"));
  PickleParseOptions shallow;
  shallow.max_depth = 2;
  EXPECT_THAT(Error("(((", shallow), HasSubstr("nesting is deeper than 2"));
  EXPECT_EQ(Load(std::string(1000, '(') + std::string(1000, 'l') + "."),
            std::string(32, '[') + "..." + std::string(32, ']'));
}

TEST(PickleTest, DeepListsWithoutMarksParseWithoutRecursion) {
  // [[[...]]] 200,000 deep: EMPTY_LIST x n, then APPEND x (n - 1).
  constexpr int kDepth = 200000;
  const std::string pickle =
      std::string(kDepth, ']') + std::string(kDepth - 1, 'a') + ".";
  absl::StatusOr<PickleDocument> doc = ParsePickle(pickle);
  ASSERT_TRUE(doc.ok()) << doc.status();
  EXPECT_EQ(Repr(*doc, doc->root(), 3), "[[[...]]]");
}

// Every proper prefix of a valid pickle is an error, never a crash; a
// single corrupted byte gives a clean error or some other document (the
// sanitizer builds check there is no bad access either way).
TEST(PickleTest, TruncatedAndCorruptedPicklesFailCleanly) {
  for (const PythonVector& v : kPythonVectors) {
    SCOPED_TRACE(absl::StrFormat("protocol %d: %s", v.protocol, v.hex));
    const std::string pickle = FromHex(v.hex);
    for (size_t n = 0; n < pickle.size(); ++n) {
      EXPECT_FALSE(ParsePickle(pickle.substr(0, n)).ok()) << n;
    }
    for (size_t i = 0; i < pickle.size(); ++i) {
      for (int delta : {1, 0x7f, 0xff}) {
        std::string corrupt = pickle;
        corrupt[i] = static_cast<char>(corrupt[i] + delta);
        absl::StatusOr<PickleDocument> doc = ParsePickle(corrupt);
        if (doc.ok()) Repr(*doc, doc->root());
      }
    }
  }
}

}  // namespace
}  // namespace allocd
