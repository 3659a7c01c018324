// DaemonBackend: the engine's DeviceBackend in a client process, with
// memory from the node daemon. A segment is a run of daemon chunks mapped
// at consecutive addresses of one reserved range, the way the CUDA VMM
// backend maps cuMemCreate chunks: one Acquire (one request, one claim) for
// the segment, chunks of the daemon's larger sizes (a 2 GiB segment is two
// 1 GiB chunks), one EnableAccess over the whole range. Expandable segments
// map and unmap chunks inside their reservation, with chunks of the
// smallest size only, since the engine unmaps any page range of what it
// mapped. How chunks get into the address space is a
// ChunkMapper's business: by default the chunks are memfd files mapped with
// mmap (sim mode), so the memory is real and shared with the daemon; the
// CUDA VMM mapper is in client/cuda_daemon_backend.h. Chunks unmapped go
// back with DaemonClient::ReleaseSoon: off the freeing thread when the
// client releases in the background (the interposer's does).
//
// Not thread-safe: the engine calls it under its own lock (all but
// UnmapTaken, which may run beside the other calls, and MapPrewarmed, which
// releases that lock while it maps).
#ifndef ALLOCD_CLIENT_DAEMON_BACKEND_H_
#define ALLOCD_CLIENT_DAEMON_BACKEND_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "allocator/device_backend.h"
#include "client/daemon_client.h"
#include "client/spare_segments.h"
#include "client/working_set_handover.h"

namespace allocd {

// One chunk as a ChunkMapper mapped it: where, its size, and the mapper's
// handle.
struct ChunkMapping {
  uint64_t address;
  uint64_t bytes;
  uint64_t handle;
};

// Puts daemon chunks into the process's address space.
class ChunkMapper {
 public:
  virtual ~ChunkMapper() = default;
  // `bytes` of address space with nothing behind it.
  virtual absl::StatusOr<uint64_t> Reserve(size_t bytes) = 0;
  // Frees a reservation whose chunks are all unmapped.
  virtual void Free(uint64_t address, size_t bytes) = 0;
  // Maps one chunk whole, `chunk_bytes` at `offset` of `fd` (which stays
  // the caller's), at `address` inside a reservation. Returns a handle that
  // Unmap gets back.
  virtual absl::StatusOr<uint64_t> Map(uint64_t address, size_t chunk_bytes,
                                       int fd, uint64_t offset) = 0;
  // Whether Create and Export work.
  virtual bool CanCreate() const { return false; }
  // Makes a chunk of `chunk_bytes` in this process, as the daemon's source
  // makes one (so the daemon can hold and share its memory after Export),
  // and maps it whole at `address` inside a reservation. Returns a handle
  // that Unmap gets back; the memory goes with the mapping.
  // ResourceExhausted when the device has no more. Unimplemented by
  // default.
  virtual absl::StatusOr<uint64_t> Create(uint64_t address,
                                          size_t chunk_bytes);
  // A new FD (the caller's) of the memory of `chunk`, which Create made.
  virtual absl::StatusOr<UniqueFd> Export(const ChunkMapping& chunk);
  // After Map of every chunk of [address, address + bytes): makes the range
  // usable.
  virtual absl::Status EnableAccess(uint64_t address, size_t bytes) {
    (void)address;
    (void)bytes;
    return absl::OkStatus();
  }
  // Unmaps `chunks`, which are every chunk mapped in [address, address +
  // bytes); the range stays reserved.
  virtual void Unmap(uint64_t address, size_t bytes,
                     absl::Span<const ChunkMapping> chunks) = 0;
};

// Sim mode's mapper: mmap of the chunks' memfd files.
std::unique_ptr<ChunkMapper> MakeMmapChunkMapper();

class DaemonBackend : public DeviceBackend {
 private:
  // The chunk mapped at an address, which daemon session gave it, its size
  // and the mapper's handle.
  struct MappedChunk {
    uint64_t epoch;
    uint64_t id;
    uint64_t bytes;
    uint64_t handle;
    // Made here (ChunkMapper::Create), its memory not yet the daemon's.
    bool made_here = false;
  };
  // A range taken out of the books (chunks_, held_, ranges_), its chunks
  // mapped still.
  struct DetachedRange {
    uint64_t address = 0;
    uint64_t bytes = 0;
    bool free_reservation = false;
    std::vector<std::pair<uint64_t, MappedChunk>> chunks;  // by address
  };

 public:
  // Spare segments a Take* call took out of the backend: no longer spare,
  // held or anyone's, their chunks still mapped, for UnmapTaken (dropped
  // instead, they stay mapped and the daemon's count of this session until
  // it ends). Move-only.
  class TakenSpares {
   public:
    TakenSpares() = default;
    TakenSpares(TakenSpares&&) = default;
    TakenSpares& operator=(TakenSpares&&) = default;
    // How many segments, and their bytes.
    size_t size() const { return ranges_.size(); }
    uint64_t bytes() const;

   private:
    friend class DaemonBackend;
    std::vector<DetachedRange> ranges_;
  };

  // `client` outlives the backend. The device's total memory is the
  // daemon's capacity. Chunks are mapped with mmap.
  explicit DaemonBackend(DaemonClient* client);
  // Chunks are mapped by `mapper`.
  DaemonBackend(DaemonClient* client, std::unique_ptr<ChunkMapper> mapper);
  // Unmaps everything and returns its chunks.
  ~DaemonBackend() override;

  absl::StatusOr<uint64_t> AllocateSegment(size_t bytes) override;
  void FreeSegment(uint64_t address, size_t bytes) override;
  absl::StatusOr<uint64_t> ReserveAddressRange(size_t bytes) override;
  void ReleaseAddressRange(uint64_t address, size_t bytes) override;
  absl::Status MapPages(uint64_t address, size_t bytes) override;
  void UnmapPages(uint64_t address, size_t bytes) override;
  size_t TotalMemory() const override { return total_; }
  size_t FreeMemory() const override;

  // Chunks mapped now (not counting those OpenShared mapped).
  uint64_t held_bytes() const { return held_; }

  // From now on, a segment's chunks the daemon has not cached are made in
  // this process (AcquireChunksRequest.client_creates) when `on` and the
  // mapper can (ChunkMapper::CanCreate): on a GPU, creating a chunk here
  // costs less than the daemon's creation and export and this process's
  // import together. Off by default. Their memory is given to the daemon
  // (DaemonClient::GiveMemory) before a segment is shared (ShareSegment),
  // and before they are unmapped to be released while another session is
  // short (a reclaim request's window, until a give in it fails): the
  // daemon caches it, so the next process to map it (a neighbour that
  // reclaimed it) imports it instead of creating memory the driver must
  // first scrub.
  // When the device has no room for a chunk made here, the segment is asked
  // for again with every chunk made by the daemon, which can trim its cache
  // and reclaim other jobs' (counted by client_create_fallbacks).
  void set_client_creates(bool on) { client_creates_ = on && mapper_->CanCreate(); }
  // Asks the daemon for the chunks of a segment of `bytes` ahead of the
  // AllocateSegment of `bytes` that the caller foresees (the pre-warm of a
  // recurring peak: allocd/_prewarm.py), which then takes them without
  // asking: DaemonClient::Prewarm, which says what the errors mean. May be
  // called from any thread while AllocateSegment runs on another.
  absl::Status Prewarm(size_t bytes);
  // Maps the grant Prewarm(`bytes`) parked into a segment of its own now,
  // on the caller's thread, for the next AllocateSegment(`bytes`), which
  // then takes it at the cost of a lookup: whatever lock the allocating
  // caller holds (PyTorch's allocator's, in the interposer, which every
  // allocation of the job waits for) is held for no mapping. Nor is
  // `caller_lock`, the lock the caller holds for every call of this
  // backend (the interposer's, which the job's cudaMalloc and cudaFree
  // take): it is released while the chunks are mapped (7-12 ms for 60 GiB
  // on an H200), so the job's requests of other sizes do not wait for the
  // mapping. One of `bytes` should wait for it (MappingPrewarmed) rather
  // than ask the daemon for another. Returns whether one was mapped: false
  // when the grant is no longer parked (the request it foresaw took it).
  // On an error the grant went back.
  absl::StatusOr<bool> MapPrewarmed(size_t bytes, absl::Mutex& caller_lock)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(caller_lock);
  // Whether a MapPrewarmed(`bytes`) is mapping, its caller's lock released.
  bool MappingPrewarmed(size_t bytes) const {
    return prewarms_mapping_.contains(bytes);
  }
  // Takes the segments MapPrewarmed mapped that no AllocateSegment took.
  TakenSpares TakeUnusedPrewarmed();

  // A reclaim's partial give-back (SpareSegments says why). While `on`, a
  // segment that FreeSegment frees stays mapped as a spare instead of going
  // back (one ShareSegment shared goes back all the same), without the
  // device synchronisation of an unmap (PyTorch's empty_cache()
  // synchronises before it frees). The caller then gives
  // back what the reclaim asked for with TakeSpares and UnmapTaken; the
  // next AllocateSegment of a kept size takes one at the cost of a lookup.
  // Off by default.
  void KeepFreedSegments(bool on) { keep_freed_ = on; }
  // Takes spares (kept or pre-warmed), largest first, until their bytes
  // reach `bytes` (every one when 0).
  TakenSpares TakeSpares(uint64_t bytes);
  // Takes the spares no AllocateSegment took within `keep` of becoming
  // spare.
  TakenSpares TakeSparesOlderThan(absl::Duration keep);
  // Unmaps what a Take* call took and returns its chunks (a reclaim's
  // window gives the daemon the memory made here first, as FreeSegment
  // does): the bytes given back. Unlike every other call, it may run
  // without the caller's lock, beside the others: it reads none of the
  // backend's books (one atomic aside), only the mapper and the client,
  // which take their own locks. So a job's allocations on other threads do not wait for a
  // reclaim's unmaps (tens of GiB: milliseconds on a GPU).
  uint64_t UnmapTaken(TakenSpares taken);
  // Mapped segments that no allocation uses (counted in held_bytes, and
  // reported to the daemon as cached).
  uint64_t spare_bytes() const { return spares_.bytes(); }
  // Segments the daemon made because this process could not.
  uint64_t client_create_fallbacks() const { return client_create_fallbacks_; }

  // The working set. Every segment AllocateSegment maps counts; when the
  // segments' bytes reach a new high, their sizes (in the order they were
  // asked for) go to the daemon (DaemonClient::PublishWorkingSet), which
  // hands them to the job's next session.
  // HandOver: maps the working set the daemon handed this session
  // (DaemonClient::handed_working_set) ahead, from the daemon's cache, on
  // a background thread, for AllocateSegment to take: WorkingSetHandover,
  // which gives back what is not taken within `keep` (and on a reclaim).
  // Nothing when the daemon handed over nothing or `keep` is zero. Call
  // once, before the first AllocateSegment; the mapper is then called from
  // that thread too.
  void HandOver(absl::Duration keep);
  // Nullptr without a handover (tests, stats).
  const WorkingSetHandover* handover() const { return handover_.get(); }

  // Sharing a segment with another process (CUDA IPC). ShareSegment: a
  // token naming the chunks of the segment AllocateSegment gave at
  // `address`, which another process's OpenShared maps while this one keeps
  // them. NotFound when no segment starts there.
  absl::StatusOr<std::string> ShareSegment(uint64_t address);
  // Maps the chunks another process shared under `share_token` into a new
  // range, read-write: returns its address and size. They stay the other
  // process's (not in held_bytes) until CloseShared.
  absl::StatusOr<std::pair<uint64_t, size_t>> OpenShared(
      const std::string& share_token);
  // Unmaps (after the work queued on them, on a GPU) a range OpenShared
  // gave and closes the open; false when `address` is not one.
  bool CloseShared(uint64_t address);

 private:
  // A range OpenShared mapped.
  struct SharedRange {
    uint64_t epoch;
    std::string token;
    size_t bytes;
    std::vector<ChunkMapping> mappings;
  };
  // Maps chunks of at most `max_chunk_bytes` each over [address, address +
  // bytes).
  absl::Status Map(uint64_t address, size_t bytes, uint64_t max_chunk_bytes);
  // Maps `got`'s chunks one after another from `address`, within `bytes`,
  // and enables access to them; on failure unmaps what it mapped.
  absl::StatusOr<std::vector<ChunkMapping>> MapReceived(uint64_t address,
                                                        size_t bytes,
                                                        ReceivedChunks& got);
  // A range of its own for all of `got`'s chunks, mapped (MapReceived):
  // its address and the mappings. On failure nothing stays reserved.
  struct MappedRange {
    uint64_t address;
    std::vector<ChunkMapping> mappings;
  };
  absl::StatusOr<MappedRange> MapIntoNewRange(ReceivedChunks& got);
  // Unmaps [address, address + bytes) and returns its chunks; frees the
  // reservation too unless `keep_reservation`. Detach, then Finish.
  void Unmap(uint64_t address, size_t bytes, bool keep_reservation);
  // Takes [address, address + bytes)'s chunks out of the books, and its
  // reservation unless `keep_reservation`.
  DetachedRange Detach(uint64_t address, uint64_t bytes, bool keep_reservation);
  // In a reclaim's window, gives the daemon the memory made here; then
  // unmaps, frees the reservation where Detach took it, and returns the
  // chunks. Touches no books: see UnmapTaken.
  void Finish(DetachedRange& range);
  // Gives the daemon the memory of `chunks` (at their addresses) that was
  // made here (GiveMemory), all within `timeout`: from then on it is the
  // daemon's, as if it had made them. On failure, the chunks of the epochs
  // given before it are the daemon's (counted in chunks_given), the others
  // still made here (counted in gives_failed).
  absl::Status GiveMadeMemory(
      const std::vector<std::pair<uint64_t, MappedChunk*>>& chunks,
      absl::Duration timeout);

  // Keeps `got`'s chunks, mapped as `mapped`, as this backend's.
  void Adopt(const ReceivedChunks& got, const std::vector<ChunkMapping>& mapped);
  // Takes `segment`, which the handover mapped at its address, as one of
  // AllocateSegment's.
  void AdoptHandedOver(const WorkingSetHandover::Segment& segment);
  // A segment of `bytes` joins the working set (AllocateSegment's).
  void CountSegment(uint64_t address, size_t bytes);
  // A new segment of `bytes`, mapped from a new grant.
  absl::StatusOr<uint64_t> MapNewSegment(size_t bytes);
  // Takes `spares`, which left spares_, out of the books. Reports what
  // stays spare.
  TakenSpares Take(const std::vector<SpareSegments::Spare>& spares);
  // Reports spare_bytes() to the daemon.
  void ReportSpares();

  DaemonClient* const client_;
  const std::unique_ptr<ChunkMapper> mapper_;
  const uint64_t total_;
  std::map<uint64_t, MappedChunk> chunks_;  // by address
  std::map<uint64_t, size_t> ranges_;       // reservations, by address
  // AllocateSegment's, by address: its bytes, when it was asked for, and
  // whether ShareSegment shared it (another process may map it still: it is
  // never kept as a spare for this one's next request).
  struct Segment {
    size_t bytes;
    uint64_t order;
    bool shared = false;
  };
  std::map<uint64_t, Segment> segments_;
  // The live segments' sizes by the order they were asked for, their
  // bytes, and the most they reached (the working set's).
  std::map<uint64_t, uint64_t> sizes_by_order_;
  uint64_t next_order_ = 0;
  uint64_t segment_bytes_ = 0;
  uint64_t peak_segment_bytes_ = 0;
  std::map<uint64_t, SharedRange> shared_;  // OpenShared's, by address
  // Segments mapped that no allocation uses: MapPrewarmed's not taken yet,
  // and those FreeSegment kept.
  SpareSegments spares_;
  // The sizes MapPrewarmed is mapping now, its caller's lock released.
  std::multiset<size_t> prewarms_mapping_;
  bool keep_freed_ = false;
  uint64_t held_ = 0;
  bool client_creates_ = false;
  uint64_t client_create_fallbacks_ = 0;
  // The reclaim request (DaemonClient::reclaims) during which a free's give
  // failed: the frees after it give nothing until the daemon asks again.
  // Atomic: Finish runs without the caller's lock (UnmapTaken).
  std::atomic<int64_t> give_failed_in_reclaim_ = -1;
  // Destroyed first: its thread uses the mapper and the client.
  std::unique_ptr<WorkingSetHandover> handover_;
};

}  // namespace allocd

#endif  // ALLOCD_CLIENT_DAEMON_BACKEND_H_
