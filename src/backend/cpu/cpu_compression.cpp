#include "backend/cpu/cpu_compression.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "backend/cpu/block_eviction.h"
#include "backend/cpu/compression_ops.h"
#include "kv/compression_validation.h"

namespace origami::cpu {
namespace {

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
  return validate_compression_batch(jobs, kv.layout().block_size, kv.num_blocks(), c.num_query_slots, c.max_window,
                                    kv.has_global_scores());
}

Status run_compression(CpuKVCache& kv, const std::vector<CompressionJob>& jobs, float scale, ThreadPool* pool,
                       std::vector<int>* evicted_blocks,
                       const std::vector<std::vector<float>>* reconstruction_scores) {
  ORIGAMI_RETURN_IF_ERROR(validate_compression_jobs(kv, jobs));
  ORIGAMI_RETURN_IF_ERROR(validate_job_groups(jobs, kv.layout().num_groups()));
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (jobs[j].kind != CompressionKind::kCompact || !jobs[j].recipe->reconstruction_scores) continue;
    const size_t expected = static_cast<size_t>(kv.layout().num_layers) * kv.layout().num_kv_heads * jobs[j].num_entries;
    if (reconstruction_scores == nullptr || reconstruction_scores->size() <= j || (*reconstruction_scores)[j].size() != expected)
      return invalid_argument("compression job " + std::to_string(j) + " (request " + std::to_string(jobs[j].request_id) +
                              "): its recipe selects by KVzip reconstruction scores, which were not computed");
  }
  // Block evictions first: they only read, and no job of the batch writes a page they read.
  std::vector<int> evicted(jobs.size(), -1);
  std::vector<int> evict_jobs;
  for (size_t j = 0; j < jobs.size(); ++j)
    if (jobs[j].kind == CompressionKind::kEvictBlock) evict_jobs.push_back(static_cast<int>(j));
  parallel_for(pool, static_cast<int>(evict_jobs.size()), [&](int i) {
    const int j = evict_jobs[static_cast<size_t>(i)];
    evicted[static_cast<size_t>(j)] = pick_evicted_block(block_mean_scores(kv, jobs[static_cast<size_t>(j)], scale));
  });
  if (evicted_blocks != nullptr) *evicted_blocks = std::move(evicted);
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
    if (jobs[j].kind != CompressionKind::kCompact) continue;
    keep_per_layer_head += jobs[j].num_keep;
    if (jobs[j].recipe->global_decay > 0.0f) scores_per_layer_head += jobs[j].num_entries;
  }

  for (int l0 = 0; l0 < num_layers; l0 += stride) {
    const int l1 = std::min(num_layers, l0 + stride);
    const int layers = l1 - l0;
    std::vector<Item> items;
    for (size_t j = 0; j < jobs.size(); ++j) {
      if (jobs[j].num_entries == 0 || jobs[j].kind != CompressionKind::kCompact) continue;
      // The job's table addresses only its own group's heads.
      for (int l = l0; l < l1; ++l)
        for (int h = 0; h < num_heads; ++h)
          if (kv.head(l, h).group == jobs[j].group) items.push_back({static_cast<int>(j), l, h});
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
      std::vector<float> keys(static_cast<size_t>(n) * d), values(static_cast<size_t>(n) * d);
      for (int e = 0; e < n; ++e) {
        std::memcpy(keys.data() + static_cast<size_t>(e) * d, kv.key_at(it.layer, src[e / bs], it.head, e % bs),
                    d * sizeof(float));
        std::memcpy(values.data() + static_cast<size_t>(e) * d, kv.value_at(it.layer, src[e / bs], it.head, e % bs),
                    d * sizeof(float));
      }
      std::vector<float> window_q;
      if (recipe.needs_queries()) {
        const int w = std::min(recipe.window, n);
        // Rows are keyed by position (CompressionJob::num_positions).
        const int positions = job.num_positions >= 0 ? job.num_positions : n;
        window_q.resize(static_cast<size_t>(w) * group_size * d);
        for (int q = 0; q < w; ++q) {
          const int row = (positions - w + q) % config.max_window;
          const float* heads = kv.query_row(it.layer, job.query_slot, row) + static_cast<size_t>(it.head) * group_size * d;
          std::memcpy(window_q.data() + static_cast<size_t>(q) * group_size * d, heads,
                      static_cast<size_t>(group_size) * d * sizeof(float));
        }
      }
      float* f = nullptr;
      // Gate scores were written with their entries, KVzip's computed for all of them: every
      // entry is scored.
      const int num_scored = recipe.gate_scores || recipe.reconstruction_scores ? n : job.num_scored_entries;
      if (recipe.global_decay > 0.0f) {
        f = new_scores.data() + slot(it, scores_per_layer_head) + score_offset[it.job];
        const HeadPages pages = kv.head(it.layer, it.head);
        if (recipe.reconstruction_scores) {
          const float* given = (*reconstruction_scores)[static_cast<size_t>(it.job)].data() +
                               (static_cast<size_t>(it.layer) * num_heads + it.head) * n;
          std::copy(given, given + n, f);
        } else {
          for (int e = 0; e < num_scored; ++e)
            f[e] = pages.f[static_cast<size_t>(src[e / bs]) * pages.f_block_stride + e % bs];
        }
      }
      std::vector<float> scores(n);
      score_head(recipe, keys.data(), n, d, window_q.empty() ? nullptr : window_q.data(), group_size, scale, bs, f,
                 num_scored, job.first_compression, scores.data(), job.num_keep, values.data());
      select_keep(scores.data(), n, job.num_keep, keep.data() + slot(it, keep_per_layer_head) + keep_offset[it.job]);
    });

    // Phase 2: compact K, V and F of every item.
    parallel_for(pool, static_cast<int>(items.size()), [&](int i) {
      const Item& it = items[i];
      const CompressionJob& job = jobs[it.job];
      const int32_t* kept = keep.data() + slot(it, keep_per_layer_head) + keep_offset[it.job];
      const BlockId* src = job.src_blocks->data();
      const BlockId* dst = job.dst_blocks->data();
      // The head's pages as a one-head array (head index 0 at its base).
      const HeadPages pages = kv.head(it.layer, it.head);
      compact_entries(pages.k, pages.block_stride, 0, bs, d, src, dst, kept, job.num_keep);
      compact_entries(pages.v, pages.block_stride, 0, bs, d, src, dst, kept, job.num_keep);
      if (job.recipe->global_decay > 0.0f) {
        const float* f = new_scores.data() + slot(it, scores_per_layer_head) + score_offset[it.job];
        for (int e = 0; e < job.num_keep; ++e)
          pages.f[static_cast<size_t>(dst[e / bs]) * pages.f_block_stride + e % bs] = f[kept[e]];
      }
    });
  }
  return Status::ok();
}

Status CpuCompressor::begin(const std::vector<CompressionJob>& jobs) {
  const auto t0 = std::chrono::steady_clock::now();
  evicted_blocks_.clear();
  status_ = run_compression(*kv_, jobs, scale_, pool_, &evicted_blocks_, &reconstruction_scores_);
  reconstruction_scores_.clear();
  device_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return status_;
}

}  // namespace origami::cpu
