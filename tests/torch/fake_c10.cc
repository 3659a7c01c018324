#include "tests/torch/fake_c10.h"

#include <utility>

// Errors constructed and not yet destroyed.
extern "C" {
int fake_c10_live_errors = 0;
}

namespace c10 {

Error::Error(SourceLocation where, std::string msg)
    : msg_(std::move(msg)),
      what_(msg_ + " (thrown from " + where.function + " at " + where.file +
            ")") {
  tracker_.live = &fake_c10_live_errors;
  ++fake_c10_live_errors;
}

}  // namespace c10

// Makes the library define OutOfMemoryError's type_info and vtable, as
// PyTorch's libc10_cuda.so does by throwing it.
extern "C" void fake_c10_throw_out_of_memory() {
  throw c10::OutOfMemoryError({__func__, __FILE__, __LINE__}, "fake");
}
