#include "client/thread_name.h"

#include <pthread.h>

namespace allocd {

// Linux's limit: 16 bytes with the terminating NUL.
constexpr size_t kMaxThreadName = 15;

void NameThisThread(const std::string& name) {
  (void)pthread_setname_np(pthread_self(), name.substr(0, kMaxThreadName).c_str());
}

std::string ThisThreadName() {
  char name[kMaxThreadName + 1] = {};
  if (pthread_getname_np(pthread_self(), name, sizeof(name)) != 0) return "";
  return name;
}

}  // namespace allocd
