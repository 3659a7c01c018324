// ChunkGrants: the process's chunks of daemon memory: acquiring them (a
// round trip on the lease when the daemon can grant at once, over gRPC
// and a claim on the lease when it has to wait), reading grants ahead,
// releasing them, and sharing them with other processes.
//
// A grant's FDs arrive over the lease connection with SCM_RIGHTS. Every
// chunk granted is recorded in HeldChunks until released, so a restarted
// daemon hears of it; a chunk granted by a daemon that went away is
// released to the one that adopted it, or only forgotten here.
//
// Thread-safe. One background thread reads grants ahead
// (GrantReadAhead), when options.read_ahead_keep is not zero; one returns
// chunks (ChunkReleaser), when options.release_in_background.
#ifndef ALLOCD_CLIENT_CHUNK_GRANTS_H_
#define ALLOCD_CLIENT_CHUNK_GRANTS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/chunk_releaser.h"
#include "client/daemon_client_options.h"
#include "client/daemon_connection.h"
#include "client/grant_read_ahead.h"
#include "client/held_chunks.h"
#include "client/received_chunks.h"

namespace allocd {

class ChunkGrants {
 public:
  // Grants go over `active`'s current connection and into `held`; the bytes
  // read ahead go to `report_read_ahead` after every change. `options`,
  // `active` and `held` outlive the grants.
  ChunkGrants(const DaemonClientOptions& options, ActiveConnection& active,
              HeldChunks& held,
              std::function<void(uint64_t bytes)> report_read_ahead);
  // Gives back what was read ahead (after a fetch in flight) and delivers
  // the releases pending.
  ~ChunkGrants();
  ChunkGrants(const ChunkGrants&) = delete;
  ChunkGrants& operator=(const ChunkGrants&) = delete;

  // At least `bytes` of chunks, none larger than `max_chunk_bytes` (the
  // daemon's chunk sizes up to it, largest first; chunk_bytes for chunks
  // of the smallest size only, e.g. to unmap any of them on its own later).
  // ResourceExhausted when the node (or a quota) has no more; Unavailable
  // when the daemon stayed away longer than reconnect_wait. When the daemon
  // cannot grant at once (it would wait for other sessions to give memory
  // back, or refuses for lack of it), the releases pending (ReleaseSoon)
  // are delivered first and the grant asked for again. With
  // read_ahead_keep, the second call in a row with the same arguments
  // starts asking for the next grants like it in the background
  // (GrantReadAhead). With `client_creates`, the chunks the daemon has not
  // cached come as ReceivedChunks.client_made, for the caller to make
  // (AcquireChunksRequest.client_creates; a daemon before it creates them).
  absl::StatusOr<ReceivedChunks> Acquire(uint64_t bytes,
                                         uint64_t max_chunk_bytes,
                                         bool client_creates);
  // Up to `count` grants of `bytes` each (as Acquire's, split), asked for
  // ahead of need (AcquireChunksRequest.read_ahead): only what the daemon
  // gives at once from its cache, or, with `client_creates`, as budget;
  // none when it would wait or create, is away, or refused.
  std::vector<ReceivedChunks> AcquireAhead(uint64_t bytes,
                                           uint64_t max_chunk_bytes,
                                           uint32_t count,
                                           bool client_creates);
  // A grant as Acquire's (the daemon may ask other sessions to give back
  // what they cache, and the caller waits for it), asked for ahead of a need
  // the caller foresees (the pre-warm of a recurring peak), parked for the
  // next Acquire with the same arguments: that one then asks the daemon
  // nothing, and, come while the grant is asked for, waits for it
  // (GrantReadAhead::BeginPark, Park). Unused, it is given back after
  // read_ahead_keep, or when the daemon asks for memory back (it counts as
  // read ahead). FailedPrecondition without read-ahead
  // (options.read_ahead_keep zero); Aborted when the daemon asked for memory
  // back meanwhile (the grant went back); otherwise Acquire's errors
  // (ResourceExhausted: the daemon could not give it). Nothing is parked
  // on an error.
  absl::Status Prewarm(uint64_t bytes, uint64_t max_chunk_bytes,
                       bool client_creates);
  // The grant parked for Acquire's arguments (read ahead, or by Prewarm),
  // for the caller to map itself; nullopt when none is (a request took
  // it). Asks the daemon nothing; waits only for a fetch in flight.
  std::optional<ReceivedChunks> TakeParked(uint64_t bytes,
                                           uint64_t max_chunk_bytes,
                                           bool client_creates);
  // Returns chunks granted in `epoch` to the daemon that owns them now (the
  // one that granted them, or a restarted one that adopted them); chunks no
  // live daemon owns are only forgotten here.
  absl::Status Release(uint64_t epoch, absl::Span<const uint64_t> ids);
  // Release without waiting for the daemon, with
  // options.release_in_background: the chunks are forgotten here at once
  // (never to be mapped again: the caller unmapped them), and the
  // ChunkReleaser tells the daemon within about a round trip, batched with
  // the other releases of that time. A daemon gone meanwhile takes them
  // back as Release says. Without the option, Release.
  void ReleaseSoon(uint64_t epoch, absl::Span<const uint64_t> ids);
  // Returns once every ReleaseSoon before the call reached the daemon;
  // whether one had not yet.
  bool FlushReleases();
  // Whether a ReleaseSoon has not reached the daemon yet.
  bool ReleasesPending() const;
  // ReleaseChunks calls the background releases took (0 without them).
  uint64_t background_release_calls() const;
  // Acquires that asked the daemon themselves: not served by a grant read
  // ahead.
  uint64_t own_acquires() const { return own_acquires_.load(); }
  // The daemon asked for memory back: gives back what was read ahead, and
  // delivers the releases pending (the reclaim waits for them to arrive).
  // Returns the bytes read ahead it gives back.
  uint64_t GiveBackForReclaim();

  // Sharing chunks with other processes (CUDA IPC). Share: a token under
  // which other sessions of the daemon may open chunks `ids` of `epoch`,
  // which this process holds (FailedPrecondition for an older epoch's that
  // the daemon now did not adopt).
  absl::StatusOr<std::string> Share(uint64_t epoch,
                                    absl::Span<const uint64_t> ids);
  // The chunks another process shared under `share_token`, to map while it
  // keeps them; CloseShare (with the answer's epoch) when done. NotFound
  // when the token is unknown or its owner freed the memory or ended.
  absl::StatusOr<ReceivedChunks> OpenShare(const std::string& share_token);
  // Closes an open of `epoch` (of an older epoch: a no-op, that daemon
  // closed it when the session ended).
  absl::Status CloseShare(uint64_t epoch, const std::string& share_token);
  // Gives the daemon the memory of client-made chunks `ids` of `epoch`, an
  // FD of each in `fds` (the same order; the caller keeps its own), so it
  // can share them (NodePool::GiveMemory). FailedPrecondition for an older
  // epoch's chunks, as Share; DeadlineExceeded when the daemon did not take
  // them all within `timeout` (some may be its already, and the rest may
  // still become its: LeaseCall).
  absl::Status GiveMemory(uint64_t epoch, absl::Span<const uint64_t> ids,
                          absl::Span<const int> fds, absl::Duration timeout);

 private:
  // Acquire's round trip: waits for a lost daemon and for other sessions
  // to give memory back. `read_ahead` > 0: up to that many grants of
  // `bytes` in one (SplitGrant parts them), asked as GrantReadAhead does,
  // and nullopt where it would wait (the daemon is away, the node is short
  // or would be left less than as much again, its cache holds too little,
  // the daemon grants nothing on the lease). `prewarm`: asked for a
  // pre-warm (AcquireChunksRequest.prewarm), not by the job's allocation.
  absl::StatusOr<std::optional<ReceivedChunks>> AcquireGrant(
      uint64_t bytes, uint64_t max_chunk_bytes, uint32_t read_ahead,
      bool client_creates, bool prewarm);
  // A grant over gRPC, claimed on the lease of `c`: waits for other
  // sessions to give memory back. Unavailable when the daemon died, or
  // restarted and no longer knows the session.
  absl::StatusOr<ReceivedChunks> AcquireOverRpc(Connection& c, uint64_t bytes,
                                                uint64_t max_chunk_bytes,
                                                bool client_creates,
                                                bool prewarm);
  // The current connection when its session owns `ids` of `epoch`
  // (HeldChunks::OwnedBy); else FailedPrecondition saying so, ending in
  // `refused`: what cannot be done with them.
  absl::StatusOr<std::shared_ptr<Connection>> Owner(
      uint64_t epoch, absl::Span<const uint64_t> ids,
      absl::string_view refused);
  // ReleaseChunks on `c`; a daemon gone away is Lost, and takes the chunks
  // back itself when the session ends.
  absl::Status ReleaseOn(const std::shared_ptr<Connection>& c,
                         absl::Span<const uint64_t> ids);

  const DaemonClientOptions& options_;
  ActiveConnection& active_;
  HeldChunks& held_;
  const std::function<void(uint64_t)> report_read_ahead_;
  // Set in the constructor (options.read_ahead_keep), reset first in the
  // destructor.
  std::unique_ptr<GrantReadAhead> read_ahead_;
  // Acquire calls that asked the daemon themselves.
  std::atomic<uint64_t> own_acquires_{0};
  // Set in the constructor (options.release_in_background), reset after
  // read_ahead_ in the destructor.
  std::unique_ptr<ChunkReleaser> releaser_;
};

}  // namespace allocd

#endif  // ALLOCD_CLIENT_CHUNK_GRANTS_H_
