#pragma once
// KVzip's importance of every cached KV pair (Kim et al. 2025, "KVzip: query-agnostic KV cache
// compression with context reconstruction"; Fast KVzip's training target, §3.3): prefill the
// context, then let the model reconstruct it — a prompt asking to repeat it, then the context
// again as forced tokens — and score each (layer, KV head, context token) by the largest
// attention it receives from any reconstruction query (every query head of the KV head's GQA
// group, every token of the reconstruction input).
//
// Long contexts are reconstructed chunk by chunk, as the reference implementation does: chunk c
// = tokens [s, e) is repeated after the whole context with
//   first chunk:  "\n\nRepeat the previous context exactly." + suffix + context[s, e)
//   later chunks: "\n\nRepeat the part of the previous context exactly, starting with"
//                 + context[s - 8, s) + suffix + context[s, e)
// and its scores are the softmax over the chunk's keys, the first 4 keys (the sinks; none for the
// first chunk, which starts there) and the reconstruction's own keys (causal); each chunk's
// reconstruction replaces the previous one in the cache. A context of one chunk is scored with
// the model's exact attention. The first 4 tokens score 1 (always kept).
// Runs on the CPU backend in fp32; the hidden states the gates read (the layers' attention
// inputs over the context) come from the same prefill.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_thread_pool.h"
#include "core/status.h"
#include "eval/head_calibration.h"
#include "eval/single_sequence_backend.h"
#include "model/config.h"
#include "policy/kvzip_prompt.h"
#include "tokenizer/tokenizer.h"

namespace origami::eval {

struct KVzipPrompts {
  std::vector<int32_t> first;   // before the first chunk's copy
  std::vector<int32_t> next;    // before a later chunk's copy (then the previous 8 tokens)
  std::vector<int32_t> suffix;  // between the prompt and the copy (a newline: no chat template)
};
// The reference's prompts, tokenized without special tokens.
KVzipPrompts kvzip_prompts(const Tokenizer& tokenizer);

struct KVzipOptions {
  KVzipPrompts prompts;
  int chunk_size = 2048;  // context tokens reconstructed per pass (the reference's)
  int num_sinks = kKVzipSinks;  // leading tokens scored 1, and kept in later chunks' softmax
  int previous_tail = 8;  // tokens of the previous chunk quoted in a later chunk's prompt
};

struct KVzipResult {
  HeadScores scores;                       // [layer][kv head][context token], in [0, 1]
  std::vector<std::vector<float>> hidden;  // [layer][token * hidden]: attention inputs (if asked)
};

class KVzipScorer {
 public:
  // A CPU backend for contexts of up to max_context tokens (plus one chunk's reconstruction).
  static Expected<std::unique_ptr<KVzipScorer>> create(const std::string& model_dir, const ModelConfig& config,
                                                       const KVzipOptions& options, int max_context,
                                                       int num_threads);

  // Scores a context of 1 .. max_context tokens; with keep_hidden the layers' attention inputs
  // over the context are returned too.
  Expected<KVzipResult> score(const std::vector<int32_t>& context, bool keep_hidden);

  // The reconstruction input of chunk [begin, end) of `context` (tests rebuild it).
  std::vector<int32_t> reconstruction_tokens(const std::vector<int32_t>& context, int begin, int end) const;
  const KVzipOptions& options() const { return options_; }
  const ModelConfig& config() const { return config_; }

 private:
  KVzipScorer() = default;

  ModelConfig config_;
  KVzipOptions options_;
  int max_context_ = 0;
  std::unique_ptr<cpu::ThreadPool> pool_;  // KV heads scored in parallel
  std::unique_ptr<SingleSequenceBackend> runner_;
};

}  // namespace origami::eval
