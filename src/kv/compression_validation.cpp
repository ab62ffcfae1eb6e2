#include "kv/compression_validation.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace origami {
namespace {

int pages_for(int entries, int block_size) { return (entries + block_size - 1) / block_size; }

Status validate_recipe(const std::string& who, const ScoreRecipe& r, int max_window, bool have_global_scores) {
  if (!valid_scorer(r.scorer))
    return invalid_argument(who + ": recipe.scorer " + std::to_string(static_cast<int32_t>(r.scorer)) +
                            " is not a registered scorer (kv/scorers.h)");
  if (r.window < 0) return invalid_argument(who + ": recipe.window must be >= 0, got " + std::to_string(r.window));
  if (r.num_sinks < 0)
    return invalid_argument(who + ": recipe.num_sinks must be >= 0, got " + std::to_string(r.num_sinks));
  if (r.needs_queries()) {
    if (r.window < 1) return invalid_argument(who + ": " + std::string(scorer_name(r.scorer)) + " scoring needs recipe.window >= 1, got 0");
    if (r.window > max_window)
      return invalid_argument(who + ": recipe.window " + std::to_string(r.window) +
                              " exceeds the query cache's max_window " + std::to_string(max_window));
  }
  if (r.pool_kernel > 1 && r.pool_kernel % 2 == 0)
    return invalid_argument(who + ": recipe.pool_kernel must be odd, got " + std::to_string(r.pool_kernel));
  // Written so that NaN fails too.
  if (!(r.global_decay >= 0.0f) || !std::isfinite(r.global_decay))
    return invalid_argument(who + ": recipe.global_decay must be a finite value >= 0, got " +
                            std::to_string(r.global_decay));
  if (r.global_decay > 0.0f && !have_global_scores)
    return invalid_argument(who + ": recipe.global_decay > 0 needs CompressionConfig::global_scores");
  if (r.redundancy_span < 0)
    return invalid_argument(who + ": recipe.redundancy_span must be >= 0, got " + std::to_string(r.redundancy_span));
  if (!(r.recent_ratio >= 0.0f && r.recent_ratio < 1.0f))
    return invalid_argument(who + ": recipe.recent_ratio must be in [0, 1), got " + std::to_string(r.recent_ratio));
  if (r.global_mode != GlobalMode::kMax && r.global_mode != GlobalMode::kSum)
    return invalid_argument(who + ": recipe.global_mode " + std::to_string(static_cast<int>(r.global_mode)) +
                            " is neither kMax nor kSum");
  if (r.recent < 0) return invalid_argument(who + ": recipe.recent must be >= 0, got " + std::to_string(r.recent));
  if (r.scorer == Scorer::kKara) {
    if (r.protect_window || r.recent >= r.window)
      return invalid_argument(who + ": kara scoring compresses its window: recipe.protect_window must be false and "
                              "recipe.recent (the buffer) below recipe.window " + std::to_string(r.window) + ", got " +
                              std::to_string(r.recent));
    if (r.window_keep < 0 || r.window_keep > r.window - r.recent || r.chunk_budget < 0 || r.chunk_max_len < 3)
      return invalid_argument(who + ": kara needs 0 <= window_keep <= window - recent, chunk_budget >= 0 and "
                              "chunk_max_len >= 3, got window_keep " + std::to_string(r.window_keep) + ", chunk_budget " +
                              std::to_string(r.chunk_budget) + ", chunk_max_len " + std::to_string(r.chunk_max_len));
  }
  if (r.redundancy != RedundancyMode::kNone && !(r.redundancy_tau > 0.0f))
    return invalid_argument(who + ": recipe.redundancy_tau must be > 0, got " + std::to_string(r.redundancy_tau));
  return Status::ok();
}

// The page tables of one job.
Status validate_tables(const std::string& who, const CompressionJob& job, int bs, int num_blocks) {
  auto check_table = [&](const char* name, const std::vector<BlockId>& table, int entries) -> Status {
    const int need = pages_for(entries, bs);
    if (static_cast<int>(table.size()) < need)
      return invalid_argument(who + ": " + name + " has " + std::to_string(table.size()) + " pages, " +
                              std::to_string(entries) + " entries need " + std::to_string(need));
    for (int p = 0; p < need; ++p)
      if (table[p] <= kNullBlock || table[p] >= num_blocks)
        return invalid_argument(who + ": " + name + "[" + std::to_string(p) + "] is block " +
                                std::to_string(table[p]) + ", outside [1, " + std::to_string(num_blocks) + ")");
    return Status::ok();
  };
  ORIGAMI_RETURN_IF_ERROR(check_table("src_blocks", *job.src_blocks, job.num_entries));
  ORIGAMI_RETURN_IF_ERROR(check_table("dst_blocks", *job.dst_blocks, job.num_keep));
  // In place is safe only if no destination page is a source page at a later table index: kept
  // entry i comes from source entry keep[i] >= i (keep ascending), so once destination page p is
  // written, source pages before p are no longer needed but later ones may still be.
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

// A block eviction reads whole blocks, at least 3 (the first and the last are never chosen), and
// writes nothing, so it needs neither a destination nor queries.
Status validate_evict_block_job(const std::string& who, const CompressionJob& job, int bs, int num_blocks) {
  if (job.recipe == nullptr) return invalid_argument(who + ": recipe is null");
  if (!valid_scorer(job.recipe->scorer) || job.recipe->needs_queries())
    return invalid_argument(who + ": a block eviction needs a registered scorer that reads no queries, got " +
                            std::string(scorer_name(job.recipe->scorer)));
  if (job.num_entries < 3 * bs || job.num_entries % bs != 0)
    return invalid_argument(who + ": a block eviction needs whole blocks, at least 3, got num_entries " +
                            std::to_string(job.num_entries) + " at block size " + std::to_string(bs));
  const int need = job.num_entries / bs;
  if (static_cast<int>(job.src_blocks->size()) < need)
    return invalid_argument(who + ": src_blocks has " + std::to_string(job.src_blocks->size()) + " pages, " +
                            std::to_string(job.num_entries) + " entries need " + std::to_string(need));
  for (int p = 0; p < need; ++p)
    if ((*job.src_blocks)[p] <= kNullBlock || (*job.src_blocks)[p] >= num_blocks)
      return invalid_argument(who + ": src_blocks[" + std::to_string(p) + "] is block " +
                              std::to_string((*job.src_blocks)[p]) + ", outside [1, " + std::to_string(num_blocks) + ")");
  return Status::ok();
}

}  // namespace

Status validate_compression_config(const CompressionConfig& config) {
  if (config.num_query_slots < 0)
    return invalid_argument("compression config: num_query_slots must be >= 0, got " +
                            std::to_string(config.num_query_slots));
  if (config.max_window < 1)
    return invalid_argument("compression config: max_window must be >= 1, got " + std::to_string(config.max_window));
  if (config.layer_stride < 1)
    return invalid_argument("compression config: layer_stride must be >= 1, got " +
                            std::to_string(config.layer_stride));
  return Status::ok();
}

// The checks of validate_compression_batch, each violation named (job, request, field): what the
// fast pass below defers to when it finds anything wrong.
Status describe_compression_batch_error(const std::vector<CompressionJob>& jobs, int block_size, int num_blocks,
                            int num_query_slots, int max_window, bool have_global_scores) {
  const int bs = block_size;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const CompressionJob& job = jobs[j];
    const std::string who = "compression job " + std::to_string(j) + " (request " + std::to_string(job.request_id) + ")";
    if (job.src_blocks == nullptr) return invalid_argument(who + ": src_blocks is null");
    if (job.kind == CompressionKind::kEvictBlock) {
      ORIGAMI_RETURN_IF_ERROR(validate_evict_block_job(who, job, bs, num_blocks));
      continue;
    }
    if (job.kind != CompressionKind::kCompact)
      return invalid_argument(who + ": kind " + std::to_string(static_cast<int>(job.kind)) + " is not a compression kind");
    if (job.dst_blocks == nullptr) return invalid_argument(who + ": dst_blocks is null");
    if (job.recipe == nullptr) return invalid_argument(who + ": recipe is null");
    if (job.num_entries < 0)
      return invalid_argument(who + ": num_entries must be >= 0, got " + std::to_string(job.num_entries));
    if (job.num_keep < 0 || job.num_keep > job.num_entries)
      return invalid_argument(who + ": num_keep " + std::to_string(job.num_keep) + " outside [0, num_entries " +
                              std::to_string(job.num_entries) + "]");
    if (job.num_scored_entries < 0 || job.num_scored_entries > job.num_entries)
      return invalid_argument(who + ": num_scored_entries " + std::to_string(job.num_scored_entries) +
                              " outside [0, num_entries " + std::to_string(job.num_entries) + "]");
    ORIGAMI_RETURN_IF_ERROR(validate_recipe(who, *job.recipe, max_window, have_global_scores));
    // An empty job scores nothing, so it needs no queries.
    if (job.recipe->needs_queries() && job.num_entries > 0 && (job.query_slot < 0 || job.query_slot >= num_query_slots))
      return invalid_argument(who + ": " + std::string(scorer_name(job.recipe->scorer)) + " scoring needs the window's queries, but query_slot " +
                              std::to_string(job.query_slot) + " is outside [0, " + std::to_string(num_query_slots) +
                              ")");
    if (job.num_positions != -1 && job.num_positions < job.num_entries)
      return invalid_argument(who + ": num_positions " + std::to_string(job.num_positions) + " is below num_entries " +
                              std::to_string(job.num_entries) + " (-1 = equal)");
    // Kara decides its kept set itself: everything before the window, window_keep entries of the
    // compressible region, the buffer.
    if (job.recipe->scorer == Scorer::kKara && job.num_entries > 0) {
      const int w = std::min(job.recipe->window, job.num_entries);
      const int keep = job.num_entries - std::max(w - job.recipe->recent, 0) +
                       std::min(job.recipe->window_keep, std::max(w - job.recipe->recent, 0));
      if (job.num_keep != keep)
        return invalid_argument(who + ": a kara job over " + std::to_string(job.num_entries) + " entries keeps " +
                                std::to_string(keep) + " (all before its window, window_keep of it, the buffer), not " +
                                std::to_string(job.num_keep));
    }
    ORIGAMI_RETURN_IF_ERROR(validate_tables(who, job, bs, num_blocks));
  }
  // Backends run the jobs of a batch in parallel, so a page one job writes must not be touched by
  // another. Source pages shared by several jobs (a common prefix) are only read, which is fine.
  std::unordered_map<BlockId, size_t> written;  // dst page -> job
  // Block evictions write nothing.
  auto writes = [&](size_t j) { return jobs[j].kind == CompressionKind::kCompact; };
  for (size_t j = 0; j < jobs.size(); ++j)
    for (int p = 0; writes(j) && p < pages_for(jobs[j].num_keep, bs); ++p) {
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


// Whether every check of describe_batch_error passes, without building a name or a hash table per
// job: with per-head pages a batch holds a job per (request, layer, KV head) (73,728 when 256
// requests compress together), and naming each job and hashing its pages was most of a
// compression's host time. Never true where describe_batch_error fails; false sends the batch there.
bool compression_batch_fits(const std::vector<CompressionJob>& jobs, int bs, int num_blocks, int num_query_slots,
                            int max_window, bool have_global_scores) {
  const ScoreRecipe* checked_recipe = nullptr;  // jobs of a batch share a few recipes
  auto inside = [&](BlockId b) { return b > kNullBlock && b < num_blocks; };
  auto table_inside = [&](const std::vector<BlockId>& table, int entries) {
    const int need = pages_for(entries, bs);
    if (static_cast<int>(table.size()) < need) return false;
    bool ok = true;
    for (int p = 0; p < need; ++p) ok &= inside(table[static_cast<size_t>(p)]);
    return ok;
  };
  for (const CompressionJob& job : jobs) {
    if (job.src_blocks == nullptr || job.recipe == nullptr) return false;
    const ScoreRecipe& r = *job.recipe;
    if (job.kind == CompressionKind::kEvictBlock) {
      if (!valid_scorer(r.scorer) || r.needs_queries() || job.num_entries < 3 * bs || job.num_entries % bs != 0 ||
          !table_inside(*job.src_blocks, job.num_entries))
        return false;
      continue;
    }
    if (job.kind != CompressionKind::kCompact || job.dst_blocks == nullptr) return false;
    if (job.num_entries < 0 || job.num_keep < 0 || job.num_keep > job.num_entries || job.num_scored_entries < 0 ||
        job.num_scored_entries > job.num_entries)
      return false;
    if (&r != checked_recipe) {
      if (!validate_recipe("", r, max_window, have_global_scores).is_ok()) return false;
      checked_recipe = &r;
    }
    if (r.needs_queries() && job.num_entries > 0 && (job.query_slot < 0 || job.query_slot >= num_query_slots))
      return false;
    if (job.num_positions != -1 && job.num_positions < job.num_entries) return false;
    if (r.scorer == Scorer::kKara && job.num_entries > 0) {
      const int w = std::min(r.window, job.num_entries);
      if (job.num_keep != job.num_entries - std::max(w - r.recent, 0) + std::min(r.window_keep, std::max(w - r.recent, 0)))
        return false;
    }
    if (!table_inside(*job.src_blocks, job.num_entries) || !table_inside(*job.dst_blocks, job.num_keep)) return false;
    // In place: no destination page twice, none a source page at a later index. A job's tables
    // are a few pages; long ones go to the named check, which hashes.
    const int src_pages = pages_for(job.num_entries, bs), dst_pages = pages_for(job.num_keep, bs);
    if (dst_pages > 64) return false;
    const BlockId* src = job.src_blocks->data();
    const BlockId* dst = job.dst_blocks->data();
    for (int p = 0; p < dst_pages; ++p) {
      for (int q = 0; q < p; ++q)
        if (dst[q] == dst[p]) return false;
      for (int q = p + 1; q < src_pages; ++q)
        if (src[q] == dst[p]) {
          // The named check keeps a block's first source index: a later one counts only if it is
          // the block's first appearance.
          bool first = true;
          for (int e = 0; e < q; ++e) first &= src[e] != dst[p];
          if (first) return false;
        }
    }
  }
  // Jobs run in parallel: a page one job writes is neither written nor read by another. Every page
  // is inside the pool by now, so a table indexed by block finds the writer.
  std::vector<int32_t> writer(static_cast<size_t>(std::max(num_blocks, 1)), -1);
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (jobs[j].kind != CompressionKind::kCompact) continue;
    const BlockId* dst = jobs[j].dst_blocks->data();
    for (int p = 0; p < pages_for(jobs[j].num_keep, bs); ++p) {
      int32_t& w = writer[static_cast<size_t>(dst[p])];
      if (w >= 0) return false;
      w = static_cast<int32_t>(j);
    }
  }
  for (size_t j = 0; j < jobs.size(); ++j) {
    const BlockId* src = jobs[j].src_blocks->data();
    for (int p = 0; p < pages_for(jobs[j].num_entries, bs); ++p) {
      const int32_t w = writer[static_cast<size_t>(src[p])];
      if (w >= 0 && w != static_cast<int32_t>(j)) return false;
    }
  }
  return true;
}

Status validate_compression_batch(const std::vector<CompressionJob>& jobs, int block_size, int num_blocks,
                                  int num_query_slots, int max_window, bool have_global_scores) {
  if (compression_batch_fits(jobs, block_size, num_blocks, num_query_slots, max_window, have_global_scores))
    return Status::ok();
  return describe_compression_batch_error(jobs, block_size, num_blocks, num_query_slots, max_window, have_global_scores);
}

Status validate_job_groups(const std::vector<CompressionJob>& jobs, int num_groups) {
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (jobs[j].group < 0 || jobs[j].group >= num_groups)
      return invalid_argument("compression job " + std::to_string(j) + " (request " +
                              std::to_string(jobs[j].request_id) + "): group " + std::to_string(jobs[j].group) +
                              " outside the layout's " + std::to_string(num_groups) + " head groups");
    if (jobs[j].kind == CompressionKind::kEvictBlock && num_groups > 1)
      return Status(ErrorCode::kUnimplemented,
                    "compression job " + std::to_string(j) + " (request " + std::to_string(jobs[j].request_id) +
                        "): block eviction averages over every layer and head of one table; it supports the "
                        "one-group layout only, got " + std::to_string(num_groups) + " head groups");
  }
  // A runtime allocation selects a request's jobs jointly: one job per head group of the layout,
  // each group once, every job with the same recipe and mean_keep.
  std::unordered_map<uint64_t, std::vector<size_t>> joint;  // request -> its jobs
  for (size_t j = 0; j < jobs.size(); ++j) {
    const CompressionJob& job = jobs[j];
    if (job.kind != CompressionKind::kCompact || job.recipe == nullptr) continue;
    auto who = [&] { return "compression job " + std::to_string(j) + " (request " + std::to_string(job.request_id) + ")"; };
    if (!runtime_allocation(*job.recipe)) {
      if (job.mean_keep != 0)
        return invalid_argument(who() + ": mean_keep " + std::to_string(job.mean_keep) +
                                " is for a runtime allocation, but the recipe's allocation is uniform");
      continue;
    }
    if (job.mean_keep < 1)
      return invalid_argument(who() + ": allocation " + std::string(keep_allocation_name(job.recipe->allocation)) +
                              " needs mean_keep >= 1, got " + std::to_string(job.mean_keep));
    if (!(job.recipe->alpha_safe >= 0.0f && job.recipe->alpha_safe <= 1.0f))
      return invalid_argument(who() + ": alpha_safe must be in [0, 1], got " + std::to_string(job.recipe->alpha_safe));
    joint[job.request_id].push_back(j);
  }
  for (const auto& entry : joint) {
    const std::vector<size_t>& js = entry.second;
    std::vector<int> seen(static_cast<size_t>(num_groups), 0);
    const CompressionJob& first = jobs[js[0]];
    for (size_t j : js) {
      if (jobs[j].recipe != first.recipe || jobs[j].mean_keep != first.mean_keep)
        return invalid_argument("compression jobs " + std::to_string(js[0]) + " and " + std::to_string(j) +
                                " (request " + std::to_string(entry.first) +
                                ") are selected jointly but differ in recipe or mean_keep");
      ++seen[static_cast<size_t>(jobs[j].group)];
    }
    for (int g = 0; g < num_groups; ++g)
      if (seen[static_cast<size_t>(g)] != 1)
        return invalid_argument("request " + std::to_string(entry.first) + ": a runtime allocation (" +
                                keep_allocation_name(first.recipe->allocation) +
                                ") selects every head group jointly, but head group " + std::to_string(g) + " has " +
                                std::to_string(seen[static_cast<size_t>(g)]) + " jobs (one each expected)");
  }
  return Status::ok();
}

}  // namespace origami
