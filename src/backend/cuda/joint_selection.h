#pragma once
// Runtime allocation on the CUDA compressor (kv/compression.h KeepAllocation kLayer / kGlobal):
// per request, the entries each (layer, KV head) keeps, exactly as cpu::joint_head_counts
// (backend/cpu/joint_selection.h) defines them, computed on the device between scoring and
// selection (no host round trip: compression runs asynchronously on its own stream), then each
// job's count, the largest of its rows' (a head group keeps its heads' largest count).
//
// It runs on one group of the compression kernels (compression_kernels.h) whose rows hold the
// selection scores (final_scores) of every (layer, KV head) of each joint request: the driver
// scores every layer of a batch with a joint job before it selects any (cuda_compression.h).
// Two kernels:
//  1. per row (head): its +inf entries counted, its guarantee g = min(n, max(#+inf,
//     floor(alpha_safe x mean_keep))) and the key of its g-th best entry by radix select
//     (radix_select.cuh; keys in cpu::select_keep's order), below which its remaining entries lie;
//  2. per scope (a request's heads for kGlobal, one layer's for kLayer; one CTA each): the total
//     mean_keep x heads less the guarantees is filled by one radix select over every head's
//     remaining entries for the scope's threshold key; each head counts its remaining entries
//     above it, and the heads holding an entry equal to it (at most one each) take the tie in the
//     scope's head order ((layer, KV head), the CPU's order). Every head's count, then the jobs'
//     maxima (atomicMax into kept_counts).
//     Page-aligned jobs (CompressionJobDesc::page_aligned, pages of GroupArgs::block_size): the
//     same descent over the remaining entries with the page objective: per 8-bit pass each warp
//     histograms one head at a time and adds the head's pages, ceil((guarantee + entries above)
//     / b), at each of the 256 bucket boundaries; the lowest boundary whose pages fit the scope's
//     P is kept, the bucket below it descended into (up to 8 passes: the pass ends early only when
//     the pages fit P exactly). Tied keys open a page each in head order while pages are left; then
//     every head fills its last page (cpu::joint_head_counts' page-aligned definition).
// A scope's work is one pass over its entries per 8-bit radix digit (at most 8, usually 4-5) plus
// a counting pass, in one CTA: about 1.2 M entries per scope for a Qwen3-8B request of 4096
// entries under kGlobal (36 layers x 8 heads), 8 x fewer per CTA under kLayer.
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "backend/cuda/compression_kernels.h"
#include "kv/compression.h"

namespace origami::cuda {

// One scope's heads: members [member0, member0 + num_members) of JointArgs::members.
struct JointScope {
  int32_t member0 = 0;
  int32_t num_members = 0;
};

// The scopes of a group's joint jobs and their rows (job * rows_per_job + lh, the group's row
// numbering), each scope's rows in (layer, KV head) order.
struct JointPlan {
  std::vector<JointScope> scopes;
  std::vector<int32_t> members;
};

// desc_jobs[d]: the job of the group's descriptor d (its recipe's allocation says whether it is
// joint); row_head(d, lh) -> (layer, KV head) of the descriptor's row lh. A request's scopes span
// all its descriptors (one per head group).
JointPlan plan_joint_selection(const std::vector<const CompressionJob*>& desc_jobs, int rows_per_job,
                               const std::function<std::pair<int, int>(int, int)>& row_head);

struct JointArgs {
  const JointScope* scopes = nullptr;  // [num_scopes] device
  int num_scopes = 0;
  const int32_t* members = nullptr;  // [num_members] device (JointPlan::members)
  int num_members = 0;
  // Scratch, [num_members] each.
  int32_t* guaranteed = nullptr;
  unsigned long long* cut = nullptr;  // a head's remaining entries are those with a key below
  // Outputs: every member's count, and per descriptor of the group the largest of its members'
  // (zeroed by the launcher first; GroupArgs::kept_counts of the select and compact kernels).
  int32_t* head_counts = nullptr;
  int32_t* kept_counts = nullptr;
};

// Enqueues both kernels on `stream` (after the group's launch_compression_scores). The group's
// descriptors give each member's n, score rows, mean_keep and alpha_safe.
cudaError_t launch_joint_counts(const GroupArgs& group, const JointArgs& joint, cudaStream_t stream);

}  // namespace origami::cuda
