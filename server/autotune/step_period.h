// FindStepPeriod: how many events one step of a training loop takes, found
// in the trace of the loop itself.
//
// Method. Each event gets a signature that dynamic shapes leave alone: its
// op, its pool (small: under 1 MiB; large) and its stream; sizes change from
// step to step with variable batches, the sequence of operations mostly
// does not. Candidate periods are the distances between 64-event runs at 32
// anchors spread over the trace's second half and their other occurrences,
// the 64 supported by the most anchors (a step is supported by nearly every
// anchor, a layer only by those inside its stretch). Each candidate scores
// the share of events after its first period that equal the event one
// period earlier. Layers repeat inside a step at shorter periods, but the
// sequence breaks at the step's forward/backward/optimizer boundaries, so
// they score well below the step (on llama_lora 0.5-0.65 against 0.88); the
// step's multiples score about as well as the step. So the step is the
// shortest candidate that scores at least 0.75 and within 0.15 of the best
// (a run that repeats exactly scores 1.0 at its whole length). The first
// step or two (warm-up) may differ: llama_lora's step is found once about
// four steps are in.
//
// Lost events (an advisor loses a few between reading PyTorch's history and
// clearing it) shift the stream after them: with `max_shift` > 0 the score
// follows an offset of up to that many events, moved only where the 16
// events after a mismatch match at the new offset and not at the old one, so a stream with a few gaps scores like one
// without; the step found is then the stream's, which is the real one less
// the events lost in it (within `max_shift`). Realigning lifts a layer's
// score too, so the step must then score within 0.05 of the best candidate
// instead of 0.15.
#ifndef ALLOCD_SERVER_AUTOTUNE_STEP_PERIOD_H_
#define ALLOCD_SERVER_AUTOTUNE_STEP_PERIOD_H_

#include <cstdint>
#include <cstddef>
#include <optional>

#include "allocator/trace/trace.h"

namespace allocd {

// The step period in events, or nullopt when the trace holds no two
// repetitions of one (too short, or steps that differ in structure).
// `max_shift`: how many events the stream may have lost in a row (0: none).
std::optional<uint64_t> FindStepPeriod(const Trace& trace, size_t max_shift = 0);

// Whether the last three `period`s of `trace` are training steps, which give
// back what they allocate. Over each, the least bytes live (the least, so
// that neither where the period starts in a step nor the step's shapes
// matter): the last must be within a hundredth of what the last period
// allocated of the one before, and the three must not be a ramp, each
// keeping (or freeing) the same bytes. A model's construction repeats too
// (each layer's weights, kept: llama_lora, 250 events a layer), and so do
// the layers of a forward pass (each keeps its output: 14.8 MB of the 1.9 GB
// a layer allocates, a ramp) and of a backward pass (each frees one), and
// the last of them, where the logits come, by 7% of it: deciding on them
// would tune what happens before training. Steps keep what their shapes
// leave (llama_lora's and a multi-scale ResNet-50's: at most 0.2%) or what a
// training loop accumulates (a loss a step). False when the trace holds
// fewer than three periods.
bool ReturnsWhatItAllocates(const Trace& trace, uint64_t period);

}  // namespace allocd

#endif  // ALLOCD_SERVER_AUTOTUNE_STEP_PERIOD_H_
