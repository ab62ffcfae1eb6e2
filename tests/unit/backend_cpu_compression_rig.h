#pragma once
// A CPU backend with random weights of a small GQA shape and compression configured, plus helpers
// that fill a sequence's pages and query slot with random data, snapshot them, and recover which
// source entry every compacted row came from (random rows are unique, so a bit-exact match names
// its source).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "kv/kv_cache_dtype.h"
#include "backend_cpu_compression_naive.h"

namespace origami::test {

struct Rig {
  std::unique_ptr<CpuBackend> backend;
  int num_layers = 3, num_kv_heads = 2, num_q_heads = 4, head_dim = 16, block_size = 16;
  int max_window = 16;

  cpu::CpuKVCache& kv() { return backend->kv_cache(); }
  int group_size() const { return num_q_heads / num_kv_heads; }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(head_dim)); }
};

inline ModelConfig rig_config(int num_layers, int num_kv_heads, int num_q_heads, int head_dim) {
  ModelConfig c;
  c.model_type = "qwen3";
  c.vocab_size = 64;
  c.hidden_size = 64;
  c.intermediate_size = 64;
  c.num_layers = num_layers;
  c.num_heads = num_q_heads;
  c.num_kv_heads = num_kv_heads;
  c.head_dim = head_dim;
  c.max_position_embeddings = 4096;
  c.qk_norm = true;
  return c;
}

// num_q_heads / num_kv_heads is the GQA group size.
// kv_dtype: the cache's element type (bf16 and fp8 are emulated; fill_entries rounds like a write).
inline Rig make_rig(int block_size, int num_blocks, int num_kv_heads, int num_q_heads, int layer_stride,
                    int num_threads = 2, bool global_scores = true, KVCacheDType kv_dtype = KVCacheDType::kAuto) {
  Rig rig;
  rig.num_kv_heads = num_kv_heads;
  rig.num_q_heads = num_q_heads;
  rig.block_size = block_size;
  BackendOptions options;
  options.num_threads = num_threads;
  rig.backend = std::make_unique<CpuBackend>(options);
  const ModelConfig config = rig_config(rig.num_layers, num_kv_heads, num_q_heads, rig.head_dim);
  Status st = rig.backend->load_dummy(config, 7);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  KVLayout layout = KVLayout::full(rig.num_layers, num_kv_heads, rig.head_dim, block_size, num_blocks,
                                   kv_dtype == KVCacheDType::kBF16 ? DType::kBF16 : DType::kF32);
  layout.fp8 = kv_dtype == KVCacheDType::kFP8;
  st = rig.backend->allocate_kv_cache(layout);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  CompressionConfig cc;
  cc.num_query_slots = 2;
  cc.max_window = rig.max_window;
  cc.global_scores = global_scores;
  cc.layer_stride = layer_stride;
  st = rig.backend->configure_compression(cc);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return rig;
}

// Random K and V for entries [from, to) of a table, every layer and head. Keys are clustered (near
// duplicates) so that redundancy scoring has something to find. Each entry is rounded to the
// cache's KV dtype, as the backend's write does.
inline void fill_entries(Rig& rig, const std::vector<BlockId>& table, int from, int to, uint32_t seed) {
  const int d = rig.head_dim, bs = rig.block_size;
  for (int l = 0; l < rig.num_layers; ++l)
    for (int h = 0; h < rig.num_kv_heads; ++h) {
      auto keys = clustered_keys(to - from, d, std::max(1, (to - from) / 6), seed + 1000 * l + 17 * h);
      auto values = random_vec(static_cast<size_t>(to - from) * d, seed + 1000 * l + 17 * h + 5);
      for (int e = from; e < to; ++e) {
        float* key = rig.kv().key_at(l, table[e / bs], h, e % bs);
        float* value = rig.kv().value_at(l, table[e / bs], h, e % bs);
        std::memcpy(key, &keys[static_cast<size_t>(e - from) * d], d * 4);
        std::memcpy(value, &values[static_cast<size_t>(e - from) * d], d * 4);
        rig.kv().round_entry(key);
        rig.kv().round_entry(value);
      }
    }
}

// Random queries in every row of a slot, every layer.
inline void fill_slot(Rig& rig, int slot, uint32_t seed) {
  const size_t row = static_cast<size_t>(rig.num_q_heads) * rig.head_dim;
  for (int l = 0; l < rig.num_layers; ++l) {
    auto q = random_vec(row * rig.max_window, seed + l);
    for (int r = 0; r < rig.max_window; ++r) std::memcpy(rig.kv().query_row(l, slot, r), &q[r * row], row * 4);
  }
}

// A sequence's K, V (and F) in entry order: [layer][head] -> [n, d] (F: [n]).
struct Snapshot {
  int n = 0;
  std::vector<std::vector<float>> k, v, f;  // index layer * heads + head
};

inline Snapshot snapshot(Rig& rig, const std::vector<BlockId>& table, int n) {
  Snapshot s;
  s.n = n;
  const int d = rig.head_dim, bs = rig.block_size;
  for (int l = 0; l < rig.num_layers; ++l)
    for (int h = 0; h < rig.num_kv_heads; ++h) {
      std::vector<float> k(static_cast<size_t>(n) * d), v(static_cast<size_t>(n) * d), f(n, 0.0f);
      for (int e = 0; e < n; ++e) {
        std::memcpy(&k[static_cast<size_t>(e) * d], rig.kv().key_at(l, table[e / bs], h, e % bs), d * 4);
        std::memcpy(&v[static_cast<size_t>(e) * d], rig.kv().value_at(l, table[e / bs], h, e % bs), d * 4);
        if (rig.kv().has_global_scores())
          f[e] = rig.kv().global_scores(l)[static_cast<size_t>(table[e / bs]) * rig.kv().score_block_stride() +
                                           static_cast<size_t>(h) * bs + e % bs];
      }
      s.k.push_back(std::move(k));
      s.v.push_back(std::move(v));
      s.f.push_back(std::move(f));
    }
  return s;
}

// The window's queries of KV head h at layer l for a cache of n entries: [w, group, d].
inline std::vector<float> window_queries(Rig& rig, int slot, int l, int h, int n, int window) {
  const int w = std::min(window, n), g = rig.group_size(), d = rig.head_dim;
  std::vector<float> q;
  for (int i = 0; i < w; ++i) {
    const float* row = rig.kv().query_row(l, slot, (n - w + i) % rig.max_window);
    q.insert(q.end(), row + static_cast<size_t>(h) * g * d, row + static_cast<size_t>(h + 1) * g * d);
  }
  return q;
}

// For every result entry i < num_keep of (l, h), the source entry whose key and value it
// bit-equals (rounded fp8 keys of near duplicates may coincide; the random values do not). -1
// where no source matches: a moved key that lost its value (or its scale) names no source.
inline std::vector<int> recover_keep(Rig& rig, const Snapshot& before, const Snapshot& after, int l, int h,
                                     int num_keep) {
  const int d = rig.head_dim;
  const auto& src_k = before.k[l * rig.num_kv_heads + h];
  const auto& src_v = before.v[l * rig.num_kv_heads + h];
  const auto& dst_k = after.k[l * rig.num_kv_heads + h];
  const auto& dst_v = after.v[l * rig.num_kv_heads + h];
  std::vector<int> keep(num_keep, -1);
  for (int i = 0; i < num_keep; ++i)
    for (int e = 0; e < before.n; ++e)
      if (std::memcmp(&dst_k[static_cast<size_t>(i) * d], &src_k[static_cast<size_t>(e) * d], d * 4) == 0 &&
          std::memcmp(&dst_v[static_cast<size_t>(i) * d], &src_v[static_cast<size_t>(e) * d], d * 4) == 0) {
        keep[i] = e;
        break;
      }
  return keep;
}

// `keep` is strictly ascending, num_keep long, and a valid top-k of `scores`: every kept entry
// scores at least every dropped one (up to a rounding tolerance); +inf entries are all kept.
inline void expect_valid_top_k(const std::vector<int>& keep, const std::vector<double>& scores, int num_keep,
                               const std::string& where) {
  ASSERT_EQ(static_cast<int>(keep.size()), num_keep) << where;
  std::vector<char> kept(scores.size(), 0);
  for (size_t i = 0; i < keep.size(); ++i) {
    ASSERT_GE(keep[i], 0) << where << ": result entry " << i << " matches no source entry";
    if (i > 0) {
      ASSERT_GT(keep[i], keep[i - 1]) << where << ": kept entries out of order";
    }
    kept[keep[i]] = 1;
  }
  double min_kept = std::numeric_limits<double>::infinity(), max_dropped = -std::numeric_limits<double>::infinity();
  for (size_t e = 0; e < scores.size(); ++e) {
    if (kept[e]) {
      min_kept = std::min(min_kept, scores[e]);
    } else {
      max_dropped = std::max(max_dropped, scores[e]);
    }
    if (std::isinf(scores[e]) && scores[e] > 0) {
      ASSERT_TRUE(kept[e]) << where << ": protected entry " << e << " dropped";
    }
  }
  if (num_keep > 0 && num_keep < static_cast<int>(scores.size())) {
    EXPECT_GE(min_kept, max_dropped - 1e-5 * std::max(1.0, std::abs(max_dropped))) << where;
  }
}

}  // namespace origami::test
