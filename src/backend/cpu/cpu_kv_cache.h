#pragma once
// The CPU backend's paged KV storage: fp32, per layer one K and one V array laid out
// [num_blocks, num_kv_heads, block_size, head_dim] (see kv/kv_layout.h); and, once compression is
// configured, the query cache Q[L, M, max_window, h_q, d] and the global scores
// F[L, num_blocks, h_kv, block_size] (kv/compression.h).
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <vector>

#include "core/status.h"
#include "kv/block_table.h"
#include "kv/compression.h"
#include "kv/kv_layout.h"

namespace origami::cpu {

class CpuKVCache {
 public:
  // Supports the one-group full layout (every layer and KV head in group 0) with fp32 entries.
  Status allocate(const KVLayout& layout);
  bool allocated() const { return data_ != nullptr; }
  const KVLayout& layout() const { return layout_; }
  int num_blocks() const { return num_blocks_; }

  // [num_blocks, num_kv_heads, block_size, head_dim]
  float* keys(int layer) { return data_.get() + layer_offset(layer, 0); }
  float* values(int layer) { return data_.get() + layer_offset(layer, 1); }
  const float* keys(int layer) const { return data_.get() + layer_offset(layer, 0); }
  const float* values(int layer) const { return data_.get() + layer_offset(layer, 1); }
  // Elements between consecutive blocks of one layer's K (or V) array.
  size_t block_stride() const { return block_floats_; }

  // The head_dim floats of entry `offset` of `block` for one KV head.
  float* key_at(int layer, BlockId block, int head, int offset) { return entry(keys(layer), block, head, offset); }
  float* value_at(int layer, BlockId block, int head, int offset) {
    return entry(values(layer), block, head, offset);
  }

  // Copies one page (every layer, K and V, and its global scores if kept) onto another.
  void copy_block(BlockId src, BlockId dst);

  // --- Compression state (after allocate()) ---
  // Allocates the query cache for `num_q_heads` query heads and, if config.global_scores, the
  // global scores (zero-initialised). Replaces any earlier configuration.
  Status configure_compression(const CompressionConfig& config, int num_q_heads);
  bool compression_configured() const { return compression_configured_; }
  const CompressionConfig& compression_config() const { return compression_; }
  int num_q_heads() const { return num_q_heads_; }
  // Floats of one query slot, [L, max_window, h_q, d].
  static size_t query_slot_floats(const KVLayout& layout, int num_q_heads, int max_window) {
    return static_cast<size_t>(layout.num_layers) * max_window * num_q_heads * layout.head_dim;
  }
  // Row `row` (an entry index modulo max_window) of query slot `slot` for one layer: [h_q, d].
  float* query_row(int layer, int slot, int row) {
    const CompressionConfig& c = compression_;
    const size_t q_floats = static_cast<size_t>(num_q_heads_) * layout_.head_dim;
    return queries_.data() + ((static_cast<size_t>(layer) * c.num_query_slots + slot) * c.max_window + row) * q_floats;
  }
  bool has_global_scores() const { return scores_ != nullptr; }
  // One layer's global scores, [num_blocks, num_kv_heads, block_size].
  float* global_scores(int layer) { return scores_.get() + static_cast<size_t>(layer) * num_blocks_ * score_block_stride(); }
  // Elements between consecutive blocks of one layer's global scores.
  size_t score_block_stride() const { return static_cast<size_t>(layout_.num_kv_heads) * layout_.block_size; }

 private:
  struct FreeDeleter {
    void operator()(float* p) const { std::free(p); }
  };
  size_t layer_offset(int layer, int kv) const { return (static_cast<size_t>(layer) * 2 + kv) * layer_floats_; }
  float* entry(float* base, BlockId block, int head, int offset) const {
    return base + static_cast<size_t>(block) * block_floats_ +
           (static_cast<size_t>(head) * layout_.block_size + offset) * layout_.head_dim;
  }

  KVLayout layout_;
  int num_blocks_ = 0;
  size_t block_floats_ = 0;  // num_kv_heads * block_size * head_dim
  size_t layer_floats_ = 0;  // num_blocks * block_floats_
  std::unique_ptr<float, FreeDeleter> data_;

  bool compression_configured_ = false;
  CompressionConfig compression_;
  int num_q_heads_ = 0;
  std::vector<float> queries_;                  // [L, M, max_window, h_q, d]
  std::unique_ptr<float, FreeDeleter> scores_;  // [L, num_blocks, h_kv, block_size] or null
};

}  // namespace origami::cpu
