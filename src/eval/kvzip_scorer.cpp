#include "eval/kvzip_scorer.h"

#include "backend/cpu/kvzip_scores.h"
#include "policy/kvzip_prompt.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace origami::eval {

KVzipPrompts kvzip_prompts(const Tokenizer& tokenizer) {
  KVzipPrompts p;
  p.first = tokenizer.encode(kKVzipRepeatPrompt, /*add_special_tokens=*/false);
  p.next = tokenizer.encode(kKVzipRepeatPartPrompt, /*add_special_tokens=*/false);
  p.suffix = tokenizer.encode(kKVzipPromptSuffix, /*add_special_tokens=*/false);
  return p;
}

Expected<std::unique_ptr<KVzipScorer>> KVzipScorer::create(const std::string& model_dir, const ModelConfig& config,
                                                           const KVzipOptions& options, int max_context,
                                                           int num_threads) {
  if (max_context < 1) return invalid_argument("kvzip: max context must be >= 1");
  if (options.chunk_size < 1 || options.num_sinks < 0 || options.previous_tail < 0)
    return invalid_argument("kvzip: chunk size must be >= 1, sinks and previous tail >= 0");
  if (options.prompts.first.empty() || options.prompts.next.empty())
    return invalid_argument("kvzip: the reconstruction prompts are empty");
  std::unique_ptr<KVzipScorer> s(new KVzipScorer());
  s->config_ = config;
  s->options_ = options;
  s->max_context_ = max_context;
  s->pool_ = std::make_unique<cpu::ThreadPool>(num_threads);
  const int longest_prompt =
      static_cast<int>(std::max(options.prompts.first.size(), options.prompts.next.size() + options.previous_tail) +
                       options.prompts.suffix.size());
  const int max_tokens = max_context + longest_prompt + std::min(options.chunk_size, max_context);
  ORIGAMI_ASSIGN_OR_RETURN(s->runner_, SingleSequenceBackend::create(model_dir, config, max_tokens, num_threads));
  return s;
}

std::vector<int32_t> KVzipScorer::reconstruction_tokens(const std::vector<int32_t>& context, int begin,
                                                        int end) const {
  std::vector<int32_t> r;
  if (begin == 0) {
    r = options_.prompts.first;
  } else {
    r = options_.prompts.next;
    const int tail_begin = std::max(0, begin - options_.previous_tail);
    r.insert(r.end(), context.begin() + tail_begin, context.begin() + begin);
  }
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
  const int layers = c.num_layers, heads = c.num_kv_heads, d = c.head_dim, hidden = c.hidden_size;
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

  // One reconstruction pass per chunk, scored as its layers run.
  cpu::CpuKVCache& kv = backend.kv_cache();
  const std::vector<BlockId>& table = runner_->block_table();
  const int bs = runner_->block_size();
  for (int begin = 0; begin < n; begin += options_.chunk_size) {
    const int end = std::min(n, begin + options_.chunk_size);
    const std::vector<int32_t> repeat = reconstruction_tokens(context, begin, end);
    const int r = static_cast<int>(repeat.size());
    const int sinks = std::min(options_.num_sinks, begin);
    const int num_ctx = sinks + (end - begin);  // context keys in the softmax: sinks, then the chunk
    backend.set_layer_observer([&](const CpuBackend::LayerActivations& a) {
      cpu::ReconstructionLayer layer;
      layer.qkv = a.qkv;
      layer.qkv_width = a.qkv_width;
      layer.num_tokens = r;
      layer.num_heads = c.num_heads;
      layer.num_kv_heads = heads;
      layer.head_dim = d;
      // The sinks, then the chunk.
      layer.context_key = [&](int h, int i) {
        const int e = i < sinks ? i : begin + (i - sinks);
        return static_cast<const float*>(kv.key_at(a.layer, table[e / bs], h, e % bs));
      };
      layer.num_context = num_ctx;
      layer.first_scored = sinks;
      std::vector<float*> best(heads);
      for (int h = 0; h < heads; ++h) best[h] = result.scores[a.layer][h].data() + begin;
      cpu::accumulate_reconstruction_scores(layer, best.data(), pool_.get());
    });
    st = runner_->run(repeat, n);
    backend.set_layer_observer({});
    ORIGAMI_RETURN_IF_ERROR(st);
  }
  for (auto& layer : result.scores)
    for (auto& head : layer) std::fill(head.begin(), head.begin() + std::min(n, options_.num_sinks), 1.0f);
  return result;
}

}  // namespace origami::eval
