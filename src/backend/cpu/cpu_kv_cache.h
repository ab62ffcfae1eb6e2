#pragma once
// The CPU backend's paged KV storage, fp32 (see kv/kv_layout.h). Narrower KV dtypes (bf16, fp8:
// KVLayout::dtype / fp8) are emulated: entries stay fp32 but every entry written goes through
// round_entry(), which leaves exactly the value the narrower cache would dequantize to (for fp8
// the E4M3 codes times the entry's own scale, kv/kv_cache_dtype.h). Every reader and every move
// (compaction, copies) then sees the CUDA cache's values with no code of its own, and a moved
// entry carries its scale implicitly.
// Layouts:
//  - full layout (one group): per layer one K and one V array [num_blocks, num_kv_heads,
//    block_size, head_dim]; global scores F[L, num_blocks, h_kv, block_size];
//  - grouped layout (shared pool of group pages): pages [num_pages, 2 (K, V), H_p, block_size,
//    head_dim]; global scores F[num_pages, H_p, block_size].
// Code that reads or writes entries goes through head(layer, kv_head) (HeadPages: where that
// head's K, V and F live and the group whose table addresses them), so it never depends on which
// layout is in use. Once compression is configured there is also the query cache
// Q[L, M, max_window, h_q, d] (kv/compression.h).
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <vector>

#include "core/status.h"
#include "kv/block_table.h"
#include "kv/compression.h"
#include "kv/kv_layout.h"

namespace origami::cpu {

// Group addressing of one (layer, KV head): block b's `block_size` entries of this head start at
// k + b * block_stride (V and F alike); entry o of a block is o * head_dim floats further (F: o).
struct HeadPages {
  int group = 0;  // the head group whose page table and length address these pages
  float* k = nullptr;
  float* v = nullptr;
  size_t block_stride = 0;  // floats between consecutive pages of K (or V)
  float* f = nullptr;       // global scores, or null when none are kept
  size_t f_block_stride = 0;
};

class CpuKVCache {
 public:
  // Supports the one-group full layout (every layer and KV head in group 0) and grouped layouts
  // with a shared pool (KVLayout::grouped), with fp32 entries.
  Status allocate(const KVLayout& layout);
  bool allocated() const { return data_ != nullptr; }
  const KVLayout& layout() const { return layout_; }
  int num_blocks() const { return num_blocks_; }

  bool grouped() const { return layout_.shared_pool; }
  // Where one (layer, KV head) lives (either layout).
  HeadPages head(int layer, int kv_head) const;

  // Full layout only: [num_blocks, num_kv_heads, block_size, head_dim]
  float* keys(int layer) { return data_.get() + layer_offset(layer, 0); }
  float* values(int layer) { return data_.get() + layer_offset(layer, 1); }
  const float* keys(int layer) const { return data_.get() + layer_offset(layer, 0); }
  const float* values(int layer) const { return data_.get() + layer_offset(layer, 1); }
  // Elements between consecutive blocks of one layer's K (or V) array.
  size_t block_stride() const { return block_floats_; }

  // The head_dim floats of entry `offset` of `block` for one KV head (`block` of its group).
  float* key_at(int layer, BlockId block, int head, int offset) const {
    const HeadPages p = this->head(layer, head);
    return p.k + static_cast<size_t>(block) * p.block_stride + static_cast<size_t>(offset) * layout_.head_dim;
  }
  float* value_at(int layer, BlockId block, int head, int offset) const {
    const HeadPages p = this->head(layer, head);
    return p.v + static_cast<size_t>(block) * p.block_stride + static_cast<size_t>(offset) * layout_.head_dim;
  }

  // Rounds one head vector (head_dim floats) in place to what the layout's KV dtype stores:
  // unchanged for fp32, through bf16, or through E4M3 with the vector's own scale. Every write of
  // a new entry into the cache goes through it.
  void round_entry(float* v) const;
  // Whether round_entry changes anything (the cache is not plain fp32).
  bool rounds_entries() const { return layout_.fp8 || layout_.dtype != DType::kF32; }

  // Copies one page (full layout: every layer; grouped: the group page; K and V, and its global
  // scores if kept) onto another.
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
  // Full layout only: one layer's global scores, [num_blocks, num_kv_heads, block_size].
  float* global_scores(int layer) { return scores_.get() + static_cast<size_t>(layer) * num_blocks_ * score_block_stride(); }
  // Elements between consecutive blocks of one layer's global scores.
  size_t score_block_stride() const { return static_cast<size_t>(layout_.num_kv_heads) * layout_.block_size; }

 private:
  struct FreeDeleter {
    void operator()(float* p) const { std::free(p); }
  };
  size_t layer_offset(int layer, int kv) const { return (static_cast<size_t>(layer) * 2 + kv) * layer_floats_; }
  KVLayout layout_;
  int num_blocks_ = 0;
  size_t block_floats_ = 0;  // full: num_kv_heads * block_size * head_dim; grouped: 2 * H_p * block_size * head_dim
  size_t layer_floats_ = 0;  // full: num_blocks * block_floats_
  std::vector<HeadGroupSlot> head_slots_;  // [num_layers * num_kv_heads]
  std::unique_ptr<float, FreeDeleter> data_;

  bool compression_configured_ = false;
  CompressionConfig compression_;
  int num_q_heads_ = 0;
  std::vector<float> queries_;                  // [L, M, max_window, h_q, d]
  std::unique_ptr<float, FreeDeleter> scores_;  // [L, num_blocks, h_kv, block_size] or null
};

}  // namespace origami::cpu
