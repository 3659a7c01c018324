#include "client/telemetry_stream.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "client/thread_name.h"
#include "proto/protocol.h"

namespace allocd {
namespace {

// Events per telemetry message: ~16 bytes each packed, well inside the
// daemon's 1 MiB message limit.
constexpr size_t kMaxEventsPerReport = 16384;

}  // namespace

TelemetryStream::TelemetryStream(const DaemonClientOptions& options,
                                 const ActiveConnection& active)
    : options_(options),
      active_(active),
      reads_ahead_(options.read_ahead_keep > absl::ZeroDuration()) {
  if (options_.event_capacity > 0) {
    recorder_ = std::make_unique<EventRecorder>(options_.event_capacity, [this] {
      absl::MutexLock lock(&mu_);
      events_waiting_ = true;
    });
  }
  thread_ = std::thread([this] { Run(); });
}

TelemetryStream::~TelemetryStream() { Stop(); }

void TelemetryStream::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (context_ != nullptr) context_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
}

void TelemetryStream::PublishStats(std::map<std::string, int64_t> stats,
                                   uint64_t config_version) {
  absl::MutexLock lock(&mu_);
  stats_.clear_stats();
  for (auto& [k, v] : stats) (*stats_.mutable_stats())[k] = v;
  // Without reading ahead, only while something else holds unused memory.
  if (reads_ahead_ || UnusedTotal() != 0) WriteAheadBytes();
  stats_.set_config_version(config_version);
  ++stats_published_;
}

absl::Status TelemetryStream::Flush(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  flush_ = true;
  auto sent = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return stats_sent_ == stats_published_ || stopping_;
  };
  if (timeout == absl::InfiniteDuration()) timeout = options_.rpc_timeout;
  if (!mu_.AwaitWithTimeout(absl::Condition(&sent), timeout)) {
    return absl::DeadlineExceededError("telemetry not sent");
  }
  return absl::OkStatus();
}

void TelemetryStream::PublishWorkingSet(std::vector<uint64_t> segment_bytes) {
  absl::MutexLock lock(&mu_);
  working_set_.mutable_segment_bytes()->Assign(segment_bytes.begin(),
                                               segment_bytes.end());
  working_set_unsent_ = true;
  ++stats_published_;
}

void TelemetryStream::PublishFeatures(const v1::JobFeatures& features) {
  absl::MutexLock lock(&mu_);
  // Features only turn on: merging proto3 bools sets those `features`
  // has, leaving the others as they were (the union).
  v1::JobFeatures all = features_;
  all.MergeFrom(features);
  if (all.SerializeAsString() == features_.SerializeAsString()) return;
  features_ = std::move(all);
  features_unsent_ = true;
  ++stats_published_;
  flush_ = true;  // at once: a decision under way must see them
}

void TelemetryStream::NewSession() {
  absl::MutexLock lock(&mu_);
  const bool working_set = !working_set_.segment_bytes().empty();
  const bool features = features_.ByteSizeLong() > 0;
  if (!working_set && !features) return;
  working_set_unsent_ = working_set;
  features_unsent_ = features;
  ++stats_published_;
}

void TelemetryStream::SetUnusedBytes(Unused holder, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  unused_bytes_[static_cast<size_t>(holder)] = static_cast<int64_t>(bytes);
  PublishAheadBytes();
}

void TelemetryStream::PublishAheadBytes() {
  WriteAheadBytes();
  ++stats_published_;
  flush_ = true;
}

int64_t TelemetryStream::UnusedTotal() const {
  return std::accumulate(unused_bytes_.begin(), unused_bytes_.end(), int64_t{0});
}

void TelemetryStream::WriteAheadBytes() {
  (*stats_.mutable_stats())[kReadAheadStat] = UnusedTotal();
}

bool TelemetryStream::Send(grpc::ClientWriter<v1::TelemetryReport>& writer,
                           const Connection& c, v1::TelemetryReport* stats,
                           std::vector<RecordedBatch>& batches) {
  // The stats ride with the first message; events follow in messages of
  // at most kMaxEventsPerReport.
  v1::TelemetryReport report;
  if (stats != nullptr) report = std::move(*stats);
  NameSession(c, report);
  bool pending = stats != nullptr;
  for (size_t b = 0; b < batches.size(); ++b) {
    const RecordedBatch& batch = batches[b];
    for (size_t begin = 0; begin < batch.events.size() || begin == 0;
         begin += kMaxEventsPerReport) {
      const size_t end =
          std::min(batch.events.size(), begin + kMaxEventsPerReport);
      v1::EventBatch* out = report.mutable_events();
      out->set_sequence(batch.sequence + begin);
      out->set_dropped(begin == 0 ? batch.dropped : 0);
      for (size_t i = begin; i < end; ++i) {
        const RecordedEvent& e = batch.events[i];
        out->add_ops(static_cast<uint32_t>(e.op));
        out->add_sizes(e.size);
        out->add_ids(e.id);
        out->add_streams(e.stream);
      }
      if (!writer.Write(report)) {
        // What did not reach the daemon is a gap before what comes next.
        std::vector<RecordedBatch> unsent(batches.begin() + b, batches.end());
        unsent.front().events.erase(unsent.front().events.begin(),
                                    unsent.front().events.begin() + begin);
        if (begin > 0) unsent.front().dropped = 0;
        recorder_->Unsent(unsent);
        return false;
      }
      report.Clear();
      NameSession(c, report);
      pending = false;
      if (end == batch.events.size()) break;
    }
    if (batch.state_after == nullptr) continue;
    // The state in a report of its own: with a full batch it would pass
    // the daemon's message limit. Lost with the stream, it is not resent:
    // the next step mark brings a newer one.
    v1::EventBatch* out = report.mutable_events();
    out->set_sequence(batch.sequence + batch.events.size());
    *out->mutable_state_after() = *batch.state_after;
    if (!writer.Write(report)) {
      recorder_->Unsent(std::vector<RecordedBatch>(batches.begin() + b + 1, batches.end()));
      return false;
    }
    report.Clear();
    NameSession(c, report);
  }
  return !pending || writer.Write(report);
}

void TelemetryStream::Run() {
  NameThisThread("allocd-telemtry");
  std::shared_ptr<Connection> streaming;
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::ClientWriter<v1::TelemetryReport>> writer;
  v1::TelemetryAck ack;
  auto close_stream = [&] {
    if (writer != nullptr) {
      writer->WritesDone();
      (void)writer->Finish();
    }
    {
      absl::MutexLock lock(&mu_);
      context_ = nullptr;
    }
    writer.reset();
    context.reset();
    streaming.reset();
  };
  for (;;) {
    v1::TelemetryReport report;
    uint64_t sequence;
    bool new_stats;
    std::shared_ptr<Connection> c;
    {
      absl::MutexLock lock(&mu_);
      auto wake = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stopping_ || flush_ || events_waiting_;
      };
      mu_.AwaitWithTimeout(absl::Condition(&wake), options_.telemetry_period);
      if (stopping_) break;
      events_waiting_ = false;
      c = active_.Current();
      sequence = stats_published_;
      new_stats = sequence != stats_sent_;
      if (new_stats) report = stats_;
      if (!new_stats) flush_ = false;
      if (new_stats && working_set_unsent_) {
        *report.mutable_working_set() = working_set_;
        working_set_unsent_ = false;
      }
      if (new_stats && features_unsent_) {
        *report.mutable_features() = features_;
        features_unsent_ = false;
      }
    }
    // Events go out every period, whether the stats changed or not; while
    // the daemon is away they stay in the recorder (up to its capacity).
    std::vector<RecordedBatch> batches;
    if (recorder_ != nullptr && c != nullptr) batches = recorder_->Take();
    if (c == nullptr || (!new_stats && batches.empty())) continue;
    if (streaming != c) {
      close_stream();
      context = std::make_unique<grpc::ClientContext>();
      {
        absl::MutexLock lock(&mu_);
        context_ = context.get();
      }
      writer = c->stub->StreamTelemetry(context.get(), &ack);
      streaming = c;
    }
    if (!Send(*writer, *c, new_stats ? &report : nullptr, batches)) {
      close_stream();
      if (report.has_working_set() || report.has_features()) {
        absl::MutexLock lock(&mu_);
        // The next try sends the latest.
        working_set_unsent_ = working_set_unsent_ || report.has_working_set();
        features_unsent_ = features_unsent_ || report.has_features();
      }
      continue;
    }
    if (!new_stats) continue;
    absl::MutexLock lock(&mu_);
    stats_sent_ = sequence;
    if (stats_sent_ == stats_published_) flush_ = false;
  }
  close_stream();
}

}  // namespace allocd
