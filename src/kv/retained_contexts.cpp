#include "kv/retained_contexts.h"

#include <algorithm>

#include "core/check.h"

namespace origami {

uint64_t prefix_hash(std::span<const int32_t> tokens) {
  uint64_t h = kEmptyPrefixHash;
  for (int32_t t : tokens) h = extend_prefix_hash(h, t);
  return h;
}

RetainedContexts::RetainedContexts(std::vector<int> num_pool_pages) {
  for (int n : num_pool_pages) refs_.emplace_back(static_cast<size_t>(std::max(n, 1)), 0);
}

void RetainedContexts::count_pages(const RetainedContext& context, std::span<const int> pool_of_group, int delta) {
  ORIGAMI_CHECK(delta == 1 || delta == -1);
  for (size_t g = 0; g < context.kv.groups.size(); ++g) {
    std::vector<int>& refs = refs_[static_cast<size_t>(pool_of_group[g])];
    for (BlockId b : context.kv.groups[g].blocks) {
      int& r = refs[static_cast<size_t>(b)];
      if (delta > 0 && r++ == 0) ++stats_.num_pages;
      if (delta < 0) {
        ORIGAMI_CHECK(r > 0);
        if (--r == 0) --stats_.num_pages;
      }
    }
  }
}

void RetainedContexts::touch(std::list<RetainedContext>::iterator it) {
  it->last_used = tick();
  contexts_.splice(contexts_.end(), contexts_, it);
}

}  // namespace origami
