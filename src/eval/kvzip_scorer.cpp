#include "eval/kvzip_scorer.h"

#include "policy/kvzip_prompt.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace origami::eval {

KVzipPrompts kvzip_prompts(const Tokenizer& tokenizer) {
  KVzipPrompts p;
  p.first = tokenizer.encode(kKVzipRepeatPrompt, /*add_special_tokens=*/false);
  p.suffix = tokenizer.encode(kKVzipPromptSuffix, /*add_special_tokens=*/false);
  return p;
}

Expected<std::unique_ptr<KVzipScorer>> KVzipScorer::create(const std::string& model_dir, const ModelConfig& config,
                                                           const KVzipOptions& options, int max_context,
                                                           int num_threads) {
  if (max_context < 1) return invalid_argument("kvzip: max context must be >= 1");
  if (options.chunk_size < 1 || options.num_sinks < 0)
    return invalid_argument("kvzip: chunk size must be >= 1, sinks >= 0");
  if (options.prompts.first.empty()) return invalid_argument("kvzip: the reconstruction prompt is empty");
  std::unique_ptr<KVzipScorer> s(new KVzipScorer());
  s->config_ = config;
  s->options_ = options;
  s->max_context_ = max_context;
  // The reconstruction runs in the backend's own scratch cache: this one holds the context.
  ORIGAMI_ASSIGN_OR_RETURN(s->runner_, SingleSequenceBackend::create(model_dir, config, max_context, num_threads));
  return s;
}

std::vector<int32_t> KVzipScorer::reconstruction_tokens(const std::vector<int32_t>& context, int begin,
                                                        int end) const {
  std::vector<int32_t> r = options_.prompts.first;
  r.insert(r.end(), options_.prompts.suffix.begin(), options_.prompts.suffix.end());
  r.insert(r.end(), context.begin() + begin, context.begin() + end);
  return r;
}

Expected<KVzipResult> KVzipScorer::score(const std::vector<int32_t>& context, bool keep_hidden) {
  const int n = static_cast<int>(context.size());
  if (n < 1 || n > max_context_)
    return invalid_argument("kvzip: a context of " + std::to_string(n) + " tokens is outside [1, " +
                            std::to_string(max_context_) + "]");
  const ModelConfig& c = config_;
  const int layers = c.num_layers, heads = c.num_kv_heads, hidden = c.hidden_size;
  KVzipResult result;
  result.scores.assign(layers, std::vector<std::vector<float>>(heads, std::vector<float>(n, 0.0f)));
  CpuBackend& backend = runner_->backend();

  // The context's prefill, keeping the gates' inputs.
  if (keep_hidden) {
    result.hidden.assign(layers, std::vector<float>(static_cast<size_t>(n) * hidden));
    backend.set_layer_observer([&](const CpuBackend::LayerActivations& a) {
      std::memcpy(result.hidden[a.layer].data(), a.normed_input, static_cast<size_t>(n) * hidden * sizeof(float));
    });
  }
  Status st = runner_->run(context, 0);
  backend.set_layer_observer({});
  ORIGAMI_RETURN_IF_ERROR(st);

  // The reconstruction, chunk by chunk, in the backend's scratch cache.
  CpuBackend::KVzipReconstruction rec;
  rec.block_table = &runner_->block_table();
  rec.num_entries = n;
  rec.context_tokens = context.data();
  rec.prompt = reconstruction_tokens(context, 0, 0);
  rec.chunk_size = options_.chunk_size;
  rec.num_sinks = options_.num_sinks;
  std::vector<float> flat(static_cast<size_t>(layers) * heads * n, 0.0f);
  ORIGAMI_RETURN_IF_ERROR(backend.kvzip_reconstruction(rec, flat.data()));
  for (int l = 0; l < layers; ++l)
    for (int h = 0; h < heads; ++h) {
      const float* row = flat.data() + (static_cast<size_t>(l) * heads + h) * n;
      std::copy(row, row + n, result.scores[l][h].begin());
    }
  for (auto& layer : result.scores)
    for (auto& head : layer) std::fill(head.begin(), head.begin() + std::min(n, options_.num_sinks), 1.0f);
  return result;
}

}  // namespace origami::eval
