#pragma once
// The KV-compression kernels of the CUDA backend (kv/compression.h): query capture in the forward
// pass, the scorers (the base scorers in scorers/, one file each; the shared stages here),
// per-(layer, KV head) top-k selection and compaction into destination pages.
// Their arithmetic follows the CPU twins in backend/cpu/compression_ops.h (which state the exact
// semantics: causal window, pooling padding, redundancy zeroing, tie-breaking); the GPU computes
// in fp32 from bf16 (or dequantized FP8) data, so scores agree to rounding, selections agree
// exactly on equal scores, and compaction is a bit-exact move.
//
// Work is organised as a *group*: a batch of jobs (requests) times a range of consecutive layers
// (the layer stride) times every KV head. A "row" is one (job, layer of the group, KV head); rows
// are numbered job-major: row = job * rows_per_job + (layer - layer0) * num_kv_heads + head with
// rows_per_job = num_group_layers * num_kv_heads. Every launcher only enqueues work on `stream`
// (no allocation, no synchronisation); scratch buffers belong to the caller (cuda_compression.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kv/scorers.h"

namespace origami::cuda {

// --- Query capture ----------------------------------------------------------------------------

// Copies one layer's post-RoPE queries of the capturing tokens into the query cache:
//   q         [num_tokens, row_elems]          (row_elems = num_heads * head_dim, a multiple of 8)
//   dst_rows  [num_tokens] device: the destination row (slot * max_window + entry % max_window) in
//             this layer's part of the cache, or -1 to skip the token. A device input, so a CUDA
//             graph captured once replays with new destinations.
//   q_cache   this layer's [num_slots * max_window, row_elems]
void launch_capture_queries(const __nv_bfloat16* q, const int32_t* dst_rows, int num_tokens, int row_elems,
                            __nv_bfloat16* q_cache, cudaStream_t stream);

// --- Compression of one group -----------------------------------------------------------------

// One job as the kernels see it (built on the host from a CompressionJob and its ScoreRecipe).
struct CompressionJobDesc {
  int32_t n = 0;           // cached entries (>= 1)
  int32_t num_keep = 0;    // kept per (layer, KV head), 0 .. n; a joint job: the most it may keep
                           // (its keep rows are num_keep apart; GroupArgs::kept_counts says how many)
  int32_t joint = 0;       // 1: a runtime allocation (kv/compression.h KeepAllocation kLayer /
                           // kGlobal): the joint selection (joint_selection.h) chooses the count
  int32_t mean_keep = 0;   // joint: CompressionJob::mean_keep
  float alpha_safe = 0.0f;  // joint: the recipe's alpha_safe
  int32_t page_aligned = 0;  // joint: the recipe's page_aligned (counts in pages of block_size)
  int32_t num_scored = 0;  // leading entries whose global score F is valid
  int32_t query_slot = 0;  // slot of the window queries (scorers that need queries)
  int32_t window = 0;      // attention window w = min(recipe.window, n) (scorers that need queries)
  int32_t q_pos0 = 0;      // position of the window's first query: query u is at slot row
                           // (q_pos0 + u) % max_window (rows are keyed by position)
  int32_t src_page0 = 0;   // offset of the source table in GroupArgs::pages
  int32_t dst_page0 = 0;   // offset of the destination table in GroupArgs::pages
  int32_t chunk0 = 0;      // first 64-entry chunk of this job in the group's chunk list
  int32_t heads0 = -1;     // head groups: offset in GroupArgs::pages of the job's KV heads, one per
                           // head slot of its pages (the query cache is indexed by KV head);
                           // -1: slot h is KV head h
  int32_t layer = 0;       // head groups: the job's layer, whose query-cache rows it reads (a
                           // launch serves groups of several layers); 0 for the full layout
  int64_t score0 = 0;      // offset (elements) of this job's rows in scores/final/redundancy/z:
                           // row r of the job is at score0 + r * n
  int64_t keep0 = 0;       // offset of this job's rows in keep: row r at keep0 + r * num_keep
  int64_t lse0 = 0;        // offset of this job's rows in lse: row r at lse0 + r * window * group_size
  // The recipe, resolved for this compression.
  Scorer scorer = Scorer::kZero;  // the base scorer (kv/scorers.h) that writes S for its rows
  float global_decay = 0.0f;  // > 0: G-KV global score (reads and rewrites F)
  int32_t global_sum = 0;     // 1: F <- decay * F_prev + S (GlobalMode::kSum); 0: the max (kMax)
  int32_t pool_kernel = 0;    // > 1: pooling applies now (first compression or every time)
  int32_t pool_avg = 0;       // 1 = average pooling, 0 = max
  int32_t redundancy = 0;     // 0 none, 1 flash (all pairs), 2 lightning (within spans)
  int32_t redundancy_span = 1;  // lightning: keys are compared within consecutive spans of this many
  float redundancy_lambda = 0.2f;
  float redundancy_tau = 0.4f;
  float redundancy_threshold = 0.5f;
  int32_t protect_window = 0;  // last min(protect_window, n) entries kept (+inf)
  int32_t num_sinks = 0;       // first min(num_sinks, n) entries kept (+inf)
  // Kara (Scorer::kKara): the window's compressible region is entries [n - window, n - window +
  // kara_region); window_keep of them are kept (Token2Chunk with chunk_budget, chunk_max_len).
  int32_t kara_region = 0;
  int32_t window_keep = 0;
  int32_t chunk_budget = 0;
  int32_t chunk_max_len = 8;
};

// Whether a job's redundancy score runs span by span on the tensor cores (head_dim 64 or 128):
// lightning with spans of whole 64-entry chunks, at most kMaxTiledSpan entries, which one block
// holds in shared memory and compares all at once. Other redundancy jobs compare a chunk of rows
// with the columns of its span (or, flash, every column) tile by tile.
constexpr int kMaxTiledSpan = 256;
__host__ __device__ inline bool redundancy_span_tiled(const CompressionJobDesc& jd) {
  return jd.redundancy == 2 && jd.redundancy_span % 64 == 0 && jd.redundancy_span <= kMaxTiledSpan;
}
__host__ __device__ inline bool redundancy_tiles_head_dim(int head_dim) { return head_dim == 64 || head_dim == 128; }

struct GroupArgs {
  const CompressionJobDesc* jobs = nullptr;  // [num_jobs] device
  int num_jobs = 0;
  const int32_t* chunk_job = nullptr;  // [num_chunks] device: job of each 64-entry chunk
  int num_chunks = 0;                  // sum over jobs of ceil(n / 64)
  // [num_span_chunks] device: the first chunk of every span of the jobs whose redundancy runs span
  // by span (redundancy_span_tiled); other_redundancy: some redundancy job does not.
  const int32_t* span_chunks = nullptr;
  int num_span_chunks = 0;
  bool other_redundancy = false;
  const int32_t* pages = nullptr;      // device: every job's source and destination tables
  int max_window_group = 0;            // max over jobs of window * group_size (0: no attention job)
  bool any_redundancy = false;         // some job has a redundancy score
  uint32_t scorers = 0;                // scorer_bit() of every base scorer some job uses: only their
                                       // launchers run (CompressionPlan::scorers)

  // Model geometry.
  int num_group_layers = 0;  // layers in this group
  int num_kv_heads = 0;
  int group_size = 0;        // query heads per KV head (<= 64)
  int head_dim = 0;          // a multiple of 32, at most 256
  int block_size = 0;
  float scale = 0.0f;        // attention scale, 1 / sqrt(head_dim)

  // Paged storage, each pointer at the group's first layer; `*_layer_pitch` elements separate
  // consecutive layers. K/V: [num_blocks, num_kv_heads, block_size, head_dim] bf16.
  // Head groups (KVLayout::grouped): a job's rows are the H_p head slots of its group's pages
  // (num_kv_heads = H_p, one layer per launch), a page holds K then V of those slots, so K/V pages
  // are kv_page_heads = 2 H_p head rows apart (v = k + H_p head rows) and F pages
  // f_page_heads = H_p; q_kv_heads is the model's KV-head count that the query cache is laid out
  // with. 0 for any of them: num_kv_heads.
  int kv_page_heads = 0;
  int f_page_heads = 0;
  int q_kv_heads = 0;
  __nv_bfloat16* k = nullptr;
  __nv_bfloat16* v = nullptr;
  size_t kv_layer_pitch = 0;
  // FP8 cache (--kv-cache-dtype fp8; k / v are then null): E4M3 codes at the element offsets a bf16
  // cache would use (kv_layer_pitch counts elements = bytes here), and one fp32 scale per head row
  // at element offset / head_dim (scale layer pitch kv_layer_pitch / head_dim). Whether the cache
  // is FP8: k8 != nullptr (then v8, k_scales and v_scales are set too; codes 8-byte aligned). The
  // fp32 kernels read code * scale (kv/kv_cache_dtype.h), compaction moves codes and scales.
  uint8_t* k8 = nullptr;
  uint8_t* v8 = nullptr;
  float* k_scales = nullptr;
  float* v_scales = nullptr;
  // Query cache: per layer [num_slots, max_window, num_kv_heads * group_size, head_dim] bf16.
  const __nv_bfloat16* q = nullptr;
  size_t q_layer_pitch = 0;
  int max_window = 0;
  // Global scores F: per layer [num_blocks, num_kv_heads, block_size] fp32 (null if unused).
  float* f = nullptr;
  size_t f_layer_pitch = 0;

  // Scratch (fp32 unless noted), sized by the job offsets above.
  float* scores = nullptr;      // base score S (written by the job's scorer), then S after the global
                                // update (= new F)
  float* final_scores = nullptr;  // what selection reads (pooled, redundancy-combined, protected)
  float* redundancy = nullptr;  // cosine-similarity row sums (redundancy jobs)
  float* norms = nullptr;       // key norms (redundancy jobs)
  int2* z = nullptr;            // per entry: its newest partner above the threshold and that similarity's bits
  float2* lse = nullptr;        // per (row, window query, head of the group): softmax max and sum
  int32_t* keep = nullptr;      // kept entry indices, ascending
  // [num_jobs] device: the entries each joint job keeps per row (joint_selection.h writes them
  // between scoring and selection); null when no job of the group is joint.
  const int32_t* kept_counts = nullptr;
};

int rows_per_job(const GroupArgs& a);

// Scores every row: the base scorers in args.scorers (scorers/scorer_launchers.h; e.g. window
// attention in two passes, softmax statistics then probabilities) write S, then key norms and
// redundancy row sums, then per row the global update, pooling, redundancy softmax and
// combination and protection, leaving the selection scores in final_scores and the new global
// scores (S after the update) in scores.
cudaError_t launch_compression_scores(const GroupArgs& args, cudaStream_t stream);

// Step 1 alone: the base scorers in args.scorers write S into scores (block eviction reads it).
cudaError_t launch_base_scores(const GroupArgs& args, cudaStream_t stream);

// Per row, the kept_count best entries of final_scores (num_keep, or a joint job's
// GroupArgs::kept_counts) in ascending entry order (cpu::select_keep's
// total order: higher score first, NaN lowest, ties to the larger index) into keep.
cudaError_t launch_compression_select(const GroupArgs& args, cudaStream_t stream);

// Per row, moves the kept K and V entries (FP8: codes and scales) to their destination pages (entry i of the result at
// dst table page i / block_size, offset i % block_size), and for jobs with a global decay writes
// F of the destination entries from scores. In place is safe when every destination page is not a
// source page or is one at the same or an earlier source table index (cpu::compact_entries).
cudaError_t launch_compression_compact(const GroupArgs& args, cudaStream_t stream);

}  // namespace origami::cuda
