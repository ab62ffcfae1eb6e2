#pragma once
// What a backend needs to compress requests' KV caches in place, as plain parameter structs.
// Policies (src/policy) decide *what* to keep by building a ScoreRecipe; the engine decides
// *when* and builds CompressionJobs; backends run the scorer, select and compact kernels.
//
// Eviction is token-wise per (layer, KV head): every (layer, head) keeps its own `num_keep`
// highest-scoring entries, in their original order, so heads keep different tokens but equally
// many and one block table still serves them all. Keys are cached after RoPE, so moving an entry
// does not change its meaning.
#include <cstdint>
#include <vector>

#include "core/status.h"
#include "kv/block_table.h"
#include "kv/scorers.h"

namespace origami {

enum class PoolType { kMax, kAvg };
// How the global score F combines with this compression's score S (ScoreRecipe::global_decay > 0).
enum class GlobalMode {
  kMax,  // G-KV (Zipage): F <- max(decay * F_prev, S)
  kSum,  // accumulated score (H2O's accumulated attention with decay 1): F <- decay * F_prev + S
};
enum class RedundancyMode {
  kNone,
  kFlash,      // cosine similarity between all pairs of a head's keys (block-tiled)
  kLightning,  // similarity only between keys of the same block
};

// How many entries each (layer, KV head) of a request keeps at a compression.
enum class KeepAllocation {
  kUniform,  // every head of a job keeps the job's num_keep (the scheduler fixes the count)
  // The backend decides (AdaKV): per layer, one top-k over all the layer's heads' selection
  // scores, the layer keeping `mean_keep` x its heads in total.
  kLayer,
  // The backend decides (Fast KVzip / KVzip): one threshold over every layer and head, the request
  // keeping `mean_keep` x layers x heads in total.
  kGlobal,
};
inline const char* keep_allocation_name(KeepAllocation allocation) {
  switch (allocation) {
    case KeepAllocation::kLayer: return "layer";
    case KeepAllocation::kGlobal: return "global";
    default: return "uniform";
  }
}

// How entries are scored: a base scorer (kv/scorers.h) then the shared stages below. Every
// backend implements every registered scorer. Scores are per (layer, KV head, entry); higher
// means keep.
struct ScoreRecipe {
  // The base score S. kAttention (the default) is the observation window's attention:
  // softmax(q.k / sqrt(d)) of each of the last `window` entries' queries over all cached keys
  // (causal inside the window), max over the query heads of a GQA group, mean over the window's
  // queries; it needs the window's queries captured into a query slot (SequenceInput::query_slot).
  // kRecency (StreamingLLM) scores an entry by its index, kKeyNorm by -||k||, kKeyDiff by
  // -cos(k, mean of the unit keys), kZero leaves 0.
  Scorer scorer = Scorer::kAttention;
  int window = 16;       // the last `window` entries always kept (+inf); for kAttention their queries
                         // score the rest
  int num_sinks = 0;     // the first `num_sinks` entries always kept (+inf)
  // Pooling of the attention score along the sequence (SnapKV), odd kernel; <= 1 = off.
  int pool_kernel = 0;
  PoolType pool_type = PoolType::kMax;
  bool pool_first_only = true;  // pool only at a request's first compression (Zipage)
  // G-KV global score: F <- max(global_decay * F_prev, S) per entry (global_mode kSum:
  // F <- global_decay * F_prev + S), F moving with its entry on compaction; selection then uses F
  // instead of S. 0 = off. Entries new since the last compression start from F = S.
  float global_decay = 0.0f;
  GlobalMode global_mode = GlobalMode::kMax;
  // R-KV redundancy: final = lambda * S - (1 - lambda) * R, with R the softmax over entries of
  // (row sums of the thresholded cosine similarity, / length, / tau).
  RedundancyMode redundancy = RedundancyMode::kNone;
  float redundancy_lambda = 0.2f;
  float redundancy_tau = 0.4f;
  float redundancy_threshold = 0.5f;  // per column, the newest duplicate above this is kept
  // Lightning compares keys only within consecutive groups of this many entries; 0 = one block
  // (the paper's definition). A fixed span makes lightning behave alike at every block size.
  int redundancy_span = 0;
  // The last `recent` entries are always kept too (+inf), beside the observation window: a recent
  // window as H2O keeps one. 0 = only the observation window.
  int recent = 0;
  // A recent window as a share of what a compression keeps: the last floor(recent_ratio *
  // num_keep) entries are kept too (H2O's split of the budget between recent tokens and heavy
  // hitters). In [0, 1); 0 = off.
  float recent_ratio = 0.0f;
  // Whether the observation window is protected (the usual case: its queries score the entries
  // before it). false when the window is itself what is compressed (Kara: only the last `recent`
  // entries, its buffer U, are protected).
  bool protect_window = true;
  // Kara (Scorer::kKara): of the window's compressible region (its first window - recent entries)
  // `window_keep` entries are kept: ceil(r * (W - U)) - chunk_budget by score, then Token2Chunk
  // adds up to `chunk_budget` entries inside gaps shorter than `chunk_max_len` (gamma, endpoints
  // included) and fills what it leaves unused with the next-best entries.
  int window_keep = 0;
  int chunk_budget = 0;   // alpha
  int chunk_max_len = 8;  // gamma (>= 3)
  // Fast KVzip: the backend writes every entry's gate score into F as it writes the entry (a
  // backend with gates loaded, global-score pages allocated), so every entry of a job counts as
  // scored (num_scored_entries = num_entries) and, with scorer kZero and global_decay 1 (kMax),
  // the selection score is the gate's: S = max(F, 0) = F.
  bool gate_scores = false;
  // KVzip: the backend scores the job's entries by a reconstruction pass just before selecting
  // (CompressionJob::reconstruction_tokens: the repeat prompt, then the entries' own tokens; each
  // entry's largest attention from the reconstruction's queries) and, with scorer kZero and global_decay 1
  // (kMax), selects by those scores: S = max(KVzip, 0).
  bool reconstruction_scores = false;
  // Context entries reconstructed per pass (0: all in one pass), each pass over the first
  // reconstruction_sinks entries and its chunk, its queries placed right after the chunk so that
  // attention stays within the model's trained context (backend/cpu/cpu_reconstruction.cpp).
  int reconstruction_chunk = 0;
  int reconstruction_sinks = 4;
  // Who decides the kept counts (KeepAllocation). With kLayer / kGlobal the request's jobs (one per
  // head group) are selected jointly: every head keeps its protected entries (+inf: window, sinks)
  // and at least floor(alpha_safe x mean_keep) (AdaKV's safeguard; capped by its entries), then
  // one top-k over the scope's remaining entries fills the scope's total; a head group keeps the
  // largest count of its heads (a head that chose fewer keeps its next-best entries up to it: its
  // pages exist anyway).
  KeepAllocation allocation = KeepAllocation::kUniform;
  float alpha_safe = 0.2f;
  // kLayer / kGlobal: the scope's total is counted in pages of the KV block size b (the backend's),
  // every head keeping a whole number of pages or all its entries (cpu::joint_head_counts,
  // backend/cpu/joint_selection.h), so that with pages of one head none is left partly empty.
  bool page_aligned = false;

  // The lightning group at this block size, and how many trailing entries are protected when a
  // compression keeps `num_keep` entries (0: the ratio-based recent window is left out).
  int lightning_span(int block_size) const { return redundancy_span > 0 ? redundancy_span : block_size; }
  int protected_tail(int num_keep = 0) const {
    int tail = protect_window && window > recent ? window : recent;
    const int by_ratio = static_cast<int>(recent_ratio * static_cast<float>(num_keep));
    return by_ratio > tail ? by_ratio : tail;
  }

  bool needs_queries() const { return scorer_needs_queries(scorer); }
};

// Backend state for compression, set once after allocate_kv_cache().
struct CompressionConfig {
  int num_query_slots = 0;  // M: requests that may capture window queries at once
  int max_window = 16;      // w of the query cache Q[L, M, max_window, h_q, d]
  bool global_scores = false;  // keep a per-entry score F[L, num_blocks, h_kv, block_size]
  int layer_stride = 8;        // layers scored and compacted together (bounds temporary memory)
};

// What a job does to the request's cache.
enum class CompressionKind {
  // Token-wise eviction per (layer, KV head): score, keep the top num_keep, compact them into
  // dst_blocks (every policy; PagedEviction at the end of a prefill).
  kCompact,
  // Block eviction (PagedEviction's decode phase): score every entry with the recipe's base
  // scorer, average it per block over the block's entries, layers and KV heads (one page table
  // serves them all), and name the block with the lowest mean among src_blocks[1 .. n - 2]
  // (never the first, never the last). Nothing is written: the scheduler drops that block from
  // the request's table (CompressionResult::evicted_block). num_entries must fill whole blocks,
  // at least 3 of them; dst_blocks, num_keep, query_slot and global scores are unused.
  kEvictBlock,
};

// One request's compression of one head group (full layout: group 0, whose table all layers and
// heads share; head groups: one job per compressed group, each with its own tables and num_keep).
struct CompressionJob {
  CompressionKind kind = CompressionKind::kCompact;
  uint64_t request_id = 0;
  int group = 0;  // the head group whose table src_blocks / dst_blocks are
  // The request's current pages and how many entries they hold.
  const std::vector<BlockId>* src_blocks = nullptr;
  int num_entries = 0;
  // Where the kept entries go, in order: entry i of the result lands in dst_blocks[i / block_size]
  // at offset i % block_size. Usually the leading src blocks themselves (in-place compaction: a
  // destination index never exceeds its source index); a shared prefix block (ref count > 1) is
  // never written, so its place is taken by a freshly allocated target block.
  const std::vector<BlockId>* dst_blocks = nullptr;
  int num_keep = 0;  // entries kept per (layer, KV head); <= num_entries
  // recipe->allocation kLayer / kGlobal: the average entries kept per (layer, KV head) over the
  // request's jobs of the batch (one per head group of the layout, all of them), which the backend
  // selects jointly; num_keep is then the most this group may keep (dst_blocks hold that many)
  // and CompressionResult::num_kept the count it kept. 0 with kUniform.
  int mean_keep = 0;
  // The query slot holding the last `recipe->window` entries' queries (needs_queries()).
  int query_slot = -1;
  // Leading entries whose global score F is valid from an earlier compression; the rest are new.
  int num_scored_entries = 0;
  bool first_compression = true;
  // The request's logical length (positions) when it is compressed: query slot rows are keyed by
  // position (row = position % max_window), which compaction never changes, so the window's
  // query i (entry num_entries - w + i) is at row (num_positions - w + i) % max_window. Its
  // trailing w entries are uncompressed, hence consecutive positions. -1: equal to num_entries.
  int num_positions = -1;
  const ScoreRecipe* recipe = nullptr;
  // recipe->reconstruction_scores: the tokens the model reads after the job's entries to
  // reconstruct them: KVzip's repeat prompt, then the entries' own tokens (the backend splits them
  // into chunks of recipe->reconstruction_chunk, each chunk's input placed right after it).
  std::vector<int32_t> reconstruction_tokens;
};

// What a backend reports for each compression it finished, or refused: on success the request's
// destination table holds its num_keep entries; on failure nothing is known of its pages.
struct CompressionResult {
  uint64_t request_id = 0;
  Status status;
  int group = 0;  // the job's head group
  // kEvictBlock, on success: the index in src_blocks of the block to drop; -1 otherwise.
  int evicted_block = -1;
  // kCompact, on success: entries the group keeps per (layer, KV head) (num_keep, or with a
  // runtime allocation the count the backend chose); -1 when the backend did not say.
  int num_kept = -1;
  // kEvictBlock, on success, where the backend reports them: the per-block base-score sums the
  // choice was made from (KVCompressor::evicted_block_sums).
  std::vector<float> block_score_sums;
};

// Whether the backend decides the kept counts of the recipe's compressions (KeepAllocation).
inline bool runtime_allocation(const ScoreRecipe& recipe) { return recipe.allocation != KeepAllocation::kUniform; }

}  // namespace origami
