// The autotuner's vocabulary: what a job runs under (its mode and policy),
// what a client reports (events, step marks, its allocator's state), why a
// run is queued (AutotuneTrigger), what it came to (AutotuneResult), where a
// job stands (AutotuneJobState), and the decision record itself.
//
// Triggers, results and states are enums inside the daemon; their names,
// the text the proto, the metrics' `result` label and the logs carry, are
// in one table each below. A new trigger is one enum value and one row.
#ifndef ALLOCD_SERVER_AUTOTUNE_AUTOTUNE_TYPES_H_
#define ALLOCD_SERVER_AUTOTUNE_AUTOTUNE_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "allocator/trace/trace.h"
#include "proto/protocol.h"
#include "server/autotune/job_features.h"
#include "server/tenant_id.h"

namespace allocd {

// One enum value and the name it goes by outside the daemon.
template <typename Enum>
struct NamedValue {
  Enum value;
  const char* name;
};

// The name of `value` in `table`; "?" for a value the table lacks (none
// does: each table below lists its enum whole).
template <typename Enum, size_t N>
constexpr const char* NameIn(const NamedValue<Enum> (&table)[N], Enum value) {
  for (const NamedValue<Enum>& row : table) {
    if (row.value == value) return row.name;
  }
  return "?";
}

enum class AutotuneMode { kOff, kRecommend, kApply };
inline constexpr NamedValue<AutotuneMode> kAutotuneModes[] = {
    {AutotuneMode::kOff, "off"},
    {AutotuneMode::kRecommend, "recommend"},
    {AutotuneMode::kApply, "apply"},
};
// "off" | "recommend" | "apply"; InvalidArgument otherwise.
absl::StatusOr<AutotuneMode> ParseAutotuneMode(absl::string_view name);
constexpr const char* AutotuneModeName(AutotuneMode mode) { return NameIn(kAutotuneModes, mode); }

// Why a run was queued (see autotuner.h for when each fires).
enum class AutotuneTrigger {
  kFirstPass,       // the job's window first holds enough to decide on
  kFragmentation,   // reserved/allocated stayed above fragmentation_ratio
  kAllocRetry,      // PyTorch freed its cache to retry an allocation
  kOom,             // a session ran out of memory
  kBadStartConfig,  // a first pass, early: the job started on a harmful config
  kGrowth,          // reserved grew past what the last decision said it needs
  kLargerRequest,   // a request larger than any the last decision saw peaked
  kAdmin,           // an admin asked (RunNow)
  // A first pass of a job started on a config the daemon chose instead of
  // its own (the node's prior, or its harmful config made safe): judged
  // like a push, against staying on its own (ReviewPrior).
  kStartReview,
};
inline constexpr NamedValue<AutotuneTrigger> kAutotuneTriggers[] = {
    {AutotuneTrigger::kFirstPass, "first_pass"},
    {AutotuneTrigger::kFragmentation, "fragmentation"},
    {AutotuneTrigger::kAllocRetry, "alloc_retry"},
    {AutotuneTrigger::kOom, "oom"},
    {AutotuneTrigger::kBadStartConfig, "bad_start_config"},
    {AutotuneTrigger::kGrowth, "growth"},
    {AutotuneTrigger::kLargerRequest, "larger_request"},
    {AutotuneTrigger::kAdmin, "admin"},
    {AutotuneTrigger::kStartReview, "start_review"},
};
constexpr const char* AutotuneTriggerName(AutotuneTrigger trigger) {
  return NameIn(kAutotuneTriggers, trigger);
}

// What a decision came to: pushed to a canary (apply), recommended only
// (recommend), kept the job's config, pushed and then rolled back, or
// skipped (nothing could be decided, or nothing could be pushed).
enum class AutotuneResult { kPushed, kRecommended, kKept, kRolledBack, kSkipped };
inline constexpr NamedValue<AutotuneResult> kAutotuneResults[] = {
    {AutotuneResult::kPushed, "pushed"},
    {AutotuneResult::kRecommended, "recommended"},
    {AutotuneResult::kKept, "kept"},
    {AutotuneResult::kRolledBack, "rolled_back"},
    {AutotuneResult::kSkipped, "skipped"},
};
constexpr const char* AutotuneResultName(AutotuneResult result) {
  return NameIn(kAutotuneResults, result);
}

// Where a job stands: waiting for a trigger, a run queued or running, a
// push on its canary, a push set for the whole job, or not autotuned.
enum class AutotuneJobState { kWatching, kDeciding, kCanary, kApplied, kOff };
inline constexpr NamedValue<AutotuneJobState> kAutotuneJobStates[] = {
    {AutotuneJobState::kWatching, "watching"},
    {AutotuneJobState::kDeciding, "deciding"},
    {AutotuneJobState::kCanary, "canary"},
    {AutotuneJobState::kApplied, "applied"},
    {AutotuneJobState::kOff, "off"},
};
constexpr const char* AutotuneJobStateName(AutotuneJobState state) {
  return NameIn(kAutotuneJobStates, state);
}

// By name (gtest prints values with these). absl::StrCat writes an enum
// as its number: logs name them with the *Name functions above.
std::ostream& operator<<(std::ostream& out, AutotuneTrigger trigger);
std::ostream& operator<<(std::ostream& out, AutotuneResult result);
std::ostream& operator<<(std::ostream& out, AutotuneJobState state);

// One allocator event as a client reports it. `id` names the allocation from
// its alloc to its free_completed (managed mode: the engine's block handle;
// advisor mode: the address, which can be reused after free_completed).
// `stream`: the CUDA stream handle (order matters: PyTorch orders free
// blocks by stream).
struct EvidenceEvent {
  TraceOp op;  // or kStepMark
  uint64_t stream;
  uint64_t id;
  uint64_t size;  // bytes the program asked for
};

// EvidenceEvent::op of a step mark (EventBatch op kEventOpStep): the job
// ended a step here. No TraceOp: a mark is no allocation and never reaches
// a replay.
inline constexpr TraceOp kStepMark = static_cast<TraceOp>(kEventOpStep);

// A client allocator's memory at one point of its event stream
// (v1::AllocatorState, sent at a step mark): its segments, and the blocks
// in them the program holds, named by the ids its events use.
struct AllocatorSnapshot {
  struct Segment {
    uint64_t address;
    uint64_t size;
    uint64_t stream;  // CUDA handle
    bool is_small;
    bool is_expandable;  // one mapped range of an expandable segment
  };
  struct Block {
    uint64_t id;
    uint64_t address;
    uint64_t size;
    uint64_t requested_size;
    bool free_requested;  // freed, held for another stream
  };
  std::vector<Segment> segments;
  std::vector<Block> blocks;
};

struct JobPolicy {
  AutotuneMode mode = AutotuneMode::kRecommend;
  // PYTORCH_CUDA_ALLOC_CONF keys the job set itself and the autotuner must
  // never change (e.g. "expandable_segments"); candidates keep the job's
  // value for them.
  std::vector<std::string> pinned_keys;
  // Only then may a memory fraction (hard cap) be proposed.
  bool allow_memory_fraction = false;
};

// What a push set for the whole job teaches its next runs, which start on
// the config from their first allocation (learn_check.h): the push's config,
// or what the run had without it when that replayed lower from the job's
// window's first event.
struct LearnedFromPush {
  std::string config;  // canonical: what the job's next runs start on
  // Replayed from the window's first event: `config`'s peak reserved and
  // the push's (0: not replayed).
  int64_t peak = 0;
  int64_t pushed_peak = 0;
  std::string why;  // which config is learned and why, with those peaks
};

struct AutotuneDecision {
  uint64_t id = 0;  // increasing per daemon
  absl::Time triggered_at;  // when the trigger queued the run
  absl::Time at;            // when the decision was made
  std::string job;
  TenantId tenant;  // the job's: its label names it within this tenant only
  std::string run;  // the job's run id (JobKey::run): "" for a label's job
  AutotuneTrigger trigger = AutotuneTrigger::kFirstPass;
  AutotuneResult result = AutotuneResult::kSkipped;
  std::string from_config;  // canonical; what the job runs
  std::string to_config;    // canonical; proposed ("" when kept/skipped)
  std::optional<double> memory_fraction;  // only for jobs that allow it
  // Predictions over the part of the window after the switch point: staying
  // on from_config, and switching (live Reconfigure + empty cache) at the
  // switch point.
  int64_t predicted_peak_current = 0;
  int64_t predicted_peak_switched = 0;
  int64_t predicted_saving = 0;
  int64_t predicted_peak_allocated = 0;  // the job's need over the same events
  int64_t predicted_peak_requested = 0;  // the same in sizes as asked
  // If the push were rolled back at the end of the window: the peak reserved
  // over the window's events after the switch point repeated (the job's next
  // steps as far as the window tells), with what the push made and still
  // held at the rollback left reserved. Set with a proposal.
  std::optional<int64_t> predicted_peak_rolled_back;
  std::optional<int64_t> realized_peak;    // peak reserved the sessions reported after the push
  std::optional<int64_t> realized_saving;  // predicted_peak_current - realized_peak
  // A push's prediction for the steps the job really ran after it. A
  // decision predicts the steps its window holds; a job whose later steps
  // are larger (random batches, lengths, resolutions, a growing KV cache)
  // needs more under every config, which is the job's doing, not the
  // config's. realized_peak_requested: the most the canary's own stream held
  // requested after the push (unset until it sends events after it).
  // predicted_peak_at_need: the newest prediction for the pushed config
  // (at_need_basis says which: empty for the push's own, else a replay of
  // the pushed config on the events the canary ran after the push, or a
  // later decision that kept it), scaled by how much more the job needed
  // since than that prediction covered (at least 1x; on the canary's stream, else on
  // PyTorch's allocated peak in its stats reports): what the autotuner says
  // the pushed config reserves for the steps that came, and the prediction
  // realized_peak is judged against.
  std::optional<int64_t> realized_peak_requested;
  std::optional<int64_t> predicted_peak_at_need;
  std::string at_need_basis;
  // A push's judgement (see AutotuneOptions::rollback_margin): staying's
  // peak reserved replayed on the judged_events events the canary ran after
  // the push, what a rollback then was predicted to leave the job at, and
  // what keeping the push was predicted at on the same repeat.
  std::optional<int64_t> staying_after_push;
  std::optional<int64_t> rollback_after_push;
  std::optional<int64_t> keeping_after_push;
  uint64_t judged_events = 0;
  // Trigger to the canary's ACK of the pushed config (the issue's "trigger ->
  // ACK"): queueing, the replays, the push and the client's apply.
  std::optional<absl::Duration> trigger_to_ack;
  // A push's review, once the canary's session has ended or run half a
  // window of events after the push: the least peak
  // reserved that staying, or any config the autotuner could push, reaches
  // on the events the canary ran after the push, switched to at the push
  // from the state there (a replay of its window): the issue's "best config
  // on those same steps", which realized_peak is judged against; over
  // reviewed_events events. Unset when the push left the window or was
  // rolled back.
  std::optional<int64_t> best_reachable_peak;
  uint64_t reviewed_events = 0;
  uint64_t window_events = 0;
  double replay_seconds = 0;  // wall time of the decision's replays
  size_t candidates = 0;
  std::vector<uint64_t> sessions;  // canary first
  // The session whose stream the decision replayed (the job's recorded
  // one then; 0: none): the one a decision that settles the job tells it
  // has nothing to decide (StreamDemand).
  uint64_t decided_on = 0;
  uint64_t version = 0;  // config version pushed (0: none)
  std::string why;  // evidence and the gates that passed or failed, human-readable
  // Candidates left out because PyTorch cannot run them with what the job
  // does (Decision::left_out).
  std::vector<LeftOutConfig> left_out;
  // A push set for the whole job, once checked as its next runs would use it
  // (the autotuner's learn check): what they start on. Unset until then, and
  // for any other decision: nothing is learned from a push before it is
  // checked.
  std::optional<LearnedFromPush> learned;
};

// A session of a job as the admin sees it: its rank (when its client
// reported one) and the config it runs.
struct AutotuneRankStatus {
  uint64_t session = 0;
  uint32_t rank = 0;
  uint32_t world_size = 0;  // 0: its client reported no rank
  std::string config;       // canonical; what it runs ("" PyTorch's defaults)
  uint64_t config_version = 0;
  bool canary = false;  // the push under way went to it first
};

// A job as the admin sees it (Autotuner::Status).
struct AutotuneJobStatus {
  std::string job;
  TenantId tenant;
  std::string run;  // JobKey::run
  JobPolicy policy;
  size_t sessions = 0;
  std::vector<AutotuneRankStatus> ranks;  // by rank, then session
  uint64_t window_events = 0;
  uint64_t dropped_events = 0;  // events clients could not send (gaps in the window)
  uint64_t window_bytes = 0;    // daemon memory the window holds (~16 bytes an event)
  // Whether the recorded session's client marks its optimizer steps, and
  // the steps it marked in the window's stream: a client that marks none
  // runs no optimizer and is decided on as aperiodic.
  bool marks_steps = false;
  uint64_t steps_marked = 0;
  JobFeatures features;  // what its sessions reported doing (the union)
  AutotuneJobState state = AutotuneJobState::kWatching;
  std::optional<AutotuneDecision> last;
};

// `bytes` as a decision's `why` writes sizes ("1.50 GiB").
std::string GiB(int64_t bytes);
// Whether a config peaking at `peak` saves at least `share` of
// `staying_peak`: the saving a push needs (DecideOptions::min_saving).
inline bool SavesAtLeast(int64_t staying_peak, int64_t peak, double share) {
  return static_cast<double>(staying_peak - peak) >= share * static_cast<double>(staying_peak);
}
// A PYTORCH_CUDA_ALLOC_CONF as a decision's `why` writes it: "(defaults)"
// for the empty one.
std::string ConfigName(const std::string& config);

// A replay under way for as long as it lives, told to `on_replay` (the
// autotuner's count, for metrics and tests: AutotuneOptions::on_replay):
// +1 as it is made, -1 as it goes; nothing when `on_replay` is empty.
class CountedReplay {
 public:
  explicit CountedReplay(const std::function<void(int)>& on_replay) : on_replay_(on_replay) {
    if (on_replay_) on_replay_(+1);
  }
  ~CountedReplay() {
    if (on_replay_) on_replay_(-1);
  }
  CountedReplay(const CountedReplay&) = delete;
  CountedReplay& operator=(const CountedReplay&) = delete;

 private:
  const std::function<void(int)>& on_replay_;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_AUTOTUNE_AUTOTUNE_TYPES_H_
