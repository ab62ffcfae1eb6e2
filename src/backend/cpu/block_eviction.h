#pragma once
// Block eviction (CompressionKind::kEvictBlock, PagedEviction's decode phase) on the CPU: the mean
// base score of every block of a request's table, over the block's entries, every layer and every
// KV head (one page table serves them all, so a block leaves all of them at once), and the block
// to drop. The CUDA backend's kernels (cuda/block_eviction.h) follow the same arithmetic.
#include <vector>

#include "backend/cpu/cpu_kv_cache.h"
#include "kv/compression.h"

namespace origami::cpu {

// Per block p of the job's table (num_entries / block_size blocks, all full): the mean over layers,
// KV heads and the block's entries of the recipe's base score (step 1 of the pipeline only: no
// protection, pooling or redundancy), summed in fp64 in (layer, head, entry) order. The job must be
// a valid kEvictBlock job.
std::vector<double> block_mean_scores(CpuKVCache& kv, const CompressionJob& job, float scale);

// The block to evict from `means` [num_blocks]: the lowest mean among blocks 1 .. num_blocks - 2
// (never the first, never the last); NaN counts as lowest; ties go to the lower index.
// num_blocks >= 3.
int pick_evicted_block(const std::vector<double>& means);

}  // namespace origami::cpu
