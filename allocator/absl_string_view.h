// Debian's abseil has a string_view of its own rather than an alias of
// std::string_view: ToAbsl is where a std::string_view meets abseil's
// string functions (a view of the same bytes, nothing copied).
#ifndef ALLOCD_ALLOCATOR_ABSL_STRING_VIEW_H_
#define ALLOCD_ALLOCATOR_ABSL_STRING_VIEW_H_

#include <string_view>

#include "absl/strings/string_view.h"

namespace allocd {

inline absl::string_view ToAbsl(std::string_view text) {
  return absl::string_view(text.data(), text.size());
}

}  // namespace allocd

#endif  // ALLOCD_ALLOCATOR_ABSL_STRING_VIEW_H_
