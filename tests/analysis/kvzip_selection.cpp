// Which selection of KVzip's reconstruction attention keeps a retrieval document's secret where
// the answer needs it: the offline simulation behind "What selection keeps the secret"
// (docs/policies.md, `kvzip`). An analysis tool, not a test.
//
//   kvzip_selection DOCS.jsonl NUM_DOCS [BUDGET [GATES.safetensors]]
//
// Per document (tokenized as `origami eval retrieval` does, origami-tiny-qwen3, fp32 CPU):
//   - the answer head: the (layer, KV head) whose query head pays the answer's copy most attention
//     (the answer run with full KV of retrieval_probe.h; layer 4, KV head 0 on every tuning
//     document: kvzip_answer_heads);
//   - KVzip's one reconstruction pass by brute force (retrieval_probe.h), and from the same
//     attention several scores per (layer, KV head, document entry), each a max over the KV
//     head's query heads and the reconstruction's queries:
//       max        KVzip's: the attention itself (the scorer's, to 1e-6: kvzip_answer_heads)
//       copy       the copy's queries only (not the repeat prompt's)
//       doc        each query's attention renormalized over the document's keys (the share of
//                  what it reads from the document, whatever it reads from the reconstruction)
//       nosink     renormalized without the 4 sinks (p / (1 - sinks' share))
//       mean       the mean over queries instead of the max (H2O-like)
//       gate       with GATES: Fast KVzip's gate scores (what `fastkvzip` keeps), the last 128
//                  entries always kept (its window)
//   - selections at BUDGET entries per head (the 4 sinks always kept, BUDGET - 4 chosen among
//     the rest; BUDGET x heads in all for the global ones):
//       uniform    the top BUDGET - 4 of every head (what `kvzip` does today)
//       global     one threshold over every head's scores (KVzip's and Fast KVzip's)
//       layer      one threshold per layer over its heads
//       g/max      one threshold over scores divided by their head's largest
//       g/sum      one threshold over scores divided by their head's sum
//       g+floor    every head its top quarter of BUDGET - 4 first, the rest by one threshold
// Reported per score and selection, averaged over documents: the share of the secret's 5 tokens
// (" " and the digits) the answer head keeps, the share of documents whose 4 digits it keeps all,
// the share the other heads keep, the answer head's kept entries, and the fewest kept by a head.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "gates/gate_weights.h"
#include "gates/sink_attention_gate.h"
#include "kept_set_answerer.h"
#include "retrieval_probe.h"

namespace origami::analysis {
namespace {

enum Score { kMax, kCopy, kDoc, kNoSink, kMean, kGate, kNumScores };
const char* const kScoreNames[kNumScores] = {"max", "copy", "doc", "nosink", "mean", "gate"};
constexpr int kGateWindow = 128;  // fastkvzip's protected recent window
enum Selection { kUniform, kGlobal, kLayer, kGlobalByMax, kGlobalBySum, kGlobalFloor, kNumSelections };
const char* const kSelectionNames[kNumSelections] = {"uniform", "global", "layer", "g/max", "g/sum", "g+floor"};
constexpr int kMaxAnswerTokens = 6;  // `origami eval retrieval`'s default

// kept[head][i] for scores[head][i] (head = layer * kv_heads + kv head), the first `sinks` kept.
std::vector<std::vector<char>> select(const std::vector<std::vector<double>>& scores, int kv_heads, int sinks,
                                      int budget, Selection how) {
  const int heads = static_cast<int>(scores.size()), n = static_cast<int>(scores[0].size());
  std::vector<std::vector<char>> kept(heads, std::vector<char>(n, 0));
  const int per_head = std::max(0, std::min(budget, n) - sinks);
  struct Entry {
    double v;
    int head, i;
  };
  auto keep_top = [&](std::vector<Entry>& entries, size_t count) {
    count = std::min(count, entries.size());
    std::partial_sort(entries.begin(), entries.begin() + static_cast<std::ptrdiff_t>(count), entries.end(),
                      [](const Entry& a, const Entry& b) { return a.v > b.v; });
    for (size_t e = 0; e < count; ++e) kept[entries[e].head][entries[e].i] = 1;
  };
  auto entries_of = [&](int head, std::vector<Entry>* out) {
    double scale = 1.0;
    if (how == kGlobalByMax || how == kGlobalBySum) {
      double m = 0.0, s = 0.0;
      for (int i = sinks; i < n; ++i) m = std::max(m, scores[head][i]), s += scores[head][i];
      scale = how == kGlobalByMax ? m : s;
      if (scale <= 0.0) scale = 1.0;
    }
    for (int i = sinks; i < n; ++i) out->push_back({scores[head][i] / scale, head, i});
  };
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < std::min(sinks, n); ++i) kept[h][i] = 1;
  if (how == kUniform) {
    for (int h = 0; h < heads; ++h) {
      std::vector<Entry> e;
      entries_of(h, &e);
      keep_top(e, per_head);
    }
  } else if (how == kLayer) {
    for (int l = 0; l < heads / kv_heads; ++l) {
      std::vector<Entry> e;
      for (int h = l * kv_heads; h < (l + 1) * kv_heads; ++h) entries_of(h, &e);
      keep_top(e, static_cast<size_t>(per_head) * kv_heads);
    }
  } else if (how == kGlobalFloor) {
    const int floor = per_head / 4;
    for (int h = 0; h < heads; ++h) {
      std::vector<Entry> e;
      entries_of(h, &e);
      keep_top(e, floor);
    }
    std::vector<Entry> rest;
    for (int h = 0; h < heads; ++h) {
      std::vector<Entry> e;
      entries_of(h, &e);
      for (const Entry& x : e)
        if (!kept[x.head][x.i]) rest.push_back(x);
    }
    keep_top(rest, static_cast<size_t>(per_head - floor) * heads);
  } else {
    std::vector<Entry> e;
    for (int h = 0; h < heads; ++h) entries_of(h, &e);
    keep_top(e, static_cast<size_t>(per_head) * heads);
  }
  return kept;
}

}  // namespace
}  // namespace origami::analysis

int main(int argc, char** argv) {
  using namespace origami;
  using namespace origami::analysis;
  if (argc < 3) {
    std::fprintf(stderr, "usage: kvzip_selection DOCS.jsonl NUM_DOCS [BUDGET [GATES.safetensors]]\n");
    return 2;
  }
  const int num_docs = std::atoi(argv[2]), budget = argc > 3 ? std::atoi(argv[3]) : 512;
  Expected<ProbeModel> m = load_probe_model();
  if (!m) {
    std::fprintf(stderr, "%s\n", m.status().message().c_str());
    return 1;
  }
  const ModelConfig& c = m->config;
  Expected<gates::GateWeights> gate_weights = gates::GateWeights{};
  if (argc > 4) gate_weights = gates::load_gates(argv[4], c);
  if (!gate_weights) {
    std::fprintf(stderr, "%s\n", gate_weights.status().message().c_str());
    return 1;
  }
  const bool with_gates = argc > 4;
  const int num_scores = with_gates ? kNumScores : kGate;
  const int L = c.num_layers, H = c.num_heads, KV = c.num_kv_heads, G = H / KV, sinks = kKVzipSinks;
  // [score][selection]: sums over documents.
  double answer_share[kNumScores][kNumSelections] = {}, answer_all[kNumScores][kNumSelections] = {},
         other_share[kNumScores][kNumSelections] = {}, answer_count[kNumScores][kNumSelections] = {},
         fewest[kNumScores][kNumSelections] = {};
  // Where the answer head's copy queries look: sinks, the rest of the document, the reconstruction.
  double to_sinks = 0.0, to_doc = 0.0, to_rec = 0.0;
  double correct[kNumScores][kNumSelections] = {};
  int docs = 0, full_correct = 0;
  auto answerer = KeptSetAnswerer::create(m->dir, c, c.max_position_embeddings + 64, 1);
  if (!answerer) {
    std::fprintf(stderr, "%s\n", answerer.status().message().c_str());
    return 1;
  }
  std::ifstream in(argv[1]);
  std::string line;
  for (; docs < num_docs && std::getline(in, line); ++docs) {
    Expected<DocProbe> probe = probe_document(*m, line, with_gates);
    if (!probe) {
      std::fprintf(stderr, "document %d: %s\n", docs, probe.status().message().c_str());
      return 1;
    }
    const RetrievalDoc* doc = &probe->doc;
    const std::vector<double>* answer = &probe->answer;
    const std::vector<int32_t>& rec = probe->rec;
    const std::vector<std::vector<float>>& hidden = probe->hidden;
    const int n = doc->n;
    const int best = static_cast<int>(std::max_element(answer->begin(), answer->end()) - answer->begin());
    const int answer_head = (best / H) * KV + (best % H) / G;  // layer * KV + kv head
    const int r = static_cast<int>(rec.size()), p = r - n;
    const auto keys = cached_keys(*probe->runner, c, n + r);
    std::vector<std::vector<std::vector<double>>> scores(kNumScores,
                                                         std::vector<std::vector<double>>(L * KV, std::vector<double>(n)));
    std::vector<double> a;
    for (int l = 0; l < L; ++l)
      for (int kv = 0; kv < KV; ++kv) {
        const int head = l * KV + kv;
        for (int j = 0; j < G; ++j)
          for (int t = 0; t < r; ++t) {
            attention(probe->queries.at(c, l, t, kv * G + j), keys[l][kv], c.head_dim, n + t + 1, &a);
            double sink = 0.0, document = 0.0;
            for (int i = 0; i < n; ++i) (i < sinks ? sink : document) += a[i];
            if (head == answer_head && t >= p) {
              to_sinks += sink / (static_cast<double>(G) * (r - p));
              to_doc += document / (static_cast<double>(G) * (r - p));
              to_rec += (1.0 - sink - document) / (static_cast<double>(G) * (r - p));
            }
            for (int i = 0; i < n; ++i) {
              scores[kMax][head][i] = std::max(scores[kMax][head][i], a[i]);
              if (t >= p) scores[kCopy][head][i] = std::max(scores[kCopy][head][i], a[i]);
              scores[kDoc][head][i] = std::max(scores[kDoc][head][i], a[i] / (sink + document));
              if (sink < 1.0) scores[kNoSink][head][i] = std::max(scores[kNoSink][head][i], a[i] / (1.0 - sink));
              scores[kMean][head][i] += a[i] / (static_cast<double>(G) * r);
            }
          }
      }
    // Answers from the kept sets (context mode: the question and a greedy answer after them).
    Status st = (*answerer)->prefill(*doc);
    auto answers_right = [&](const std::vector<std::vector<char>>& kept) -> Expected<bool> {
      ORIGAMI_ASSIGN_OR_RETURN(std::vector<int32_t> out, (*answerer)->answer(*doc, kept, kMaxAnswerTokens));
      return eval::retrieval_answer_matches(m->tokenizer->decode(out, true), doc->digits);
    };
    Expected<bool> full_right =
        st.is_ok() ? answers_right(std::vector<std::vector<char>>(L * KV, std::vector<char>(n, 1)))
                   : Expected<bool>(st);
    if (!full_right) {
      std::fprintf(stderr, "%s\n", full_right.status().message().c_str());
      return 1;
    }
    full_correct += *full_right;
    if (with_gates) {
      std::vector<float> rows(static_cast<size_t>(n) * KV);
      for (int l = 0; l < L; ++l) {
        gates::gate_scores(gate_weights->shape, gate_weights->layers[l], hidden[l].data(), n, c.hidden_size,
                           rows.data());
        for (int kv = 0; kv < KV; ++kv)
          for (int i = 0; i < n; ++i)
            scores[kGate][l * KV + kv][i] = i >= n - kGateWindow ? 2.0 : rows[static_cast<size_t>(i) * KV + kv];
      }
    }
    std::printf("document %d: %d tokens, secret digits at %d, answer head %d.%d (attention %.2f), full KV %s\n",
                docs, n, doc->secret, answer_head / KV, answer_head % KV, (*answer)[best],
                *full_right ? "right" : "wrong");
    for (int s = 0; s < num_scores; ++s) {
      std::printf("  %-7s", kScoreNames[s]);
      for (int how = 0; how < kNumSelections; ++how) {
        const auto kept = select(scores[s], KV, sinks, budget, static_cast<Selection>(how));
        int in_answer = 0, digits = 0, in_others = 0, count = 0, least = n;
        for (int k = 0; k < 5; ++k) {
          const int e = doc->first_secret_token() + k;
          in_answer += kept[answer_head][e];
          digits += k > 0 && kept[answer_head][e];
          for (int h = 0; h < L * KV; ++h) in_others += h != answer_head && kept[h][e];
        }
        for (int h = 0; h < L * KV; ++h) {
          int m = 0;
          for (int i = 0; i < n; ++i) m += kept[h][i];
          least = std::min(least, m);
          if (h == answer_head) count = m;
        }
        answer_share[s][how] += in_answer / 5.0;
        answer_all[s][how] += digits == 4;
        other_share[s][how] += in_others / (5.0 * (L * KV - 1));
        answer_count[s][how] += count;
        fewest[s][how] += least;
        Expected<bool> right = answers_right(kept);
        if (!right) {
          std::fprintf(stderr, "%s\n", right.status().message().c_str());
          return 1;
        }
        correct[s][how] += *right;
        std::printf("  %s %d/5 (%d)%s", kSelectionNames[how], in_answer, count, *right ? " ok" : "");
      }
      std::printf("\n");
    }
    std::fflush(stdout);
  }
  std::printf("\nanswer head's copy queries: %.2f of their attention on the 4 sinks, %.2f on the rest of the "
              "document, %.2f on the reconstruction\n",
              to_sinks / docs, to_doc / docs, to_rec / docs);
  std::printf("\nmean over %d documents, budget %d per head (%d heads):\n", docs, budget, L * KV);
  std::printf("full KV answers %d of %d\n", full_correct, docs);
  std::printf("score | selection | accuracy | answer head keeps (share of the secret's 5 tokens) | all 4 digits (docs) | "
              "other heads keep | answer head's entries | fewest entries of a head\n");
  for (int s = 0; s < num_scores; ++s)
    for (int how = 0; how < kNumSelections; ++how)
      std::printf("%s | %s | %.2f | %.2f | %.2f | %.2f | %.0f | %.0f\n", kScoreNames[s], kSelectionNames[how],
                  correct[s][how] / docs, answer_share[s][how] / docs, answer_all[s][how] / docs, other_share[s][how] / docs,
                  answer_count[s][how] / docs, fewest[s][how] / docs);
  return 0;
}
