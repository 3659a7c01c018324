#include "server/autotune/step_period.h"

#include <string>

#include "allocator/trace/snapshot_reader.h"
#include "gtest/gtest.h"
#include "tests/trace/trace_builder.h"

namespace allocd {
namespace {

// A loop of `steps` steps, each `layers` identical layers forward (sizes
// from the step's batch) then backward, then an optimizer update.
Trace Loop(int steps, int layers) {
  TraceBuilder b;
  for (int s = 0; s < steps; ++s) {
    const uint64_t batch = (1 + s % 3) * 4096;
    std::vector<uint32_t> saved;
    for (int l = 0; l < layers; ++l) {
      saved.push_back(b.Alloc(batch * 8));
      b.Free(b.Alloc(batch));
    }
    for (int l = layers - 1; l >= 0; --l) {
      const uint32_t grad = b.Alloc(batch * 8);
      b.Free(saved[l]).Free(grad);
    }
    const uint32_t update = b.Alloc(64 << 20);
    b.Free(b.Alloc(2 << 20));
    b.Free(update);
  }
  return b.Build();
}

absl::StatusOr<Trace> Recorded(const std::string& workload) {
  return ReadSnapshotFile(std::string(ALLOCD_SOURCE_DIR) + "/traces/" + workload + ".pickle.gz");
}

// bench/gpu/resnet_train.py --steps 60 under max_split_size_mb:64 on the
// H100 (PyTorch 2.11, 2026-11-23): a ResNet-50 whose input resolution
// changes every step.
absl::StatusOr<Trace> MultiScaleResNet() {
  return ReadSnapshotFile(std::string(ALLOCD_SOURCE_DIR) +
                          "/tests/autotune/data/resnet50_multiscale.pickle.gz");
}

// How far the daemon lets the stream shift (decision_inputs.cc's kStepShift).
constexpr size_t kShift = 32;

TEST(StepPeriodTest, FindsTheStepNotTheLayer) {
  const Trace one = Loop(1, 12);
  const Trace trace = Loop(10, 12);
  const std::optional<uint64_t> period = FindStepPeriod(trace);
  ASSERT_TRUE(period.has_value());
  EXPECT_EQ(*period, one.events.size());
  // Allowed to follow lost events, it still does not take a layer for the step.
  EXPECT_EQ(FindStepPeriod(trace, /*max_shift=*/32), period);
}

TEST(StepPeriodTest, NoneWithoutARepetition) {
  EXPECT_FALSE(FindStepPeriod(Trace{}).has_value());
  EXPECT_FALSE(FindStepPeriod(Loop(1, 4)).has_value());
  // Small and large allocations in a pseudo-random order (a 16-bit LFSR).
  TraceBuilder b;
  uint16_t lfsr = 0xACE1u;
  for (int i = 0; i < 20000; ++i) {
    lfsr = static_cast<uint16_t>((lfsr >> 1) | (((lfsr ^ (lfsr >> 2) ^ (lfsr >> 3) ^ (lfsr >> 5)) & 1u) << 15));
    b.Free(b.Alloc((lfsr & 1) ? 4096 : 8 << 20));
  }
  EXPECT_FALSE(FindStepPeriod(b.Build()).has_value());
}

TEST(StepPeriodTest, LlamaLoraTakesOneTwentiethOfItsTrace) {
  // The recording ran 20 steps (traces/README.md).
  absl::StatusOr<Trace> trace = Recorded("llama_lora");
  ASSERT_TRUE(trace.ok()) << trace.status();
  const std::optional<uint64_t> period = FindStepPeriod(*trace);
  ASSERT_TRUE(period.has_value());
  const double per_step = static_cast<double>(trace->events.size()) / 20;
  EXPECT_GT(*period, 0.8 * per_step);
  EXPECT_LT(*period, 1.2 * per_step);
  // Following lost events must not turn a layer (500 events) into the step.
  EXPECT_EQ(FindStepPeriod(*trace, /*max_shift=*/32), period);
}

// Building a model repeats too (each layer: its weights, kept, and a
// temporary, freed), but keeps what it allocates; a training step gives it
// back. The advisor's window of llama_lora on the H100 began with 16 layers
// of 250 events that the first pass took for two steps.
TEST(StepPeriodTest, BuildingTheModelIsNotATrainingStep) {
  TraceBuilder b;
  for (int layer = 0; layer < 64; ++layer) {
    for (int w = 0; w < 6; ++w) b.Alloc(32 << 20);
    b.Free(b.Alloc(1 << 20));
  }
  const Trace building = b.Build();
  const std::optional<uint64_t> layer = FindStepPeriod(building);
  ASSERT_TRUE(layer.has_value());
  EXPECT_FALSE(ReturnsWhatItAllocates(building, *layer));

  const Trace training = Loop(10, 12);
  const std::optional<uint64_t> step = FindStepPeriod(training);
  ASSERT_TRUE(step.has_value());
  EXPECT_TRUE(ReturnsWhatItAllocates(training, *step));
  // Also the real llama_lora, over its training steps.
  absl::StatusOr<Trace> llama = Recorded("llama_lora");
  ASSERT_TRUE(llama.ok()) << llama.status();
  const std::optional<uint64_t> llama_step = FindStepPeriod(*llama);
  ASSERT_TRUE(llama_step.has_value());
  Trace ten_steps = *llama;
  ten_steps.events.resize(10 * *llama_step);
  EXPECT_TRUE(ReturnsWhatItAllocates(ten_steps, *llama_step));
}

// The first training step's layers repeat before any step does: forward,
// each keeps its output (llama_lora on the H100: 14.8 MB of the 4 GB a layer
// allocates, a 250-event period 5,000 events into the advisor's stream, which
// the first pass took for the step and pushed on, to roll back 6 s later).
TEST(StepPeriodTest, TheLayersOfTheFirstStepAreNotTrainingSteps) {
  TraceBuilder b;
  std::vector<uint32_t> outputs;
  for (int layer = 0; layer < 16; ++layer) {
    outputs.push_back(b.Alloc(16 << 20));
    for (int t = 0; t < 8; ++t) b.Free(b.Alloc(512 << 20));
  }
  const Trace forward = b.Build();
  for (int layer = 15; layer >= 0; --layer) {
    b.Free(outputs[layer]);
    for (int t = 0; t < 8; ++t) b.Free(b.Alloc(512 << 20));
  }
  const Trace backward = b.Build();
  // A layer: its output and 8 temporaries, each freed (requested, completed).
  constexpr uint64_t kLayer = 1 + 8 * 3;
  EXPECT_FALSE(ReturnsWhatItAllocates(forward, kLayer));
  EXPECT_FALSE(ReturnsWhatItAllocates(backward, kLayer + 2));
  // A step that keeps a loss (4 bytes of gigabytes) is still a step.
  TraceBuilder steps;
  for (int s = 0; s < 6; ++s) {
    steps.Alloc(4);
    for (int t = 0; t < 16; ++t) steps.Free(steps.Alloc(512 << 20));
  }
  EXPECT_TRUE(ReturnsWhatItAllocates(steps.Build(), 1 + 16 * 3));

  // The real llama_lora, searched as the daemon does: whatever repeats
  // before its fourth step is not taken for a step (allowed to shift, the
  // search finds 250-event layers up to the logits, where the floor jumps by
  // 7% of what a layer allocates); from then on, its step is.
  absl::StatusOr<Trace> llama = Recorded("llama_lora");
  ASSERT_TRUE(llama.ok()) << llama.status();
  const std::optional<uint64_t> step = FindStepPeriod(*llama);
  ASSERT_TRUE(step.has_value());
  bool found_early = false;
  for (size_t n = 2000; n < llama->events.size(); n = n * 5 / 4) {
    Trace prefix = *llama;
    prefix.events.resize(n);
    const std::optional<uint64_t> period = FindStepPeriod(prefix, kShift);
    if (!period) continue;
    SCOPED_TRACE(testing::Message() << n << " events, period " << *period);
    if (n < 3 * *step) {
      found_early = true;
      EXPECT_FALSE(ReturnsWhatItAllocates(prefix, *period));
    } else if (n > 4 * *step) {
      EXPECT_EQ(*period, *step);
      EXPECT_TRUE(ReturnsWhatItAllocates(prefix, *period));
    }
  }
  EXPECT_TRUE(found_early);  // the case this guards against is in the trace
}

// Its steps differ by up to 12 events (cuDNN's workspaces follow the
// shape): no step repeats exactly, and the daemon never decided on a job
// that lost no events until the search was allowed to shift.
TEST(StepPeriodTest, AMultiScaleResNetsStepIsFoundThoughStepsDifferInLength) {
  absl::StatusOr<Trace> trace = MultiScaleResNet();
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_FALSE(FindStepPeriod(*trace).has_value());
  const std::optional<uint64_t> step = FindStepPeriod(*trace, kShift);
  ASSERT_TRUE(step.has_value());
  const double per_step = static_cast<double>(trace->events.size()) / 60;
  EXPECT_NEAR(static_cast<double>(*step), per_step, 0.02 * per_step);
  EXPECT_TRUE(ReturnsWhatItAllocates(*trace, *step));
  // Before its third step, nothing it repeats is taken for a step.
  for (size_t n = 2000; n < 3 * *step; n = n * 5 / 4) {
    Trace prefix = *trace;
    prefix.events.resize(n);
    const std::optional<uint64_t> period = FindStepPeriod(prefix, kShift);
    if (period) {
      EXPECT_FALSE(ReturnsWhatItAllocates(prefix, *period)) << n << " events, period " << *period;
    }
  }
}

// An advisor loses a few events between reading PyTorch's history and
// clearing it (on the H100: 8 of the ~150,000 that llama_lora's first 11
// steps make): each loss shifts the rest of the stream by a few events,
// which must not hide the step (without the offset, the score finds four
// steps: 55,374 events).
TEST(StepPeriodTest, AFewLostEventsDoNotHideTheStep) {
  absl::StatusOr<Trace> trace = Recorded("llama_lora");
  ASSERT_TRUE(trace.ok()) << trace.status();
  const std::optional<uint64_t> full = FindStepPeriod(*trace);
  ASSERT_TRUE(full.has_value());
  const size_t kept = 11 * *full;
  Trace lossy = *trace;
  lossy.events.resize(kept);
  // Eight losses of 1-3 events, spread over the steps.
  for (int k = 8; k >= 1; --k) {
    const size_t at = k * kept / 9 + 977 * k;
    lossy.events.erase(lossy.events.begin() + at, lossy.events.begin() + at + 1 + k % 3);
  }
  const std::optional<uint64_t> period = FindStepPeriod(lossy, /*max_shift=*/32);
  ASSERT_TRUE(period.has_value());
  // Where every step holds a loss, the stream's step is the step less what
  // was lost: within max_shift of the real one, not a multiple of it.
  EXPECT_NEAR(static_cast<double>(*period), static_cast<double>(*full), 32);
}

// gpt2_full's steps differ in length (autocast, variable batches): no
// period is claimed, or one close to the average step.
TEST(StepPeriodTest, Gpt2FullClaimsNoWrongStep) {
  absl::StatusOr<Trace> trace = Recorded("gpt2_full");
  ASSERT_TRUE(trace.ok()) << trace.status();
  const std::optional<uint64_t> period = FindStepPeriod(*trace);
  if (!period) return;
  const double per_step = static_cast<double>(trace->events.size()) / 20;
  EXPECT_GT(*period, 0.8 * per_step);
  EXPECT_LT(*period, 1.2 * per_step);
}

}  // namespace
}  // namespace allocd
