#include "backend/cpu/block_eviction.h"

#include <cmath>
#include <cstring>

#include "backend/cpu/scorers/scorer_input.h"
#include "core/check.h"

namespace origami::cpu {

std::vector<double> block_mean_scores(CpuKVCache& kv, const CompressionJob& job, float scale) {
  const KVLayout& layout = kv.layout();
  const int bs = layout.block_size, d = layout.head_dim, n = job.num_entries;
  ORIGAMI_CHECK(job.kind == CompressionKind::kEvictBlock && n % bs == 0 && job.recipe != nullptr);
  const int num_blocks = n / bs;
  const std::vector<BlockId>& table = *job.src_blocks;
  std::vector<double> sums(static_cast<size_t>(num_blocks), 0.0);
  std::vector<float> keys(static_cast<size_t>(n) * d), values(static_cast<size_t>(n) * d), s(static_cast<size_t>(n));
  for (int l = 0; l < layout.num_layers; ++l)
    for (int h = 0; h < layout.num_kv_heads; ++h) {
      for (int e = 0; e < n; ++e) {
        std::memcpy(keys.data() + static_cast<size_t>(e) * d, kv.key_at(l, table[e / bs], h, e % bs), d * sizeof(float));
        std::memcpy(values.data() + static_cast<size_t>(e) * d, kv.value_at(l, table[e / bs], h, e % bs),
                    d * sizeof(float));
      }
      ScorerInput in;
      in.keys = keys.data();
      in.values = values.data();
      in.n = n;
      in.d = d;
      in.scale = scale;
      score_base(job.recipe->scorer, in, s.data());
      for (int e = 0; e < n; ++e) sums[static_cast<size_t>(e / bs)] += s[static_cast<size_t>(e)];
    }
  const double count = static_cast<double>(layout.num_layers) * layout.num_kv_heads * bs;
  for (double& x : sums) x /= count;
  return sums;
}

int pick_evicted_block(const std::vector<double>& means) {
  const int num_blocks = static_cast<int>(means.size());
  ORIGAMI_CHECK(num_blocks >= 3);
  int best = 1;
  for (int p = 2; p <= num_blocks - 2; ++p) {
    const double a = means[static_cast<size_t>(p)], b = means[static_cast<size_t>(best)];
    if (std::isnan(b)) break;            // nothing is lower than NaN; the lower index keeps it
    if (std::isnan(a) || a < b) best = p;
  }
  return best;
}

}  // namespace origami::cpu
