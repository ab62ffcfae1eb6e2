#include "engine/forward_batch_builder.h"

#include <algorithm>

#include "core/check.h"
#include "sched/compression_state.h"

namespace origami {

CompressionJob compression_job(const Request& r) {
  const RequestCompression& c = r.compression;
  ORIGAMI_CHECK((c.in_flight || c.switched_early) && c.policy != nullptr);
  CompressionJob job;
  job.request_id = r.id;
  job.kind = c.src_kind;
  job.src_blocks = &c.src_blocks;
  job.num_entries = c.src_entries;
  job.dst_blocks = &c.dst_blocks;
  job.num_keep = c.num_keep;
  job.query_slot = c.src_query_slot;
  job.num_scored_entries = c.src_scored_entries;
  job.first_compression = c.src_first_compression;
  // Nothing is computed while a compression is pending or in flight: the length it started at.
  job.num_positions = r.num_computed_tokens;
  // A prefill chunk before the prompt's end is scored by the policy's chunk score (its question has
  // not arrived); the prompt's end and everything after by its own.
  job.recipe = c.src_chunk ? &c.policy->chunk_score_recipe() : &c.policy->score_recipe();
  // A runtime allocation: the backend selects the request's groups jointly at this average; a
  // group may keep up to all of its entries (its destination is its whole table).
  if (c.runtime_allocated() && job.kind == CompressionKind::kCompact) {
    job.mean_keep = c.num_keep;
    job.num_keep = job.num_entries;
  }
  return job;
}

void append_compression_jobs(const Request& r, std::vector<CompressionJob>* jobs) {
  const RequestCompression& c = r.compression;
  // What every group's job shares, resolved once: a per-head layout has 288 groups.
  const CompressionJob base = compression_job(r);
  if (c.groups.empty()) {
    jobs->push_back(base);
    return;
  }
  for (size_t g = 0; g < c.groups.size(); ++g) {
    const GroupCompaction& gc = c.groups[g];
    if (!gc.compress) continue;  // within its budget: left as is
    CompressionJob& job = jobs->emplace_back(base);
    job.group = static_cast<int>(g);
    job.num_entries = gc.src_entries;
    job.num_keep = gc.num_keep;
    job.num_scored_entries = gc.src_scored_entries;
    if (g > 0) {
      job.src_blocks = &gc.src_blocks;
      job.dst_blocks = &gc.dst_blocks;
    }
  }
}

ForwardBatch build_forward_batch(const SchedulerOutput& plan, const ForwardBatchOptions& options) {
  ForwardBatch batch;
  batch.token_ids.reserve(plan.num_batched_tokens);
  batch.positions.reserve(plan.num_batched_tokens);
  batch.sequences.reserve(plan.sequences.size());
  for (const ScheduledSequence& s : plan.sequences) {
    const Request& r = *s.request;
    SequenceInput in;
    in.request_id = r.id;
    in.query_start = static_cast<int>(batch.token_ids.size());
    in.num_query_tokens = s.num_new_tokens;
    in.start_position = r.num_computed_tokens;
    in.num_cached_entries = r.kv.num_entries(0) - s.num_new_tokens;
    in.block_table = &r.kv.groups[0].blocks;
    in.kv = &r.kv;
    // Tokens of the next compression's window capture their queries into the request's slot.
    if (r.compression.query_slot >= 0) {
      // The policy counts the lead group's entries; the backend compares group 0's.
      const int lead_cached = num_cache_entries(r) - s.num_new_tokens;
      const int capture_from = query_capture_from(r, options.block_size, lead_cached, s.num_new_tokens);
      if (capture_from >= 0) {
        in.query_slot = r.compression.query_slot;
        in.query_capture_from = std::max(0, capture_from - (lead_cached - in.num_cached_entries));
      }
    }
    const bool completes_prompt = r.num_computed_tokens + s.num_new_tokens == r.num_tokens();
    in.logits_mode = completes_prompt ? LogitsMode::kLast : LogitsMode::kNone;
    in.sampling = &r.sampling;
    in.seed = r.seed;
    in.sample_index = static_cast<int>(r.output_token_ids.size()) + r.num_pending_tokens;
    in.logit_adjustments = r.logit_adjustments.empty() ? nullptr : &r.logit_adjustments;
    // The row that predicts a forced token is the one sampled.
    if (completes_prompt && options.logprob_token) in.logprob_token = options.logprob_token(r);
    if (completes_prompt && options.num_top_logprobs) in.num_top_logprobs = options.num_top_logprobs(r);
    const int known = r.num_known_tokens();
    for (int i = 0; i < s.num_new_tokens; ++i) {
      const int position = r.num_computed_tokens + i;
      if (position < known) {
        batch.token_ids.push_back(r.token_at(position));
      } else {
        // The token the step launched before this one samples for it: the backend fills it in.
        ORIGAMI_CHECK_MSG(position == known && r.pending_sequence >= 0, "a batch reads a token nobody samples");
        batch.pending_tokens.push_back({static_cast<int>(batch.token_ids.size()), r.pending_sequence});
        batch.token_ids.push_back(0);
      }
      batch.positions.push_back(position);
    }
    batch.sequences.push_back(in);
  }
  for (const Request* r : plan.compressions) {
    const size_t first = batch.compressions.size();
    append_compression_jobs(*r, &batch.compressions);
    for (size_t j = first; j < batch.compressions.size(); ++j) {
      CompressionJob& job = batch.compressions[j];
      if (job.recipe->reconstruction_scores && options.reconstruction_prompt != nullptr) {
        job.reconstruction_tokens = *options.reconstruction_prompt;
        for (int i = 0; i < job.num_positions; ++i) job.reconstruction_tokens.push_back(r->token_at(i));
      }
    }
  }
  batch.wait_for_compressions =
      plan.wait_for_compressions || (options.synchronous_compression && !batch.compressions.empty());
  return batch;
}

}  // namespace origami
