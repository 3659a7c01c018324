// Session secrets: what proves a session, besides the caller's kernel
// credentials. Session ids are small counters anyone can guess; the secret
// is handed only to the client that registered the session
// (RegisterResponse.session_secret) and every request naming the session
// carries it.
#ifndef ALLOCD_SERVER_SESSION_SECRET_H_
#define ALLOCD_SERVER_SESSION_SECRET_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace allocd {

// Bytes in a secret: 256 random bits.
inline constexpr size_t kSessionSecretBytes = 32;

// kSessionSecretBytes from getrandom(2) (the kernel's CSPRNG; waits, once
// at boot, for it to be seeded). Thread-safe.
std::string NewSessionSecret();

// Whether `given` is `secret`, in a time that depends on their lengths
// only, never on where they differ: a caller timing refusals learns
// nothing of the secret. An empty `secret` matches nothing.
bool SameSecret(absl::string_view secret, absl::string_view given);

}  // namespace allocd

#endif  // ALLOCD_SERVER_SESSION_SECRET_H_
