#pragma once
// Checks of compression inputs that do not depend on the backend: a CompressionConfig, and a
// batch of CompressionJobs against a paged pool. Every backend runs them before it touches
// memory, so that a bad job is an error naming the job, request and field instead of a corrupted
// cache, and so that all backends reject exactly the same inputs with the same messages.
// Backend-specific conditions (cache allocated, supported head shapes) stay in the backend.
#include <vector>

#include "core/status.h"
#include "kv/compression.h"

namespace origami {

// The fields of a CompressionConfig that every backend needs in range.
Status validate_compression_config(const CompressionConfig& config);

// Checks every job of a batch for a pool of `num_blocks` pages (block 0 the null block) of
// `block_size` entries, with `num_query_slots` query slots of `max_window` rows, and global
// scores if `have_global_scores`:
// - the fields of each job and its recipe are in range, and an attention recipe has a query slot;
// - src_blocks / dst_blocks hold enough pages for num_entries / num_keep, all inside the pool;
// - compaction in place is safe: no destination page is listed twice, nor is a source page at a
//   later table index (it would be overwritten before it is read);
// - jobs may run in parallel: a page one job writes is neither read nor written by another.
// The first violation is returned.
Status validate_compression_batch(const std::vector<CompressionJob>& jobs, int block_size, int num_blocks,
                                  int num_query_slots, int max_window, bool have_global_scores);

// The two halves of validate_compression_batch, for its tests: a pass that names nothing (true:
// every check passes; with per-head pages a batch holds 288 jobs a request, and naming each job
// was most of a compression's host time), and the named checks it defers to otherwise.
bool compression_batch_fits(const std::vector<CompressionJob>& jobs, int block_size, int num_blocks,
                            int num_query_slots, int max_window, bool have_global_scores);
Status describe_compression_batch_error(const std::vector<CompressionJob>& jobs, int block_size, int num_blocks,
                                        int num_query_slots, int max_window, bool have_global_scores);

// Head groups: every job names a group of the layout's `num_groups`, and block eviction (which
// averages over one table's layers and heads) runs on the one-group layout only.
Status validate_job_groups(const std::vector<CompressionJob>& jobs, int num_groups);

}  // namespace origami
