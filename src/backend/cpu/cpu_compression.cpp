#include "backend/cpu/cpu_compression.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "backend/cpu/compression_ops.h"

namespace origami::cpu {
namespace {

int pages_for(int entries, int block_size) { return (entries + block_size - 1) / block_size; }

Status validate_recipe(const std::string& who, const ScoreRecipe& r, const CpuKVCache& kv) {
  const CompressionConfig& c = kv.compression_config();
  if (r.window < 0) return invalid_argument(who + ": recipe.window must be >= 0, got " + std::to_string(r.window));
  if (r.num_sinks < 0)
    return invalid_argument(who + ": recipe.num_sinks must be >= 0, got " + std::to_string(r.num_sinks));
  if (r.needs_queries()) {
    if (r.window < 1) return invalid_argument(who + ": attention scoring needs recipe.window >= 1, got 0");
    if (r.window > c.max_window)
      return invalid_argument(who + ": recipe.window " + std::to_string(r.window) + " exceeds the query cache's " +
                              "max_window " + std::to_string(c.max_window));
  }
  if (r.pool_kernel > 1 && r.pool_kernel % 2 == 0)
    return invalid_argument(who + ": recipe.pool_kernel must be odd, got " + std::to_string(r.pool_kernel));
  if (!(r.global_decay >= 0.0f) || !std::isfinite(r.global_decay))
    return invalid_argument(who + ": recipe.global_decay must be a finite value >= 0, got " +
                            std::to_string(r.global_decay));
  if (r.global_decay > 0.0f && !kv.has_global_scores())
    return invalid_argument(who + ": recipe.global_decay > 0 needs CompressionConfig::global_scores");
  if (r.redundancy != RedundancyMode::kNone && !(r.redundancy_tau > 0.0f))
    return invalid_argument(who + ": recipe.redundancy_tau must be > 0, got " + std::to_string(r.redundancy_tau));
  return Status::ok();
}

// Pages and table checks of one job.
Status validate_tables(const std::string& who, const CompressionJob& job, const CpuKVCache& kv) {
  const int bs = kv.layout().block_size;
  auto check_table = [&](const char* name, const std::vector<BlockId>& table, int entries) -> Status {
    const int need = pages_for(entries, bs);
    if (static_cast<int>(table.size()) < need)
      return invalid_argument(who + ": " + name + " has " + std::to_string(table.size()) + " pages, " +
                              std::to_string(entries) + " entries need " + std::to_string(need));
    for (int p = 0; p < need; ++p)
      if (table[p] <= kNullBlock || table[p] >= kv.num_blocks())
        return invalid_argument(who + ": " + name + "[" + std::to_string(p) + "] is block " +
                                std::to_string(table[p]) + ", outside [1, " + std::to_string(kv.num_blocks()) + ")");
    return Status::ok();
  };
  ORIGAMI_RETURN_IF_ERROR(check_table("src_blocks", *job.src_blocks, job.num_entries));
  ORIGAMI_RETURN_IF_ERROR(check_table("dst_blocks", *job.dst_blocks, job.num_keep));
  // In place is safe only if no destination page is a source page at a later table index.
  std::unordered_map<BlockId, int> src_index;
  for (int p = 0; p < pages_for(job.num_entries, bs); ++p) src_index.emplace((*job.src_blocks)[p], p);
  std::unordered_set<BlockId> seen;
  for (int p = 0; p < pages_for(job.num_keep, bs); ++p) {
    const BlockId b = (*job.dst_blocks)[p];
    if (!seen.insert(b).second)
      return invalid_argument(who + ": dst_blocks lists block " + std::to_string(b) + " twice");
    auto it = src_index.find(b);
    if (it != src_index.end() && it->second > p)
      return invalid_argument(who + ": dst_blocks[" + std::to_string(p) + "] is block " + std::to_string(b) +
                              ", which is src_blocks[" + std::to_string(it->second) +
                              "]: a later source page would be overwritten before it is read");
  }
  return Status::ok();
}

// One (job, layer, KV head) of a stride.
struct Item {
  int job;
  int layer;
  int head;
};

}  // namespace

Status validate_compression_jobs(const CpuKVCache& kv, const std::vector<CompressionJob>& jobs) {
  if (!kv.allocated()) return invalid_argument("compression: the KV cache is not allocated");
  if (!kv.compression_configured())
    return invalid_argument("compression: configure_compression() was not called");
  const CompressionConfig& c = kv.compression_config();
  const int bs = kv.layout().block_size;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const CompressionJob& job = jobs[j];
    const std::string who = "compression job " + std::to_string(j) + " (request " + std::to_string(job.request_id) + ")";
    if (!job.src_blocks) return invalid_argument(who + ": src_blocks is null");
    if (!job.dst_blocks) return invalid_argument(who + ": dst_blocks is null");
    if (!job.recipe) return invalid_argument(who + ": recipe is null");
    if (job.num_entries < 0)
      return invalid_argument(who + ": num_entries must be >= 0, got " + std::to_string(job.num_entries));
    if (job.num_keep < 0 || job.num_keep > job.num_entries)
      return invalid_argument(who + ": num_keep " + std::to_string(job.num_keep) + " outside [0, num_entries " +
                              std::to_string(job.num_entries) + "]");
    if (job.num_scored_entries < 0 || job.num_scored_entries > job.num_entries)
      return invalid_argument(who + ": num_scored_entries " + std::to_string(job.num_scored_entries) +
                              " outside [0, num_entries " + std::to_string(job.num_entries) + "]");
    ORIGAMI_RETURN_IF_ERROR(validate_recipe(who, *job.recipe, kv));
    if (job.recipe->needs_queries() && job.num_entries > 0 &&
        (job.query_slot < 0 || job.query_slot >= c.num_query_slots))
      return invalid_argument(who + ": attention scoring needs the window's queries, but query_slot " +
                              std::to_string(job.query_slot) + " is outside [0, " +
                              std::to_string(c.num_query_slots) + ")");
    ORIGAMI_RETURN_IF_ERROR(validate_tables(who, job, kv));
  }
  // A page written by one job must not be touched by any other job of the batch (jobs run in
  // parallel). Shared source pages read by several jobs are fine.
  std::unordered_map<BlockId, size_t> written;  // dst page -> job
  for (size_t j = 0; j < jobs.size(); ++j)
    for (int p = 0; p < pages_for(jobs[j].num_keep, bs); ++p) {
      auto [it, inserted] = written.emplace((*jobs[j].dst_blocks)[p], j);
      if (!inserted)
        return invalid_argument("compression jobs " + std::to_string(it->second) + " and " + std::to_string(j) +
                                " both write block " + std::to_string(it->first));
    }
  for (size_t j = 0; j < jobs.size(); ++j)
    for (int p = 0; p < pages_for(jobs[j].num_entries, bs); ++p) {
      auto it = written.find((*jobs[j].src_blocks)[p]);
      if (it != written.end() && it->second != j)
        return invalid_argument("compression job " + std::to_string(j) + " reads block " + std::to_string(it->first) +
                                ", which job " + std::to_string(it->second) + " writes");
    }
  return Status::ok();
}

Status run_compression(CpuKVCache& kv, const std::vector<CompressionJob>& jobs, float scale, ThreadPool* pool) {
  ORIGAMI_RETURN_IF_ERROR(validate_compression_jobs(kv, jobs));
  const KVLayout& layout = kv.layout();
  const int num_layers = layout.num_layers, num_heads = layout.num_kv_heads, d = layout.head_dim;
  const int bs = layout.block_size;
  const CompressionConfig& config = kv.compression_config();
  const int group_size = kv.num_q_heads() / num_heads;
  const int stride = std::max(1, config.layer_stride);

  // Per job, the offsets of its items' kept indices and new scores inside one stride's buffers.
  std::vector<size_t> keep_offset(jobs.size()), score_offset(jobs.size());
  size_t keep_per_layer_head = 0, scores_per_layer_head = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    keep_offset[j] = keep_per_layer_head;
    score_offset[j] = scores_per_layer_head;
    keep_per_layer_head += jobs[j].num_keep;
    if (jobs[j].recipe->global_decay > 0.0f) scores_per_layer_head += jobs[j].num_entries;
  }

  for (int l0 = 0; l0 < num_layers; l0 += stride) {
    const int l1 = std::min(num_layers, l0 + stride);
    const int layers = l1 - l0;
    std::vector<Item> items;
    for (size_t j = 0; j < jobs.size(); ++j) {
      if (jobs[j].num_entries == 0) continue;
      for (int l = l0; l < l1; ++l)
        for (int h = 0; h < num_heads; ++h) items.push_back({static_cast<int>(j), l, h});
    }
    // [layers, heads, per-job] kept indices and new global scores of this stride.
    auto slot = [&](const Item& it, size_t per_layer_head) {
      return (static_cast<size_t>(it.layer - l0) * num_heads + it.head) * per_layer_head;
    };
    std::vector<int32_t> keep(static_cast<size_t>(layers) * num_heads * keep_per_layer_head);
    std::vector<float> new_scores(static_cast<size_t>(layers) * num_heads * scores_per_layer_head);

    // Phase 1: score and select.
    parallel_for(pool, static_cast<int>(items.size()), [&](int i) {
      const Item& it = items[i];
      const CompressionJob& job = jobs[it.job];
      const ScoreRecipe& recipe = *job.recipe;
      const int n = job.num_entries;
      const std::vector<BlockId>& src = *job.src_blocks;
      std::vector<float> keys(static_cast<size_t>(n) * d);
      for (int e = 0; e < n; ++e)
        std::memcpy(keys.data() + static_cast<size_t>(e) * d, kv.key_at(it.layer, src[e / bs], it.head, e % bs),
                    d * sizeof(float));
      std::vector<float> window_q;
      if (recipe.needs_queries()) {
        const int w = std::min(recipe.window, n);
        window_q.resize(static_cast<size_t>(w) * group_size * d);
        for (int q = 0; q < w; ++q) {
          const int row = (n - w + q) % config.max_window;
          const float* heads = kv.query_row(it.layer, job.query_slot, row) + static_cast<size_t>(it.head) * group_size * d;
          std::memcpy(window_q.data() + static_cast<size_t>(q) * group_size * d, heads,
                      static_cast<size_t>(group_size) * d * sizeof(float));
        }
      }
      float* f = nullptr;
      if (recipe.global_decay > 0.0f) {
        f = new_scores.data() + slot(it, scores_per_layer_head) + score_offset[it.job];
        const float* layer_f = kv.global_scores(it.layer);
        for (int e = 0; e < job.num_scored_entries; ++e)
          f[e] = layer_f[static_cast<size_t>(src[e / bs]) * kv.score_block_stride() +
                         static_cast<size_t>(it.head) * bs + e % bs];
      }
      std::vector<float> scores(n);
      score_head(recipe, keys.data(), n, d, window_q.empty() ? nullptr : window_q.data(), group_size, scale, bs, f,
                 job.num_scored_entries, job.first_compression, scores.data());
      select_keep(scores.data(), n, job.num_keep, keep.data() + slot(it, keep_per_layer_head) + keep_offset[it.job]);
    });

    // Phase 2: compact K, V and F of every item.
    parallel_for(pool, static_cast<int>(items.size()), [&](int i) {
      const Item& it = items[i];
      const CompressionJob& job = jobs[it.job];
      const int32_t* kept = keep.data() + slot(it, keep_per_layer_head) + keep_offset[it.job];
      const BlockId* src = job.src_blocks->data();
      const BlockId* dst = job.dst_blocks->data();
      compact_entries(kv.keys(it.layer), kv.block_stride(), it.head, bs, d, src, dst, kept, job.num_keep);
      compact_entries(kv.values(it.layer), kv.block_stride(), it.head, bs, d, src, dst, kept, job.num_keep);
      if (job.recipe->global_decay > 0.0f) {
        const float* f = new_scores.data() + slot(it, scores_per_layer_head) + score_offset[it.job];
        float* layer_f = kv.global_scores(it.layer);
        for (int e = 0; e < job.num_keep; ++e)
          layer_f[static_cast<size_t>(dst[e / bs]) * kv.score_block_stride() + static_cast<size_t>(it.head) * bs +
                  e % bs] = f[kept[e]];
      }
    });
  }
  return Status::ok();
}

}  // namespace origami::cpu
