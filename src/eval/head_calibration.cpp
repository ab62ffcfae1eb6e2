#include "eval/head_calibration.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "backend/cpu/compression_ops.h"
#include "core/check.h"
#include "core/json_parse.h"
#include "eval/perplexity_task.h"
#include "policy/policy_registry.h"

namespace origami::eval {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A document's windows, each with where it came from.
struct DocumentWindows {
  std::vector<CalibrationSample> windows;
};

DocumentWindows cut_document(const std::vector<int32_t>& tokens, const std::string& origin, bool text,
                             const SampleReadOptions& options) {
  DocumentWindows doc;
  int start = 0;
  for (std::vector<int32_t>& w : make_windows(tokens, options.max_tokens)) {
    const int len = static_cast<int>(w.size());
    if (len >= options.min_tokens) {
      CalibrationSample s;
      s.origin = text ? origin + ", tokens " + std::to_string(start) + "-" + std::to_string(start + len - 1) : origin;
      s.token_ids = std::move(w);
      doc.windows.push_back(std::move(s));
    }
    start += len;
  }
  return doc;
}

}  // namespace

Expected<ScoreRecipe> calibration_recipe(const std::string& name) {
  std::string accepted;
  for (const char* s : kCalibrationScorers) {
    accepted += (accepted.empty() ? "" : ", ") + std::string(s);
    if (name != s) continue;
    ORIGAMI_ASSIGN_OR_RETURN(std::shared_ptr<const KVPolicy> policy, PolicyRegistry::builtin().create(name));
    return policy->score_recipe();
  }
  return invalid_argument("--scorer: unknown scorer '" + name + "'; accepted: " + accepted);
}

Expected<std::vector<CalibrationSample>> read_calibration_samples(const std::string& path,
                                                                  const PromptBuilder& builder,
                                                                  const SampleReadOptions& options) {
  if (options.max_tokens < 1 || options.min_tokens < 1 || options.min_tokens > options.max_tokens)
    return invalid_argument("calibration samples: need 1 <= min tokens (" + std::to_string(options.min_tokens) +
                            ") <= max tokens (" + std::to_string(options.max_tokens) + ")");
  if (options.document_stride < 1 || options.document_offset < 0 || options.document_offset >= options.document_stride)
    return invalid_argument("samples: need 0 <= document offset (" + std::to_string(options.document_offset) +
                            ") < document stride (" + std::to_string(options.document_stride) + ")");
  auto wanted = [&](int d) { return d % options.document_stride == options.document_offset; };
  std::vector<DocumentWindows> docs;
  if (ends_with(path, ".jsonl")) {
    std::ifstream in(path);
    if (!in) return not_found(path + ": cannot open file");
    std::string line;
    for (int line_no = 1, d = 0; std::getline(in, line); ++line_no) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      if (!wanted(d++)) continue;
      const std::string where = path + ":" + std::to_string(line_no);
      Expected<nlohmann::json> parsed = parse_json(line, kRequestJsonMaxDepth);
      if (!parsed) return invalid_argument(where + ": invalid JSON: " + parsed.status().message());
      const nlohmann::json j = std::move(*parsed);
      if (!j.is_object()) return invalid_argument(where + ": expected a JSON object with \"prompt\" or \"messages\"");
      Expected<std::vector<int32_t>> ids = builder.from_json(j);
      if (!ids) return invalid_argument(where + ": " + ids.status().message());
      docs.push_back(cut_document(*ids, where, false, options));
    }
  } else {
    ORIGAMI_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
    static const std::string kSeparator("\n\0\n", 3);
    size_t begin = 0;
    for (int d = 0; begin <= text.size(); ++d) {
      const size_t end = std::min(text.find(kSeparator, begin), text.size());
      const std::string doc = text.substr(begin, end - begin);
      if (wanted(d) && doc.find_first_not_of(" \t\r\n") != std::string::npos) {
        Expected<std::vector<int32_t>> ids = builder.from_text(doc);
        if (!ids) return invalid_argument(path + ": document " + std::to_string(d) + ": " + ids.status().message());
        docs.push_back(cut_document(*ids, path + ": document " + std::to_string(d), true, options));
      }
      if (end == text.size()) break;
      begin = end + kSeparator.size();
    }
  }
  std::vector<CalibrationSample> samples;
  for (size_t round = 0; static_cast<int>(samples.size()) < options.max_samples; ++round) {
    bool any = false;
    for (DocumentWindows& doc : docs) {
      if (round >= doc.windows.size()) continue;
      any = true;
      samples.push_back(std::move(doc.windows[round]));
      if (static_cast<int>(samples.size()) == options.max_samples) break;
    }
    if (!any) break;
  }
  if (samples.empty())
    return invalid_argument(path + ": no document of at least " + std::to_string(options.min_tokens) +
                            " tokens (lower --min-tokens or give longer documents)");
  return samples;
}

Expected<std::unique_ptr<PrefillScorer>> PrefillScorer::create(const std::string& model_dir, const ModelConfig& config,
                                                               const ScoreRecipe& recipe, int max_tokens,
                                                               int num_threads) {
  if (max_tokens < 1) return invalid_argument("calibration: max tokens must be >= 1");
  if (max_tokens > config.max_position_embeddings)
    return invalid_argument("calibration: samples of " + std::to_string(max_tokens) +
                            " tokens exceed the model's context of " + std::to_string(config.max_position_embeddings));
  std::unique_ptr<PrefillScorer> s(new PrefillScorer());
  s->config_ = config;
  s->recipe_ = recipe;
  s->max_tokens_ = max_tokens;
  ORIGAMI_ASSIGN_OR_RETURN(s->runner_, SingleSequenceBackend::create(model_dir, config, max_tokens, num_threads));
  // One query slot for the window's queries (scorers that read none leave it unused).
  s->max_window_ = std::max(1, recipe.window);
  CompressionConfig cc;
  cc.num_query_slots = 1;
  cc.max_window = s->max_window_;
  ORIGAMI_RETURN_IF_ERROR(s->runner_->backend().configure_compression(cc));
  return s;
}

Expected<HeadScores> PrefillScorer::score(const std::vector<int32_t>& tokens) {
  const int n = static_cast<int>(tokens.size());
  if (n < 1 || n > max_tokens_)
    return invalid_argument("calibration: a sample of " + std::to_string(n) + " tokens is outside [1, " +
                            std::to_string(max_tokens_) + "]");
  const int w = std::min(recipe_.window, n);
  const bool capture = recipe_.needs_queries();
  ORIGAMI_RETURN_IF_ERROR(runner_->run(tokens, 0, capture ? 0 : -1, n - w));

  // The gather and score_head call of cpu::run_compression (cpu_compression.cpp) for a first
  // compression of the whole prompt: keys and values in entry order, the window's queries from
  // the rows keyed by position, no global score.
  cpu::CpuKVCache& kv = runner_->backend().kv_cache();
  const std::vector<BlockId>& table = runner_->block_table();
  const int layers = config_.num_layers, heads = config_.num_kv_heads, d = config_.head_dim;
  const int group_size = config_.num_heads / heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int bs = runner_->block_size();
  HeadScores scores(layers, std::vector<std::vector<float>>(heads));
  std::vector<float> keys(static_cast<size_t>(n) * d), values(static_cast<size_t>(n) * d), window_q;
  for (int l = 0; l < layers; ++l) {
    for (int h = 0; h < heads; ++h) {
      for (int e = 0; e < n; ++e) {
        std::memcpy(keys.data() + static_cast<size_t>(e) * d, kv.key_at(l, table[e / bs], h, e % bs), d * sizeof(float));
        std::memcpy(values.data() + static_cast<size_t>(e) * d, kv.value_at(l, table[e / bs], h, e % bs),
                    d * sizeof(float));
      }
      window_q.clear();
      if (capture) {
        window_q.resize(static_cast<size_t>(w) * group_size * d);
        for (int q = 0; q < w; ++q) {
          const float* row = kv.query_row(l, 0, (n - w + q) % max_window_) + static_cast<size_t>(h) * group_size * d;
          std::memcpy(window_q.data() + static_cast<size_t>(q) * group_size * d, row,
                      static_cast<size_t>(group_size) * d * sizeof(float));
        }
      }
      std::vector<float>& s = scores[l][h];
      s.resize(n);
      cpu::score_head(recipe_, keys.data(), n, d, capture ? window_q.data() : nullptr, group_size, scale, bs,
                      nullptr, 0, /*first_compression=*/true, s.data(), /*num_keep=*/0, values.data());
    }
  }
  return scores;
}

int layer_topk_size(const std::vector<std::vector<float>>& layer_scores, double rho) {
  const int heads = static_cast<int>(layer_scores.size());
  const int n = heads ? static_cast<int>(layer_scores[0].size()) : 0;
  int protected_entries = 0;
  for (const auto& head : layer_scores)
    for (float s : head) protected_entries += (std::isinf(s) && s > 0) ? 1 : 0;
  const int64_t total = static_cast<int64_t>(heads) * n;
  const int64_t k = static_cast<int64_t>(std::ceil(rho * static_cast<double>(total) - 1e-9));
  return static_cast<int>(std::clamp<int64_t>(std::max<int64_t>(k, protected_entries), 0, total));
}

std::vector<int> layer_topk_kept_counts(const std::vector<std::vector<float>>& layer_scores, int k) {
  const int heads = static_cast<int>(layer_scores.size());
  const int n = heads ? static_cast<int>(layer_scores[0].size()) : 0;
  std::vector<float> flat;
  flat.reserve(static_cast<size_t>(heads) * n);
  for (const auto& head : layer_scores) {
    ORIGAMI_CHECK(static_cast<int>(head.size()) == n);
    flat.insert(flat.end(), head.begin(), head.end());
  }
  std::vector<int32_t> kept(k);
  cpu::select_keep(flat.data(), static_cast<int>(flat.size()), k, kept.data());
  std::vector<int> counts(heads, 0);
  for (int32_t i : kept) ++counts[i / n];
  return counts;
}

SampleRetention measure_retention(const HeadScores& scores, double rho) {
  SampleRetention r;
  r.num_tokens = scores.empty() || scores[0].empty() ? 0 : static_cast<int>(scores[0][0].size());
  for (const auto& layer : scores) {
    const std::vector<int> counts = layer_topk_kept_counts(layer, layer_topk_size(layer, rho));
    std::vector<double> fractions;
    for (int c : counts) fractions.push_back(static_cast<double>(c) / static_cast<double>(r.num_tokens));
    r.kept_fraction.push_back(std::move(fractions));
  }
  return r;
}

HeadBudgets summarize_retention(const std::vector<SampleRetention>& samples, const CalibrationOptions& options,
                                const ModelIdentity& model) {
  ORIGAMI_CHECK(!samples.empty());
  HeadBudgets b;
  b.model = model;
  b.scorer = options.scorer;
  b.alpha = options.alpha;
  b.rho = options.rho;
  b.samples = static_cast<int>(samples.size());
  for (const SampleRetention& s : samples) b.sample_tokens.push_back(s.num_tokens);
  const double count = static_cast<double>(samples.size());
  double longest = 1.0;
  for (const SampleRetention& s : samples) longest = std::max(longest, static_cast<double>(s.num_tokens));
  for (int l = 0; l < model.num_layers; ++l) {
    std::vector<double> ratio, mean, stddev;
    for (int h = 0; h < model.num_kv_heads; ++h) {
      double sum = 0.0;
      for (const SampleRetention& s : samples) sum += s.kept_fraction[l][h];
      const double mu = sum / count;
      double sq = 0.0;
      for (const SampleRetention& s : samples) sq += (s.kept_fraction[l][h] - mu) * (s.kept_fraction[l][h] - mu);
      const double sigma = samples.size() > 1 ? std::sqrt(sq / (count - 1.0)) : 0.0;
      mean.push_back(mu);
      stddev.push_back(sigma);
      // A head that kept nothing in every sample (possible only without a protected window)
      // still gets one token of the longest sample, so that B stays in (0, 1].
      ratio.push_back(std::clamp(mu + options.alpha * sigma, 1.0 / longest, 1.0));
    }
    b.ratios.push_back(std::move(ratio));
    b.mean.push_back(std::move(mean));
    b.stddev.push_back(std::move(stddev));
  }
  return b;
}

}  // namespace origami::eval
