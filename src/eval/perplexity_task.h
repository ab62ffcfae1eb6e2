#pragma once
// Perplexity under compression: a text is tokenized once, cut into non-overlapping windows of
// `context` tokens, and each window is fed as forced decode tokens after its first token, so
// decode-time compression runs through it while the engine reports log p(token). Perplexity is
// token-weighted over all windows: exp(sum of NLL / number of predicted tokens).
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "eval/eval_item.h"

namespace origami::eval {

// The whole file as UTF-8 text, without a leading byte-order mark. Errors name the path.
Expected<std::string> read_text_file(const std::string& path);

// Consecutive windows of `context` tokens (the last one may be shorter; windows of fewer than
// two tokens predict nothing and are dropped). `limit` > 0 keeps the first `limit` windows.
std::vector<std::vector<int32_t>> make_windows(const std::vector<int32_t>& tokens, int context, int limit = 0);

// prompt = the window's first token, forced = the rest, with their log-probabilities returned.
EvalItem make_perplexity_item(const std::vector<int32_t>& window);

// Sum of negative log-likelihoods over predicted tokens.
struct NllTotal {
  double nll_sum = 0.0;
  int64_t num_tokens = 0;

  void add_logprobs(const std::vector<float>& logprobs) {
    for (float lp : logprobs) nll_sum -= static_cast<double>(lp);
    num_tokens += static_cast<int64_t>(logprobs.size());
  }
  double mean_nll() const { return num_tokens ? nll_sum / static_cast<double>(num_tokens) : 0.0; }
  double perplexity() const;  // exp(mean NLL); NaN with no tokens
};

// Adds the log-probabilities of every completed window to point->nll; failed windows are
// counted in num_failed and left out of the perplexity.
struct PointResult;
void score_perplexity(const std::vector<EvalItemResult>& results, PointResult* point);

}  // namespace origami::eval
