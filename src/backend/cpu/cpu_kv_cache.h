#pragma once
// The CPU backend's paged KV storage: fp32, per layer one K and one V array laid out
// [num_blocks, num_kv_heads, block_size, head_dim] (see kv/kv_layout.h).
#include <cstddef>
#include <cstdlib>
#include <memory>

#include "core/status.h"
#include "kv/block_table.h"
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

  // Copies one page (every layer, K and V) onto another.
  void copy_block(BlockId src, BlockId dst);

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
};

}  // namespace origami::cpu
