#pragma once
// Block eviction (CompressionKind::kEvictBlock, PagedEviction's decode phase) on the GPU, the twin
// of backend/cpu/block_eviction.h: per job, the mean base score of every block of its table over
// the block's entries, every layer and every KV head, then the block to drop. The jobs' base
// scores come from the scorer launchers (launch_base_scores) layer group by layer group; these
// kernels only reduce and choose, and only enqueue work on `stream`.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/compression_kernels.h"

namespace origami::cuda {

// Adds, for every job of `a` and every block p of its table (jd.n / block_size blocks), the sum of
// the group's base scores (a.scores, every row of the group, the block's entries) to
// sums[sum0[job] + p]. Each sum has one writer, and its terms are added in a fixed order, so the
// result does not depend on timing. `sums` must be zeroed before the first group. max_blocks: the
// largest table among the jobs.
cudaError_t launch_block_score_sums(const GroupArgs& a, const int32_t* sum0, float* sums, int max_blocks,
                                    cudaStream_t stream);

// Per job: evicted[job] = the block p in [1, n / block_size - 2] with the lowest mean
// sums[sum0[job] + p] * inv_count (NaN lowest, ties to the lower index), as
// cpu::pick_evicted_block; inv_count = 1 / (layers * KV heads * block_size).
cudaError_t launch_pick_evicted_blocks(const CompressionJobDesc* jobs, int num_jobs, const int32_t* sum0,
                                       const float* sums, int block_size, float inv_count, int32_t* evicted,
                                       cudaStream_t stream);

}  // namespace origami::cuda
