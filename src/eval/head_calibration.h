#pragma once
// TANGRAM's offline budget calibration (paper §4.1) behind `origami calibrate`: prefill sample
// documents with full KV on the CPU backend, score every (layer, KV head, entry) exactly as the
// CPU backend's compression scores it (cpu::score_head over the paged cache and the captured
// window queries, the recipe of the registered policy), run the non-uniform selection of
// AdaKV / TANGRAM eq. 3 per layer (one top-k over all heads' scores, k = ceil(rho * H * N),
// protected entries always kept), and record each head's kept fraction. Over the samples,
// B[l][h] = min(1, mean + alpha * std) (eq. 5; std with the n - 1 divisor, 0 for one sample).
//
//   PrefillScorer scorer = ...create(model_dir, config, recipe, max_tokens, threads);
//   for each sample: retention.push_back(measure_retention(*scorer.score(tokens), rho));
//   HeadBudgets b = summarize_retention(retention, options, model_identity(config));
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "eval/single_sequence_backend.h"
#include "core/status.h"
#include "engine/prompt_builder.h"
#include "kv/compression.h"
#include "kv/head_budgets.h"
#include "model/config.h"

namespace origami::eval {

// The scorers calibration accepts, each the default recipe of the registered policy of that
// name (snapkv: window 32, max pooling 7; keydiff and knorm: window 16).
inline constexpr const char* kCalibrationScorers[] = {"snapkv", "keydiff", "knorm"};
// The recipe of calibration scorer `name`; the error lists the accepted names.
Expected<ScoreRecipe> calibration_recipe(const std::string& name);

// One calibration document.
struct CalibrationSample {
  std::vector<int32_t> token_ids;
  std::string origin;  // "<file>:<line>" (JSONL) or "<file>: document D, tokens A-B" (text)
};

struct SampleReadOptions {
  int max_samples = 50;
  int max_tokens = 2048;  // longer documents are cut into windows of this many tokens
  int min_tokens = 256;   // shorter windows (a document's tail, a short line) are skipped
  // Only documents d with d % document_stride == document_offset are read (a sample spread over a
  // large corpus, and disjoint samples from one file: gate training and its held-out check).
  int document_stride = 1;
  int document_offset = 0;
};

// Documents from `path`. A ".jsonl" file has one JSON object per line whose "prompt" (text or
// token ids) or "messages" is the document, read as `origami generate` reads requests
// (PromptBuilder::from_json; other fields, e.g. a retrieval "answer", are ignored; blank lines
// are skipped; a bad line is an error naming <file>:<line>). Any other file is UTF-8 text
// (eval::read_text_file) whose documents are separated by "\n\0\n" lines, as in
// train_corpus.txt (a file without separators is one document), tokenized as `origami generate`
// tokenizes a prompt. Every document is cut into windows of max_tokens (eval::make_windows);
// windows are taken round-robin across documents (every document's first window, then every
// second window, ...) so that samples come from as many documents as possible, skipping those
// shorter than min_tokens, up to max_samples. Errors: unreadable file, no window long enough.
Expected<std::vector<CalibrationSample>> read_calibration_samples(const std::string& path,
                                                                  const PromptBuilder& builder,
                                                                  const SampleReadOptions& options);

// Per (layer, KV head, entry) scores of one document: [layer][head][entry], higher = keep,
// +inf for the entries the recipe protects (window, sinks).
using HeadScores = std::vector<std::vector<std::vector<float>>>;

// A CPU backend holding the model and a full-KV cache for one document of up to max_tokens.
class PrefillScorer {
 public:
  // Loads the weights of `model_dir` (whose config is `config`) on a CPU backend with
  // `num_threads` threads (0 = all cores).
  static Expected<std::unique_ptr<PrefillScorer>> create(const std::string& model_dir, const ModelConfig& config,
                                                         const ScoreRecipe& recipe, int max_tokens, int num_threads);
  // Prefills `tokens` (1 <= size <= max_tokens) in one step with full KV, capturing the window's
  // queries as a compression at the end of the prompt would, then scores every entry of every
  // (layer, KV head) with the recipe: the same gather and cpu::score_head call the CPU backend's
  // compression makes for a first compression of the whole prompt.
  Expected<HeadScores> score(const std::vector<int32_t>& tokens);

  const ModelConfig& config() const { return config_; }
  const ScoreRecipe& recipe() const { return recipe_; }
  // The backend and the document's page table (pages 1 .. ceil(max_tokens / block_size)), for
  // tests that run the backend's own compression on the prefilled cache; query slot 0 holds the
  // window's queries.
  CpuBackend& backend() { return runner_->backend(); }
  const std::vector<BlockId>& block_table() const { return runner_->block_table(); }
  int block_size() const { return runner_->block_size(); }

 private:
  PrefillScorer() = default;

  ModelConfig config_;
  ScoreRecipe recipe_;
  int max_tokens_ = 0;
  int max_window_ = 1;
  std::unique_ptr<SingleSequenceBackend> runner_;
};

// The non-uniform selection's size for one layer: k = ceil(rho * H * N), raised to the number
// of protected (+inf) entries so that those are always kept and never crowd out each other.
int layer_topk_size(const std::vector<std::vector<float>>& layer_scores, double rho);
// Entries each head keeps when one top-k runs over all heads' scores of a layer ([head][entry],
// every head the same length): the k best (layer, head, entry) by score, ties to the later
// (head, entry) in head-major order, NaN lowest (cpu::select_keep's order over the concatenated
// scores). Returns the per-head counts, summing to k.
std::vector<int> layer_topk_kept_counts(const std::vector<std::vector<float>>& layer_scores, int k);

// One sample's kept fraction per (layer, head), [layer][head], and its length.
struct SampleRetention {
  int num_tokens = 0;
  std::vector<std::vector<double>> kept_fraction;
};
SampleRetention measure_retention(const HeadScores& scores, double rho);

struct CalibrationOptions {
  std::string scorer = "snapkv";
  double alpha = 2.0;
  double rho = 0.25;
};

// B = min(1, mean + alpha * std) per (layer, head) over the samples (at least one), with the
// metadata of the file. The result passes validate_head_budgets().
HeadBudgets summarize_retention(const std::vector<SampleRetention>& samples, const CalibrationOptions& options,
                                const ModelIdentity& model);

}  // namespace origami::eval
