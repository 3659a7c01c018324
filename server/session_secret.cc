#include "server/session_secret.h"

#include <sys/random.h>

#include <cerrno>

namespace allocd {

std::string NewSessionSecret() {
  std::string secret(kSessionSecretBytes, '\0');
  size_t filled = 0;
  while (filled < secret.size()) {
    const ssize_t n =
        getrandom(secret.data() + filled, secret.size() - filled, 0);
    if (n > 0) filled += static_cast<size_t>(n);
    // n < 0 is EINTR (a signal while the pool was not yet seeded): again.
  }
  return secret;
}

bool SameSecret(absl::string_view secret, absl::string_view given) {
  if (secret.empty() || secret.size() != given.size()) return false;
  // Every byte is looked at, whatever the first difference: no early exit.
  unsigned char differ = 0;
  for (size_t i = 0; i < secret.size(); ++i) {
    differ |= static_cast<unsigned char>(secret[i] ^ given[i]);
  }
  return differ == 0;
}

}  // namespace allocd
