#pragma once
// Owns the block pools of every head group and the requests' page tables. All changes follow
// "prepare, then apply": a call that cannot be satisfied returns false and changes nothing.
#include <cstdint>
#include <memory>
#include <vector>

#include "kv/block_pool.h"
#include "kv/kv_layout.h"

namespace origami {

struct Request;

class KVCacheManager {
 public:
  KVCacheManager(const KVLayout& layout, bool enable_prefix_caching);

  // On admission: looks up the longest run of the request's full prompt blocks already cached
  // (chained hashes), takes references to them and returns the number of tokens they hold. At
  // least one prompt token is always left to compute, so the last prompt logits exist.
  int acquire_cached_prefix(Request& request);
  // Ensures the request's tables can hold `num_entries_after` entries; all-or-nothing.
  bool allocate_slots(Request& request, int num_entries_after);
  // After a step: registers the request's newly completed full blocks in the prefix cache.
  void cache_full_blocks(Request& request, int num_computed_tokens);
  // Drops the request's references (cached blocks stay reusable until evicted, LRU).
  void free(Request& request);

  int num_free_blocks(int group = 0) const;
  int num_used_blocks(int group = 0) const;
  const KVLayout& layout() const { return layout_; }
  BlockPool& pool(int group = 0) { return *pools_[group]; }
  bool prefix_caching_enabled() const { return enable_prefix_caching_; }
  int blocks_needed(int num_entries) const;

 private:
  KVLayout layout_;
  bool enable_prefix_caching_;
  std::vector<std::unique_ptr<BlockPool>> pools_;
};

}  // namespace origami
