// Paged attention against dense causal attention in double precision, over odd lengths and page
// sizes with scattered pages and GQA; and its invariance to chunking and batching.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cpu/cpu_attention.h"

namespace origami::cpu {
namespace {

struct PagedFixture {
  AttentionShape shape;
  int num_entries = 0;
  std::vector<float> keys, values;  // dense [num_entries, num_kv_heads, head_dim]
  std::vector<float> k_cache, v_cache;  // [num_blocks, num_kv_heads, block_size, head_dim]
  std::vector<BlockId> table;

  PagedFixture(int num_heads, int num_kv_heads, int head_dim, int block_size, int entries, uint32_t seed) {
    shape = {num_heads, num_kv_heads, head_dim, block_size, 1.0f / std::sqrt(static_cast<float>(head_dim))};
    num_entries = entries;
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    const size_t row = static_cast<size_t>(num_kv_heads) * head_dim;
    keys.resize(entries * row);
    values.resize(entries * row);
    for (float& x : keys) x = 2.0f * dist(rng);
    for (float& x : values) x = dist(rng);
    // Pages scattered over a pool twice the size needed, block 0 unused (the null block).
    const int pages = (entries + block_size - 1) / block_size;
    const int pool = 2 * pages + 1;
    std::vector<BlockId> ids(pool - 1);
    std::iota(ids.begin(), ids.end(), 1);
    std::shuffle(ids.begin(), ids.end(), rng);
    table.assign(ids.begin(), ids.begin() + pages);
    const size_t block_stride = row * block_size;
    k_cache.assign(pool * block_stride, std::nanf(""));  // unwritten slots must never be read
    v_cache.assign(pool * block_stride, std::nanf(""));
    for (int s = 0; s < entries; ++s)
      for (int g = 0; g < num_kv_heads; ++g) {
        const size_t dst = table[s / block_size] * block_stride + (static_cast<size_t>(g) * block_size + s % block_size) * head_dim;
        std::copy_n(&keys[s * row + g * head_dim], head_dim, &k_cache[dst]);
        std::copy_n(&values[s * row + g * head_dim], head_dim, &v_cache[dst]);
      }
  }
};

// Dense causal reference: query t of a chunk starting after `cached` entries sees 0..cached+t.
std::vector<double> reference(const PagedFixture& f, const std::vector<float>& q, int cached, int num_q) {
  const auto& s = f.shape;
  const int d = s.head_dim, group = s.num_heads / s.num_kv_heads;
  std::vector<double> out(static_cast<size_t>(num_q) * s.num_heads * d, 0.0);
  for (int t = 0; t < num_q; ++t)
    for (int h = 0; h < s.num_heads; ++h) {
      const int g = h / group, n = cached + t + 1;
      std::vector<double> p(n);
      double mx = -1e300;
      for (int j = 0; j < n; ++j) {
        double dotv = 0;
        for (int i = 0; i < d; ++i)
          dotv += static_cast<double>(q[(t * s.num_heads + h) * d + i]) * f.keys[(j * s.num_kv_heads + g) * d + i];
        p[j] = dotv / std::sqrt(static_cast<double>(d));
        mx = std::max(mx, p[j]);
      }
      double sum = 0;
      for (double& x : p) sum += (x = std::exp(x - mx));
      for (int j = 0; j < n; ++j)
        for (int i = 0; i < d; ++i)
          out[(t * s.num_heads + h) * d + i] += p[j] / sum * f.values[(j * s.num_kv_heads + g) * d + i];
    }
  return out;
}

std::vector<float> random_queries(int num_q, const AttentionShape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(num_q) * s.num_heads * s.head_dim);
  for (float& x : q) x = 2.0f * dist(rng);
  return q;
}

TEST(CpuPagedAttention, MatchesDenseReference) {
  ThreadPool pool(2);
  for (int block_size : {1, 16, 256}) {
    for (int length : {1, 7, 97, 1000}) {
      PagedFixture f(8, 2, 24, block_size, length, 100 + length + block_size);
      // A prefill chunk of the last min(length, 13) entries over the cached rest.
      const int num_q = std::min(length, 13), cached = length - num_q;
      auto q = random_queries(num_q, f.shape, 7 + length);
      const int width = f.shape.num_heads * f.shape.head_dim;
      std::vector<float> out(num_q * width);
      paged_attention(f.shape, {{0, num_q, cached, f.table.data()}}, q.data(), width, f.k_cache.data(),
                      f.v_cache.data(), out.data(), width, &pool);
      auto ref = reference(f, q, cached, num_q);
      for (size_t i = 0; i < out.size(); ++i)
        ASSERT_NEAR(out[i], ref[i], 2e-5) << "block_size " << block_size << " length " << length << " i " << i;
    }
  }
}

TEST(CpuPagedAttention, ChunkingAndBatchingAreBitInvariant) {
  ThreadPool pool(2);
  const int length = 97;
  PagedFixture f(4, 4, 16, 16, length, 5);  // MHA
  const int width = 4 * 16;
  auto q = random_queries(length, f.shape, 9);
  std::vector<float> whole(length * width);
  paged_attention(f.shape, {{0, length, 0, f.table.data()}}, q.data(), width, f.k_cache.data(), f.v_cache.data(),
                  whole.data(), width, &pool);
  for (int chunk : {1, 7, 16}) {
    std::vector<float> pieces(length * width);
    for (int start = 0; start < length; start += chunk) {
      const int n = std::min(chunk, length - start);
      paged_attention(f.shape, {{0, n, start, f.table.data()}}, q.data() + start * width, width, f.k_cache.data(),
                      f.v_cache.data(), pieces.data() + start * width, width, nullptr);
    }
    ASSERT_EQ(pieces, whole) << "chunk " << chunk;
  }
  // Same queries with the same cache copied to a different page size: bit-identical.
  PagedFixture f1(4, 4, 16, 1, length, 5);
  ASSERT_EQ(f1.keys, f.keys);
  std::vector<float> paged1(length * width);
  paged_attention(f1.shape, {{0, length, 0, f1.table.data()}}, q.data(), width, f1.k_cache.data(),
                  f1.v_cache.data(), paged1.data(), width, &pool);
  ASSERT_EQ(paged1, whole);
  // Batched behind another sequence in one call (separate caches are not allowed in one call, so
  // the second sequence shares f's pool and reads a prefix of f's pages).
  auto q2 = random_queries(3, f.shape, 10);
  std::vector<float> qb(q2);
  qb.insert(qb.end(), q.begin(), q.end());
  std::vector<float> batched((3 + length) * width);
  paged_attention(f.shape, {{0, 3, 30, f.table.data()}, {3, length, 0, f.table.data()}}, qb.data(), width,
                  f.k_cache.data(), f.v_cache.data(), batched.data(), width, &pool);
  ASSERT_TRUE(std::equal(whole.begin(), whole.end(), batched.begin() + 3 * width));
}

}  // namespace
}  // namespace origami::cpu
