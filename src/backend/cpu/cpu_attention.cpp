#include "backend/cpu/cpu_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cpu/cpu_kernels.h"

namespace origami::cpu {
namespace {

struct WorkItem {
  int seq = 0;
  int token = 0;  // index among the sequence's new tokens
  int head = 0;   // query head
};

// One query head of one token: scores over entries [0, num_keys), softmax, weighted sum of V.
void attend_one(const AttentionShape& shape, const BlockId* block_table, int num_keys, const KVHeadPages& pages,
                const float* q, float* scores, float* out) {
  const int d = shape.head_dim;
  const int bs = shape.block_size;
  const size_t block_stride = pages.block_stride;
  const float* k_cache = pages.k;
  const float* v_cache = pages.v;

  float max_score = -std::numeric_limits<float>::infinity();
  for (int j0 = 0; j0 < num_keys; j0 += bs) {
    const float* kb = k_cache + static_cast<size_t>(block_table[j0 / bs]) * block_stride;
    const int n = std::min(bs, num_keys - j0);
    for (int o = 0; o < n; ++o) {
      const float s = dot(q, kb + static_cast<size_t>(o) * d, d) * shape.scale;
      scores[j0 + o] = s;
      max_score = std::max(max_score, s);
    }
  }
  float sum = 0.0f;
  for (int j = 0; j < num_keys; ++j) {
    scores[j] = std::exp(scores[j] - max_score);
    sum += scores[j];
  }
  const float inv_sum = 1.0f / sum;
  for (int j = 0; j < num_keys; ++j) scores[j] *= inv_sum;

  std::fill(out, out + d, 0.0f);
  for (int j0 = 0; j0 < num_keys; j0 += bs) {
    const float* vb = v_cache + static_cast<size_t>(block_table[j0 / bs]) * block_stride;
    const int n = std::min(bs, num_keys - j0);
    for (int o = 0; o < n; ++o) {
      const float p = scores[j0 + o];
      const float* v = vb + static_cast<size_t>(o) * d;
      for (int i = 0; i < d; ++i) out[i] += p * v[i];
    }
  }
}

}  // namespace

void paged_attention(const AttentionShape& shape, const std::vector<AttentionSequence>& sequences, const float* q,
                     size_t ldq, const float* k_cache, const float* v_cache, float* out, size_t ldo,
                     ThreadPool* pool) {
  const size_t block_stride = static_cast<size_t>(shape.num_kv_heads) * shape.block_size * shape.head_dim;
  std::vector<KVHeadPages> heads(static_cast<size_t>(shape.num_kv_heads));
  for (int h = 0; h < shape.num_kv_heads; ++h) {
    const size_t offset = static_cast<size_t>(h) * shape.block_size * shape.head_dim;
    heads[static_cast<size_t>(h)] = {k_cache + offset, v_cache + offset, block_stride};
  }
  paged_attention(shape, sequences, q, ldq, heads, out, ldo, pool);
}

void paged_attention(const AttentionShape& shape, const std::vector<AttentionSequence>& sequences, const float* q,
                     size_t ldq, const std::vector<KVHeadPages>& heads, float* out, size_t ldo, ThreadPool* pool) {
  std::vector<WorkItem> items;
  double work = 0;  // multiply-adds, to decide whether threads pay off
  for (int s = 0; s < static_cast<int>(sequences.size()); ++s) {
    const AttentionSequence& seq = sequences[s];
    work += (seq.num_cached_entries + 0.5 * seq.num_query_tokens) * seq.num_query_tokens;
    for (int t = 0; t < seq.num_query_tokens; ++t)
      for (int h = 0; h < shape.num_heads; ++h) items.push_back({s, t, h});
  }
  work *= 2.0 * shape.num_heads * shape.head_dim;
  const int group_size = shape.num_heads / shape.num_kv_heads;
  const int d = shape.head_dim;
  parallel_for(work >= 64.0 * 1024 ? pool : nullptr, static_cast<int>(items.size()), [&](int i) {
    thread_local std::vector<float> scores;  // [num_keys] of the current item
    const WorkItem& item = items[i];
    const AttentionSequence& seq = sequences[item.seq];
    const int kv_head = item.head / group_size;
    HeadTable table{seq.block_table, seq.num_cached_entries};
    if (seq.head_tables != nullptr) table = seq.head_tables[kv_head];
    const size_t row = static_cast<size_t>(seq.query_start + item.token);
    const int num_keys = table.num_cached_entries + item.token + 1;
    if (scores.size() < static_cast<size_t>(num_keys)) scores.resize(num_keys);
    attend_one(shape, table.block_table, num_keys, heads[static_cast<size_t>(kv_head)],
               q + row * ldq + static_cast<size_t>(item.head) * d, scores.data(),
               out + row * ldo + static_cast<size_t>(item.head) * d);
  });
}

}  // namespace origami::cpu
