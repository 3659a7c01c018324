#include "client/daemon_backend.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "allocator/bytes.h"
#include "proto/protocol.h"

namespace allocd {
namespace {

// How long after a reclaim request the process's frees give the memory it
// made to the daemon (DaemonBackend::Unmap): the reclaim's empty_cache
// runs at the job's next safe point or advisor round, well within it.
constexpr absl::Duration kGiveAfterReclaim = absl::Seconds(5);
// How long a free waits for the daemon to take the memory it gives: the
// free is PyTorch's cudaFree, under the engine's lock, and a daemon that
// answers at all takes a segment's chunks in well under a millisecond (it
// checks and keeps their FDs). A stalled or vanished one costs one free
// this much per reclaim request, since a give that fails ends giving until
// the daemon asks again; the lease's own timeout (kSideCallTimeout) would
// stall every free of the window for seconds.
constexpr absl::Duration kGiveTimeout = absl::Milliseconds(200);

// Sim mode: chunks are memfd files; a reservation is PROT_NONE anonymous
// memory that chunks are mmap()ed over.
class MmapChunkMapper final : public ChunkMapper {
 public:
  bool CanCreate() const override { return true; }

  // A memfd as the daemon's MemfdChunkSource makes one (its name and
  // seals, which its AdoptChunk checks), kept for Export until unmapped.
  absl::StatusOr<uint64_t> Create(uint64_t address,
                                  size_t chunk_bytes) override {
    UniqueFd fd(memfd_create("allocd-chunk", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!fd.valid() ||
        ftruncate(fd.get(), static_cast<off_t>(chunk_bytes)) != 0 ||
        fcntl(fd.get(), F_ADD_SEALS,
              F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "making a ", FormatSize(chunk_bytes), " memfd chunk: ", strerror(errno)));
    }
    absl::StatusOr<uint64_t> handle = Map(address, chunk_bytes, fd.get(), 0);
    if (handle.ok()) {
      absl::MutexLock lock(&mu_);
      made_[address] = std::move(fd);
    }
    return handle;
  }

  absl::StatusOr<UniqueFd> Export(const ChunkMapping& chunk) override {
    absl::MutexLock lock(&mu_);
    auto it = made_.find(chunk.address);
    if (it == made_.end()) {
      return absl::NotFoundError(absl::StrCat(
          "no chunk made here is mapped at 0x", absl::Hex(chunk.address)));
    }
    return DuplicateFd(it->second.get());
  }

  absl::StatusOr<uint64_t> Reserve(size_t bytes) override {
    void* p = mmap(nullptr, bytes, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot reserve ", FormatSize(bytes), " of address space: ",
          strerror(errno)));
    }
    return reinterpret_cast<uint64_t>(p);
  }

  void Free(uint64_t address, size_t bytes) override {
    munmap(reinterpret_cast<void*>(address), bytes);
  }

  absl::StatusOr<uint64_t> Map(uint64_t address, size_t chunk_bytes, int fd,
                               uint64_t offset) override {
    void* p = mmap(reinterpret_cast<void*>(address), chunk_bytes,
                   PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
                   static_cast<off_t>(offset));
    if (p == MAP_FAILED) {
      return absl::InternalError(
          absl::StrCat("mmap of a daemon chunk: ", strerror(errno)));
    }
    return 0;
  }

  void Unmap(uint64_t address, size_t bytes,
             absl::Span<const ChunkMapping>) override {
    // One call for the whole range, whatever is mapped in it.
    mmap(reinterpret_cast<void*>(address), bytes, PROT_NONE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    absl::MutexLock lock(&mu_);
    made_.erase(made_.lower_bound(address), made_.lower_bound(address + bytes));
  }

 private:
  // A working set handed over is mapped on another thread.
  absl::Mutex mu_;
  std::map<uint64_t, UniqueFd> made_ ABSL_GUARDED_BY(mu_);  // Create's memfds
};

}  // namespace

absl::StatusOr<uint64_t> ChunkMapper::Create(uint64_t, size_t) {
  return absl::UnimplementedError("this mapper makes no chunks");
}

absl::StatusOr<UniqueFd> ChunkMapper::Export(const ChunkMapping&) {
  return absl::UnimplementedError("this mapper makes no chunks");
}

std::unique_ptr<ChunkMapper> MakeMmapChunkMapper() {
  return std::make_unique<MmapChunkMapper>();
}

DaemonBackend::DaemonBackend(DaemonClient* client)
    : DaemonBackend(client, MakeMmapChunkMapper()) {}

DaemonBackend::DaemonBackend(DaemonClient* client,
                             std::unique_ptr<ChunkMapper> mapper)
    : client_(client),
      mapper_(std::move(mapper)),
      total_(client->capacity_bytes()) {}

DaemonBackend::~DaemonBackend() {
  if (handover_ != nullptr) {
    client_->OnReclaim(nullptr);
    handover_.reset();
  }
  while (!shared_.empty()) CloseShared(shared_.begin()->first);
  while (!ranges_.empty()) {
    auto [address, bytes] = *ranges_.begin();
    Unmap(address, bytes, false);
  }
}

size_t DaemonBackend::FreeMemory() const {
  return total_ > held_ ? total_ - held_ : 0;
}

absl::StatusOr<std::vector<ChunkMapping>> DaemonBackend::MapReceived(
    uint64_t address, size_t bytes, ReceivedChunks& got) {
  std::vector<ChunkMapping> mappings;
  uint64_t at = address;
  absl::Status failed;
  const size_t first_made = got.ids.size() - got.client_made;
  MapPathCounters& counters = client_->map_path();
  for (size_t i = 0; i < got.ids.size() && failed.ok(); ++i) {
    const uint64_t size = got.sizes[i];
    if (at + size > address + bytes) {
      failed = absl::DataLossError(
          absl::StrCat("the daemon's chunks add up to more than the ",
                       FormatSize(bytes), " asked for"));
      break;
    }
    absl::StatusOr<uint64_t> handle;
    {
      NanosInto timed(counters.map_ns);
      handle = i >= first_made
                   ? mapper_->Create(at, size)
                   : mapper_->Map(at, size, got.fds[i].get(), got.offsets[i]);
    }
    if (!handle.ok()) {
      failed = handle.status();
      break;
    }
    (i >= first_made ? counters.chunks_created : counters.chunks_mapped)
        .fetch_add(1, std::memory_order_relaxed);
    // The mapping holds the memory: the FD is no longer needed.
    got.fds[i].reset();
    mappings.push_back({.address = at, .bytes = size, .handle = *handle});
    at += size;
  }
  if (failed.ok()) {
    NanosInto timed(counters.access_ns);
    failed = mapper_->EnableAccess(address, at - address);
  }
  if (!failed.ok()) {
    if (!mappings.empty()) mapper_->Unmap(address, at - address, mappings);
    return failed;
  }
  return mappings;
}

absl::Status DaemonBackend::Map(uint64_t address, size_t bytes,
                                uint64_t max_chunk_bytes) {
  absl::StatusOr<ReceivedChunks> got;
  absl::StatusOr<std::vector<ChunkMapping>> mapped;
  for (bool creates = client_creates_;; creates = false) {
    {
      NanosInto timed(client_->map_path().acquire_ns);
      got = client_->Acquire(bytes, max_chunk_bytes, creates);
    }
    if (!got.ok()) {
      // The engine's OOM path (free the cache, retry, report) handles both.
      if (absl::IsResourceExhausted(got.status()) ||
          absl::IsUnavailable(got.status())) {
        return absl::ResourceExhaustedError(got.status().message());
      }
      return got.status();
    }
    mapped = MapReceived(address, bytes, *got);
    if (mapped.ok()) {
      client_->map_path().segments_mapped.fetch_add(1, std::memory_order_relaxed);
      client_->map_path().NoteSegment(bytes);
      break;
    }
    (void)client_->Release(got->epoch, got->ids);
    // The device is full below the pool's capacity (another job's cache,
    // contexts): the daemon makes the chunks instead, and only it can make
    // room by trimming its cache and asking other jobs to give theirs back.
    const bool device_full =
        got->client_made > 0 && absl::IsResourceExhausted(mapped.status());
    if (!device_full) return mapped.status();
    ++client_create_fallbacks_;
  }
  Adopt(*got, *mapped);
  return absl::OkStatus();
}

void DaemonBackend::Adopt(const ReceivedChunks& got,
                          const std::vector<ChunkMapping>& mapped) {
  const size_t first_made = got.ids.size() - got.client_made;
  for (size_t i = 0; i < mapped.size(); ++i) {
    const ChunkMapping& m = mapped[i];
    chunks_[m.address] = {.epoch = got.epoch,
                          .id = got.ids[i],
                          .bytes = m.bytes,
                          .handle = m.handle,
                          .made_here = i >= first_made};
    held_ += m.bytes;
  }
}

absl::Status DaemonBackend::Prewarm(size_t bytes) {
  // AllocateSegment's first ask (Map): whole, with the largest chunks.
  return client_->Prewarm(bytes, UINT64_MAX, client_creates_);
}

absl::StatusOr<bool> DaemonBackend::MapPrewarmed(size_t bytes,
                                                absl::Mutex& caller_lock) {
  std::optional<ReceivedChunks> got =
      client_->TakeParked(bytes, UINT64_MAX, client_creates_);
  if (!got.has_value()) return false;
  // Mapping reads none of the books (the handover's thread maps the same
  // way beside the caller's calls), and the client takes its own locks.
  const auto mapping = prewarms_mapping_.insert(bytes);
  caller_lock.Unlock();
  absl::StatusOr<MappedRange> mapped = MapIntoNewRange(*got);
  if (!mapped.ok()) (void)client_->Release(got->epoch, got->ids);
  caller_lock.Lock();
  prewarms_mapping_.erase(mapping);
  if (!mapped.ok()) return mapped.status();
  client_->map_path().segments_mapped.fetch_add(1, std::memory_order_relaxed);
  client_->map_path().NoteSegment(bytes);
  ranges_[mapped->address] = bytes;
  Adopt(*got, mapped->mappings);
  spares_.Add({.address = mapped->address,
               .bytes = bytes,
               .origin = SpareSegments::Origin::kPrewarmed,
               .since = absl::Now()});
  ReportSpares();
  return true;
}

uint64_t DaemonBackend::TakenSpares::bytes() const {
  uint64_t bytes = 0;
  for (const DetachedRange& range : ranges_) bytes += range.bytes;
  return bytes;
}

DaemonBackend::TakenSpares DaemonBackend::TakeUnusedPrewarmed() {
  return Take(spares_.TakeAll(SpareSegments::Origin::kPrewarmed));
}

DaemonBackend::TakenSpares DaemonBackend::TakeSpares(uint64_t bytes) {
  return Take(spares_.TakeLargestCovering(bytes));
}

DaemonBackend::TakenSpares DaemonBackend::TakeSparesOlderThan(absl::Duration keep) {
  if (spares_.empty()) return {};
  return Take(spares_.TakeSpareSince(absl::Now() - keep));
}

DaemonBackend::TakenSpares DaemonBackend::Take(
    const std::vector<SpareSegments::Spare>& spares) {
  TakenSpares taken;
  for (const SpareSegments::Spare& spare : spares) {
    taken.ranges_.push_back(Detach(spare.address, spare.bytes, false));
  }
  if (!spares.empty()) ReportSpares();
  return taken;
}

uint64_t DaemonBackend::UnmapTaken(TakenSpares taken) {
  for (DetachedRange& range : taken.ranges_) Finish(range);
  return taken.bytes();
}

void DaemonBackend::ReportSpares() {
  client_->SetUnusedBytes(TelemetryStream::Unused::kSpare, spares_.bytes());
}

void DaemonBackend::Unmap(uint64_t address, size_t bytes,
                          bool keep_reservation) {
  DetachedRange range = Detach(address, bytes, keep_reservation);
  Finish(range);
}

DaemonBackend::DetachedRange DaemonBackend::Detach(uint64_t address, uint64_t bytes,
                                                   bool keep_reservation) {
  DetachedRange range{.address = address, .bytes = bytes,
                      .free_reservation = !keep_reservation};
  for (auto it = chunks_.lower_bound(address);
       it != chunks_.end() && it->first < address + bytes;) {
    range.chunks.emplace_back(it->first, it->second);
    held_ -= it->second.bytes;
    it = chunks_.erase(it);
  }
  if (!keep_reservation) ranges_.erase(address);
  return range;
}

void DaemonBackend::Finish(DetachedRange& range) {
  // Freed while another session is short, memory made here goes to it
  // through the daemon's cache: released to the driver, it would be
  // scrubbed before anyone could have it again, and the neighbour would
  // wait for that instead of importing it. Otherwise it leaves with the
  // release: the daemon's cache holds no more than reclaims bring back,
  // and the device keeps room for what the pool does not serve (contexts,
  // libraries' workspaces, processes not under allocd). Where the daemon
  // does not take it, it leaves too, and so does what the window's later
  // frees made: until its next reclaim request, no free waits again for a
  // daemon that did not take a give.
  if (client_->ReclaimAskedWithin(kGiveAfterReclaim)) {
    const int64_t reclaim = client_->reclaims();
    std::vector<std::pair<uint64_t, MappedChunk*>> chunks;
    for (auto& [address, chunk] : range.chunks) chunks.emplace_back(address, &chunk);
    if (reclaim != give_failed_in_reclaim_.load(std::memory_order_relaxed) &&
        !GiveMadeMemory(chunks, kGiveTimeout).ok()) {
      give_failed_in_reclaim_.store(reclaim, std::memory_order_relaxed);
    }
  }
  std::map<uint64_t, std::vector<uint64_t>> ids_by_epoch;
  std::vector<ChunkMapping> mappings;
  for (const auto& [address, chunk] : range.chunks) {
    ids_by_epoch[chunk.epoch].push_back(chunk.id);
    mappings.push_back({.address = address, .bytes = chunk.bytes, .handle = chunk.handle});
  }
  if (!mappings.empty()) {
    MapPathCounters& counters = client_->map_path();
    NanosInto timed(counters.unmap_ns);
    mapper_->Unmap(range.address, range.bytes, mappings);
    counters.segments_unmapped.fetch_add(1, std::memory_order_relaxed);
  }
  if (range.free_reservation) mapper_->Free(range.address, range.bytes);
  // Unmapped: the freeing thread need not wait for the daemon to hear.
  for (const auto& [epoch, ids] : ids_by_epoch) client_->ReleaseSoon(epoch, ids);
}

absl::StatusOr<uint64_t> DaemonBackend::AllocateSegment(size_t bytes) {
  if (std::optional<uint64_t> spare = spares_.Take(bytes)) {
    client_->map_path().spares_taken.fetch_add(1, std::memory_order_relaxed);
    ReportSpares();
    CountSegment(*spare, bytes);
    return *spare;
  }
  if (handover_ != nullptr) {
    if (std::optional<WorkingSetHandover::Segment> ready =
            handover_->Take(bytes)) {
      AdoptHandedOver(*ready);
      return ready->address;
    }
  }
  absl::StatusOr<uint64_t> address = MapNewSegment(bytes);
  if (!address.ok() && absl::IsResourceExhausted(address.status()) &&
      !spares_.empty()) {
    // As PyTorch frees its cache and tries again when the device is full:
    // spares of other sizes are this process's own cache.
    UnmapTaken(TakeSpares(0));
    address = MapNewSegment(bytes);
  }
  if (!address.ok()) return address;
  CountSegment(*address, bytes);
  return address;
}

absl::StatusOr<uint64_t> DaemonBackend::MapNewSegment(size_t bytes) {
  absl::StatusOr<uint64_t> address = mapper_->Reserve(bytes);
  if (!address.ok()) return address;
  ranges_[*address] = bytes;
  // Freed whole (FreeSegment): the daemon's largest chunks serve it.
  if (absl::Status s = Map(*address, bytes, UINT64_MAX); !s.ok()) {
    mapper_->Free(*address, bytes);
    ranges_.erase(*address);
    return s;
  }
  return address;
}

void DaemonBackend::AdoptHandedOver(const WorkingSetHandover::Segment& segment) {
  ranges_[segment.address] = segment.bytes;
  uint64_t at = segment.address;
  for (size_t i = 0; i < segment.ids.size(); ++i) {
    chunks_[at] = {.epoch = segment.epoch,
                   .id = segment.ids[i],
                   .bytes = segment.sizes[i],
                   .handle = segment.handles[i]};
    held_ += segment.sizes[i];
    at += segment.sizes[i];
  }
  CountSegment(segment.address, segment.bytes);
}

void DaemonBackend::CountSegment(uint64_t address, size_t bytes) {
  segments_[address] = {.bytes = bytes, .order = next_order_};
  sizes_by_order_[next_order_++] = bytes;
  segment_bytes_ += bytes;
  if (segment_bytes_ <= peak_segment_bytes_) return;
  peak_segment_bytes_ = segment_bytes_;
  std::vector<uint64_t> working_set;
  for (const auto& [order, size] : sizes_by_order_) {
    if (working_set.size() == kMaxWorkingSetSegments) break;
    working_set.push_back(size);
  }
  client_->PublishWorkingSet(std::move(working_set));
}

void DaemonBackend::FreeSegment(uint64_t address, size_t bytes) {
  bool shared = false;
  if (auto it = segments_.find(address); it != segments_.end()) {
    sizes_by_order_.erase(it->second.order);
    segment_bytes_ -= it->second.bytes;
    shared = it->second.shared;
    segments_.erase(it);
  }
  if (keep_freed_ && !shared && ranges_.count(address) != 0) {
    spares_.Add({.address = address,
                 .bytes = bytes,
                 .origin = SpareSegments::Origin::kKept,
                 .since = absl::Now()});
    client_->map_path().segments_kept.fetch_add(1, std::memory_order_relaxed);
    ReportSpares();
    return;
  }
  Unmap(address, bytes, false);
}

void DaemonBackend::HandOver(absl::Duration keep) {
  const std::vector<uint64_t>& plan = client_->handed_working_set();
  if (plan.empty() || keep <= absl::ZeroDuration() || handover_ != nullptr) {
    return;
  }
  WorkingSetHandover::Callbacks callbacks{
      .fetch =
          [this](uint64_t bytes, uint32_t count) {
            return client_->AcquireAhead(bytes, UINT64_MAX, count);
          },
      .map = [this](ReceivedChunks grant)
          -> absl::StatusOr<WorkingSetHandover::Segment> {
        absl::StatusOr<MappedRange> mapped = MapIntoNewRange(grant);
        if (!mapped.ok()) {
          (void)client_->Release(grant.epoch, grant.ids);
          return mapped.status();
        }
        WorkingSetHandover::Segment segment{.address = mapped->address,
                                            .bytes = grant.bytes(),
                                            .epoch = grant.epoch,
                                            .ids = grant.ids,
                                            .sizes = grant.sizes};
        for (const ChunkMapping& m : mapped->mappings) {
          segment.handles.push_back(m.handle);
        }
        return segment;
      },
      .give_back =
          [this](WorkingSetHandover::Segment segment) {
            std::vector<ChunkMapping> mappings;
            uint64_t at = segment.address;
            for (size_t i = 0; i < segment.ids.size(); ++i) {
              mappings.push_back({.address = at,
                                  .bytes = segment.sizes[i],
                                  .handle = segment.handles[i]});
              at += segment.sizes[i];
            }
            mapper_->Unmap(segment.address, segment.bytes, mappings);
            mapper_->Free(segment.address, segment.bytes);
            (void)client_->Release(segment.epoch, segment.ids);
          },
      .release =
          [this](ReceivedChunks grant) {
            (void)client_->Release(grant.epoch, grant.ids);
          },
      .report = [this](uint64_t bytes) {
        client_->SetUnusedBytes(TelemetryStream::Unused::kHandedOver, bytes);
      },
  };
  handover_ = std::make_unique<WorkingSetHandover>(plan, std::move(callbacks),
                                                   keep);
  WorkingSetHandover* const handover = handover_.get();
  // Given back whole, whatever the daemon asks: it is memory no segment
  // uses, the cheapest to give.
  client_->OnReclaim([handover](uint64_t) { return handover->Drop(); });
}

absl::StatusOr<std::string> DaemonBackend::ShareSegment(uint64_t address) {
  auto segment = segments_.find(address);
  if (segment == segments_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "no segment from the allocd daemon starts at 0x", absl::Hex(address)));
  }
  // The daemon can share only memory it holds: give it first.
  std::vector<std::pair<uint64_t, MappedChunk*>> chunks;
  for (auto it = chunks_.lower_bound(address);
       it != chunks_.end() && it->first < address + segment->second.bytes; ++it) {
    chunks.emplace_back(it->first, &it->second);
  }
  if (absl::Status s = GiveMadeMemory(chunks, client_->options().rpc_timeout); !s.ok()) {
    return s;
  }
  segment->second.shared = true;
  std::vector<uint64_t> ids;
  uint64_t epoch = 0;
  for (const auto& [chunk_address, chunk] : chunks) {
    epoch = chunk->epoch;  // one Acquire: one epoch
    ids.push_back(chunk->id);
  }
  return client_->Share(epoch, ids);
}

absl::Status DaemonBackend::GiveMadeMemory(
    const std::vector<std::pair<uint64_t, MappedChunk*>>& chunks, absl::Duration timeout) {
  // By epoch: a range mapped across a reconnect holds chunks of two.
  struct Gift {
    std::vector<uint64_t> ids;
    std::vector<UniqueFd> fds;
    std::vector<MappedChunk*> chunks;
  };
  std::map<uint64_t, Gift> gifts;
  const int64_t started = absl::GetCurrentTimeNanos();
  const absl::Time deadline = absl::FromUnixNanos(started) + timeout;
  absl::Status given;
  for (const auto& [address, chunk_at] : chunks) {
    MappedChunk& chunk = *chunk_at;
    if (!chunk.made_here) continue;
    absl::StatusOr<UniqueFd> fd = mapper_->Export(
        {.address = address, .bytes = chunk.bytes, .handle = chunk.handle});
    if (!fd.ok()) {
      given = fd.status();  // nothing is given
      break;
    }
    Gift& gift = gifts[chunk.epoch];
    gift.ids.push_back(chunk.id);
    gift.fds.push_back(*std::move(fd));
    gift.chunks.push_back(&chunk);
  }
  if (gifts.empty() && given.ok()) return given;
  MapPathCounters& counters = client_->map_path();
  for (auto& [epoch, gift] : gifts) {
    if (!given.ok()) break;
    std::vector<int> fds;
    for (const UniqueFd& fd : gift.fds) fds.push_back(fd.get());
    given = client_->GiveMemory(epoch, gift.ids, fds, deadline - absl::Now());
    if (!given.ok()) break;
    for (MappedChunk* chunk : gift.chunks) chunk->made_here = false;
    counters.chunks_given.fetch_add(gift.ids.size(), std::memory_order_relaxed);
  }
  if (!given.ok()) counters.gives_failed.fetch_add(1, std::memory_order_relaxed);
  counters.give_ns.fetch_add(
      static_cast<uint64_t>(absl::GetCurrentTimeNanos() - started),
      std::memory_order_relaxed);
  return given;
}

absl::StatusOr<std::pair<uint64_t, size_t>> DaemonBackend::OpenShared(
    const std::string& share_token) {
  absl::StatusOr<ReceivedChunks> got = client_->OpenShare(share_token);
  if (!got.ok()) return got.status();
  const size_t bytes = got->bytes();
  absl::StatusOr<MappedRange> mapped = MapIntoNewRange(*got);
  if (!mapped.ok()) {
    (void)client_->CloseShare(got->epoch, share_token);
    return mapped.status();
  }
  shared_[mapped->address] = {.epoch = got->epoch,
                              .token = share_token,
                              .bytes = bytes,
                              .mappings = std::move(mapped->mappings)};
  return std::pair{mapped->address, bytes};
}

absl::StatusOr<DaemonBackend::MappedRange> DaemonBackend::MapIntoNewRange(
    ReceivedChunks& got) {
  const size_t bytes = got.bytes();
  absl::StatusOr<uint64_t> address = mapper_->Reserve(bytes);
  if (!address.ok()) return address.status();
  absl::StatusOr<std::vector<ChunkMapping>> mapped =
      MapReceived(*address, bytes, got);
  if (!mapped.ok()) {
    mapper_->Free(*address, bytes);
    return mapped.status();
  }
  return MappedRange{.address = *address, .mappings = *std::move(mapped)};
}

bool DaemonBackend::CloseShared(uint64_t address) {
  auto it = shared_.find(address);
  if (it == shared_.end()) return false;
  SharedRange& range = it->second;
  mapper_->Unmap(address, range.bytes, range.mappings);
  mapper_->Free(address, range.bytes);
  (void)client_->CloseShare(range.epoch, range.token);
  shared_.erase(it);
  return true;
}

absl::StatusOr<uint64_t> DaemonBackend::ReserveAddressRange(size_t bytes) {
  absl::StatusOr<uint64_t> address = mapper_->Reserve(bytes);
  if (address.ok()) ranges_[*address] = bytes;
  return address;
}

void DaemonBackend::ReleaseAddressRange(uint64_t address, size_t bytes) {
  Unmap(address, bytes, false);
}

absl::Status DaemonBackend::MapPages(uint64_t address, size_t bytes) {
  // UnmapPages may take back any page range of it: the smallest chunks.
  return Map(address, bytes, client_->chunk_bytes());
}

void DaemonBackend::UnmapPages(uint64_t address, size_t bytes) {
  Unmap(address, bytes, true);
}

}  // namespace allocd
