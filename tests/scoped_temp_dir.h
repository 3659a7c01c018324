// ScopedTempDir: a test's own temporary directory, for the tests that would
// otherwise leave theirs in /tmp.
#ifndef ALLOCD_TESTS_SCOPED_TEMP_DIR_H_
#define ALLOCD_TESTS_SCOPED_TEMP_DIR_H_

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

namespace allocd {

// A fresh directory of a test's own, removed with everything in it when the
// object goes. A fixture whose daemon (or other process) works in the
// directory declares it before the members that stop that process, so it is
// destroyed after them. Not copyable; a move hands the directory over.
class ScopedTempDir {
 public:
  // Makes PARENT/PREFIXxxxxxx with mkdtemp (mode 0700, a name no other test
  // holds). PARENT is /tmp unless given, not testing::TempDir(): a daemon's
  // socket in it must stay within 107 bytes, and the security tests' other
  // uids must reach it. If it cannot be made the test binary aborts, saying
  // why: no test may go on in a directory it did not get.
  explicit ScopedTempDir(std::string_view prefix,
                         std::string_view parent = "/tmp") {
    std::string pattern =
        std::string(parent) + "/" + std::string(prefix) + "XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      const int error = errno;
      std::fprintf(stderr, "ScopedTempDir: mkdtemp(%s): %s\n",
                   pattern.c_str(), std::strerror(error));
      std::abort();
    }
    path_ = std::move(pattern);
  }

  // Removes the directory and everything in it; never throws (what cannot
  // be removed is left).
  ~ScopedTempDir() { Remove(); }

  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;

  // The moved-from object owns nothing and removes nothing.
  ScopedTempDir(ScopedTempDir&& other) noexcept
      : path_(std::exchange(other.path_, std::string())) {}
  // Removes this one's directory first.
  ScopedTempDir& operator=(ScopedTempDir&& other) noexcept {
    if (this != &other) {
      Remove();
      path_ = std::exchange(other.path_, std::string());
    }
    return *this;
  }

  // The directory: PARENT/PREFIXxxxxxx, no trailing slash ("" once moved
  // from).
  const std::string& path() const { return path_; }

 private:
  void Remove() noexcept {
    if (path_.empty()) return;
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }

  std::string path_;
};

}  // namespace allocd

#endif  // ALLOCD_TESTS_SCOPED_TEMP_DIR_H_
