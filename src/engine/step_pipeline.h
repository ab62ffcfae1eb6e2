#pragma once
// The model steps the engine has launched and not yet finished. Under asynchronous scheduling
// (EngineConfig::async_scheduling) the engine launches step N+1 before it finishes step N, so that
// the host's work between steps (step N's tokens turned into text, the next schedule and batch)
// runs while the device computes: a backend that launches asynchronously (Backend::launch) gets
// the steps as they come; any other backend runs each step when it is launched (Backend::execute),
// with the batch's pending tokens taken from the step before, so that the engine's pipelined
// bookkeeping runs, and is tested, on every backend.
#include <deque>
#include <vector>

#include "backend/backend.h"
#include "backend/forward_batch.h"
#include "core/status.h"

namespace origami {

// `batch` with its pending tokens filled in from `last_sampled` (the tokens the step launched
// before it sampled, per sequence; -1 where it sampled none) and its list of them emptied, for a
// backend that runs the step when it is launched; an error naming a token nobody sampled.
Expected<ForwardBatch> resolve_pending_tokens(const ForwardBatch& batch, const std::vector<int32_t>& last_sampled);

class StepPipeline {
 public:
  explicit StepPipeline(Backend* backend) : backend_(backend) {}

  // Launches `batch` (at most two steps are launched and not finished). Its output so far (the
  // compressions reported when it started) is launched_output() until finish() hands it over.
  Status launch(const ForwardBatch& batch);
  StepOutput& launched_output() { return launched_.back().output; }
  // Waits for the oldest launched step; its output moves to `out`. The launch's error, if it failed.
  Status finish(StepOutput* out);
  size_t num_launched() const { return launched_.size(); }

 private:
  struct Launched {
    Status status;
    StepOutput output;
  };
  Backend* backend_;
  std::deque<Launched> launched_;  // oldest first; a deque keeps each output where the backend filled it
  // A backend that runs steps at launch: the tokens the last launched step sampled, per sequence
  // (what the next batch's pending tokens name).
  std::vector<int32_t> last_sampled_;
};

}  // namespace origami
