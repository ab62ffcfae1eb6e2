#include "backend/cpu/cpu_kv_cache.h"

#include <cstring>
#include <new>
#include <string>

#include "kv/compression_validation.h"
#include "kv/kv_cache_dtype.h"

namespace origami::cpu {

Status CpuKVCache::allocate(const KVLayout& layout) {
  if (layout.num_layers <= 0 || layout.num_kv_heads <= 0 || layout.head_dim <= 0 || layout.block_size <= 0)
    return invalid_argument("KV layout: num_layers, num_kv_heads, head_dim and block_size must be positive");
  if (layout.dtype != DType::kF32 && layout.dtype != DType::kBF16)
    return invalid_argument(std::string("KV layout: the CPU backend's KV cache is float32 or bfloat16 (emulated), got ") +
                            dtype_name(layout.dtype));
  if (layout.shared_pool) {
    // Grouped: KVLayout::grouped() checked the groups; every head must have its slot.
    const int hp = layout.groups.empty() ? 0 : static_cast<int>(layout.groups[0].kv_heads.size());
    for (const HeadGroup& g : layout.groups)
      if (g.layers.size() != 1 || static_cast<int>(g.kv_heads.size()) != hp)
        return invalid_argument("KV layout: grouped layouts need groups of one layer and equally many heads");
    if (layout.groups.empty() || layout.groups[0].num_blocks < 2)
      return invalid_argument("KV layout: the shared pool needs at least 2 pages (page 0 is the null page)");
    num_blocks_ = layout.groups[0].num_blocks;
    block_floats_ = size_t{2} * hp * layout.block_size * layout.head_dim;
    layer_floats_ = 0;
  } else {
    if (layout.groups.size() != 1)
      return Status(ErrorCode::kUnimplemented,
                    "KV layout: the CPU backend supports one head group (full KV) or a grouped layout with a "
                    "shared pool, got " + std::to_string(layout.groups.size()) + " groups with pools of their own");
    const HeadGroup& group = layout.groups[0];
    if (static_cast<int>(group.layers.size()) != layout.num_layers ||
        static_cast<int>(group.kv_heads.size()) != layout.num_kv_heads)
      return Status(ErrorCode::kUnimplemented,
                    "KV layout: the CPU backend's one head group must cover every layer and KV head");
    for (int i = 0; i < layout.num_layers; ++i)
      if (group.layers[i] != i)
        return Status(ErrorCode::kUnimplemented, "KV layout: group 0 must list layers in order 0..num_layers-1");
    for (int i = 0; i < layout.num_kv_heads; ++i)
      if (group.kv_heads[i] != i)
        return Status(ErrorCode::kUnimplemented, "KV layout: group 0 must list KV heads in order 0..num_kv_heads-1");
    if (group.num_blocks < 2)
      return invalid_argument("KV layout: group 0 needs at least 2 blocks (block 0 is the null block), got " +
                              std::to_string(group.num_blocks));
    num_blocks_ = group.num_blocks;
    block_floats_ = static_cast<size_t>(layout.num_kv_heads) * layout.block_size * layout.head_dim;
    layer_floats_ = static_cast<size_t>(num_blocks_) * block_floats_;
  }
  std::vector<HeadGroupSlot> slots(static_cast<size_t>(layout.num_layers) * layout.num_kv_heads);
  for (int l = 0; l < layout.num_layers; ++l)
    for (int h = 0; h < layout.num_kv_heads; ++h) {
      slots[static_cast<size_t>(l) * layout.num_kv_heads + h] = layout.group_of(l, h);
      if (slots[static_cast<size_t>(l) * layout.num_kv_heads + h].group < 0)
        return invalid_argument("KV layout: layer " + std::to_string(l) + " KV head " + std::to_string(h) +
                                " is in no head group");
    }
  const size_t total = layout.shared_pool ? static_cast<size_t>(num_blocks_) * block_floats_
                                          : layer_floats_ * 2 * layout.num_layers;
  // calloc: the OS hands out zero pages lazily, so a large pool costs nothing until it is used.
  float* p = static_cast<float*>(std::calloc(total, sizeof(float)));
  if (!p)
    return Status(ErrorCode::kResourceExhausted,
                  "KV cache: cannot allocate " + std::to_string(total * sizeof(float)) + " bytes");
  data_.reset(p);
  layout_ = layout;
  head_slots_ = std::move(slots);
  // A new pool invalidates any compression state sized for the old one.
  compression_configured_ = false;
  compression_ = CompressionConfig{};
  queries_.clear();
  scores_.reset();
  return Status::ok();
}

Status CpuKVCache::configure_compression(const CompressionConfig& config, int num_q_heads) {
  if (!allocated()) return invalid_argument("compression config: configure after allocate_kv_cache()");
  ORIGAMI_RETURN_IF_ERROR(validate_compression_config(config));
  if (num_q_heads <= 0 || num_q_heads % layout_.num_kv_heads != 0)
    return invalid_argument("compression config: " + std::to_string(num_q_heads) +
                            " query heads is not a multiple of " + std::to_string(layout_.num_kv_heads) +
                            " KV heads");
  const size_t q_floats = query_slot_floats(layout_, num_q_heads, config.max_window) * config.num_query_slots;
  std::vector<float> queries;
  std::unique_ptr<float, FreeDeleter> scores;
  try {
    queries.assign(q_floats, 0.0f);
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::kResourceExhausted,
                  "compression config: cannot allocate the query cache (" + std::to_string(q_floats * sizeof(float)) +
                      " bytes)");
  }
  if (config.global_scores) {
    const size_t f_floats = grouped() ? static_cast<size_t>(num_blocks_) * layout_.heads_per_group() * layout_.block_size
                                      : static_cast<size_t>(layout_.num_layers) * num_blocks_ * score_block_stride();
    scores.reset(static_cast<float*>(std::calloc(f_floats, sizeof(float))));
    if (!scores)
      return Status(ErrorCode::kResourceExhausted, "compression config: cannot allocate the global scores (" +
                                                       std::to_string(f_floats * sizeof(float)) + " bytes)");
  }
  compression_ = config;
  num_q_heads_ = num_q_heads;
  queries_ = std::move(queries);
  scores_ = std::move(scores);
  compression_configured_ = true;
  return Status::ok();
}

void CpuKVCache::round_entry(float* v) const {
  const int d = layout_.head_dim;
  if (layout_.fp8) {
    round_head_vector_fp8(v, d);
  } else if (layout_.dtype == DType::kBF16) {
    for (int i = 0; i < d; ++i) v[i] = bf16_to_f32(f32_to_bf16(v[i]));
  }
}

HeadPages CpuKVCache::head(int layer, int kv_head) const {
  const HeadGroupSlot s = head_slots_[static_cast<size_t>(layer) * layout_.num_kv_heads + kv_head];
  const size_t bs = static_cast<size_t>(layout_.block_size), d = static_cast<size_t>(layout_.head_dim);
  HeadPages p;
  p.group = s.group;
  if (grouped()) {
    // A page: [2 (K, V), H_p, block_size, head_dim]; F page: [H_p, block_size].
    const size_t hp = static_cast<size_t>(layout_.heads_per_group());
    p.k = data_.get() + static_cast<size_t>(s.slot) * bs * d;
    p.v = p.k + hp * bs * d;
    p.block_stride = block_floats_;
    if (scores_) {
      p.f = scores_.get() + static_cast<size_t>(s.slot) * bs;
      p.f_block_stride = hp * bs;
    }
  } else {
    p.k = data_.get() + layer_offset(layer, 0) + static_cast<size_t>(kv_head) * bs * d;
    p.v = data_.get() + layer_offset(layer, 1) + static_cast<size_t>(kv_head) * bs * d;
    p.block_stride = block_floats_;
    if (scores_) {
      p.f = scores_.get() + static_cast<size_t>(layer) * num_blocks_ * score_block_stride() +
            static_cast<size_t>(kv_head) * bs;
      p.f_block_stride = score_block_stride();
    }
  }
  return p;
}

void CpuKVCache::copy_block(BlockId src, BlockId dst) {
  if (src == dst) return;
  if (grouped()) {
    float* base = data_.get();
    std::memcpy(base + static_cast<size_t>(dst) * block_floats_, base + static_cast<size_t>(src) * block_floats_,
                block_floats_ * sizeof(float));
    if (scores_) {
      const size_t stride = static_cast<size_t>(layout_.heads_per_group()) * layout_.block_size;
      std::memcpy(scores_.get() + static_cast<size_t>(dst) * stride, scores_.get() + static_cast<size_t>(src) * stride,
                  stride * sizeof(float));
    }
    return;
  }
  for (int layer = 0; layer < layout_.num_layers; ++layer)
    for (int kv = 0; kv < 2; ++kv) {
      float* base = data_.get() + layer_offset(layer, kv);
      std::memcpy(base + static_cast<size_t>(dst) * block_floats_, base + static_cast<size_t>(src) * block_floats_,
                  block_floats_ * sizeof(float));
    }
  if (scores_) {
    const size_t stride = score_block_stride();
    for (int layer = 0; layer < layout_.num_layers; ++layer) {
      float* base = global_scores(layer);
      std::memcpy(base + static_cast<size_t>(dst) * stride, base + static_cast<size_t>(src) * stride,
                  stride * sizeof(float));
    }
  }
}

}  // namespace origami::cpu
