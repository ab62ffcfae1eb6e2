#pragma once
// A CPU backend whose compressions finish only some steps after they start, as on a GPU stream:
// the jobs run when the backend reports them done, so any change the engine made to a
// compressing request's tables or pages in between would show (async compression tests).
#include "cpu_backend_wrapper.h"

namespace origami::testing {

// A compressor that runs a batch on the CPU backend's compressor only after `delay` polls of
// done() (or on wait()).
class DeferredCompressor : public KVCompressor {
 public:
  DeferredCompressor(KVCompressor* inner, int delay, int* num_deferred_polls)
      : inner_(inner), delay_(delay), num_deferred_polls_(num_deferred_polls) {}
  Status begin(const std::vector<CompressionJob>& jobs) override {
    if (!jobs_.empty()) return internal_error("a second batch while one is in flight");
    jobs_ = jobs;
    polls_ = 0;
    return Status::ok();
  }
  bool done() override {
    if (jobs_.empty()) return true;
    if (++polls_ <= delay_) {
      ++*num_deferred_polls_;
      return false;
    }
    status_ = run();
    return true;
  }
  Status wait() override {
    if (!jobs_.empty()) status_ = run();
    return status_;
  }
  double device_seconds() const override { return inner_->device_seconds(); }
  const std::vector<CompressionJob>& jobs() const { return jobs_; }

 private:
  Status run() {
    Status st = inner_->begin(jobs_);
    evicted_blocks_ = inner_->evicted_blocks();  // the blocks its block evictions chose
    kept_entries_ = inner_->kept_entries();      // the counts its runtime allocations chose
    jobs_.clear();
    return st;
  }
  KVCompressor* inner_;
  std::vector<CompressionJob> jobs_;
  int delay_;
  int polls_ = 0;
  int* num_deferred_polls_;
  Status status_;
};

// A CPU backend whose compressions finish only some steps after they start (DeferredCompressor),
// stepped the way every backend steps them (CompressionStepper).
class DeferredCompressionBackend : public CpuBackendWrapper {
 public:
  DeferredCompressionBackend(int delay, int* num_deferred_polls)
      : CpuBackendWrapper("deferred-cpu"), delay_(delay), num_deferred_polls_(num_deferred_polls) {}
  Status execute(const ForwardBatch& batch, StepOutput* out) override {
    // No sequence of the step may belong to a request being compressed.
    for (const SequenceInput& s : batch.sequences)
      for (const CompressionJob& j : compressor_->jobs())
        if (j.request_id == s.request_id) return internal_error("request " + std::to_string(s.request_id) + " ran while compressing");
    ForwardBatch forward = batch;
    forward.compressions.clear();
    forward.wait_for_compressions = false;
    if (!forward.sequences.empty()) ORIGAMI_RETURN_IF_ERROR(inner_->execute(forward, out));
    std::vector<float> logprobs = std::move(out->token_logprobs);
    std::vector<int32_t> sampled = std::move(out->sampled_tokens);
    stepper_.start(compressor_.get(), batch, out);
    stepper_.collect(compressor_.get(), out);
    out->sampled_tokens = std::move(sampled);
    out->token_logprobs = std::move(logprobs);
    return Status::ok();
  }
  Status configure_compression(const CompressionConfig& c) override {
    ORIGAMI_RETURN_IF_ERROR(inner_->configure_compression(c));
    compressor_ = std::make_unique<DeferredCompressor>(inner_->compressor(), delay_, num_deferred_polls_);
    return Status::ok();
  }
  KVCompressor* compressor() override { return compressor_.get(); }

 private:
  std::unique_ptr<DeferredCompressor> compressor_;
  CompressionStepper stepper_;
  int delay_;
  int* num_deferred_polls_;
};

}  // namespace origami::testing
