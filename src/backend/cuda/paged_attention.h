#pragma once
// Paged attention over the bf16 or FP8 KV cache (fp32 accumulation, sm_90).
//
// One kernel serves decode, prefill and mixed batches: for every (sequence, KV head) the query
// rows of that head's GQA group are packed as (new token, head-in-group) pairs into tiles of 64
// rows, 16 for decode batches (so a decode step with a group of 4 heads is one tile of 4 rows,
// and K/V are read once for all heads of the group). Each CTA streams K/V tiles of 64 entries through shared memory
// (16-byte cp.async, double-buffered) and runs Q·Kᵀ and P·V on the tensor cores (mma.sync
// m16n8k16 bf16) with an online softmax in fp32. Long contexts are split across CTAs (split-K):
// partial outputs and log-sum-exps land in a caller-owned workspace and a second kernel merges them.
//
// Plan once per step on the host (it needs only sizes and the longest KV length), then run:
//   AttentionPlan plan = plan_paged_attention(shape, max_kv_len, num_sms);
//   size_t bytes = paged_attention_workspace_bytes(plan, shape);   // allocate once, reuse
//   paged_attention(args, plan, workspace, bytes, stream);
// A plan made for a larger max_kv_len stays valid for shorter sequences (each sequence shares its
// kv_len out over the splits, at most kv_chunk_size and at least 128 entries per split; splits past
// its end do no work), so a CUDA graph captured with the model's longest length replays at any
// length without leaving a short sequence's attention to one split.
// FP8 decode batches run a variant (paged_attention.cu, paged_decode_fp8_stream_kernel) with a CTA
// per (sequence, KV head, split) work item instead of per query tile (AttentionPlan::items_per_cta),
// or, where balanced_decode_pays, its balanced form: one resident wave of CTAs sharing the batch's
// KV tiles out evenly, each (sequence, KV head) cut where a CTA's share ends and merged by the
// last CTA to finish it (AttentionPlan::stream_ctas; it needs AttentionArgs::split_counters).
// Launchers only enqueue work on `stream`: no allocation, no synchronisation.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace origami::cuda {

// Sizes that fix the launch shape (host values).
struct AttentionShape {
  int num_seqs = 0;
  int num_tokens = 0;    // total new (query) tokens of the batch = q_indptr[num_seqs]
  int num_heads = 0;     // query heads; a multiple of num_kv_heads
  int num_kv_heads = 0;
  int head_dim = 0;      // 64 or 128 (paged_attention_supported says which)
  int block_size = 0;    // KV entries per page (any positive value; 1, 16, 32, 256 tested)
};

// Ragged paging (TANGRAM §4.2, KVLayout::grouped): the KV heads of a layer are cut into head
// groups, each with its own page table and length per sequence; a group's page holds K and V of
// its heads ([2, heads, block_size, head_dim]), so K of head slot s of page p starts at
// k_cache + p * page_stride + s * block_size * head_dim. Heads of a group need not be adjacent.
// The split map (§4.3) gives every head its own number of KV splits: grid row y of a query tile
// is (KV head h, split y - head_split0[h]) with head_split0 the prefix sum of head_splits, so a
// group with a larger budget gets more CTAs and each CTA reads about as many entries. Device
// arrays, fixed per layer (a CUDA graph replays them as they are).
struct RaggedHeads {
  int num_tables = 0;                  // tables (head groups) per sequence in this layer; 0 = off
  long long page_stride = 0;           // elements from one page to the next in k_cache / v_cache
  const int32_t* head_table = nullptr;   // [num_kv_heads] the table (group of the layer) of each head
  const int32_t* head_slot = nullptr;    // [num_kv_heads] its slot in the group's pages
  const int32_t* head_splits = nullptr;  // [num_kv_heads] KV splits of each head (>= 1)
  const int32_t* head_split0 = nullptr;  // [num_kv_heads] first grid row of each head (prefix sum)
  int num_work = 0;    // sum of head_splits: grid rows per query tile
  int max_splits = 0;  // max of head_splits: partial slots in the workspace
};

struct AttentionArgs {
  AttentionShape shape;
  float softmax_scale = 0.f;                // usually 1/sqrt(head_dim)
  const __nv_bfloat16* q = nullptr;         // [num_tokens, num_heads, head_dim], RoPE applied
  __nv_bfloat16* out = nullptr;             // [num_tokens, num_heads, head_dim]
  const __nv_bfloat16* k_cache = nullptr;   // [num_blocks, num_kv_heads, block_size, head_dim]
  const __nv_bfloat16* v_cache = nullptr;   // [num_blocks, num_kv_heads, block_size, head_dim]
  // FP8 cache (--kv-cache-dtype fp8; k_cache / v_cache unused): E4M3 codes at the element offsets
  // above and one fp32 scale per (entry, KV head) at element offset / head_dim (kv_cache_write.h).
  // The kernel converts the codes to bf16 exactly and applies the scales in fp32: to the scores
  // (K) and to the probabilities before P.V (V, the softmax sums take the unscaled ones).
  const uint8_t* k_codes = nullptr;
  const uint8_t* v_codes = nullptr;
  const float* k_scales = nullptr;
  const float* v_scales = nullptr;
  // Device arrays. The new tokens of sequence i are q rows q_indptr[i] .. q_indptr[i+1] and are
  // already written to the cache as its LAST q_len entries; kv_len[i] counts them (so
  // kv_len[i] >= q_len > 0). Query j (0-based within the sequence's new tokens) sees entries
  // 0 .. kv_len - q_len + j (causal). Entry e lives in page page_indices[page_indptr[i] + e / block_size]
  // at offset e % block_size; the last page may be partly filled.
  const int32_t* q_indptr = nullptr;      // [num_seqs + 1]
  const int32_t* page_indptr = nullptr;   // [num_seqs + 1]
  const int32_t* page_indices = nullptr;  // [page_indptr[num_seqs]]
  const int32_t* kv_len = nullptr;        // [num_seqs]
  // Decode launches with many KV splits (at least kFusedMergeMinSplits; the narrow kernel and the
  // FP8 streamed one) merge the splits in the CTA of each (query tile or sequence, KV head) that
  // finishes last, instead of in a second kernel, when given these arrival counters: at least
  // split_counter_count(shape) ints, zero before the first launch (cudaMemset once after
  // allocating); every launch leaves them zero. One set per stream: two launches in flight at
  // once must not share them. Null, fewer splits, prefill and mixed batches: the merge kernel.
  int* split_counters = nullptr;
  // Ragged paging (ragged.num_tables > 0): table t of sequence i is page_indptr / kv_len index
  // t * num_seqs + i (page_indptr [num_tables * num_seqs + 1], kv_len [num_tables * num_seqs]);
  // every table of a sequence ends with the same q_len new entries.
  RaggedHeads ragged;
};

struct AttentionPlan {
  int num_splits = 1;       // KV splits per (query tile, KV head); 1 = no merge pass. Ragged: the
                            // uniform count the split map was chosen for (ragged_plan)
  int kv_chunk_size = 0;    // most KV entries per split (a multiple of the 64-entry tile)
  int num_tile_slots = 0;   // CTAs along the query dimension (an upper bound; extras exit at once)
  int query_rows = 64;      // packed query rows per CTA: 64 (the warps split the rows: prefill,
                            // mixed) or 16 (the warps split each KV tile: decode)
  int items_per_cta = 0;    // FP8 decode (query_rows 16, one token a sequence, GQA group <= 8):
                            // work items (sequence, KV head, split) per CTA of the streamed
                            // kernel (the planner: 1); 0 = the one-CTA-per-query-tile kernel,
                            // which the bf16 cache always takes. Both are exact for any value.
  int stream_ctas = 0;      // FP8 decode as above: > 0 = the balanced variant, this many CTAs (one
                            // resident wave) sharing the batch's KV tiles out evenly, cut units
                            // merged by their last CTA; used when the launch has split counters
                            // (else the streamed kernel runs num_splits). 0 = off.
  int stream_unit_cost = 1; // the balanced kernel's fixed cost of a unit (sequence, KV head) in
                            // tiles, added to its tiles when sharing them out (0-64)
};

// True when the kernels are built for this head_dim (64 and 128). Others (e.g. 8) are not: the
// backend must report them as unsupported.
bool paged_attention_supported(int head_dim);

// Picks the number of KV splits so that the grid fills the GPU (about four CTAs per SM) without
// making a split shorter than 128 entries. max_kv_len: the longest kv_len of the batch (or any
// upper bound of it, e.g. the model's context length when capturing a graph). num_sms: the
// device's multiprocessor count.
AttentionPlan plan_paged_attention(const AttentionShape& shape, int max_kv_len, int num_sms);

// The balanced FP8 decode kernel (AttentionPlan::stream_ctas): its CTA count on this device (one
// resident wave), and whether it beats `split_plan` (plan_paged_attention's plan for this shape
// and the step's longest KV length) as measured: where the plan fills a wave with short splits,
// and on per-head tables (`per_head`: KV lengths that differ by head) wherever the plan splits.
// plan_paged_attention applies it with per_head false; a CUDA graph captured for a longer length
// must decide with the step's own (the backend records one graph per choice).
int balanced_decode_ctas(int head_dim, int num_sms);
bool balanced_decode_pays(const AttentionPlan& split_plan, const AttentionShape& shape, int num_sms, bool per_head);
// A decode step's AttentionPlan::stream_ctas at its own longest KV length: balanced_decode_ctas where
// balanced_decode_pays for plan_paged_attention's plan at that length, else 0.
int balanced_step_ctas(const AttentionShape& shape, int max_kv_len, int num_sms, bool per_head);

// Splits for a ragged launch whose split map balances the groups (non-uniform budgets): as many
// as keep the grid within ONE wave of resident CTAs (floor(resident CTAs / (tiles x KV heads)),
// at least 1, no split shorter than 128 entries of `planning_len`). In one wave every CTA starts
// at once and the step ends with its longest CTA, which the map shortens; plan_paged_attention's
// two waves of shorter splits let the hardware scheduler even out unbalanced ones instead, so the
// map would buy little there. Resident CTAs per SM come from the occupancy API (2 for D 128).
// When one wave would leave fewer than 4 splits per head (large batches) it returns
// plan_paged_attention's plan: two waves of more splits are faster there.
AttentionPlan plan_ragged_attention(const AttentionShape& shape, int planning_len, int num_sms);

// `plan` with `query_rows` 16 or 64 (and the tile slots that takes): both kernels are exact for any
// batch; the planner picks 16 for decode batches. For tests and benchmarks.
AttentionPlan with_query_rows(const AttentionPlan& plan, const AttentionShape& shape, int query_rows);

// `plan` with `splits` KV splits of a `max_kv_len` context (chunks rounded up to whole KV tiles,
// so the count may come out lower), as plan_paged_attention lays them out. For benchmarks.
AttentionPlan with_kv_splits(const AttentionPlan& plan, int max_kv_len, int splits);

// The plan of a ragged launch: `uniform` (plan_paged_attention's, whose num_splits chose the
// split map) with the map's grid rows and largest split count.
AttentionPlan ragged_plan(const AttentionPlan& uniform, const RaggedHeads& ragged);

// The fewest KV splits a decode launch merges in its last CTAs (AttentionArgs::split_counters). Measured on the H100 (docs/kernels.md, "Split merge in the last
// CTA"): with 32-64 splits (batch 1, contexts 4K and the graph plan's 64) the fused merge makes a
// step's attention 5-15% faster; with 2-9 (batch 8-64) every CTA's fence and atomic cost 1.5-4% of
// it, more than the merge kernel it saves (with programmatic launch that kernel's CTAs are already
// resident when the attention ends); 8 splits tie. 16 lies between the measured wins and losses.
constexpr int kFusedMergeMinSplits = 16;

// The arrival counters AttentionArgs::split_counters must hold for `shape`: one per (query tile
// slot of the narrow decode kernel, KV head), which also covers the streamed kernel's
// (sequence, KV head).
long long split_counter_count(const AttentionShape& shape);

// Workspace for the split-K partials: num_splits * num_tokens * num_heads * (head_dim + 1) floats
// (0 when num_splits == 1); with a balanced plan (stream_ctas > 0) at least
// (num_seqs * num_kv_heads + stream_ctas) * group rows of head_dim + 1 floats.
size_t paged_attention_workspace_bytes(const AttentionPlan& plan, const AttentionShape& shape);

// Mixed batches: prompt tokens beside decode rows. One launch runs them all in the 64-row kernel,
// where a decode row of a GQA group of 4 fills 4 of a tile's 64 rows and, over the FP8 cache, every
// tile is converted to f16 before its products: that kernel reads FP8 KV at 36-46% of the copy
// bandwidth where the decode kernels read it at 53-95% (docs/kernels.md, "Decode: the narrow
// kernel"), and at max load most of a mixed step's KV bytes are its decode rows'. When the batch's
// first `decode_seqs` sequences have one new token each (the scheduler lists the running requests
// before those it admits, so their tokens are the batch's first), they run as a decode batch of
// their own (narrow; FP8: streamed or balanced) and the sequences after them in a second launch.
struct MixedAttentionPlan {
  int decode_seqs = 0;   // leading one-token sequences run as a decode batch; 0: one launch, `rest`
  AttentionPlan decode;  // for mixed_decode_shape(shape, decode_seqs)
  AttentionPlan rest;    // for mixed_rest_shape(shape, decode_seqs), or the whole batch
};

// The fewest leading decode rows worth a launch of their own: each launch costs a few us a layer,
// what the split saves grows with the decode rows' KV bytes. A first guess, to be measured.
constexpr int kMixedDecodeMinSeqs = 8;

// The two parts' shapes: the first decode_seqs sequences (one token each), and the rest.
AttentionShape mixed_decode_shape(const AttentionShape& shape, int decode_seqs);
AttentionShape mixed_rest_shape(const AttentionShape& shape, int decode_seqs);

// Plans a batch whose first `decode_seqs` sequences have one new token each (0 where none or where
// not known). Splits where the batch has tokens past them, at least kMixedDecodeMinSeqs of them,
// a GQA group the decode kernels take, and an FP8 cache (`fp8`: over bf16 the 64-row kernel reads
// at the decode kernels' bandwidth already); else `rest` is plan_paged_attention's plan for the
// whole batch. decode_max_kv_len / rest_max_kv_len: the longest kv_len of each part.
MixedAttentionPlan plan_mixed_attention(const AttentionShape& shape, int decode_seqs, int decode_max_kv_len,
                                        int rest_max_kv_len, bool fp8, int num_sms);

// Workspace for both launches (they run one after the other and share it).
size_t mixed_attention_workspace_bytes(const MixedAttentionPlan& plan, const AttentionShape& shape);

// Enqueues a mixed plan: with decode_seqs 0, paged_attention(args, plan.rest, ...); else the decode
// rows' launch, then the rest's with q / out advanced past the decode rows' tokens, page_indptr /
// kv_len past their sequences, and `rest_q_indptr` as its q_indptr: a device array of
// num_seqs - decode_seqs + 1 values, q_indptr[decode_seqs + i] - decode_seqs. Not for ragged args
// (their per-table arrays are num_seqs apart): cudaErrorInvalidValue.
cudaError_t paged_attention_mixed(const AttentionArgs& args, const MixedAttentionPlan& plan,
                                  const int32_t* rest_q_indptr, void* workspace, size_t workspace_bytes,
                                  cudaStream_t stream);

// Enqueues the attention (and the merge pass when plan.num_splits > 1). Returns
// cudaErrorInvalidValue for an unsupported head_dim, bad sizes, a too-small workspace or a plan
// made for a different shape; otherwise the launch status.
cudaError_t paged_attention(const AttentionArgs& args, const AttentionPlan& plan, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream);

}  // namespace origami::cuda
