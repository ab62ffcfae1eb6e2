// Whether KVzip's reconstruction scores keep a retrieval document's secret: the measurement behind
// "Why one pass stays the default" (docs/policies.md, `kvzip`). An analysis tool, not a test (the
// scores themselves are checked against a brute force in tests/e2e/eval_kvzip_scorer_test.cpp).
//
//   kvzip_retention DOCS.jsonl NUM_DOCS BUDGET CHUNK ...
//
// Each document (retrieval_dev.jsonl's format; make one with scripts/make_retrieval_set.py), cut
// before "\nQuestion:", is scored by eval::KVzipScorer on origami-tiny-qwen3 for every CHUNK
// (0: one pass after the whole document; N: equal chunks of at most N tokens, each reconstructed
// right after itself). Reported per document and chunk size: the share of the secret's tokens (the
// answer's digits, with the token before and after them) that each (layer, KV head)'s top
// BUDGET - 4 entries after the 4 sinks hold (what a compression to BUDGET keeps), per layer and
// overall (random: about (BUDGET - 4) / n).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval/kvzip_scorer.h"
#include "model/config.h"
#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  using namespace origami;
  if (argc < 5) {
    std::fprintf(stderr, "usage: kvzip_retention DOCS.jsonl NUM_DOCS BUDGET CHUNK ...\n");
    return 2;
  }
  const char* shared = std::getenv("ORIGAMI_SHARED_DIR");
  const std::string model = std::string(shared != nullptr ? shared : ORIGAMI_SHARED_DIR) + "/models/origami-tiny-qwen3";
  const int num_docs = std::atoi(argv[2]), budget = std::atoi(argv[3]);
  std::vector<int> chunks;
  for (int i = 4; i < argc; ++i) chunks.push_back(std::atoi(argv[i]));
  Expected<ModelConfig> config = load_model_config(model);
  Expected<std::shared_ptr<Tokenizer>> tok = Tokenizer::load(model);
  if (!config || !tok) {
    std::fprintf(stderr, "cannot load %s\n", model.c_str());
    return 1;
  }
  std::ifstream in(argv[1]);
  std::string line;
  std::vector<double> sum(chunks.size(), 0.0);
  int doc = 0;
  for (; doc < num_docs && std::getline(in, line); ++doc) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const std::string prompt = j["prompt"], answer = j["answer"];
    const std::string text = prompt.substr(0, prompt.find("\nQuestion:"));
    const size_t at = text.find(answer);
    if (at == std::string::npos) {
      std::fprintf(stderr, "document %d: the answer is not in the document\n", doc);
      return 1;
    }
    const std::vector<int32_t> context = (*tok)->encode(text, false);
    const int n = static_cast<int>(context.size());
    const int lo = static_cast<int>((*tok)->encode(text.substr(0, at), false).size()) - 1;
    const int hi = std::min(n, static_cast<int>((*tok)->encode(text.substr(0, at + answer.size()), false).size()) + 1);
    std::printf("document %d: %d tokens, secret tokens [%d, %d)\n", doc, n, lo, hi);
    for (size_t c = 0; c < chunks.size(); ++c) {
      eval::KVzipOptions options;
      options.prompts = eval::kvzip_prompts(**tok);
      options.chunk_size = chunks[c] > 0 ? chunks[c] : n;
      auto scorer = eval::KVzipScorer::create(model, *config, options, n, 0);
      Expected<eval::KVzipResult> r = scorer ? (*scorer)->score(context, false)
                                             : Expected<eval::KVzipResult>(scorer.status());
      if (!r) {
        std::fprintf(stderr, "%s\n", r.status().message().c_str());
        return 1;
      }
      int kept = 0, total = 0;
      std::printf("  chunk %5d  kept per layer:", chunks[c]);
      for (int l = 0; l < config->num_layers; ++l) {
        int layer_kept = 0, layer_total = 0;
        for (int h = 0; h < config->num_kv_heads; ++h) {
          const std::vector<float>& s = r->scores[l][h];
          std::vector<float> sorted(s.begin() + options.num_sinks, s.end());
          std::sort(sorted.rbegin(), sorted.rend());
          const float threshold = sorted[std::min<size_t>(budget - options.num_sinks - 1, sorted.size() - 1)];
          for (int t = lo; t < hi; ++t, ++layer_total) layer_kept += s[t] >= threshold;
        }
        std::printf(" %d/%d", layer_kept, layer_total);
        kept += layer_kept;
        total += layer_total;
      }
      std::printf("  => %.2f\n", static_cast<double>(kept) / total);
      sum[c] += static_cast<double>(kept) / total;
    }
  }
  for (size_t c = 0; c < chunks.size(); ++c)
    std::printf("chunk %d: mean share kept %.3f over %d documents\n", chunks[c], sum[c] / doc, doc);
  return 0;
}
