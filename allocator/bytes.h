// Byte counts for people: PyTorch's format_size, and the one parser for
// sizes that every allocd command, flag and config file uses ("80GB",
// "79.1GiB", "80Gi", "90%").
#ifndef ALLOCD_ALLOCATOR_BYTES_H_
#define ALLOCD_ALLOCATOR_BYTES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace allocd {

// As PyTorch formats sizes in its messages: "512 bytes", "1.50 KiB",
// "20.00 MiB", "7.41 GiB".
std::string FormatSize(uint64_t bytes);

// What a size means where it is written.
struct SizeContext {
  // What "N%" is a percentage of (a device's total memory, a pool's
  // capacity). Without it a percentage is an error that gives
  // `no_percent_reason`.
  std::optional<uint64_t> percent_of;
  std::string no_percent_reason = "there is no device here to take it of";
  // A number without a unit is a byte count. Only for fields documented as
  // bytes (JSON fields named *_bytes, values other programs print); a
  // person's "80" is refused with "did you mean 80GB?", because 80 bytes is
  // never what they meant.
  bool bare_number_is_bytes = false;
};

// Parses a size: a number (decimals allowed: "79.1GiB") with a unit,
// case-insensitive, an optional space between:
//   B                          bytes
//   KB MB GB TB, or K M G T    powers of 1000 (Kubernetes writes "80G")
//   KiB MiB GiB TiB, or Ki Mi Gi Ti   powers of 1024 (Kubernetes: "80Gi")
//   N%                         N percent of context.percent_of, 0 < N <= 100
// rounded to whole bytes. InvalidArgument, with a message that says what to
// write instead, for a number without a unit (unless
// context.bare_number_is_bytes), a percentage without context.percent_of,
// negative or malformed values, and values of 2^64 bytes or more.
absl::StatusOr<uint64_t> ParseSize(std::string_view text,
                                   const SizeContext& context = {});

}  // namespace allocd

#endif  // ALLOCD_ALLOCATOR_BYTES_H_
