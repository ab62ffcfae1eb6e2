// The scheduler's side of compression: giving pending requests their destination blocks
// (Zipage Figure 3) and switching them to the compacted table when the backend is done; for a
// block eviction (PagedEviction's decode), dropping the block the backend chose from the table.
#include <algorithm>
#include <unordered_set>

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
  c.dst_blocks.clear();
  c.next_table.clear();
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
  table.num_entries = c.src_entries - kv_->layout().block_size;
  // The table no longer follows the token sequence: never registered in the prefix cache again.
  // Blocks already registered keep their (unchanged) contents and stay valid for other requests.
  table.block_keys.clear();
  request->kv.compacted = true;
  c.fresh_spare = kNullBlock;
  c.in_flight = false;
  ++c.num_compressions;
  c.num_scored_entries = 0;
}

bool Scheduler::try_start_compression(Request* request) {
  RequestCompression& c = request->compression;
  if (c.pending_kind == CompressionKind::kEvictBlock) return try_start_block_eviction(request);
  c.src_kind = CompressionKind::kCompact;
  const int block_size = kv_->layout().block_size;
  const std::vector<BlockId>& src = request->kv.groups[0].blocks;
  const int num_dst = (c.num_keep + block_size - 1) / block_size;
  ORIGAMI_CHECK(c.num_keep < num_cache_entries(*request) && num_dst <= static_cast<int>(src.size()));

  // Shared blocks (another request holds them too: a prefix-cache hit) are never written; the
  // entries that would land there go to fresh target blocks instead.
  int num_shared = 0;
  for (int i = 0; i < num_dst; ++i) num_shared += kv_->ref_count(src[static_cast<size_t>(i)]) > 1 ? 1 : 0;
  // A bounded request keeps block N_max empty for its next tokens: one of its own blocks past
  // the destination ones, or a fresh one. It then never needs another block.
  int spare = -1;
  if (c.trigger == CompressionTrigger::kCacheFull) {
    for (int i = num_dst; i < static_cast<int>(src.size()) && spare < 0; ++i)
      if (kv_->ref_count(src[static_cast<size_t>(i)]) == 1) spare = i;
  }
  const bool fresh_spare = c.trigger == CompressionTrigger::kCacheFull && spare < 0;
  std::vector<BlockId> fresh;
  if (!kv_->allocate_blocks(num_shared + (fresh_spare ? 1 : 0), &fresh)) return false;

  size_t next_fresh = 0;
  c.dst_blocks.clear();
  for (int i = 0; i < num_dst; ++i) {
    const BlockId block = src[static_cast<size_t>(i)];
    if (kv_->ref_count(block) > 1) {
      c.dst_blocks.push_back(fresh[next_fresh++]);
    } else {
      // Compacted in place: whatever the prefix cache knew of it is about to be overwritten.
      kv_->forget_contents(block);
      c.dst_blocks.push_back(block);
    }
  }
  c.next_table = c.dst_blocks;
  if (c.trigger == CompressionTrigger::kCacheFull) {
    if (fresh_spare) {
      c.next_table.push_back(fresh[next_fresh++]);
    } else {
      const BlockId block = src[static_cast<size_t>(spare)];
      kv_->forget_contents(block);  // new tokens will overwrite it
      c.next_table.push_back(block);
    }
  }
  ORIGAMI_CHECK(next_fresh == fresh.size());
  c.src_blocks = src;
  c.src_entries = num_cache_entries(*request);
  c.src_scored_entries = c.num_scored_entries;
  c.src_query_slot = c.query_slot;
  c.src_first_compression = !c.compressed();
  c.pending = false;
  c.in_flight = true;
  return true;
}

void Scheduler::start_compressions(SchedulerOutput* out) {
  const std::vector<Request*> order = running_;
  for (Request* request : order) {
    if (request->status != RequestStatus::kRunning || !request->compression.pending) continue;
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
  for (Request* request : out->compressions) {
    if (request->compression.src_kind == CompressionKind::kEvictBlock) continue;
    switch_to_compacted_table(request, &dropped);
    request->compression.switched_early = true;
  }
  kv_->release_blocks(dropped);
}

void Scheduler::switch_to_compacted_table(Request* request, std::vector<BlockId>* dropped) {
  RequestCompression& c = request->compression;
  ORIGAMI_CHECK(c.in_flight);
  BlockTable& table = request->kv.groups[0];
  const std::unordered_set<BlockId> kept(c.next_table.begin(), c.next_table.end());
  for (BlockId block : table.blocks)
    if (kept.count(block) == 0) dropped->push_back(block);  // own blocks return; shared ones lose a reference
  table.blocks = c.next_table;
  table.num_entries = c.num_keep;
  table.block_keys.clear();
  request->kv.compacted = true;  // never registered in the prefix cache again
  c.in_flight = false;
  ++c.num_compressions;
  c.num_scored_entries = c.num_keep;
  // The protected tail was kept verbatim at the end: it and what follows were never compressed.
  c.tail_from = c.num_keep - std::min(c.policy->score_recipe().protected_tail(), c.num_keep);
  // Keep the slot only if the very next token belongs to the next window (w == b).
  if (c.query_slot >= 0) {
    const int capture_from = query_capture_from(*request, kv_->layout().block_size);
    if (capture_from < 0 || capture_from > table.num_entries) release_slot(request);
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
  const std::vector<BlockId>& src = request->kv.groups[0].blocks;
  std::vector<BlockId> fresh;
  for (BlockId block : c.next_table)
    if (std::find(src.begin(), src.end(), block) == src.end()) fresh.push_back(block);
  kv_->release_blocks(fresh);
  c.src_blocks.clear();
  c.next_table.clear();
  c.dst_blocks.clear();
  c.in_flight = false;
  c.pending = false;
}

}  // namespace origami
