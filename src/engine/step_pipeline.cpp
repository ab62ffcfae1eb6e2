#include "engine/step_pipeline.h"

#include <string>
#include <utility>

namespace origami {

Expected<ForwardBatch> resolve_pending_tokens(const ForwardBatch& batch, const std::vector<int32_t>& last_sampled) {
  ForwardBatch resolved = batch;
  for (const PendingToken& p : batch.pending_tokens) {
    const size_t s = static_cast<size_t>(p.previous_sequence);
    if (s >= last_sampled.size() || last_sampled[s] < 0)
      return invalid_argument("batch: pending token at index " + std::to_string(p.token_index) + " names sequence " +
                              std::to_string(p.previous_sequence) + ", which the previous step did not sample");
    resolved.token_ids[static_cast<size_t>(p.token_index)] = last_sampled[s];
  }
  resolved.pending_tokens.clear();
  return resolved;
}

Status StepPipeline::launch(const ForwardBatch& batch) {
  if (launched_.size() >= 2)
    return Status(ErrorCode::kInternal, "step pipeline: a third step launched before the first finished");
  Launched& step = launched_.emplace_back();
  if (backend_->launches_asynchronously()) {
    step.status = backend_->launch(batch, &step.output);
    return step.status;
  }
  // The step runs now: the tokens it reads from the step before are known here already.
  if (batch.pending_tokens.empty()) {
    step.status = backend_->execute(batch, &step.output);
  } else {
    Expected<ForwardBatch> resolved = resolve_pending_tokens(batch, last_sampled_);
    if (!resolved) {
      step.status = resolved.status();
      return step.status;
    }
    step.status = backend_->execute(*resolved, &step.output);
  }
  last_sampled_ = step.output.sampled_tokens;
  if (!step.status.is_ok()) last_sampled_.clear();
  return step.status;
}

Status StepPipeline::finish(StepOutput* out) {
  if (launched_.empty()) return Status(ErrorCode::kInternal, "step pipeline: finish() with no step launched");
  Launched& step = launched_.front();
  // Finished where it was launched: the backend fills the StepOutput it began.
  if (step.status.is_ok() && backend_->launches_asynchronously()) step.status = backend_->finish_launched(&step.output);
  const Status status = step.status;
  *out = std::move(step.output);
  launched_.pop_front();
  return status;
}

}  // namespace origami
