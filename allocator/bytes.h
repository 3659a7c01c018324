// Byte counts for people: PyTorch's format_size, and a parser for sizes such
// as "80GB", "79.1GiB" or "84465090560".
#ifndef ALLOCD_ALLOCATOR_BYTES_H_
#define ALLOCD_ALLOCATOR_BYTES_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace allocd {

// As PyTorch formats sizes in its messages: "512 bytes", "1.50 KiB",
// "20.00 MiB", "7.41 GiB".
std::string FormatSize(uint64_t bytes);

// Parses a byte count: a plain integer, or a number with a unit: B, KB, MB,
// GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024),
// case-insensitive, optional space. InvalidArgument for anything else,
// negative values, or values over 2^64.
absl::StatusOr<uint64_t> ParseSize(std::string_view text);

}  // namespace allocd

#endif  // ALLOCD_ALLOCATOR_BYTES_H_
