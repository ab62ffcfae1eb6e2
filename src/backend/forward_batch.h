#pragma once
// One model step over a batch of sequences, as the backend sees it: flattened new tokens, their
// logical positions, and for every sequence its page table and where its new KV entries go.
// Built by the engine from the scheduler's plan; backends only compute.
#include <cstdint>
#include <vector>

#include "kv/block_table.h"
#include "kv/compression.h"
#include "sampling/logit_adjustments.h"
#include "sampling/logprob.h"
#include "sampling/sampling_params.h"

namespace origami {

enum class LogitsMode {
  kNone,  // a prefill chunk that ends before the prompt does: nothing to sample
  kLast,  // sample from the last new token's logits
  kAll,   // return logits of every new token (teacher forcing, prompt logprobs); samples the last
};

struct SequenceInput {
  uint64_t request_id = 0;
  int query_start = 0;      // offset of this sequence's first new token in ForwardBatch::token_ids
  int num_query_tokens = 0; // new tokens this step (a prefill chunk, or 1 when decoding)
  int start_position = 0;   // logical position of the first new token (RoPE position)
  int num_cached_entries = 0;  // KV entries already in the cache; new entries are written after them
  // Page table of head group 0 (full KV: one group). Must hold num_cached_entries + num_query_tokens.
  const std::vector<BlockId>* block_table = nullptr;
  // Every head group's table (kv->groups[g]); group g's cached entries are
  // kv->num_entries(g) - num_query_tokens (groups hold different numbers of entries under
  // non-uniform budgets). Null: one group, given by block_table / num_cached_entries.
  const RequestKV* kv = nullptr;
  // Query capture for compression: new tokens whose group-0 entry index e (num_cached_entries + i) is
  // >= query_capture_from write their post-RoPE queries (all layers) into query slot
  // `query_slot` at row position % CompressionConfig::max_window (keyed by position, which
  // compaction never changes; CompressionJob::num_positions). -1: no capture.
  int query_slot = -1;
  int query_capture_from = -1;
  LogitsMode logits_mode = LogitsMode::kLast;
  // Sampling of the next token (ignored with kNone).
  const SamplingParams* sampling = nullptr;
  uint64_t seed = 0;
  int sample_index = 0;  // index of the token being sampled in the output (keys the RNG)
  // Applied to the sampled row's logits before sampling (not to logprobs, which stay raw as in
  // vLLM); null or empty: none.
  const LogitAdjustments* logit_adjustments = nullptr;
  // >= 0 (with kLast or kAll): also return log p(logprob_token) under the logits the token is
  // sampled from, at temperature 1 (teacher forcing: the forced token's log-probability). Cheap
  // on both backends, and unlike kAll it keeps decode steps in CUDA graphs.
  int32_t logprob_token = -1;
  // >= 0 (with kLast or kAll): also return the log-probability of the token this row yields
  // (logprob_token when set, else the sampled one) and the top `num_top_logprobs` tokens
  // (<= kMaxTopLogprobs), under the raw logits (temperature 1, before any filter): the OpenAI
  // `logprobs` fields. Computed only for the rows that ask.
  int num_top_logprobs = -1;

  // Group g's page table and the entries it held before this step (group 0 without `kv`: the
  // full layout's block_table and num_cached_entries).
  const std::vector<BlockId>& group_blocks(int g) const {
    return g == 0 || kv == nullptr ? *block_table : kv->groups[static_cast<size_t>(g)].blocks;
  }
  int group_cached_entries(int g) const {
    return g == 0 || kv == nullptr ? num_cached_entries
                                   : kv->num_entries(static_cast<size_t>(g)) - num_query_tokens;
  }
};

// A token the step reads that the host has not seen yet (asynchronous scheduling: the engine
// builds step N+1 while step N runs): the token step N sampled for its sequence
// `previous_sequence`. ForwardBatch::token_ids holds 0 at `token_index`; the backend puts the
// sampled token there before the step's forward pass (on the device, where it is).
struct PendingToken {
  int token_index = 0;        // index into ForwardBatch::token_ids
  int previous_sequence = 0;  // index into the previous launched step's sequences (it sampled)
};

struct ForwardBatch {
  std::vector<int32_t> token_ids;  // [num_tokens]
  std::vector<int32_t> positions;  // [num_tokens]
  std::vector<SequenceInput> sequences;
  // Tokens the previous launched step samples (Backend::launch); empty when every token is known.
  std::vector<PendingToken> pending_tokens;
  // Compressions to start this step (kv/compression.h), before the forward pass. Their requests
  // are not among `sequences` until the backend reports them finished. The jobs' tables belong
  // to the requests and stay untouched while the compression is in flight.
  std::vector<CompressionJob> compressions;
  // Wait for every compression in flight (these included) before returning: synchronous
  // compression, or a step with nothing else to run. `sequences` may then be empty.
  bool wait_for_compressions = false;
  bool is_decode_only() const {
    for (const auto& s : sequences) if (s.num_query_tokens != 1) return false;
    return true;
  }
};

struct StepOutput {
  // One entry per sequence: the sampled token, or -1 for LogitsMode::kNone.
  std::vector<int32_t> sampled_tokens;
  // For sequences with LogitsMode::kAll: [num_query_tokens * vocab] logits, fp32; else empty.
  std::vector<std::vector<float>> all_logits;
  // One entry per sequence: log p(logprob_token), or NaN where none was asked for.
  std::vector<float> token_logprobs;
  // One entry per sequence: filled for sequences with num_top_logprobs >= 0, else empty top and
  // NaN logprob.
  std::vector<TokenLogprobs> logprobs;
  // Compressions that finished (or were refused) during this step, each reported once.
  std::vector<CompressionResult> finished_compressions;
  double compression_seconds = 0.0;         // host time this step spent starting or waiting for them
  double compression_device_seconds = 0.0;  // the backend's KVCompressor::device_seconds() so far
  // Where the step's time went, for backends that measure it (0 otherwise): host time before the
  // backend enqueued the step's forward pass (checks, flattened inputs, starting a compression
  // batch), and the step's span on the device (its input upload to its last result copy, timed by
  // the device).
  double prepare_seconds = 0.0;
  double device_seconds = 0.0;
};

}  // namespace origami
