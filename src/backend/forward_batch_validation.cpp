#include "backend/forward_batch_validation.h"

#include <string>

namespace origami {
namespace {

// Names the sequence (and head group) an error is about. The text is built only for an error: a
// grouped layout checks every group's table of every sequence each step (72 x 256 tables for the
// Qwen3-8B shape at 4 heads per group), and formatting a name for each was most of the check.
struct Where {
  size_t seq = 0;
  uint64_t request_id = 0;
  size_t group = 0;  // > 0: a head group's table beside group 0's
  std::string str() const {
    std::string who = "batch: sequence " + std::to_string(seq) + " (request " + std::to_string(request_id) + ")";
    if (group > 0) who += " group " + std::to_string(group);
    return who;
  }
};

// Whether one group's table holds `num_cached` entries before the step's `num_new` in pages
// inside the pool: the check every table of every sequence gets each step (288 x 256 for the
// Qwen3-8B shape with per-head pages), so it is branch-free over the pages, without a division
// and without a Status; validate_table says what is wrong only when this fails.
inline bool table_fits(const std::vector<BlockId>& table, int num_cached, int num_new, const ForwardBatchLimits& limits) {
  if (num_cached < 0) return false;
  const int64_t num_entries = static_cast<int64_t>(num_cached) + num_new;
  const int64_t bs = limits.block_size;
  if (static_cast<int64_t>(table.size()) * bs < num_entries) return false;
  bool all_inside = true;
  for (int64_t p = 0; p * bs < num_entries; ++p) {
    const BlockId b = table[static_cast<size_t>(p)];
    all_inside &= b > kNullBlock && b < limits.num_blocks;
  }
  return all_inside;
}

// One group's table: `num_cached` entries before the step's `num_new` must fit its pages; the
// error says which page or count is wrong.
Status validate_table(const Where& where, const std::vector<BlockId>& table, int num_cached, int num_new,
                      const ForwardBatchLimits& limits) {
  if (table_fits(table, num_cached, num_new, limits)) return Status::ok();
  const int bs = limits.block_size;
  if (num_cached < 0) return invalid_argument(where.str() + ": negative num_cached_entries");
  const int64_t num_entries = static_cast<int64_t>(num_cached) + num_new;
  const int64_t num_pages = (num_entries + bs - 1) / bs;
  if (static_cast<int64_t>(table.size()) < num_pages)
    return invalid_argument(where.str() + ": block table has " + std::to_string(table.size()) + " pages, " +
                            std::to_string(num_entries) + " entries need " + std::to_string(num_pages));
  for (int64_t p = 0; p < num_pages; ++p) {
    const BlockId b = table[static_cast<size_t>(p)];
    if (b <= kNullBlock || b >= limits.num_blocks)
      return invalid_argument(where.str() + ": page " + std::to_string(p) + " is block " + std::to_string(b) +
                              ", outside [1, " + std::to_string(limits.num_blocks) + ")");
  }
  return Status::ok();
}

}  // namespace

Status validate_forward_batch(const ForwardBatch& batch, const ForwardBatchLimits& limits) {
  const int num_tokens = static_cast<int>(batch.token_ids.size());
  if (batch.positions.size() != batch.token_ids.size())
    return invalid_argument("batch: " + std::to_string(batch.positions.size()) + " positions for " +
                            std::to_string(num_tokens) + " tokens");
  for (int i = 0; i < num_tokens; ++i) {
    if (batch.token_ids[i] < 0 || batch.token_ids[i] >= limits.vocab_size)
      return invalid_argument("batch: token id " + std::to_string(batch.token_ids[i]) + " at index " +
                              std::to_string(i) + " is outside the vocabulary [0, " +
                              std::to_string(limits.vocab_size) + ")");
    if (batch.positions[i] < 0) return invalid_argument("batch: negative position at index " + std::to_string(i));
  }
  // Pending tokens: each names one of the batch's tokens once (whether the previous step sampled
  // the sequence it names is for the backend, which kept that step, to check).
  int last_pending = -1;
  for (const PendingToken& p : batch.pending_tokens) {
    if (p.token_index <= last_pending || p.token_index >= num_tokens || p.previous_sequence < 0)
      return invalid_argument("batch: pending token at index " + std::to_string(p.token_index) + " (of sequence " +
                              std::to_string(p.previous_sequence) + " of the previous step) is not one of the " +
                              std::to_string(num_tokens) + " tokens in increasing order");
    last_pending = p.token_index;
  }
  int expected_start = 0;
  for (size_t s = 0; s < batch.sequences.size(); ++s) {
    const SequenceInput& seq = batch.sequences[s];
    const Where where{s, seq.request_id};
    if (seq.num_query_tokens < 1 || seq.query_start < 0 || seq.query_start + seq.num_query_tokens > num_tokens)
      return invalid_argument(where.str() + ": tokens [" + std::to_string(seq.query_start) + ", " +
                              std::to_string(seq.query_start + seq.num_query_tokens) + ") outside the batch's " +
                              std::to_string(num_tokens) + " tokens");
    // Sequences take consecutive token ranges in order (no token belongs to two sequences).
    if (seq.query_start != expected_start)
      return invalid_argument(where.str() + ": its tokens start at " + std::to_string(seq.query_start) + ", expected " +
                              std::to_string(expected_start) + " (sequences cover the batch's tokens in order)");
    expected_start += seq.num_query_tokens;
    if (seq.logprob_token >= limits.vocab_size)
      return invalid_argument(where.str() + ": logprob_token " + std::to_string(seq.logprob_token) +
                              " is outside the vocabulary [0, " + std::to_string(limits.vocab_size) + ")");
    if (seq.num_top_logprobs > kMaxTopLogprobs)
      return invalid_argument(where.str() + ": num_top_logprobs " + std::to_string(seq.num_top_logprobs) + " is above " +
                              std::to_string(kMaxTopLogprobs));
    if (!seq.block_table) return invalid_argument(where.str() + ": no block table");
    if (limits.check_page_tables)
      ORIGAMI_RETURN_IF_ERROR(validate_table(where, *seq.block_table, seq.num_cached_entries, seq.num_query_tokens, limits));
    if (limits.num_groups > 1 &&
        (seq.kv == nullptr || seq.kv->groups.size() != static_cast<size_t>(limits.num_groups)))
      return invalid_argument("batch: request " + std::to_string(seq.request_id) + " gives " +
                              std::to_string(seq.kv == nullptr ? 1 : seq.kv->groups.size()) +
                              " head groups' tables; the KV layout has " + std::to_string(limits.num_groups));
    if (seq.kv != nullptr) {
      // Head groups: every group's table covers its own entries.
      if (seq.kv->groups.empty() || &seq.kv->groups[0].blocks != seq.block_table)
        return invalid_argument(where.str() + ": kv does not hold block_table as group 0's table");
      for (size_t g = 1; limits.check_page_tables && g < seq.kv->groups.size(); ++g) {
        const BlockTable& t = seq.kv->groups[g];
        const int num_cached = seq.kv->num_entries(g) - seq.num_query_tokens;
        if (!table_fits(t.blocks, num_cached, seq.num_query_tokens, limits))
          return validate_table(Where{s, seq.request_id, g}, t.blocks, num_cached, seq.num_query_tokens, limits);
      }
    }
    if (seq.logits_mode != LogitsMode::kNone && !seq.sampling) return invalid_argument(where.str() + ": no sampling parameters");
    if (seq.logit_adjustments != nullptr)
      for (const LogitAdjustment& a : seq.logit_adjustments->entries())
        if (a.token < 0 || a.token >= limits.vocab_size)
          return invalid_argument(where.str() + ": logit adjustment of token " + std::to_string(a.token) +
                                  ", outside the vocabulary [0, " + std::to_string(limits.vocab_size) + ")");
    if (seq.query_slot < -1)
      return invalid_argument(where.str() + ": query_slot must be -1 (no capture) or a slot index, got " +
                              std::to_string(seq.query_slot));
    if (seq.query_slot >= 0) {
      if (limits.num_query_slots < 0)
        return invalid_argument(where.str() + ": query_slot " + std::to_string(seq.query_slot) +
                                " set but configure_compression() was not called");
      if (seq.query_slot >= limits.num_query_slots)
        return invalid_argument(where.str() + ": query_slot " + std::to_string(seq.query_slot) + " outside [0, " +
                                std::to_string(limits.num_query_slots) + ")");
      if (seq.query_capture_from < 0)
        return invalid_argument(where.str() + ": query_capture_from must be >= 0 with a query slot, got " +
                                std::to_string(seq.query_capture_from));
      for (size_t o = 0; o < s; ++o)
        if (batch.sequences[o].query_slot == seq.query_slot)
          return invalid_argument(where.str() + ": query_slot " + std::to_string(seq.query_slot) +
                                  " is also used by sequence " + std::to_string(o));
    }
  }
  if (expected_start != num_tokens)
    return invalid_argument("batch: the sequences cover " + std::to_string(expected_start) + " of its " +
                            std::to_string(num_tokens) + " tokens");
  return Status::ok();
}

}  // namespace origami
