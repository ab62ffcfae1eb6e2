#pragma once
// The compression part of Backend::execute(), the same for every backend. Before the forward
// pass, start(): hands the step's new jobs to the compressor and, when the batch asks to wait
// (synchronous compression, or nothing else to run), waits for every batch in flight. After it,
// collect(): reports a batch in flight that has finished meanwhile. Each compression is reported
// exactly once, with its status, in StepOutput::finished_compressions.
//
// Starting new jobs before the forward pass lets them overlap it (the CUDA compressor runs on its
// own stream after the work already queued); the step's sequences never belong to a request
// being compressed, so the two touch disjoint pages.
#include <cstdint>
#include <vector>

#include "backend/forward_batch.h"
#include "backend/kv_compressor.h"

namespace origami {

class CompressionStepper {
 public:
  // `compressor` may be null (a backend without compression): new jobs are then reported failed.
  void start(KVCompressor* compressor, const ForwardBatch& batch, StepOutput* out);
  void collect(KVCompressor* compressor, StepOutput* out);
  bool in_flight() const { return !in_flight_.empty(); }

 private:
  void report(const Status& status, StepOutput* out);

  std::vector<uint64_t> in_flight_;  // request ids of the batch the compressor is running
};

}  // namespace origami
