#pragma once
// Causal attention of new tokens over a paged KV cache (prefill chunks and decodes alike), fp32.
// The new tokens' K/V must already be written to their entry slots. Query token t of a sequence
// attends to entries 0 .. num_cached_entries + t, in slot order, with a plain two-pass softmax:
// the arithmetic for one (query, head) depends only on that query and those entries, never on
// chunking, batching, page size or threads.
#include <cstddef>
#include <vector>

#include "backend/cpu/cpu_thread_pool.h"
#include "kv/block_table.h"

namespace origami::cpu {

struct AttentionShape {
  int num_heads = 0;
  int num_kv_heads = 0;  // query head h reads KV head h / (num_heads / num_kv_heads) (GQA)
  int head_dim = 0;
  int block_size = 0;
  float scale = 1.0f;    // usually 1 / sqrt(head_dim)
};

// One KV head's page table and length in a sequence (head groups: each head reads its group's).
struct HeadTable {
  const BlockId* block_table = nullptr;
  int num_cached_entries = 0;
};

struct AttentionSequence {
  int query_start = 0;         // first row of this sequence in q / out
  int num_query_tokens = 0;
  int num_cached_entries = 0;  // entries before the first new token
  const BlockId* block_table = nullptr;  // covers num_cached_entries + num_query_tokens entries
  // Head groups: [num_kv_heads] table and length per KV head, overriding the two above; or null.
  const HeadTable* head_tables = nullptr;
};

// One KV head's pages of one layer: block b of the head starts at k + b * block_stride (V alike).
struct KVHeadPages {
  const float* k = nullptr;
  const float* v = nullptr;
  size_t block_stride = 0;
};

// q:   [num_tokens, num_heads * head_dim], row stride ldq
// k/v: one layer's cache, [num_blocks, num_kv_heads, block_size, head_dim]
// out: [num_tokens, num_heads * head_dim], row stride ldo (rows of no sequence are untouched)
void paged_attention(const AttentionShape& shape, const std::vector<AttentionSequence>& sequences, const float* q,
                     size_t ldq, const float* k_cache, const float* v_cache, float* out, size_t ldo,
                     ThreadPool* pool);
// The same with each KV head's pages given apart (heads: [num_kv_heads]), for any KV layout.
// The arithmetic per (query, head) is the same as above for the same entries.
void paged_attention(const AttentionShape& shape, const std::vector<AttentionSequence>& sequences, const float* q,
                     size_t ldq, const std::vector<KVHeadPages>& heads, float* out, size_t ldo, ThreadPool* pool);

}  // namespace origami::cpu
