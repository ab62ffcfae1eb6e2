#pragma once
// A backend's KV compressor: owns score -> select -> compact for a batch of CompressionJobs
// (kv/compression.h) on the backend's paged storage, and the state that compression needs (the
// query cache, global scores, scratch, a stream). Every backend has one; the engine never calls it
// during a step: jobs reach it through ForwardBatch::compressions, and what finished comes back in
// StepOutput::finished_compressions (backend/compression_stepper.h does that part of execute()).
// Tests and tools drive it directly.
#include <cstddef>
#include <vector>

#include "core/status.h"
#include "kv/compression.h"

namespace origami {

class KVCompressor {
 public:
  virtual ~KVCompressor() = default;
  // Starts compressing `jobs` (validated first: an invalid batch is refused whole and nothing is
  // written). The jobs' tables must stay alive and untouched, and their source pages unreleased,
  // until done() returns true. One batch in flight at a time: a second begin() waits for the first.
  virtual Status begin(const std::vector<CompressionJob>& jobs) = 0;
  // True once the last batch has completed (never blocks).
  virtual bool done() = 0;
  // Blocks until it completes; returns the batch's first error.
  virtual Status wait() = 0;
  // Seconds the device spent running completed batches (CUDA: from the compression stream's first
  // kernel to its last, overlapping decode steps included; CPU: the compression itself).
  virtual double device_seconds() const = 0;
  // begin() runs the batch to completion before it returns (the CPU's compressor).
  virtual bool synchronous() const { return false; }
  // Per job of the last batch, in begin()'s order: the block a kEvictBlock job chose (its index in
  // src_blocks), -1 for other jobs. Valid once wait() returned ok (or done() returned true).
  const std::vector<int>& evicted_blocks() const { return evicted_blocks_; }
  // Per job of the last batch: the entries a kCompact job kept per (layer, KV head) (the count a
  // runtime allocation chose; ScoreRecipe::allocation), -1 for other jobs. Empty: a compressor
  // without runtime allocation (every compaction kept its num_keep).
  const std::vector<int>& kept_entries() const { return kept_entries_; }
  // Per job of the last batch: a kEvictBlock job's per-block sums of its base scores over every
  // layer, this compressor's KV heads and the block's entries (what its choice was made from), so
  // that tensor parallelism can choose from every rank's heads; empty for other jobs, and where the
  // compressor does not report them.
  const std::vector<std::vector<float>>& evicted_block_sums() const { return evicted_block_sums_; }

 protected:
  std::vector<int> evicted_blocks_;
  std::vector<int> kept_entries_;
  std::vector<std::vector<float>> evicted_block_sums_;
};

}  // namespace origami
