// The scheduler's side of compression: giving pending requests their destination blocks
// (Zipage Figure 3) and switching them to the compacted table when the backend is done; for a
// block eviction (PagedEviction's decode), dropping the block the backend chose from the table.
#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "sched/compression_state.h"
#include "sched/scheduler.h"

namespace origami {

bool Scheduler::try_start_block_eviction(Request* request) {
  RequestCompression& c = request->compression;
  const int block_size = kv_->layout().block_size;
  const std::vector<BlockId>& src = request->kv.groups[0].blocks;
  const int entries = num_cache_entries(*request);
  ORIGAMI_CHECK(entries % block_size == 0 && entries / block_size == static_cast<int>(src.size()) && src.size() >= 3);
  // The evicted block becomes the block for the next tokens when it is the request's own; a
  // shared candidate (a prefix-cache hit) would only lose a reference, so a fresh block is taken
  // now, while the pool can still be asked (given back if an own block is chosen).
  bool any_shared = false;
  for (size_t i = 1; i + 1 < src.size(); ++i) any_shared = any_shared || kv_->ref_count(src[i]) > 1;
  c.fresh_spare = kNullBlock;
  if (any_shared) {
    std::vector<BlockId> fresh;
    if (!kv_->allocate_blocks(1, &fresh)) return false;
    c.fresh_spare = fresh[0];
  }
  c.src_kind = CompressionKind::kEvictBlock;
  c.src_blocks = src;
  c.src_entries = entries;
  c.src_scored_entries = 0;
  c.src_query_slot = -1;
  c.src_first_compression = !c.compressed();
  c.src_chunk = false;
  c.dst_blocks.clear();
  c.next_table.clear();
  c.jobs_in_flight = 1;
  c.job_failed = false;
  c.pending = false;
  c.in_flight = true;
  return true;
}

void Scheduler::switch_to_evicted_table(Request* request, int evicted, std::vector<BlockId>* dropped) {
  RequestCompression& c = request->compression;
  ORIGAMI_CHECK(c.in_flight && c.src_kind == CompressionKind::kEvictBlock);
  BlockTable& table = request->kv.groups[0];
  ORIGAMI_CHECK_MSG(table.blocks == c.src_blocks, "a request changed its table while its block eviction ran");
  ORIGAMI_CHECK_MSG(evicted >= 1 && evicted + 1 < static_cast<int>(table.blocks.size()),
                    "the backend chose the first or last block, or none, for a block eviction");
  const BlockId block = table.blocks[static_cast<size_t>(evicted)];
  table.blocks.erase(table.blocks.begin() + evicted);
  BlockId spare = c.fresh_spare;
  if (kv_->ref_count(block) == 1) {
    // Its own block: no other request reads it, so it takes the next tokens (its prefix-cache
    // entry, if any, is forgotten first). A fresh spare is no longer needed.
    kv_->forget_contents(block);
    if (spare != kNullBlock) dropped->push_back(spare);
    spare = block;
  } else {
    dropped->push_back(block);  // shared: only this request's reference goes
    ORIGAMI_CHECK(spare != kNullBlock);
  }
  table.blocks.push_back(spare);
  request->kv.set_num_entries(0, c.src_entries - kv_->layout().block_size);
  request->kv.tables_changed();
  // The table no longer follows the token sequence: never registered in the prefix cache again.
  // Blocks already registered keep their (unchanged) contents and stay valid for other requests.
  request->kv.trim_keys(0, 0);
  request->kv.compacted = true;
  c.fresh_spare = kNullBlock;
  c.in_flight = false;
  ++c.num_compressions;
  c.num_scored_entries = 0;
}

namespace {

// A group's tables of the compaction (group 0's live in RequestCompression itself).
struct GroupTables {
  std::vector<BlockId>& src;
  std::vector<BlockId>& dst;
  std::vector<BlockId>& next;
};

GroupTables tables_of(RequestCompression& c, int group) {
  if (group == 0) return {c.src_blocks, c.dst_blocks, c.next_table};
  GroupCompaction& g = c.groups[static_cast<size_t>(group)];
  return {g.src_blocks, g.dst_blocks, g.next_table};
}

// One group's plan: where its kept entries go and which blocks it needs fresh.
struct GroupPlan {
  int num_dst = 0;
  int num_shared = 0;  // destination places whose source block is shared: a fresh target each
  int spare = -1;      // index of an own block past the destination ones kept for the next tokens
  bool fresh_spare = false;
};

}  // namespace

int group_num_keep(const RequestCompression& c, int group) { return group_keep_of(c, group, c.num_keep); }

int group_keep_of(const RequestCompression& c, int group, int num_keep) {
  if (static_cast<size_t>(group) >= c.group_ratios.size()) return num_keep;  // uniform
  const float ratio = c.group_ratios[static_cast<size_t>(group)];
  // Ratios are floats (1/3 is 0.33333334f): a product within float rounding of an integer is it.
  const double exact = static_cast<double>(ratio) * num_keep;
  const int keep = static_cast<int>(std::ceil(exact - 1e-6 * exact - 1e-9));
  // A group keeps at least what the recipe always protects (window, sinks), as calibration raises
  // its top-k to them: a smaller share would cut into the window itself.
  int floor = 1;
  if (c.policy != nullptr) {
    const ScoreRecipe& recipe = c.policy->score_recipe();
    const int tail = recipe.scorer == Scorer::kRecency ? 0 : recipe.protected_tail(keep);  // as check_budget
    floor = std::max(1, tail + recipe.num_sinks);
  }
  return std::clamp(keep, std::min(floor, num_keep), num_keep);
}

bool Scheduler::try_start_compression(Request* request) {
  RequestCompression& c = request->compression;
  if (c.pending_kind == CompressionKind::kEvictBlock) return try_start_block_eviction(request);
  c.src_kind = CompressionKind::kCompact;
  const int block_size = kv_->layout().block_size;
  const int num_groups = kv_->num_groups();
  // With non-uniform group budgets the lead group may be within its keep while a smaller group is
  // not (trigger_budget); some group is always over its keep.
  ORIGAMI_CHECK(std::min(c.num_keep, trigger_budget(c)) < num_cache_entries(*request));
  // A runtime allocation: the backend decides every group's count, selecting them jointly, so
  // every group is compressed and its destination sized for the most it may keep: all its entries
  // (one head may take the scope's whole total). Compaction is in place, so that costs fresh
  // blocks only for shared prefix blocks.
  const bool joint = c.runtime_allocated();
  if (joint) c.kept_by_group.assign(static_cast<size_t>(num_groups), -1);
  // Blocks dropped by the groups are released together: one pool (shared, or the only group).
  ORIGAMI_CHECK(num_groups == 1 || kv_->layout().shared_pool);
  if (num_groups > 1 && static_cast<int>(c.groups.size()) != num_groups) c.groups.assign(static_cast<size_t>(num_groups), {});

  // Plan every group (a group within its budget is left as is), then take the fresh blocks of all
  // of them at once: all or nothing.
  std::vector<GroupPlan> plans(static_cast<size_t>(num_groups));
  for (int g = 0; g < num_groups; ++g) {
    const BlockTable& table = request->kv.groups[static_cast<size_t>(g)];
    const int entries = request->kv.num_entries(static_cast<size_t>(g));
    const int keep = joint ? entries : group_num_keep(c, g);
    if (num_groups > 1) {
      c.groups[static_cast<size_t>(g)].num_keep = keep;
      c.groups[static_cast<size_t>(g)].compress = joint || entries > keep;
      if (!c.groups[static_cast<size_t>(g)].compress) continue;
    }
    const std::vector<BlockId>& src = table.blocks;
    GroupPlan& plan = plans[static_cast<size_t>(g)];
    plan.num_dst = (keep + block_size - 1) / block_size;
    ORIGAMI_CHECK((joint ? keep <= entries : keep < entries) &&
                  plan.num_dst <= static_cast<int>(src.size()));
    // Shared blocks (another request holds them too: a prefix-cache hit) are never written; the
    // entries that would land there go to fresh target blocks instead.
    for (int i = 0; i < plan.num_dst; ++i) plan.num_shared += kv_->block_shared(src[static_cast<size_t>(i)], g) ? 1 : 0;
    // A bounded request keeps block N_max empty for its next tokens: one of its own blocks past
    // the destination ones, or a fresh one. It then never needs another block. (A runtime
    // allocation's groups end at their reported counts and take blocks as they grow.)
    const bool spare = c.trigger == CompressionTrigger::kCacheFull && !joint;
    if (spare) {
      for (int i = plan.num_dst; i < static_cast<int>(src.size()) && plan.spare < 0; ++i)
        if (!kv_->block_shared(src[static_cast<size_t>(i)], g)) plan.spare = i;
    }
    plan.fresh_spare = spare && plan.spare < 0;
  }
  // One pool serves every group: one allocation, then each group takes its share in order.
  int num_fresh = 0;
  for (const GroupPlan& plan : plans) num_fresh += plan.num_shared + (plan.fresh_spare ? 1 : 0);
  std::vector<BlockId> all_fresh;
  if (!kv_->allocate_blocks(num_fresh, &all_fresh)) return false;
  size_t next_fresh = 0;  // groups take their fresh blocks from all_fresh in group order

  for (int g = 0; g < num_groups; ++g) {
    const BlockTable& table = request->kv.groups[static_cast<size_t>(g)];
    if (num_groups > 1 && !c.groups[static_cast<size_t>(g)].compress) continue;
    const GroupPlan& plan = plans[static_cast<size_t>(g)];
    const std::vector<BlockId>& src = table.blocks;
    GroupTables t = tables_of(c, g);
    const size_t group_fresh = next_fresh + static_cast<size_t>(plan.num_shared + (plan.fresh_spare ? 1 : 0));
    t.dst.clear();
    for (int i = 0; i < plan.num_dst; ++i) {
      const BlockId block = src[static_cast<size_t>(i)];
      if (kv_->block_shared(block, g)) {
        t.dst.push_back(all_fresh[next_fresh++]);
      } else {
        // Compacted in place: whatever the prefix cache knew of it is about to be overwritten.
        kv_->forget_contents(block, g);
        t.dst.push_back(block);
      }
    }
    t.next = t.dst;
    if (c.trigger == CompressionTrigger::kCacheFull && !joint) {
      if (plan.fresh_spare) {
        t.next.push_back(all_fresh[next_fresh++]);
      } else {
        const BlockId block = src[static_cast<size_t>(plan.spare)];
        kv_->forget_contents(block, g);  // new tokens will overwrite it
        t.next.push_back(block);
      }
    }
    ORIGAMI_CHECK(next_fresh == group_fresh);
    t.src = src;
    if (num_groups > 1) {
      GroupCompaction& gc = c.groups[static_cast<size_t>(g)];
      gc.src_entries = request->kv.num_entries(static_cast<size_t>(g));
      gc.src_scored_entries = gc.num_scored_entries;
    }
  }
  c.src_entries = num_cache_entries(*request);
  c.src_scored_entries = c.num_scored_entries;
  c.src_query_slot = c.query_slot;
  c.src_first_compression = !c.compressed();
  c.src_chunk = c.pending_chunk;
  c.jobs_in_flight = 1;
  if (num_groups > 1) {
    c.jobs_in_flight = 0;
    for (const GroupCompaction& g : c.groups) c.jobs_in_flight += g.compress ? 1 : 0;
  }
  c.job_failed = false;
  c.pending = false;
  c.in_flight = true;
  return true;
}

void Scheduler::start_compressions(SchedulerOutput* out) {
  const std::vector<Request*> order = running_;
  for (Request* request : order) {
    if (request->status != RequestStatus::kRunning || !request->compression.pending) continue;
    // Its last token is being sampled (asynchronous scheduling): it ends once that token is known,
    // as the synchronous engine ends it before a compression could start.
    if (request->sampled_all(config_.max_model_len)) continue;
    for (;;) {
      if (try_start_compression(request)) {
        out->compressions.push_back(request);
        compressing_.push_back(request);
        break;
      }
      // Short of target blocks (only an uncompressed request with shared prefix blocks needs
      // them): preempt the last uncompressed request, possibly this one (Zipage §4.4).
      Request* victim = pick_victim(/*slotless_only=*/false);
      if (victim == nullptr) break;
      preempt(victim, nullptr, nullptr);
      out->preempted.push_back(victim);
      if (victim == request) break;
    }
  }
  if (!config_.compress_before_forward) return;
  // The backend compacts before this step's forward pass: the requests take their compacted
  // tables now and compute in this very step. The blocks they drop go back only after every
  // compression of the batch has its targets, so no job writes a page another job reads.
  // A block eviction cannot switch early: its table depends on the block the backend chooses, so
  // the request waits for the result, reported by this very step (the backend waits for it).
  std::vector<BlockId> dropped;
  // Nor can a runtime allocation: its groups' lengths are the backend's counts.
  for (Request* request : out->compressions) {
    if (request->compression.src_kind == CompressionKind::kEvictBlock || request->compression.runtime_allocated()) continue;
    switch_to_compacted_table(request, &dropped);
    request->compression.switched_early = true;
  }
  kv_->release_blocks(dropped);
}

void Scheduler::switch_to_compacted_table(Request* request, std::vector<BlockId>* dropped) {
  RequestCompression& c = request->compression;
  ORIGAMI_CHECK(c.in_flight);
  const int num_groups = kv_->num_groups();
  const int block_size = kv_->layout().block_size;
  const bool joint = c.runtime_allocated();
  std::vector<BlockId> kept;
  bool switched = false;
  for (int g = 0; g < num_groups; ++g) {
    if (num_groups > 1 && !c.groups[static_cast<size_t>(g)].compress) continue;
    BlockTable& table = request->kv.groups[static_cast<size_t>(g)];
    GroupTables t = tables_of(c, g);
    // A runtime allocation kept the backend's count: the destination blocks past it go back (own
    // ones are in the old table too; fresh targets past it are not, so they are dropped here).
    const int num_kept = joint ? c.kept_by_group[static_cast<size_t>(g)] : group_num_keep(c, g);
    if (joint) {
      ORIGAMI_CHECK(num_kept >= 0 && num_kept <= request->kv.num_entries(static_cast<size_t>(g)));
      const size_t used = static_cast<size_t>((num_kept + block_size - 1) / block_size);
      for (size_t i = used; i < t.next.size(); ++i)
        if (std::find(table.blocks.begin(), table.blocks.end(), t.next[i]) == table.blocks.end())
          dropped->push_back(t.next[i]);
      if (t.next.size() > used) t.next.resize(used);
    }
    // Own blocks return; shared ones lose a reference. (Groups share one pool, or there is one.)
    // Compacted in place with nothing shared, the kept blocks are the table's leading ones, and the
    // rest go back in table order; otherwise a sorted copy, not a hash set: this runs for every
    // group of the request (288 for the Qwen3-8B shape with per-head pages), and a table is a few
    // dozen blocks.
    if (t.next.size() <= table.blocks.size() && std::equal(t.next.begin(), t.next.end(), table.blocks.begin())) {
      dropped->insert(dropped->end(), table.blocks.begin() + static_cast<std::ptrdiff_t>(t.next.size()), table.blocks.end());
    } else {
      kept.assign(t.next.begin(), t.next.end());
      std::sort(kept.begin(), kept.end());
      for (BlockId block : table.blocks)
        if (!std::binary_search(kept.begin(), kept.end(), block)) dropped->push_back(block);
    }
    table.blocks = t.next;
    request->kv.set_num_entries(static_cast<size_t>(g), num_kept);
    switched = true;
    request->kv.trim_keys(static_cast<size_t>(g), 0);
    if (num_groups > 1) c.groups[static_cast<size_t>(g)].num_scored_entries = num_kept;
  }
  if (switched) request->kv.tables_changed();  // once for all its groups: a new version, no summary
  request->kv.compacted = true;  // never registered in the prefix cache again
  c.kept_pages = kv_->num_held_blocks(*request);
  c.in_flight = false;
  ++c.num_compressions;
  c.num_scored_entries = joint ? request->kv.num_entries(0) : c.num_keep;
  if (joint) c.entries_after_compression = num_cache_entries(*request);
  // The protected tail was kept verbatim at the end: it and what follows were never compressed.
  const int kept_mean = joint ? c.entries_after_compression : c.num_keep;
  c.tail_from = kept_mean - std::min(c.policy->score_recipe().protected_tail(), kept_mean);
  // Keep the slot only if the very next token belongs to the next window (w == b).
  if (c.query_slot >= 0) {
    const int capture_from = query_capture_from(*request, kv_->layout().block_size);
    if (capture_from < 0 || capture_from > num_cache_entries(*request)) release_slot(request);
  }
}

void Scheduler::complete_compression(Request* request, int evicted_block) {
  RequestCompression& c = request->compression;
  compressing_.erase(std::find(compressing_.begin(), compressing_.end(), request));
  if (c.src_kind == CompressionKind::kEvictBlock) {
    std::vector<BlockId> dropped;
    switch_to_evicted_table(request, evicted_block, &dropped);
    kv_->release_blocks(dropped);
  } else if (!c.switched_early) {
    std::vector<BlockId> dropped;
    switch_to_compacted_table(request, &dropped);
    kv_->release_blocks(dropped);
  }
  c.switched_early = false;
  c.src_blocks.clear();
  c.next_table.clear();
  c.dst_blocks.clear();
  for (GroupCompaction& g : c.groups) {
    g.src_blocks.clear();
    g.dst_blocks.clear();
    g.next_table.clear();
  }
}

void Scheduler::abort_compression(Request* request) {
  RequestCompression& c = request->compression;
  compressing_.erase(std::find(compressing_.begin(), compressing_.end(), request));
  if (c.switched_early) {
    // Already on its (now unreliable) compacted table: the caller finishes it, which frees it.
    c.switched_early = false;
    return;
  }
  ORIGAMI_CHECK(c.in_flight);
  if (c.src_kind == CompressionKind::kEvictBlock) {
    // Nothing was written and the table is untouched: only the fresh spare goes back.
    if (c.fresh_spare != kNullBlock) {
      const std::vector<BlockId> spare{c.fresh_spare};
      kv_->release_blocks(spare);
    }
    c.fresh_spare = kNullBlock;
    c.src_blocks.clear();
    c.in_flight = false;
    c.pending = false;
    return;
  }
  const int num_groups = kv_->num_groups();
  for (int g = 0; g < num_groups; ++g) {
    if (num_groups > 1 && !c.groups[static_cast<size_t>(g)].compress) continue;
    const std::vector<BlockId>& src = request->kv.groups[static_cast<size_t>(g)].blocks;
    GroupTables t = tables_of(c, g);
    std::vector<BlockId> fresh;
    for (BlockId block : t.next)
      if (std::find(src.begin(), src.end(), block) == src.end()) fresh.push_back(block);
    kv_->release_blocks(fresh, g);
    t.src.clear();
    t.next.clear();
    t.dst.clear();
  }
  c.in_flight = false;
  c.pending = false;
}

}  // namespace origami
