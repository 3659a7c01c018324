// SessionId: how the daemon names a client session, in every part of it
// (the pool, the registry, the autotuner, metrics).
#ifndef ALLOCD_SERVER_SESSION_ID_H_
#define ALLOCD_SERVER_SESSION_ID_H_

#include <cstdint>

namespace allocd {

// The daemon's id of a session, unique for the daemon's life. 0 is not a
// session.
using SessionId = uint64_t;

}  // namespace allocd

#endif  // ALLOCD_SERVER_SESSION_ID_H_
