#pragma once
// Runs CompressionJobs on the CPU backend's paged cache: per (job, layer, KV head) gather the
// keys, window queries and previous global scores, score (compression_ops.h score_head), select
// the top num_keep, then compact K, V and F into the destination table. Layers are processed
// `layer_stride` at a time: all (job, layer, head) items of a stride are scored (their kept
// indices and new global scores held in temporaries), then compacted, which bounds temporary
// memory by the stride as on the GPU.
//
// Global scores: the new F of every entry is computed into a temporary and written only to the
// destination pages (entry i of the result gets F of source entry keep[i]), so shared source
// pages are never written, F included. F of entries >= num_scored_entries is never read: entries
// written by execute() need no initial score. F is written only by jobs whose recipe uses it
// (global_decay > 0); other jobs leave the destination pages' F stale.
#include <vector>

#include "backend/cpu/cpu_kv_cache.h"
#include "backend/cpu/cpu_thread_pool.h"
#include "backend/kv_compressor.h"
#include "core/status.h"
#include "kv/compression.h"

namespace origami::cpu {

// Checks every job against the cache and its compression config; names the job and the field.
// Also rejects batches where a page written by one job (a destination page) is read or written
// by another job, and destination tables that are unsafe for in-place compaction (a destination
// page that is a source page at a later table index).
Status validate_compression_jobs(const CpuKVCache& kv, const std::vector<CompressionJob>& jobs);

// Validates, then runs `jobs` to completion. `scale` is the attention scale (1 / sqrt(head_dim)).
// kEvictBlock jobs (block_eviction.h) write nothing; the block each chose goes to `evicted_blocks`
// (per job, -1 for compactions) when it is not null.
// Jobs whose recipe has reconstruction_scores select by reconstruction_scores[job] ([layer][KV
// head][entry] of the job's entries, from the backend's KVzip pass); a missing one is an error.
// Jobs under a runtime allocation (ScoreRecipe::allocation kLayer / kGlobal) are selected jointly
// per request (joint_selection.h): every layer is scored first, each group keeps its heads'
// largest count. `kept_entries` (when not null) gets each job's kept count (-1 for block evictions).
Status run_compression(CpuKVCache& kv, const std::vector<CompressionJob>& jobs, float scale, ThreadPool* pool,
                       std::vector<int>* evicted_blocks = nullptr,
                       const std::vector<std::vector<float>>* reconstruction_scores = nullptr,
                       std::vector<int>* kept_entries = nullptr);

// The CPU backend's KVCompressor: begin() runs the batch to completion (run_compression), so
// done() is always true and wait() returns the batch's status.
class CpuCompressor : public KVCompressor {
 public:
  CpuCompressor(CpuKVCache* kv, float scale, ThreadPool* pool) : kv_(kv), scale_(scale), pool_(pool) {}
  Status begin(const std::vector<CompressionJob>& jobs) override;
  bool done() override { return true; }
  Status wait() override { return status_; }
  double device_seconds() const override { return device_seconds_; }
  bool synchronous() const override { return true; }
  // The KVzip scores of the next begin()'s jobs (one per job, empty for the others).
  void set_reconstruction_scores(std::vector<std::vector<float>> scores) { reconstruction_scores_ = std::move(scores); }

 private:
  CpuKVCache* kv_;
  float scale_;
  ThreadPool* pool_;
  Status status_;
  double device_seconds_ = 0.0;
  std::vector<std::vector<float>> reconstruction_scores_;
};

}  // namespace origami::cpu
