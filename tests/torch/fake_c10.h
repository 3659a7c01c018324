// A stand-in for PyTorch's libc10.so, for torch_errors_test: the names the
// Itanium C++ ABI gives c10::Error's constructor and c10::OutOfMemoryError's
// type_info and vtable are PyTorch's; the layout is this file's own (which
// ThrowOutOfMemory must not depend on).
#ifndef ALLOCD_TESTS_TORCH_FAKE_C10_H_
#define ALLOCD_TESTS_TORCH_FAKE_C10_H_

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

namespace c10 {

struct SourceLocation {
  const char* function;
  const char* file;
  uint32_t line;
};

class Error : public std::exception {
 public:
  // Defined in fake_c10.cc, as PyTorch defines it in libc10.so.
  Error(SourceLocation where, std::string msg);

  const char* what() const noexcept override { return what_.c_str(); }
  virtual const char* what_without_backtrace() const noexcept {
    return msg_.c_str();
  }
  const std::string& msg() const { return msg_; }

 private:
  // Counts live errors in the library, so a test sees the destructor run.
  struct Tracker {
    int* live = nullptr;
    ~Tracker() {
      if (live != nullptr) --*live;
    }
  };

  std::string msg_;
  std::vector<std::string> context_;
  std::shared_ptr<void> backtrace_;
  std::string what_;
  Tracker tracker_;
};

class OutOfMemoryError : public Error {
  using Error::Error;
};

}  // namespace c10

#endif  // ALLOCD_TESTS_TORCH_FAKE_C10_H_
