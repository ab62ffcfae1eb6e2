// Which tokens the query-agnostic scores keep, on retrieval documents: the per-token reason why
// K-norm and PagedEviction lose to StreamingLLM in docs/fidelity.md. An analysis tool, not a test
// (its output is a table for the docs; the kept sets themselves are checked against brute force
// in tests/e2e/engine_*_bruteforce_test.cpp).
//
//   score_breakdown DOCS.jsonl [NUM_DOCS] [BUDGET ...]
//
// Each document (retrieval_dev.jsonl's format; make one with scripts/make_retrieval_set.py) is
// prefilled with full KV on the CPU backend of origami-tiny-qwen3, block size 16; the cache is
// read back after the prompt's last chunk. Then, per scorer, layer and KV head, the scores are
// computed from the cached K and V (in double, from their definitions in kv/scorers.h) and the
// kept set is what a compression to BUDGET keeps: the top BUDGET entries with the policy's
// protected tail (its window) and sinks always kept. Reported per scorer and budget:
//   needle     share of the asked fact's answer tokens (the digits) kept, over docs x layers x heads
//   all-heads  share of docs whose digits are kept in every head of every layer
//   question   share of the question's tokens kept (from "\nQuestion:" to the prompt's end)
//   first 4    share of the first four entries kept (BOS and the attention sinks)
//   rank       median percentile rank of the digits' scores among the document's entries (0 = best)
//   kept:      what the kept entries are: sinks (first 4), the last 64 entries, tokens with no
//              letter or digit (punctuation, spaces, "<unk>" pieces, "=" rows), other
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../e2e/cpu_backend_wrapper.h"
#include "engine/engine.h"
#include "policy/policy_registry.h"
#include "tokenizer/tokenizer.h"

namespace origami::analysis {
namespace {

// The cache of the one sequence whose prompt has just been prefilled: [layer][head][entry][d].
struct Snapshot {
  int n = 0;
  std::vector<std::vector<std::vector<std::vector<float>>>> k, v;
};

class SnapshotBackend : public testing::CpuBackendWrapper {
 public:
  SnapshotBackend() : CpuBackendWrapper("score-breakdown") {}
  Status execute(const ForwardBatch& batch, StepOutput* out) override {
    Status s = inner_->execute(batch, out);
    if (!s.ok()) return s;
    for (const SequenceInput& seq : batch.sequences) {
      if (seq.logits_mode == LogitsMode::kNone || seq.num_query_tokens <= 1) continue;  // mid-prompt or decode
      auto& cache = inner_->kv_cache();
      const KVLayout& l = cache.layout();
      const int n = seq.num_cached_entries + seq.num_query_tokens;
      snap.n = n;
      snap.k.assign(l.num_layers, std::vector<std::vector<std::vector<float>>>(l.num_kv_heads));
      snap.v = snap.k;
      for (int layer = 0; layer < l.num_layers; ++layer)
        for (int h = 0; h < l.num_kv_heads; ++h)
          for (int e = 0; e < n; ++e) {
            const BlockId b = (*seq.block_table)[e / l.block_size];
            const float* kp = cache.key_at(layer, b, h, e % l.block_size);
            const float* vp = cache.value_at(layer, b, h, e % l.block_size);
            snap.k[layer][h].emplace_back(kp, kp + l.head_dim);
            snap.v[layer][h].emplace_back(vp, vp + l.head_dim);
          }
    }
    return s;
  }
  Snapshot snap;
};

double norm(const std::vector<float>& x) {
  double s = 0;
  for (float f : x) s += static_cast<double>(f) * f;
  return std::sqrt(s);
}

// S per entry, higher = keep, from the definitions in kv/scorers.h.
std::vector<double> scores(Scorer scorer, const std::vector<std::vector<float>>& k, const std::vector<std::vector<float>>& v) {
  const int n = static_cast<int>(k.size());
  std::vector<double> s(n);
  if (scorer == Scorer::kKeyDiff) {
    std::vector<double> mean(k[0].size(), 0.0);
    for (const auto& key : k) {
      const double nk = std::max(norm(key), 1e-12);
      for (size_t x = 0; x < key.size(); ++x) mean[x] += key[x] / nk / n;
    }
    double nm = 0;
    for (double m : mean) nm += m * m;
    nm = std::max(std::sqrt(nm), 1e-12);
    for (int e = 0; e < n; ++e) {
      double dot = 0;
      for (size_t x = 0; x < mean.size(); ++x) dot += k[e][x] * mean[x];
      s[e] = -dot / (std::max(norm(k[e]), 1e-12) * nm);
    }
    return s;
  }
  for (int e = 0; e < n; ++e) {
    switch (scorer) {
      case Scorer::kKeyNorm: s[e] = -norm(k[e]); break;
      case Scorer::kValueKeyNorm: s[e] = norm(v[e]) / std::max(norm(k[e]), 1e-6); break;
      default: s[e] = e; break;  // recency
    }
  }
  return s;
}

bool has_alnum(const std::string& piece) {
  for (unsigned char c : piece)
    if (std::isalnum(c) && !(piece.find("unk") != std::string::npos)) return true;
  return false;
}

struct Tally {
  double needle_kept = 0, needle_total = 0, question_kept = 0, question_total = 0;
  int docs = 0, docs_all_heads = 0;
  std::vector<double> ranks;
  double sinks = 0, recent = 0, no_alnum = 0, other = 0;
  double first4_kept = 0, first4_total = 0;
};

int run(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: score_breakdown DOCS.jsonl [NUM_DOCS] [BUDGET ...]\n");
    return 2;
  }
  const int max_docs = argc > 2 ? std::atoi(argv[2]) : 20;
  std::vector<int> budgets;
  for (int i = 3; i < argc; ++i) budgets.push_back(std::atoi(argv[i]));
  if (budgets.empty()) budgets = {256, 512};

  EngineConfig c;
  const char* shared = std::getenv("ORIGAMI_SHARED_DIR");
  c.model_dir = std::string(shared != nullptr ? shared : ORIGAMI_SHARED_DIR) + "/models/origami-tiny-qwen3";
  c.device = "cpu";
  c.block_size = 16;
  c.num_kv_blocks = 512;
  c.max_num_batched_tokens = 4096;
  auto backend = std::make_unique<SnapshotBackend>();
  SnapshotBackend* snap_backend = backend.get();
  auto created = Engine::create(c, std::move(backend));
  if (!created) {
    std::fprintf(stderr, "%s\n", created.status().to_string().c_str());
    return 1;
  }
  Engine& engine = **created;
  const Tokenizer& tok = *engine.tokenizer();

  // The policies whose scorers are compared, with their protected tails and sinks.
  const std::vector<std::string> policies = {"streaming", "knorm", "pagedeviction", "keydiff"};
  std::map<std::string, ScoreRecipe> recipes;
  for (const auto& name : policies) recipes[name] = (*PolicyRegistry::builtin().create(name))->score_recipe();
  std::map<std::pair<std::string, int>, Tally> tallies;

  std::ifstream in(argv[1]);
  std::string line;
  int doc = 0;
  while (doc < max_docs && std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    const std::string prompt = j.at("prompt"), answer = j.at("answer");
    const std::vector<int32_t> ids = tok.encode(prompt, true);
    // The asked fact's digits: the occurrence of " is <answer>." in the document.
    const size_t at = prompt.find(" is " + answer + ".");
    if (at == std::string::npos) continue;
    const int digits_from = static_cast<int>(tok.encode(prompt.substr(0, at + 4), true).size());
    const int digits_to = static_cast<int>(tok.encode(prompt.substr(0, at + 4 + answer.size()), true).size());
    const int question_from = static_cast<int>(tok.encode(prompt.substr(0, prompt.rfind("\nQuestion:")), true).size());
    SamplingParams p;
    p.temperature = 0.0f;
    p.max_tokens = 1;
    snap_backend->snap = Snapshot{};
    auto id = engine.add_request(ids, p);
    if (!id) return 1;
    while (engine.has_unfinished()) engine.step();
    const Snapshot& s = snap_backend->snap;
    if (s.n != static_cast<int>(ids.size())) {
      std::fprintf(stderr, "doc %d: snapshot of %d entries for %zu tokens\n", doc, s.n, ids.size());
      return 1;
    }
    std::vector<bool> no_alnum(s.n);
    for (int e = 0; e < s.n; ++e) no_alnum[e] = !has_alnum(tok.decode({ids[e]}));
    for (const auto& name : policies) {
      const ScoreRecipe& r = recipes[name];
      for (int budget : budgets) {
        if (budget >= s.n) continue;
        Tally& t = tallies[{name, budget}];
        bool all_heads = true;
        for (size_t layer = 0; layer < s.k.size(); ++layer)
          for (size_t h = 0; h < s.k[layer].size(); ++h) {
            std::vector<double> sc = scores(r.scorer, s.k[layer][h], s.v[layer][h]);
            // Percentile ranks before protection: where the score itself puts the digits.
            std::vector<int> order(s.n);
            for (int e = 0; e < s.n; ++e) order[e] = e;
            std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return sc[a] > sc[b]; });
            std::vector<int> rank(s.n);
            for (int i = 0; i < s.n; ++i) rank[order[i]] = i;
            for (int e = digits_from; e < digits_to; ++e) t.ranks.push_back(100.0 * rank[e] / s.n);
            const int tail = r.protected_tail(budget);
            for (int e = 0; e < s.n; ++e)
              if (e < r.num_sinks || e >= s.n - tail) sc[e] = INFINITY;
            std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return sc[a] > sc[b]; });
            std::vector<bool> kept(s.n, false);
            for (int i = 0; i < budget; ++i) kept[order[i]] = true;
            for (int e = digits_from; e < digits_to; ++e) {
              t.needle_kept += kept[e];
              t.needle_total += 1;
              all_heads = all_heads && kept[e];
            }
            for (int e = 0; e < 4; ++e) {
              t.first4_kept += kept[e];
              t.first4_total += 1;
            }
            for (int e = question_from; e < s.n; ++e) {
              t.question_kept += kept[e];
              t.question_total += 1;
            }
            for (int e = 0; e < s.n; ++e) {
              if (!kept[e]) continue;
              if (e < 4) t.sinks += 1.0 / budget;
              else if (e >= s.n - 64) t.recent += 1.0 / budget;
              else if (no_alnum[e]) t.no_alnum += 1.0 / budget;
              else t.other += 1.0 / budget;
            }
          }
        t.docs += 1;
        t.docs_all_heads += all_heads;
      }
    }
    ++doc;
  }
  std::printf("%d documents (%s), origami-tiny-qwen3, CPU, block 16\n\n", doc, argv[1]);
  std::printf("| scorer (policy) | budget | needle kept | all heads | question kept | first 4 kept | rank of digits (median %%) | kept: sinks / last 64 / no letter or digit / other |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (auto& [key, t] : tallies) {
    std::sort(t.ranks.begin(), t.ranks.end());
    const double median = t.ranks.empty() ? NAN : t.ranks[t.ranks.size() / 2];
    const double rows = t.sinks + t.recent + t.no_alnum + t.other;
    std::printf("| %s (%s) | %d | %.2f | %d/%d | %.2f | %.2f | %.0f | %.2f / %.2f / %.2f / %.2f |\n",
                scorer_name(recipes[key.first].scorer), key.first.c_str(), key.second, t.needle_kept / t.needle_total,
                t.docs_all_heads, t.docs, t.question_kept / t.question_total,
                t.first4_kept / t.first4_total, median, t.sinks / rows, t.recent / rows,
                t.no_alnum / rows, t.other / rows);
  }
  return 0;
}

}  // namespace
}  // namespace origami::analysis

int main(int argc, char** argv) { return origami::analysis::run(argc, argv); }
