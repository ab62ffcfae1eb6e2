#pragma once
// The compression kernels' CPU twins: scoring, top-k selection and compaction of one
// (layer, KV head) on plain fp32 arrays. The CPU backend runs them over its paged cache
// (cpu_compression.h); the CUDA kernels are tested against them on random inputs, so every
// function states its exact arithmetic, order of operations and tie-breaking.
//
// The score pipeline of one (layer, KV head) with n cached entries (score_head() runs it):
//   1. S = the base scorer recipe.scorer (kv/scorers.h; one file each in scorers/, dispatched by
//      score_base): attention = window_attention_scores(...), recency = recency_scores(...),
//      knorm = -|k|, vknorm = |v| / |k|, zero = 0 (e.g. redundancy only)
//   2. if recipe.global_decay > 0:             update_global_scores(S, F): S = F = max(decay*F_prev, S)
//                                              (global_mode kSum: S = F = decay*F_prev + S)
//   3. if recipe.pool_kernel > 1 and (first_compression or !recipe.pool_first_only):
//                                              S = pool_scores(S)   (after the global score, as in
//                                              Zipage C.4: F stores the unpooled score)
//   4. if recipe.redundancy != kNone:          S = lambda * S - (1 - lambda) * redundancy_scores(K)
//   5. protect_scores(S): +inf for the last min(recipe.protected_tail(num_keep), n) entries
//      (window, recent, recent_ratio * num_keep) and the first num_sinks.
// Then select_keep(S, n, num_keep) gives the kept entries and compact_entries() moves K, V and F.
#include <cstddef>
#include <cstdint>

#include "kv/block_table.h"
#include "kv/compression.h"

namespace origami::cpu {

// --- Scorers ---------------------------------------------------------------------------------

// Observation-window attention of one KV head (Zipage C.2, SnapKV).
//   q:    [w, group_size, d]  the window's queries for the KV head's query heads, in window
//         order (query i belongs to entry n - w + i; query head g * group_size + j of KV head g is
//         q[i, j]). Post-RoPE, post-q-norm, as the forward pass used them.
//   keys: [n, d]              the head's cached keys in entry order (post-RoPE).
//   out:  [n]
// Requires 1 <= w <= n. For every (i, j): p = softmax over entries e <= n - w + i of
// scale * q[i, j] . keys[e] (max-subtracted, fp32; entries after n - w + i get p = 0 — causal).
// out[e] = (1 / w) * sum_i max_j p[i, j, e]. Each column of out sums (over e) to 1 when
// group_size = 1.
void window_attention_scores(const float* q, const float* keys, int n, int w, int d, int group_size, float scale,
                             float* out);

// Kara's importance (eq. 4) of one KV head: the bidirectional attention of every window query
// over the window's compressible keys.
//   q:    [w, group_size, d] the window's queries (as for window_attention_scores).
//   keys: [m, d]             the compressible region's keys (the window's first m entries).
//   out:  [m]
// For every (i, j): p = softmax over all e < m (no causal mask: earlier queries see later keys)
// of scale * q[i, j] . keys[e] (max-subtracted, fp32); out[e] = sum_i (1 / group_size) sum_j p,
// summed in ascending i then j (the column sums of eq. 4, a GQA group's heads averaged, so the
// scores of one KV head sum to w). Requires w >= 1, m >= 1.
void kara_window_scores(const float* q, const float* keys, int m, int w, int d, int group_size, float scale,
                        float* out);

// Kara's selection in the compressible region (eqs. 5-8, App. C.3): marks exactly
// min(num_keep, m) entries of a [m] (keep[e] = 1, else 0):
//   1. I = the max(num_keep - chunk_budget, 0) best entries by a (select_keep's order: higher
//      score first, ties to the larger index), ascending.
//   2. Token2Chunk: every two consecutive I[k] < I[k+1] bound a candidate chunk if
//      I[k+1] - I[k] < chunk_max_len and it has interior entries (I[k+1] - I[k] >= 2); its score
//      R_k = (a[I[k]] + a[I[k+1]]) * (I[k+1] - I[k] - 1). The floor(chunk_budget / (chunk_max_len
//      - 2)) best chunks (higher R first, ties to the larger k) keep their interior entries (at
//      most chunk_max_len - 2 each, so at most chunk_budget in all).
//   3. What is left of the budget goes to the best unmarked entries by a (same order as 1).
// chunk_max_len must be >= 3.
void token2chunk(const float* a, int m, int num_keep, int chunk_budget, int chunk_max_len, uint8_t* keep);

// StreamingLLM: out[e] = e (the most recent entries win).
void recency_scores(int n, float* out);

// Same-size 1-D pooling along entries (SnapKV), window [e - kernel/2, e + kernel/2] clipped to
// [0, n): kMax takes the maximum of the in-range entries; kAvg their sum divided by the number of
// in-range entries (padding excluded, PyTorch's count_include_pad=False). `kernel` must be odd
// and >= 1 (1 copies). `in` and `out` must not alias.
void pool_scores(const float* in, int n, int kernel, PoolType type, float* out);

// G-KV global score (Zipage Algorithm 2), in place: for e < num_scored,
// s[e] = max(decay * f[e], s[e]) (kMax) or s[e] = (decay * f[e]) + s[e] (kSum: the product rounded
// to fp32, then the sum; H2O's accumulated attention with decay 1); then f[e] = s[e] for every
// e < n (new entries start from S).
void update_global_scores(float* s, float* f, int n, int num_scored, float decay, GlobalMode mode = GlobalMode::kMax);

// KeyDiff (Park et al. 2025; kvpress's KeyDiffPress) of one KV head's keys [n, d] -> out [n]:
//   u_e = k_e / max(|k_e|, 1e-8)                 (unit keys; |k| = sqrt of the fp32 sum of squares)
//   a[x] = (sum over e ascending of u_e[x]) / n   (the anchor: mean unit key)
//   out[e] = -(u_e . a) / max(|a|, 1e-8)          (= -cos(k_e, a))
// Keys that point away from the average direction score high (are kept).
void keydiff_scores(const float* keys, int n, int d, float* out);

// R-KV redundancy of one KV head's keys, [n, d] in entry order -> out [n] (a distribution: sums
// to 1). Exact reading of Zipage C.5 / Algorithm 3 implemented here:
//   C[i][j] = keys[i] . keys[j] / max(|keys[i]| * |keys[j]|, 1e-8)   (cosine similarity)
//   C[i][i] = 0.
//   Pairs: kFlash considers every pair (i, j) of the n entries; kLightning only pairs inside the
//   same span (entries e with equal e / span; other pairs count as 0). The paper's span is one
//   block.
//   For each column j: among the considered rows i != j with C[i][j] > threshold (strictly), the
//   one with the LARGEST i (the newest entry similar to j) gets C[i][j] = 0, so the newest
//   duplicate loses that share of its redundancy and tends to be kept. At most one per column.
//   rowsum[i] = sum_j C[i][j] (after zeroing), summed in ascending j.
//   norm[i] = rowsum[i] / L, with L = n (kFlash) or the length of i's span, min(span,
//   n - span_start) (kLightning).
//   out = softmax over all n entries of norm / tau (max-subtracted).
// span (the lightning group, ScoreRecipe::lightning_span) matters only for kLightning. mode must
// not be kNone.
void redundancy_scores(const float* keys, int n, int d, int span, RedundancyMode mode, float tau, float threshold,
                       float* out);

// Steps 4-5 of the pipeline, in place on s [n]: if r != nullptr,
// s[e] = lambda * s[e] - (1 - lambda) * r[e]; then s[e] = +inf for e >= n - min(window, n) and
// for e < min(num_sinks, n).
void protect_scores(float* s, const float* r, int n, float lambda, int window, int num_sinks);

// Runs the whole pipeline above for one (layer, KV head).
//   keys:     [n, d] in entry order.
//   window_q: [w, group_size, d] with w = min(recipe.window, n); may be null unless
//             recipe.needs_queries().
//   f:        [n] global scores, read for e < num_scored, rewritten for all e < n; may be null
//             unless recipe.global_decay > 0.
//   out:      [n] final scores. Scratch is allocated internally.
//   num_keep: entries the compression keeps; only recipe.recent_ratio reads it (0: the ratio's
//             recent window is left out).
//   values:   [n, d] in entry order; may be null unless the scorer reads values (vknorm).
void score_head(const ScoreRecipe& recipe, const float* keys, int n, int d, const float* window_q, int group_size,
                float scale, int block_size, float* f, int num_scored, bool first_compression, float* out,
                int num_keep = 0, const float* values = nullptr);

// --- Selection -------------------------------------------------------------------------------

// The k highest scores of s [n], written to out [k] in ascending entry order. Order (a total
// order, so the GPU must pick the same set): entry a beats entry b iff s[a] > s[b], or s[a] == s[b]
// and a > b (ties prefer the newer entry). NaN counts as lower than every number, -inf included
// (NaNs among themselves: again the larger index wins). +inf entries therefore always win over
// finite ones. Requires 0 <= k <= n.
void select_keep(const float* s, int n, int k, int32_t* out);
// select_keep's order: entry a (score sa) beats entry b (score sb).
bool beats(float sa, int a, float sb, int b);

// --- Compaction ------------------------------------------------------------------------------

// Moves the kept entries of one (layer, KV head) of a paged array into their destination pages.
//   base:         one layer's array [num_blocks, num_kv_heads, block_size, row_floats]:
//                 K or V (row_floats = head_dim) or the global scores F (row_floats = 1).
//   block_stride: floats between consecutive blocks (num_kv_heads * block_size * row_floats).
//   keep:         [num_keep] strictly ascending source entry indices.
// Entry i of the result (source entry keep[i], at src_blocks[keep[i] / block_size], offset
// keep[i] % block_size) lands at dst_blocks[i / block_size], offset i % block_size. Entries are
// moved in ascending i, so in-place compaction is safe as long as every destination page either is
// not a source page or is the source page at the same or an earlier table index (dst index never
// exceeds source index then, and each source is read before it can be overwritten). memmove
// semantics for i == keep[i]. Source pages that are not destination pages are never written.
void compact_entries(float* base, size_t block_stride, int head, int block_size, int row_floats,
                     const BlockId* src_blocks, const BlockId* dst_blocks, const int32_t* keep, int num_keep);

}  // namespace origami::cpu
