#pragma once
// Shared by the KVzip analysis tools (kvzip_answer_heads, kvzip_selection): a retrieval document
// tokenized as `origami eval retrieval` does, the model run on it with every query of interest
// captured, and exact attention recomputed from the cache (softmax in double). Analysis only.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval/kvzip_scorer.h"
#include "eval/retrieval_task.h"
#include "eval/single_sequence_backend.h"
#include "model/config.h"
#include "tokenizer/tokenizer.h"

namespace origami::analysis {

// Queries of the rows [first, first + count) of one step, per layer: [layer][t * q_size].
struct CapturedQueries {
  int first = 0, count = 0;
  std::vector<std::vector<float>> q;
  const float* at(const ModelConfig& c, int layer, int t, int head) const {
    return &q[layer][static_cast<size_t>(t) * c.q_size() + static_cast<size_t>(head) * c.head_dim];
  }
};

// Runs `tokens` after `start` cached entries, capturing the queries of rows [first, first + count).
inline Status run_capturing(eval::SingleSequenceBackend& runner, const ModelConfig& c,
                            const std::vector<int32_t>& tokens, int start, int first, int count,
                            CapturedQueries* out) {
  out->first = first;
  out->count = count;
  out->q.assign(c.num_layers, std::vector<float>(static_cast<size_t>(count) * c.q_size()));
  runner.backend().set_layer_observer([&](const CpuBackend::LayerActivations& a) {
    for (int t = 0; t < count; ++t)
      std::memcpy(&out->q[a.layer][static_cast<size_t>(t) * c.q_size()],
                  a.qkv + static_cast<size_t>(first + t) * a.qkv_width, c.q_size() * sizeof(float));
  });
  Status st = runner.run(tokens, start);
  runner.backend().set_layer_observer({});
  return st;
}

// The cache's keys, [layer][kv head][entry * head_dim], for entries [0, len).
inline std::vector<std::vector<std::vector<float>>> cached_keys(eval::SingleSequenceBackend& runner,
                                                                const ModelConfig& c, int len) {
  const int d = c.head_dim, bs = runner.block_size();
  std::vector<std::vector<std::vector<float>>> keys(
      c.num_layers, std::vector<std::vector<float>>(c.num_kv_heads, std::vector<float>(static_cast<size_t>(len) * d)));
  for (int l = 0; l < c.num_layers; ++l)
    for (int h = 0; h < c.num_kv_heads; ++h)
      for (int i = 0; i < len; ++i)
        std::memcpy(&keys[l][h][static_cast<size_t>(i) * d],
                    runner.backend().kv_cache().key_at(l, runner.block_table()[i / bs], h, i % bs), d * sizeof(float));
  return keys;
}

// Softmax (in double) of q over the first len of `keys` (one head's, head_dim apart).
inline void attention(const float* q, const std::vector<float>& keys, int d, int len, std::vector<double>* p) {
  p->resize(len);
  double m = -INFINITY;
  for (int i = 0; i < len; ++i) {
    const float* k = &keys[static_cast<size_t>(i) * d];
    double dot = 0.0;
    for (int x = 0; x < d; ++x) dot += static_cast<double>(q[x]) * k[x];
    (*p)[i] = dot / std::sqrt(static_cast<double>(d));
    m = std::max(m, (*p)[i]);
  }
  double sum = 0.0;
  for (int i = 0; i < len; ++i) sum += ((*p)[i] = std::exp((*p)[i] - m));
  for (int i = 0; i < len; ++i) (*p)[i] /= sum;
}

struct RetrievalDoc {
  std::vector<int32_t> ids;     // the whole prompt, as the eval tokenizes it
  int n = 0;                    // the document's tokens (context mode's prompt)
  int secret = 0;               // the asked secret's first digit, an index into ids
  std::vector<int32_t> answer;  // " ", d1 .. d4
  std::string digits;           // the answer's text
  // The secret's tokens: " " and the 4 digits, [secret - 1, secret + 4).
  int first_secret_token() const { return secret - 1; }
};

inline Expected<RetrievalDoc> load_retrieval_doc(const Tokenizer& tok, const std::string& json_line) {
  const nlohmann::json j = nlohmann::json::parse(json_line);
  RetrievalDoc doc;
  const std::string prompt = j["prompt"], answer = j["answer"];
  doc.ids = tok.encode(prompt, true);
  ORIGAMI_ASSIGN_OR_RETURN(size_t split, eval::question_split(tok, prompt, doc.ids));
  doc.n = static_cast<int>(split);
  // The asked fact, "... secret number of the {adjective} {noun} is {answer}", in the document
  // (the answer's digits alone may occur elsewhere too).
  const std::string ask = "What is the secret number of the ";
  const size_t q = prompt.rfind(ask);
  if (q == std::string::npos) return invalid_argument("no question");
  const std::string subject = prompt.substr(q + ask.size(), prompt.find('?', q) - q - ask.size());
  const std::string fact = "secret number of the " + subject + " is " + answer;
  const size_t at = prompt.find(fact);
  if (at == std::string::npos || at >= q) return invalid_argument("the asked fact is not in the document");
  doc.secret = static_cast<int>(tok.encode(prompt.substr(0, at + fact.size() - answer.size()), true).size());
  doc.answer = tok.encode(" " + answer, false);
  doc.digits = answer;
  if (doc.answer.size() != 5 || doc.secret + 4 > doc.n ||
      !std::equal(doc.answer.begin(), doc.answer.end(), doc.ids.begin() + doc.secret - 1))
    return invalid_argument("the secret's tokens are not \" \" and its 4 digits where expected");
  return doc;
}

// 1. The answer with full KV: the whole prompt, then " ", d1, d2, d3 forced. Per (layer, query
// head): the attention the query that predicts answer token k pays to the secret's token k (the
// copy an induction head makes), averaged over the 5 answer tokens.
inline Expected<std::vector<double>> answer_attention(eval::SingleSequenceBackend& runner, const ModelConfig& c,
                                                      const RetrievalDoc& doc) {
  std::vector<int32_t> tokens = doc.ids;
  tokens.insert(tokens.end(), doc.answer.begin(), doc.answer.end() - 1);
  const int full = static_cast<int>(doc.ids.size()), len = static_cast<int>(tokens.size());
  CapturedQueries aq;
  ORIGAMI_RETURN_IF_ERROR(run_capturing(runner, c, tokens, 0, full - 1, 5, &aq));
  const auto keys = cached_keys(runner, c, len);
  const int G = c.num_heads / c.num_kv_heads;
  std::vector<double> out(static_cast<size_t>(c.num_layers) * c.num_heads, 0.0), p;
  for (int l = 0; l < c.num_layers; ++l)
    for (int h = 0; h < c.num_heads; ++h)
      for (int k = 0; k < 5; ++k) {
        attention(aq.at(c, l, k, h), keys[l][h / G], c.head_dim, full + k, &p);
        out[static_cast<size_t>(l) * c.num_heads + h] += p[doc.first_secret_token() + k] / 5;
      }
  return out;
}

// 2. The reconstruction, by brute force: the document prefilled, then the repeat prompt, its
// suffix and the document again at the positions right after it (KVzip's one pass), every
// reconstruction query captured. The runner's cache then holds the document and the
// reconstruction; `rec` gets the reconstruction's tokens.
// With `hidden`, the document's prefill also hands back every layer's attention input (the
// normed hidden states Fast KVzip's gates read): [layer][token * hidden_size].
inline Status reconstruction_queries(eval::SingleSequenceBackend& runner, const ModelConfig& c,
                                     const eval::KVzipPrompts& prompts, const RetrievalDoc& doc,
                                     std::vector<int32_t>* rec, CapturedQueries* queries,
                                     std::vector<std::vector<float>>* hidden = nullptr) {
  *rec = prompts.first;
  rec->insert(rec->end(), prompts.suffix.begin(), prompts.suffix.end());
  rec->insert(rec->end(), doc.ids.begin(), doc.ids.begin() + doc.n);
  if (hidden != nullptr) {
    hidden->assign(c.num_layers, std::vector<float>(static_cast<size_t>(doc.n) * c.hidden_size));
    runner.backend().set_layer_observer([&](const CpuBackend::LayerActivations& a) {
      std::memcpy((*hidden)[a.layer].data(), a.normed_input, static_cast<size_t>(doc.n) * c.hidden_size * sizeof(float));
    });
  }
  Status st = runner.run(std::vector<int32_t>(doc.ids.begin(), doc.ids.begin() + doc.n), 0);
  runner.backend().set_layer_observer({});
  ORIGAMI_RETURN_IF_ERROR(st);
  return run_capturing(runner, c, *rec, doc.n, 0, static_cast<int>(rec->size()), queries);
}

// The model the tools probe: origami-tiny-qwen3 from $ORIGAMI_SHARED_DIR (default: the build's
// ../shared).
struct ProbeModel {
  std::string dir;
  ModelConfig config;
  std::shared_ptr<Tokenizer> tokenizer;
  eval::KVzipPrompts prompts;
};

inline Expected<ProbeModel> load_probe_model() {
  const char* shared = std::getenv("ORIGAMI_SHARED_DIR");
  ProbeModel m;
  m.dir = std::string(shared != nullptr ? shared : ORIGAMI_SHARED_DIR) + "/models/origami-tiny-qwen3";
  ORIGAMI_ASSIGN_OR_RETURN(m.config, load_model_config(m.dir));
  ORIGAMI_ASSIGN_OR_RETURN(m.tokenizer, Tokenizer::load(m.dir));
  m.prompts = eval::kvzip_prompts(*m.tokenizer);
  return m;
}

// One document probed: its answer attention (1.) and its reconstruction's queries (2.), the
// runner's cache holding the document and the reconstruction.
struct DocProbe {
  RetrievalDoc doc;
  std::vector<double> answer;  // answer_attention()
  std::vector<int32_t> rec;    // the reconstruction's tokens
  CapturedQueries queries;     // their queries
  std::vector<std::vector<float>> hidden;  // with keep_hidden: the document's attention inputs
  std::unique_ptr<eval::SingleSequenceBackend> runner;
};

inline Expected<DocProbe> probe_document(const ProbeModel& m, const std::string& json_line, bool keep_hidden) {
  DocProbe p;
  ORIGAMI_ASSIGN_OR_RETURN(p.doc, load_retrieval_doc(*m.tokenizer, json_line));
  const int n = p.doc.n, full = static_cast<int>(p.doc.ids.size());
  ORIGAMI_ASSIGN_OR_RETURN(p.runner, eval::SingleSequenceBackend::create(m.dir, m.config, 2 * n + 64 + full, 1));
  ORIGAMI_ASSIGN_OR_RETURN(p.answer, answer_attention(*p.runner, m.config, p.doc));
  ORIGAMI_RETURN_IF_ERROR(reconstruction_queries(*p.runner, m.config, m.prompts, p.doc, &p.rec, &p.queries,
                                                 keep_hidden ? &p.hidden : nullptr));
  return p;
}

}  // namespace origami::analysis
