#pragma once
// A CPU backend that launches steps asynchronously, as the CUDA backend does: launch() runs the
// step at once (its pending tokens taken from the step launched before it) and finish_launched()
// hands it over. It records, for each launch, how many launched steps were still unfinished and
// whether the batch carried prompt tokens, so that tests can see what the engine overlaps.
#include <string>
#include <vector>

#include "cpu_backend_wrapper.h"
#include "engine/step_pipeline.h"

namespace origami::testing {

class AsyncLaunchCpuBackend : public CpuBackendWrapper {
 public:
  struct LaunchRecord {
    bool decode_only = true;
    int unfinished = 0;  // launched steps not yet finished when this one was launched
  };

  AsyncLaunchCpuBackend() : CpuBackendWrapper("async-launch-cpu") {}
  bool launches_asynchronously() const override { return true; }

  Status launch(const ForwardBatch& batch, StepOutput* out) override {
    launches_.push_back(LaunchRecord{batch.is_decode_only(), unfinished_});
    Expected<ForwardBatch> resolved = resolve_pending_tokens(batch, last_sampled_);
    if (!resolved) return resolved.status();
    ORIGAMI_RETURN_IF_ERROR(inner_->execute(*resolved, out));
    last_sampled_ = out->sampled_tokens;
    ++unfinished_;
    return Status::ok();
  }
  Status finish_launched(StepOutput*) override {
    if (unfinished_ == 0) return invalid_argument("finish_launched() with no launched step");
    --unfinished_;
    return Status::ok();
  }
  Status execute(const ForwardBatch& batch, StepOutput* out) override {
    ORIGAMI_RETURN_IF_ERROR(launch(batch, out));
    return finish_launched(out);
  }

  // Shared with the test, which keeps it after the engine takes the backend.
  const std::vector<LaunchRecord>& launches() const { return launches_; }

 private:
  std::vector<LaunchRecord> launches_;
  std::vector<int32_t> last_sampled_;
  int unfinished_ = 0;
};

}  // namespace origami::testing
