// NodePool: the node's physical memory as chunks, owned by sessions.
//
// Chunks come from a ChunkSource (memfd in sim mode, cuMemCreate on a GPU).
// A chunk a session releases, or leaves behind when it ends, stays in the
// pool, cached ("free"), and the next Acquire of any session takes it before
// creating memory again. Live chunks (held + free + being created) never
// exceed the capacity, counted in bytes. Every chunk is held by at most one
// session at a time.
//
// Size classes (chunk_classes.h): chunks come in a few sizes, by default
// 2 MiB, 16 MiB, 128 MiB and 1 GiB, and Acquire splits a request into them,
// largest class first, so that a client maps few chunks per segment.
//
// A request takes the cached chunks of each of its classes, most recently
// freed first, and creates the rest. When the capacity has no room for
// what it must create, it destroys cached chunks of other classes (or
// surplus of its own), coldest first, rather than failing: the node is short
// only when the request exceeds the free capacity plus everything cached.
// Smaller cached chunks are not stitched together to stand in for a larger
// class: re-creating one 1 GiB chunk costs a few driver calls in the daemon,
// mapping 512 chunks of 2 MiB costs every client that gets them ~45 ms.
// The price is churn (destroy, create) when the classes jobs need change.
//
// Handing out a chunk is two steps (claim_tokens.h), because its FD cannot
// travel over gRPC: Acquire() picks the chunks and returns their ids with a
// one-time claim token bound to the session's pid; Claim() exchanges the
// token for the chunks' FDs, only for that pid.
//
// Sharing (chunk_shares.h): the owner of chunks names them with a share
// token (Share), other sessions map them too (OpenShare, then Claim) while
// the owner keeps them, and a chunk goes back to the cache only when its
// owner and every opener are done with it.
//
// After a daemon restart the chunks surviving clients still map are
// nobody's in a new pool: Adopt() takes each reconnecting session's
// declaration of what it holds into the accounting (see DeclaredChunk for
// what a client proves), so the pool never promises memory the device no
// longer has. Chunk ids are the daemon's, and a restarted daemon must not
// hand out an id an adopted chunk carries: ids are namespaced by a random
// epoch per pool (Options::chunk_id_epoch, in the top 24 bits), and a new
// id is never one a live chunk has (an adopted chunk of the same epoch).
//
// Tenants (server/tenant_id.h): every session belongs to one, and no
// memory crosses from one tenant to another. A chunk remembers the tenant
// that last held it. A session takes its own tenant's cached chunks as
// they are (no wait: same-tenant reuse costs what it always did). Another
// tenant's cached chunk never goes to it: Acquire creates new memory
// instead, destroying cached chunks for the room as it does for another
// size class, so that a process the pool never saw -- a fork child of a
// mapper, or one a mapper passed a chunk's FD to -- keeps only the memory
// it already had. (Zeroing the chunk in place would need the pool to show
// that no such process maps it, which neither a memfd nor a CUDA export
// lets it see.) A chunk another tenant's process may still map stays
// cached and counted, is its own tenant's to reuse, and is destroyed like
// any cached chunk when an Acquire needs its room or a trim gives it up;
// its memory then goes back to the device when that process exits, as a
// trimmed chunk's does while its client still maps it.
// Shares do not cross tenants (OpenShare); under --tenancy node every
// session is one tenant and all of this is today's reuse.
//
// Parts: the pool is a composition of state under its one lock --
// ChunkTable (the live chunks and the cache), SessionLedger (sessions,
// held bytes, quotas), ClaimTokens (grants waiting for their claim) and
// ChunkShares -- with the decisions across them (what an Acquire takes,
// creates and destroys; what an adoption may own) here.
//
// Thread-safe: one mutex, which also guards the parts (each takes it by
// name); chunk creation and destruction (device calls) run outside it, so
// a large Acquire does not stall other sessions' calls.
#ifndef ALLOCD_SERVER_POOL_NODE_POOL_H_
#define ALLOCD_SERVER_POOL_NODE_POOL_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/pool/chunk_classes.h"
#include "server/pool/chunk_shares.h"
#include "server/pool/chunk_source.h"
#include "server/pool/chunk_table.h"
#include "server/pool/claim_tokens.h"
#include "server/pool/session_ledger.h"
#include "server/session_id.h"
#include "server/tenant_id.h"

namespace allocd {

// What Acquire() handed out.
struct Grant {
  // The chunks: the cached ones first.
  std::vector<uint64_t> chunk_ids;
  // The bytes of each chunk, in chunk_ids order.
  std::vector<uint64_t> chunk_sizes;
  // The sum of chunk_sizes: the request rounded up to the smallest class.
  uint64_t bytes = 0;
  // 32 hex digits (128 random bits): the one-time key for Claim().
  std::string token;
  // How many of the chunks came from the cache rather than new memory
  // (always the session's tenant's).
  uint32_t reused_chunks = 0;
  // How many of the chunks, the last ones, the client makes itself
  // (Acquire with client_creates): the pool holds no memory of them and
  // the claim gives no FD of them.
  uint32_t client_made = 0;
};

// One claimed chunk, ready for SendMessage: `fd` is a dup() owned by the
// caller (close it after sending; the pool keeps its own), and the chunk is
// the `bytes` bytes (its size) at `offset` of the file it refers to. The FD
// stays valid whatever happens to the chunk afterwards (Release, EndSession,
// TrimFree).
struct ChunkFd {
  uint64_t id = 0;
  UniqueFd fd;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

struct SessionHolding {
  // Held bytes, including those of an Acquire still creating its chunks.
  uint64_t bytes = 0;
  uid_t uid = 0;
  pid_t pid = 0;
  TenantId tenant;
  std::optional<uint64_t> quota;
};

struct PoolStats {
  uint64_t capacity = 0;
  // The smallest chunk (every grant is a multiple of it).
  uint64_t chunk_bytes = 0;
  // Live chunks: held by sessions plus cached free.
  uint64_t created_bytes = 0;
  // Chunks held by sessions (created_bytes - free_bytes).
  uint64_t in_use_bytes = 0;
  // Cached chunks, ready for the next Acquire of any session.
  uint64_t free_bytes = 0;
  // Chunks being created by an Acquire in flight; counted against capacity
  // (created_bytes + creating_bytes <= capacity).
  uint64_t creating_bytes = 0;
  uint64_t chunks_created_total = 0;
  uint64_t chunks_reused_total = 0;
  // Chunks granted for their clients to make (Acquire's client_creates).
  uint64_t chunks_client_made_total = 0;
  // Cached chunks destroyed (their memory back to the device) by TrimFree,
  // TrimIdle, and Acquires that needed their room for chunks of another
  // size.
  uint64_t trimmed_bytes_total = 0;
  // Chunks sessions declared after a restart and the pool adopted (Adopt).
  uint64_t adopted_bytes_total = 0;
  std::map<SessionId, SessionHolding> sessions;
};

// One chunk a reconnecting client says it holds from the daemon before a
// restart (NodePool::Adopt).
struct DeclaredChunk {
  // The id the earlier daemon gave it.
  uint64_t id = 0;
  // Its size, as the client got it (each chunk has its own).
  uint64_t bytes = 0;
  // The proof, where the source takes one (ChunkSource::ProvesChunks): an
  // FD of the chunk, which the pool keeps as the chunk's memory, and where
  // in its file the chunk starts. Ignored (closed) by a source that takes
  // chunks on the client's word.
  UniqueFd fd;
  uint64_t offset = 0;
};

// A chunk a session holds (NodePool::HeldChunks).
struct HeldChunk {
  TenantId tenant;
  uint64_t id = 0;
  uint64_t bytes = 0;
};

// What Adopt() made of a declaration.
struct AdoptOutcome {
  // Now the session's, in declaration order.
  std::vector<uint64_t> adopted;
  uint64_t adopted_bytes = 0;
  // Not the session's (nor anyone's through this declaration), with why.
  std::vector<std::pair<uint64_t, std::string>> refused;
};

// When cached chunks go back to the device (TrimIdle): a node without jobs
// must not hold GPU memory that processes outside allocd could use.
struct TrimPolicy {
  // Cached chunks not reused for this long are destroyed.
  absl::Duration idle_after = absl::InfiniteDuration();
  // Cached bytes above this are destroyed at once, coldest first.
  uint64_t high_water = UINT64_MAX;
};

// True for the ResourceExhausted that Acquire returns when the node itself
// is short (not a quota): memory other sessions cache could help.
bool IsNodeShortage(const absl::Status& status);

// For a node shortage (IsNodeShortage), the bytes the node is short of: how
// much other sessions must release before the same Acquire can succeed.
// nullopt for any other status. It travels as the status payload
// kShortfallPayloadUrl (decimal bytes), so it survives copies of the status.
std::optional<uint64_t> ShortfallBytes(const absl::Status& status);
inline constexpr absl::string_view kShortfallPayloadUrl =
    "type.allocd.dev/allocd.NodeShortfallBytes";

class NodePool {
 public:
  struct Options {
    // Most bytes of live chunks (held + cached + being created).
    uint64_t capacity = 0;
    // How long a claim token lives. An expired token dies and its chunks go
    // back to the cache: a client that never claims them cannot use them.
    absl::Duration token_ttl = absl::Seconds(30);
    // The clock for token expiry (tests move it).
    std::function<absl::Time()> now = [] { return absl::Now(); };
    // The sizes chunks are created in: multiples of the source's
    // granularity, which is always one (added when missing); empty: the
    // granularity alone, every chunk the same size.
    std::vector<uint64_t> chunk_classes;
    // The top 24 bits of every chunk id this pool makes (the rest counts
    // from 1), so that a restarted daemon (another epoch: the daemon draws
    // one at random) makes no id that a surviving client still holds.
    uint32_t chunk_id_epoch = 0;
  };

  // `source` must outlive the pool.
  NodePool(ChunkSource* source, Options options);
  NodePool(ChunkSource* source, uint64_t capacity)
      : NodePool(source, Options{.capacity = capacity}) {}
  NodePool(const NodePool&) = delete;
  NodePool& operator=(const NodePool&) = delete;

  // Starts session `id` of process `pid` run by `uid`, of `tenant`: the pid
  // its claim tokens are bound to, the uid its uid quota counts against, the tenant whose cached chunks it reuses as they
  // are. InvalidArgument for id 0 or an empty tenant; AlreadyExists for a
  // live session's id.
  absl::Status AddSession(SessionId id, uid_t uid, pid_t pid,
                          TenantId tenant);

  // Ends session `id`: every chunk it holds goes back to the cache (kept,
  // not closed), its unclaimed tokens die, its session quota is forgotten.
  // An Acquire of the session still creating chunks fails (Aborted) and
  // caches what it created. Returns the bytes of chunks returned (0 for an
  // unknown session).
  uint64_t EndSession(SessionId id);

  // Gives session `id` chunks covering `bytes` rounded up to the smallest
  // class, split into classes of at most `max_chunk_bytes` (largest first;
  // a client that maps every chunk at the smallest size passes that):
  // cached ones of its tenant's of those sizes first (another tenant's
  // never: "Tenants" above), then new ones from the source, up to
  // the capacity, destroying cached chunks of other sizes when the capacity
  // has no room for the new ones, or when the source runs out of memory
  // (ResourceExhausted) before the capacity does (then once, and the
  // creation is tried again). All or nothing: on any error the session
  // holds what it held before (chunks destroyed to make room stay
  // destroyed). Errors:
  //  - InvalidArgument: bytes == 0;
  //  - NotFound: no session `id`;
  //  - ResourceExhausted, naming the limit:
  //     "session quota exceeded: session S holds X, asks Y, quota Z",
  //     "uid quota exceeded: the sessions of uid U hold X, asks Y, quota Z",
  //     "tenant T quota exceeded: its sessions hold X, asks Y, quota Z",
  //     "asks X, more than the node pool's capacity Z", or
  //     "node pool exhausted: need X, free Y of capacity Z (short by W)" --
  //     only the last is a node shortage (IsNodeShortage), with W in
  //     ShortfallBytes(): what other sessions must release (free counts
  //     the pool's cache, whatever its chunks' sizes);
  //  - the source's error when it cannot create memory (what it created
  //    before failing stays cached);
  //  - Aborted when the session ends while its chunks are being created.
  // With `client_creates`, the source creates nothing: the chunks not
  // cached are counted as the session's (the capacity, the quotas, and
  // cached chunks destroyed to make room, as for new ones) without memory
  // here, the grant's last Grant.client_made chunks, which the client
  // creates itself. Like chunks adopted on the client's word, they cannot
  // be shared and leave the pool when released, until GiveMemory gives the
  // pool their memory.
  absl::StatusOr<Grant> Acquire(SessionId id, uint64_t bytes,
                                uint64_t max_chunk_bytes = UINT64_MAX,
                                bool client_creates = false);

  // The memory of chunks `chunk_ids` of session `id` that the pool holds
  // none of (client-made, or adopted on the client's word), one FD each in
  // `fds` (the same order, each an FD of a whole chunk as
  // ChunkSource::AdoptChunk takes it): from now on the pool holds it, as a
  // created chunk's (shared, cached when released), the session's
  // tenant's, mapped by its process. All or nothing:
  // InvalidArgument for a count that differs or an id listed twice;
  // PermissionDenied naming a chunk the session does not hold;
  // FailedPrecondition naming one whose memory the pool holds already;
  // the source's error (InvalidArgument, naming the chunk) when an FD is
  // not such a chunk; NotFound for no session `id`.
  absl::Status GiveMemory(SessionId id, absl::Span<const uint64_t> chunk_ids,
                          std::vector<UniqueFd> fds);

  // Memory a client reads ahead (its next segments of one size): up to
  // `max_count` grants of `bytes` each, split as Acquire splits one, all
  // from the cache -- nothing created, nothing destroyed, because a
  // creation in the daemon stalls the asking client's own mapping on the
  // GPU, and a read-ahead is worth no more than the mapping it hides. As
  // many whole grants as the session's tenant's cached chunks (and the
  // quotas) allow, in one Grant of
  // one token: the chunks of the first, then of the second, and so on;
  // Grant.bytes is their count times `bytes` rounded up to the smallest
  // class. An empty Grant (no chunks, no token) when not even one fits.
  // Errors: InvalidArgument for bytes == 0 or max_count == 0; NotFound for
  // no session `id`.
  // With `client_creates`, the grants the cache cannot serve are made by
  // the client (as Acquire's client_creates), as many as the capacity has
  // room for beside the cache (no cached chunk is destroyed for them) and
  // the quotas allow: the first grants cached, the rest client-made.
  absl::StatusOr<Grant> AcquireCached(SessionId id, uint64_t bytes,
                                      uint64_t max_chunk_bytes,
                                      uint32_t max_count,
                                      bool client_creates = false);

  // What Claim hands over: the next batch of a grant's chunks with their
  // FDs, and whether it is the last. An error stops the claim.
  using ClaimSink =
      absl::FunctionRef<absl::Status(std::vector<ChunkFd>& batch, bool last)>;

  // Exchanges a grant's token for the FDs of its chunks, for the process
  // `claimer_pid` (from SO_PEERCRED): hands them to `sink` in batches of at
  // most `batch_size` (at least one batch, maybe empty), each batch's FDs
  // closed when `sink` returns, so a claim of a whole GPU never holds more
  // than `batch_size` FDs open. The token is used up. Chunks the session
  // released (or lost) since the Acquire are left out.
  // Errors: NotFound for an unknown, used or expired token (or one whose
  // session ended); PermissionDenied when the grant is another pid's -- the
  // token stays valid for its owner; ResourceExhausted when this process is
  // out of FDs (the token stays valid, to retry, if no batch went out);
  // whatever `sink` returned.
  absl::Status Claim(absl::string_view token, pid_t claimer_pid,
                     size_t batch_size, ClaimSink sink);

  // Gives back the chunks of a grant that was never claimed (the client
  // gave up on its Acquire): they return to the cache, as when the token
  // expires. Returns the bytes returned; 0 for an unknown, used or expired
  // token.
  uint64_t Abandon(absl::string_view token);

  // Returns chunks of session `id` to the cache. All or nothing:
  // InvalidArgument for an id listed twice, PermissionDenied naming the
  // chunk when any id is not held by the session (unknown, free, another
  // session's, or still being acquired), NotFound for no session `id`.
  // An empty list is a no-op.
  absl::Status Release(SessionId id, absl::Span<const uint64_t> chunk_ids);

  // A share token (32 hex digits) for chunks `chunk_ids` of session `id`,
  // in that order, which must all be its own. Sessions open it until the
  // owner releases one of the chunks or ends. Errors as Release's:
  // InvalidArgument for an empty list or an id listed twice,
  // PermissionDenied naming a chunk the session does not hold, NotFound
  // for no session `id`; FailedPrecondition naming a chunk adopted on the
  // client's word (Adopt), which the pool has no memory of to give out;
  // ResourceExhausted naming a chunk already in
  // ChunkShares::kMaxSharesPerChunk shares that take opens.
  absl::StatusOr<std::string> Share(SessionId id,
                                    absl::Span<const uint64_t> chunk_ids);

  // Session `id` opens share `share_token`: a Grant of the shared chunks
  // (ids, sizes, bytes; reused_chunks 0) whose claim token gives their FDs
  // to the session's pid, as an Acquire's does. The chunks stay the
  // owner's (its quotas, its held bytes); until the open is closed none of
  // them is reused. An open whose claim token expires unclaimed, or is
  // abandoned, closes. NotFound for no session `id`, or a share that is
  // unknown or no longer open to new opens; PermissionDenied for a share
  // of another tenant's session: the owner's live data would cross
  // (--tenancy node makes the node one tenant).
  absl::StatusOr<Grant> OpenShare(SessionId id, absl::string_view share_token);

  // Closes one open of `share_token` by session `id` (EndSession closes
  // all of a session's); chunks nobody holds or opens any more go back to
  // the cache. NotFound when the session has no open of it.
  absl::Status CloseShare(SessionId id, absl::string_view share_token);

  // Quotas on held bytes; nullopt removes one. Lowering a quota below what
  // is held revokes nothing: it only refuses further Acquires. False (and
  // nothing set) for an unknown session. A session is held to each quota
  // that covers it: its own, its uid's and its tenant's.
  bool SetSessionQuota(SessionId id, std::optional<uint64_t> bytes);
  void SetUidQuota(uid_t uid, std::optional<uint64_t> bytes);
  // What the sessions of `tenant` may hold together; nullopt removes the
  // tenant's own, and the default (if any) covers it again.
  void SetTenantQuota(const TenantId& tenant, std::optional<uint64_t> bytes);
  // The quota of every tenant without its own (nullopt: none).
  void SetDefaultTenantQuota(std::optional<uint64_t> bytes);

  // Destroys cached chunks, least recently freed first, until at least
  // `bytes` are gone or the cache is empty: their memory goes back to the
  // device (once no client maps it). Returns the bytes destroyed.
  uint64_t TrimFree(uint64_t bytes);
  // Destroys the cached chunks `policy` gives up on: those freed
  // `idle_after` or longer before now (the Options clock), and the coldest
  // while more than `high_water` bytes are cached. Returns the bytes
  // destroyed.
  uint64_t TrimIdle(const TrimPolicy& policy);

  // Takes the chunks session `id` declares it still holds from the daemon
  // before a restart into the pool: each one adopted is the session's (as
  // if it had acquired it, of its tenant), counts against the capacity and
  // the quotas, and is never handed out again until released (and then
  // only to its tenant, as any chunk). An adopted
  // chunk with memory (proven with its FD) goes back to the cache when
  // released like any other; one taken on the client's word has no memory here: it
  // cannot be shared (Share refuses it), and it leaves the pool when
  // released, never cached nor trimmed (its memory goes back to the device
  // when the client unmaps it). Which chunks a session may declare at all
  // is the caller's to decide (RestartAdoption::Declare: only those the
  // daemon before handed to its tenant); the pool adopts none of them past
  // its capacity or any quota, as an Acquire would not create it.
  // A chunk is refused, with why, and owned by nobody through this
  // declaration (its FD closed before this returns), when:
  //  - its id is 0 or listed twice in `chunks`;
  //  - its size is not one of this pool's classes (chunk_classes());
  //  - the source takes proofs (ProvesChunks) and its FD is missing or is
  //    not such a chunk of that size (ChunkSource::AdoptChunk);
  //  - its id is a live chunk's already (another session's, this one's,
  //    cached), or its memory is a live chunk's under another id:
  //    nothing is ever owned twice;
  //  - it would take the session past a quota (Acquire's messages), or
  //    the live chunks past the capacity (cached ones are not destroyed
  //    for it: an adoption comes before any Acquire).
  // NotFound for no session `id` (or one that ended meanwhile).
  absl::StatusOr<AdoptOutcome> Adopt(SessionId id,
                                     std::vector<DeclaredChunk> chunks);

  // The chunks sessions hold (granted or adopted; not those an Acquire is
  // still creating), each with its session's tenant: what a restarted
  // daemon may adopt (RestartAdoption).
  std::vector<HeldChunk> HeldChunks() const;
  // Changes whenever chunks change hands (an Acquire, a release, a session
  // ending, an adoption): whoever keeps a copy of HeldChunks() knows when
  // it is stale.
  uint64_t holdings_version() const { return sessions_.version(); }

  PoolStats Stats() const;
  // What an Acquire could be granted now with nobody giving back: the cached
  // chunks and the capacity not yet created (capacity - in use - creating).
  uint64_t AvailableBytes() const;

  // The smallest chunk.
  uint64_t chunk_bytes() const { return classes_.smallest(); }
  // The chunk sizes, ascending; the first is chunk_bytes().
  const std::vector<uint64_t>& chunk_classes() const {
    return classes_.sizes();
  }
  uint64_t capacity() const { return capacity_.load(); }
  // Lowers (or raises) the capacity: the daemon clips it to what the
  // device really has free once it knows what surviving clients hold.
  // Revokes nothing: it only refuses Acquires while above it.
  void SetCapacity(uint64_t bytes);
  // Whether clients prove the chunks they declare (ChunkSource::ProvesChunks).
  bool proves_chunks() const { return source_->ProvesChunks(); }

 private:
  // A chunk its owner gives up: to the cache, or, while shares of it are
  // open, to nobody until the last closes.
  void Disown(uint64_t chunk_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Caches the chunks of `chunk_ids`, which no open of a share holds any
  // more, that no session owns either.
  void CacheUnowned(absl::Span<const uint64_t> chunk_ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records a granted claim of session `id` (`s`) (of an open of `share`,
  // when not empty); returns its token.
  std::string AddClaim(SessionId id, const SessionLedger::Session& s,
                       std::string token, uint64_t grant,
                       const std::vector<uint64_t>& chunk_ids,
                       std::string share = "")
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The set of `chunk_ids` when session `id` holds every one of them (not
  // pending); otherwise Release's errors, "nothing was `what`".
  absl::StatusOr<absl::flat_hash_set<uint64_t>> HeldBy(
      SessionId id, absl::Span<const uint64_t> chunk_ids,
      absl::string_view what) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropExpiredClaims() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns the chunks of an unclaimed grant that its session still holds
  // to the cache; returns their bytes.
  uint64_t ReturnUnclaimed(const PendingClaim& claim)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ChunkTable::Trim under the lock, the memory released after it.
  uint64_t TrimColdest(
      absl::FunctionRef<bool(const ChunkTable::Chunk&, uint64_t trimmed)>
          more);

  // The acquire path (node_pool_acquire.cc): Acquire and AcquireCached,
  // and the steps they share.
  // An Acquire between its steps.
  struct AcquireInFlight {
    SessionId id = 0;
    // The grant so far: its bytes, then the cached chunks taken, then the
    // created ones.
    Grant grant;
    // Its claim token, made before the lock is taken.
    std::string token;
    // The grant's serial (ChunkTable::Chunk::grant), and the session's
    // incarnation while its chunks are created outside the lock.
    uint64_t serial = 0;
    uint64_t incarnation = 0;
    // The session's tenant (the session may end while work is outside
    // the lock).
    TenantId tenant;
    // The sizes of the chunks the cache did not have, and their sum.
    std::vector<uint64_t> to_create;
    uint64_t create_bytes = 0;
  };
  // Acquire's steps, in order. Checks `a`'s quotas and that the node has
  // room for it at all (Acquire's errors), then takes the cached chunks of
  // `sizes` for session `a.id` (`s`) and counts the grant as held;
  // `a.to_create` is the rest.
  absl::Status TakeCached(AcquireInFlight& a, SessionLedger::Session& s,
                          const std::vector<uint64_t>& sizes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Destroys cached chunks, coldest first, until the capacity has room for
  // `create_bytes` more, moving their memory to `doomed` (released outside
  // the lock).
  void MakeRoom(uint64_t create_bytes, std::vector<ChunkMemory>& doomed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With client_creates: `a.to_create` counted as the client's to make,
  // and the grant done.
  Grant GrantClientMade(AcquireInFlight& a, SessionLedger::Session& s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // New memory of `sizes` from the source, appended to `created`, outside
  // the lock (on a GPU, cuMemCreate + export). The source's error for the
  // first chunk it could not create, after trimming the cache once for a
  // ResourceExhausted.
  absl::Status CreateChunks(const std::vector<uint64_t>& sizes,
                            std::vector<ChunkMemory>& created)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Makes the `created` chunks (of `a.to_create`'s first sizes) live, and
  // them the session's with the grant done when it is still alive and
  // `failure` is OK; otherwise UndoAcquire.
  absl::StatusOr<Grant> CommitCreated(AcquireInFlight& a,
                                      std::vector<ChunkMemory> created,
                                      const absl::Status& failure)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Caches the `created` chunks and what `a` took from the cache, and
  // returns Acquire's error: Aborted when the session ended (`alive` is
  // null), else the source's `failure` (a node shortage when it is out of
  // memory).
  absl::Status UndoAcquire(AcquireInFlight& a, SessionLedger::Session* alive,
                           std::vector<ChunkMemory> created,
                           const absl::Status& failure)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ChunkSource* const source_;
  const Options options_;
  // Options::chunk_classes, with the source's granularity.
  const ChunkClasses classes_;
  // Options::capacity until SetCapacity; read outside the lock by Acquire's
  // first check.
  std::atomic<uint64_t> capacity_;

  // The pool's lock, which its parts name in every call.
  mutable absl::Mutex mu_;
  ChunkTable chunks_ ABSL_GUARDED_BY(mu_);
  // Not ABSL_GUARDED_BY(mu_): holdings_version() reads its version()
  // without the lock; every other method of it names mu_.
  SessionLedger sessions_;
  ClaimTokens claims_ ABSL_GUARDED_BY(mu_);
  ChunkShares shares_ ABSL_GUARDED_BY(mu_);
};

// NodePool::Claim with every FD collected into one vector, all open at
// once: for callers in the daemon's process and tests (the side socket
// streams batches instead).
absl::StatusOr<std::vector<ChunkFd>> ClaimAll(NodePool& pool,
                                              absl::string_view token,
                                              pid_t claimer_pid);

}  // namespace allocd

#endif  // ALLOCD_SERVER_POOL_NODE_POOL_H_
