#pragma once
// KVzip's importance of every cached KV pair (Kim et al. 2025, "KVzip: query-agnostic KV cache
// compression with context reconstruction"; Fast KVzip's training target, §3.3): prefill the
// context, then let the model reconstruct it — a prompt asking to repeat it, then the context
// again as forced tokens — and score each (layer, KV head, context token) by the largest
// attention it receives from any reconstruction query (every query head of the KV head's GQA
// group, every token of the reconstruction input).
//
// A context of at most chunk_size tokens is reconstructed in one pass after it: the model's
// exact attention. A longer one is reconstructed in ceil(n / chunk_size) equal chunks
// (CpuBackend::kvzip_reconstruction): chunk [s, e) is repeated as "\n\nRepeat the previous
// context exactly." + suffix + context[s, e) in a pass that sees the first 4 tokens (the sinks;
// the first chunk holds them itself) and the chunk, at the positions right after the chunk (the
// sinks re-rotated to sit just before it), so that no query-key distance exceeds sinks + 2 chunk
// + prompt: inside the model's trained context for chunks up to a third of it, where one pass
// after a 2000-token context attends from positions 2000-4000 (the tiny model's is 2048). Each
// chunk's scores are the model's exact attention in its pass. (The reference places its chunks'
// reconstructions after the whole context and quotes the 8 tokens before a later chunk in its
// prompt.) The first 4 tokens score 1 (always kept).
// Runs on the CPU backend in fp32; the hidden states the gates read (the layers' attention
// inputs over the context) come from the same prefill.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "eval/head_calibration.h"
#include "eval/single_sequence_backend.h"
#include "model/config.h"
#include "policy/kvzip_prompt.h"
#include "tokenizer/tokenizer.h"

namespace origami::eval {

struct KVzipPrompts {
  std::vector<int32_t> first;   // before a chunk's copy
  std::vector<int32_t> suffix;  // between the prompt and the copy (a newline: no chat template)
};
// The reference's prompts, tokenized without special tokens.
KVzipPrompts kvzip_prompts(const Tokenizer& tokenizer);

struct KVzipOptions {
  KVzipPrompts prompts;
  int chunk_size = 2048;  // most context tokens per reconstruction pass (the reference's chunk)
  int num_sinks = kKVzipSinks;    // leading tokens scored 1, and kept in later chunks' passes
};

struct KVzipResult {
  HeadScores scores;                       // [layer][kv head][context token], in [0, 1]
  std::vector<std::vector<float>> hidden;  // [layer][token * hidden]: attention inputs (if asked)
};

class KVzipScorer {
 public:
  // A CPU backend for contexts of up to max_context tokens.
  static Expected<std::unique_ptr<KVzipScorer>> create(const std::string& model_dir, const ModelConfig& config,
                                                       const KVzipOptions& options, int max_context,
                                                       int num_threads);

  // Scores a context of 1 .. max_context tokens; with keep_hidden the layers' attention inputs
  // over the context are returned too.
  Expected<KVzipResult> score(const std::vector<int32_t>& context, bool keep_hidden);

  // The reconstruction input of chunk [begin, end) of `context`: prompt, suffix, the chunk.
  std::vector<int32_t> reconstruction_tokens(const std::vector<int32_t>& context, int begin, int end) const;
  const KVzipOptions& options() const { return options_; }
  const ModelConfig& config() const { return config_; }

 private:
  KVzipScorer() = default;

  ModelConfig config_;
  KVzipOptions options_;
  int max_context_ = 0;
  std::unique_ptr<SingleSequenceBackend> runner_;
};

}  // namespace origami::eval
