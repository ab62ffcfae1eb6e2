#include "eval/kvzip_scorer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace origami::eval {

KVzipPrompts kvzip_prompts(const Tokenizer& tokenizer) {
  KVzipPrompts p;
  p.first = tokenizer.encode("\n\nRepeat the previous context exactly.", /*add_special_tokens=*/false);
  p.next = tokenizer.encode("\n\nRepeat the part of the previous context exactly, starting with",
                            /*add_special_tokens=*/false);
  p.suffix = tokenizer.encode("\n", /*add_special_tokens=*/false);
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
  s->num_threads_ = num_threads;
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
  const int group = c.num_heads / heads, q_size = c.q_size();
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
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int begin = 0; begin < n; begin += options_.chunk_size) {
    const int end = std::min(n, begin + options_.chunk_size);
    const std::vector<int32_t> repeat = reconstruction_tokens(context, begin, end);
    const int r = static_cast<int>(repeat.size());
    const int sinks = std::min(options_.num_sinks, begin);
    const int num_ctx = sinks + (end - begin);  // context keys in the softmax: sinks, then the chunk
    backend.set_layer_observer([&](const CpuBackend::LayerActivations& a) {
#pragma omp parallel for schedule(static) num_threads(std::max(1, num_threads_))
      for (int h = 0; h < heads; ++h) {
        std::vector<float> keys(static_cast<size_t>(num_ctx + r) * d);
        for (int i = 0; i < num_ctx; ++i) {
          const int e = i < sinks ? i : begin + (i - sinks);
          std::memcpy(&keys[static_cast<size_t>(i) * d], kv.key_at(a.layer, table[e / bs], h, e % bs),
                      d * sizeof(float));
        }
        for (int t = 0; t < r; ++t)
          std::memcpy(&keys[static_cast<size_t>(num_ctx + t) * d],
                      a.qkv + static_cast<size_t>(t) * a.qkv_width + q_size + h * d, d * sizeof(float));
        std::vector<float> logits(num_ctx + r);
        float* best = result.scores[a.layer][h].data() + begin;
        for (int j = 0; j < group; ++j) {
          for (int t = 0; t < r; ++t) {
            const float* q = a.qkv + static_cast<size_t>(t) * a.qkv_width + static_cast<size_t>(h * group + j) * d;
            const int len = num_ctx + t + 1;  // causal inside the reconstruction
            float m = -INFINITY;
            for (int k = 0; k < len; ++k) {
              const float* key = &keys[static_cast<size_t>(k) * d];
              float dot = 0.0f;
              for (int i = 0; i < d; ++i) dot += q[i] * key[i];
              logits[k] = dot * scale;
              m = std::max(m, logits[k]);
            }
            double sum = 0.0;
            for (int k = 0; k < len; ++k) sum += std::exp(static_cast<double>(logits[k] - m));
            for (int k = sinks; k < num_ctx; ++k) {
              const float p = static_cast<float>(std::exp(static_cast<double>(logits[k] - m)) / sum);
              best[k - sinks] = std::max(best[k - sinks], p);
            }
          }
        }
      }
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
