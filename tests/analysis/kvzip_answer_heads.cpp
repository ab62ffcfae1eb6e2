// Which heads carry a retrieval answer, and what KVzip's reconstruction does in them: the
// measurement behind "Which heads answer, and why uniform budgets lose the secret"
// (docs/policies.md, `kvzip`). An analysis tool, not a test.
//
//   kvzip_answer_heads DOCS.jsonl NUM_DOCS [BUDGET]
//
// Each document (retrieval_dev.jsonl's format; scripts/make_retrieval_set.py) is tokenized as
// `origami eval retrieval` tokenizes it (eval::make_retrieval_item: the whole prompt, cut at the
// question for context mode) on origami-tiny-qwen3, fp32 CPU backend.
//   1. Answer: the whole prompt, then the answer's tokens " ", d1, d2, d3 as forced tokens, with
//      full KV. For the query that predicts answer token k (" ", then each digit), the attention
//      each query head pays to the matching token of the secret in the document (the " " before
//      the digits, then each digit): the copy an induction head makes.
//   2. Reconstruction, recomputed here by brute force independently of CpuBackend::
//      kvzip_reconstruction: the document prefilled, then the repeat prompt and the document
//      again at the positions right after it, every query captured, softmax over all keys in
//      double. For the same query heads, the attention the copy's query that predicts each
//      secret token pays to it (the reconstruction's twin of 1.), the largest attention any
//      reconstruction query pays to it, and KVzip's score (eval::KVzipScorer, one pass, max over
//      the GQA group) with its rank among the document's entries after the 4 sinks (0 = best)
//      and whether the top BUDGET - 4 hold it. The brute-force max over the group must equal the
//      scorer's (printed: max |difference|), which checks the scorer's alignment.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "retrieval_probe.h"

int main(int argc, char** argv) {
  using namespace origami;
  using namespace origami::analysis;
  if (argc < 3) {
    std::fprintf(stderr, "usage: kvzip_answer_heads DOCS.jsonl NUM_DOCS [BUDGET]\n");
    return 2;
  }
  const int num_docs = std::atoi(argv[2]), budget = argc > 3 ? std::atoi(argv[3]) : 512;
  Expected<ProbeModel> m = load_probe_model();
  if (!m) {
    std::fprintf(stderr, "%s\n", m.status().message().c_str());
    return 1;
  }
  const ModelConfig& c = m->config;
  const int L = c.num_layers, H = c.num_heads, KV = c.num_kv_heads, G = H / KV;
  // Per (layer, query head), summed over documents and the 5 answer tokens.
  std::vector<double> answer_att(L * H, 0.0), copy_att(L * H, 0.0), max_att(L * H, 0.0);
  std::vector<double> score_sum(L * KV, 0.0), rank_sum(L * KV, 0.0), kept_sum(L * KV, 0.0);
  double max_diff = 0.0;
  int docs = 0, samples = 0;
  std::ifstream in(argv[1]);
  std::string line;
  for (; docs < num_docs && std::getline(in, line); ++docs) {
    Expected<DocProbe> probe = probe_document(*m, line, false);
    if (!probe) {
      std::fprintf(stderr, "document %d: %s\n", docs, probe.status().message().c_str());
      return 1;
    }
    const RetrievalDoc* doc = &probe->doc;
    const std::vector<int32_t>& rec = probe->rec;
    const int n = doc->n, full = static_cast<int>(doc->ids.size()), p = static_cast<int>(rec.size()) - n;
    std::printf("document %d: %d document tokens (+%d question), secret digits at %d..%d\n", docs, n, full - n,
                doc->secret, doc->secret + 3);
    const std::vector<int32_t> context(doc->ids.begin(), doc->ids.begin() + n);
    eval::KVzipOptions options;
    options.prompts = m->prompts;
    options.chunk_size = n;
    auto scorer = eval::KVzipScorer::create(m->dir, c, options, n, 1);
    Expected<eval::KVzipResult> scores =
        scorer ? (*scorer)->score(context, false) : Expected<eval::KVzipResult>(scorer.status());
    if (!scores) {
      std::fprintf(stderr, "%s\n", scores.status().message().c_str());
      return 1;
    }
    const std::vector<double>& doc_answer = probe->answer;
    const auto keys = cached_keys(*probe->runner, c, n + static_cast<int>(rec.size()));
    std::vector<double> doc_copy(L * H, 0.0), doc_max(L * H, 0.0), a;
    for (int l = 0; l < L; ++l)
      for (int kv = 0; kv < KV; ++kv) {
        std::vector<double> group_max(n, 0.0);
        for (int j = 0; j < G; ++j) {
          const int h = kv * G + j;
          std::vector<double> head_max(n, 0.0);
          for (int t = 0; t < static_cast<int>(rec.size()); ++t) {
            attention(probe->queries.at(c, l, t, h), keys[l][kv], c.head_dim, n + t + 1, &a);
            for (int i = 0; i < n; ++i) head_max[i] = std::max(head_max[i], a[i]);
            // The copy's query that predicts secret token k: the copy of the token before it.
            for (int k = 0; k < 5; ++k)
              if (t == p + doc->secret - 2 + k) doc_copy[l * H + h] += a[doc->secret - 1 + k] / 5;
          }
          for (int k = 0; k < 5; ++k) doc_max[l * H + h] += head_max[doc->secret - 1 + k] / 5;
          for (int i = 0; i < n; ++i) group_max[i] = std::max(group_max[i], head_max[i]);
        }
        const std::vector<float>& s = scores->scores[l][kv];
        for (int i = options.num_sinks; i < n; ++i)
          max_diff = std::max(max_diff, std::abs(group_max[i] - static_cast<double>(s[i])));
        for (int k = 0; k < 5; ++k) {
          const int e = doc->secret - 1 + k;
          int rank = 0;
          for (int i = options.num_sinks; i < n; ++i) rank += s[i] > s[e];
          score_sum[l * KV + kv] += s[e];
          rank_sum[l * KV + kv] += static_cast<double>(rank) / (n - options.num_sinks);
          kept_sum[l * KV + kv] += rank < budget - options.num_sinks;
        }
      }
    for (int i = 0; i < L * H; ++i) {
      answer_att[i] += doc_answer[i];
      copy_att[i] += doc_copy[i];
      max_att[i] += doc_max[i];
    }
    samples += 5;
    std::printf("  heads by answer attention to the secret (layer.head answer/copy/max):");
    std::vector<int> order(L * H);
    for (int i = 0; i < L * H; ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](int a, int b) { return doc_answer[a] > doc_answer[b]; });
    for (int i = 0; i < 6; ++i)
      std::printf(" %d.%d %.2f/%.2f/%.2f", order[i] / H, order[i] % H, doc_answer[order[i]], doc_copy[order[i]],
                  doc_max[order[i]]);
    std::printf("\n");
    std::fflush(stdout);
  }
  std::printf("\nmean over %d documents and the secret's 5 tokens (\" \" and 4 digits):\n", docs);
  std::printf("layer.qhead (kv) | answer att | copy att (recon) | max recon att | kvzip score (kv) | rank | kept@%d\n",
              budget);
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) {
      const int i = l * H + h, kv = l * KV + h / G;
      std::printf("%d.%d (%d) | %.3f | %.3f | %.3f | %.3f | %.2f | %.2f\n", l, h, h / G, answer_att[i] / docs,
                  copy_att[i] / docs, max_att[i] / docs, score_sum[kv] / samples, rank_sum[kv] / samples,
                  kept_sum[kv] / samples);
    }
  std::printf("brute-force vs scorer max |difference| over all scored entries: %.2e\n", max_diff);
  return 0;
}
