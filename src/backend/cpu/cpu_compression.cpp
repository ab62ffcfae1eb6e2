#include "backend/cpu/cpu_compression.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "backend/cpu/block_eviction.h"
#include "backend/cpu/compression_ops.h"
#include "backend/cpu/joint_selection.h"
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
                       const std::vector<std::vector<float>>* reconstruction_scores, std::vector<int>* kept_entries) {
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
  // A runtime allocation (KeepAllocation kLayer / kGlobal) selects a request's heads jointly, so
  // every layer is scored before any is selected: one stride over all layers.
  bool joint_batch = false;
  for (const CompressionJob& job : jobs) joint_batch = joint_batch || (job.kind == CompressionKind::kCompact && runtime_allocation(*job.recipe));
  const int stride = joint_batch ? num_layers : std::max(1, config.layer_stride);
  // Entries each job keeps per (layer, KV head): num_keep, or the joint selection's group count.
  std::vector<int> kept(jobs.size(), -1);
  for (size_t j = 0; j < jobs.size(); ++j)
    if (jobs[j].kind == CompressionKind::kCompact && !runtime_allocation(*jobs[j].recipe)) kept[j] = jobs[j].num_keep;

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
    // The selection scores of jointly selected items, kept until every head of the request is scored.
    std::vector<std::vector<float>> joint_scores(joint_batch ? items.size() : 0);

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
      // A joint job's protected tail follows its average keep (recent_ratio), not its upper bound.
      const bool joint = runtime_allocation(recipe);
      score_head(recipe, keys.data(), n, d, window_q.empty() ? nullptr : window_q.data(), group_size, scale, bs, f,
                 num_scored, job.first_compression, scores.data(), joint ? job.mean_keep : job.num_keep, values.data());
      if (joint) {
        joint_scores[static_cast<size_t>(i)] = std::move(scores);
        return;
      }
      select_keep(scores.data(), n, job.num_keep, keep.data() + slot(it, keep_per_layer_head) + keep_offset[it.job]);
    });

    // Joint selection: per request, every head's count, each group keeping its largest.
    if (joint_batch) {
      std::vector<std::vector<int>> request_items;  // items of one request, in (layer, head) order
      std::vector<uint64_t> request_ids;
      for (size_t i = 0; i < items.size(); ++i) {
        const CompressionJob& job = jobs[static_cast<size_t>(items[i].job)];
        if (!runtime_allocation(*job.recipe)) continue;
        const size_t r = static_cast<size_t>(std::find(request_ids.begin(), request_ids.end(), job.request_id) - request_ids.begin());
        if (r == request_ids.size()) {
          request_ids.push_back(job.request_id);
          request_items.emplace_back();
        }
        request_items[r].push_back(static_cast<int>(i));
      }
      for (std::vector<int>& ri : request_items) {
        std::sort(ri.begin(), ri.end(), [&](int a, int b) {
          return std::make_pair(items[static_cast<size_t>(a)].layer, items[static_cast<size_t>(a)].head) <
                 std::make_pair(items[static_cast<size_t>(b)].layer, items[static_cast<size_t>(b)].head);
        });
        std::vector<HeadSelectionScores> heads;
        for (int i : ri)
          heads.push_back({items[static_cast<size_t>(i)].layer, joint_scores[static_cast<size_t>(i)].data(),
                           static_cast<int>(joint_scores[static_cast<size_t>(i)].size())});
        const CompressionJob& first = jobs[static_cast<size_t>(items[static_cast<size_t>(ri[0])].job)];
        const std::vector<int> counts =
            joint_head_counts(first.recipe->allocation, heads, first.mean_keep, first.recipe->alpha_safe,
                              first.recipe->page_aligned ? bs : 0);
        for (size_t x = 0; x < ri.size(); ++x) {
          const int j = items[static_cast<size_t>(ri[x])].job;
          kept[static_cast<size_t>(j)] = std::max(kept[static_cast<size_t>(j)], counts[x]);
        }
        // Jobs whose heads had no entries keep none.
        for (size_t j = 0; j < jobs.size(); ++j)
          if (jobs[j].request_id == first.request_id && runtime_allocation(*jobs[j].recipe) && kept[j] < 0) kept[j] = 0;
      }
      for (size_t j = 0; j < jobs.size(); ++j)
        if (kept[j] > jobs[j].num_keep)
          return invalid_argument("compression job " + std::to_string(j) + " (request " +
                                  std::to_string(jobs[j].request_id) + "): the joint selection keeps " +
                                  std::to_string(kept[j]) + " entries of head group " + std::to_string(jobs[j].group) +
                                  ", more than its destination's num_keep " + std::to_string(jobs[j].num_keep));
      parallel_for(pool, static_cast<int>(items.size()), [&](int i) {
        const Item& it = items[static_cast<size_t>(i)];
        const std::vector<float>& scores = joint_scores[static_cast<size_t>(i)];
        if (!runtime_allocation(*jobs[static_cast<size_t>(it.job)].recipe)) return;
        select_keep(scores.data(), static_cast<int>(scores.size()), kept[static_cast<size_t>(it.job)],
                    keep.data() + slot(it, keep_per_layer_head) + keep_offset[it.job]);
      });
    }

    // Phase 2: compact K, V and F of every item.
    parallel_for(pool, static_cast<int>(items.size()), [&](int i) {
      const Item& it = items[i];
      const CompressionJob& job = jobs[it.job];
      const int32_t* kept_idx = keep.data() + slot(it, keep_per_layer_head) + keep_offset[it.job];
      const BlockId* src = job.src_blocks->data();
      const BlockId* dst = job.dst_blocks->data();
      const int num_kept = kept[static_cast<size_t>(it.job)];
      // The head's pages as a one-head array (head index 0 at its base).
      const HeadPages pages = kv.head(it.layer, it.head);
      compact_entries(pages.k, pages.block_stride, 0, bs, d, src, dst, kept_idx, num_kept);
      compact_entries(pages.v, pages.block_stride, 0, bs, d, src, dst, kept_idx, num_kept);
      if (job.recipe->global_decay > 0.0f) {
        const float* f = new_scores.data() + slot(it, scores_per_layer_head) + score_offset[it.job];
        for (int e = 0; e < num_kept; ++e)
          pages.f[static_cast<size_t>(dst[e / bs]) * pages.f_block_stride + e % bs] = f[kept_idx[e]];
      }
    });
  }
  if (kept_entries != nullptr) *kept_entries = std::move(kept);
  return Status::ok();
}

Status CpuCompressor::begin(const std::vector<CompressionJob>& jobs) {
  const auto t0 = std::chrono::steady_clock::now();
  evicted_blocks_.clear();
  kept_entries_.clear();
  status_ = run_compression(*kv_, jobs, scale_, pool_, &evicted_blocks_, &reconstruction_scores_, &kept_entries_);
  reconstruction_scores_.clear();
  device_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return status_;
}

}  // namespace origami::cpu
