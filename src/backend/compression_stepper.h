#pragma once
// The compression part of Backend::execute(), the same for every backend. Before the forward
// pass, start(): hands the step's new jobs to the compressor and, when the batch asks to wait
// (synchronous compression, or nothing else to run), waits for every batch in flight. After it,
// collect(): reports a batch in flight that has finished meanwhile. Each compression is reported
// exactly once, with its status (and a block eviction with its block), in
// StepOutput::finished_compressions.
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
  // Reports every job in flight with `status`; with `compressor` (or null: refused whole) each
  // result carries its block (kEvictBlock: evicted_blocks()) and kept count (kept_entries()).
  void report(const Status& status, const KVCompressor* compressor, StepOutput* out);

  struct JobId {
    uint64_t request_id = 0;
    int group = 0;
  };
  std::vector<JobId> in_flight_;  // the jobs of the batch the compressor is running
};

}  // namespace origami
