#pragma once
// Answers a retrieval document's question from a cache that keeps an arbitrary set of entries per
// (layer, KV head): what accuracy a selection gives before the engine can serve it (the global
// threshold over heads: kvzip_selection). The document is prefilled once with full KV into a CPU
// backend whose every (layer, KV head) is its own head group (page table); each selection copies
// its kept entries, in order, to fresh pages of their head (as compaction does), then the
// question is fed at its own positions and the answer decoded greedily, as context mode does
// (`origami eval retrieval --mode context`). Analysis only.
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "model/weights.h"
#include "retrieval_probe.h"

namespace origami::analysis {

class KeptSetAnswerer {
 public:
  // A backend for documents of up to max_tokens tokens (question and answer included).
  static Expected<std::unique_ptr<KeptSetAnswerer>> create(const std::string& model_dir, const ModelConfig& c,
                                                           int max_tokens, int num_threads) {
    std::unique_ptr<KeptSetAnswerer> a(new KeptSetAnswerer());
    a->c_ = c;
    a->heads_ = c.num_layers * c.num_kv_heads;
    a->pages_per_head_ = (max_tokens + kBlock - 1) / kBlock;
    BackendOptions options;
    options.device = "cpu";
    options.num_threads = num_threads;
    a->backend_ = std::make_unique<CpuBackend>(options);
    {
      ORIGAMI_ASSIGN_OR_RETURN(ModelWeights weights, load_model_weights(model_dir, c));
      ORIGAMI_RETURN_IF_ERROR(a->backend_->load(c, weights));
    }
    // Group g = layer * KV + head; its source pages, then its destination pages.
    ORIGAMI_ASSIGN_OR_RETURN(
        KVLayout layout, KVLayout::grouped(c.num_layers, c.num_kv_heads, c.head_dim, kBlock,
                                           1 + 2 * a->heads_ * a->pages_per_head_, DType::kF32,
                                           KVLayout::adjacent_heads(c.num_layers, c.num_kv_heads, 1)));
    ORIGAMI_RETURN_IF_ERROR(a->backend_->allocate_kv_cache(layout));
    return a;
  }

  // Prefills the document's tokens (doc.ids[0, doc.n)) with full KV.
  Status prefill(const RetrievalDoc& doc) {
    RequestKV kv;
    kv.groups.resize(heads_);
    for (int g = 0; g < heads_; ++g) {
      kv.groups[g].blocks = pages(g, 0);
      kv.set_num_entries(g, doc.n);
    }
    ForwardBatch batch;
    batch.token_ids.assign(doc.ids.begin(), doc.ids.begin() + doc.n);
    for (int t = 0; t < doc.n; ++t) batch.positions.push_back(t);
    SequenceInput seq;
    seq.request_id = 1;
    seq.num_query_tokens = doc.n;
    seq.block_table = &kv.groups[0].blocks;
    seq.kv = &kv;
    seq.logits_mode = LogitsMode::kNone;
    batch.sequences.push_back(seq);
    StepOutput out;
    return backend_->execute(batch, &out);
  }

  // kept[layer * KV + head][i] for the document's entries i: the cache then holds those entries
  // only; returns the greedy answer (max_tokens tokens) to the question.
  Expected<std::vector<int32_t>> answer(const RetrievalDoc& doc, const std::vector<std::vector<char>>& kept,
                                        int max_tokens) {
    RequestKV kv;
    kv.groups.resize(heads_);
    cpu::CpuKVCache& cache = backend_->kv_cache();
    for (int g = 0; g < heads_; ++g) {
      const int l = g / c_.num_kv_heads, h = g % c_.num_kv_heads;
      const std::vector<BlockId> src = pages(g, 0);
      kv.groups[g].blocks = pages(g, 1);
      int m = 0;
      for (int i = 0; i < doc.n; ++i) {
        if (!kept[g][i]) continue;
        std::memcpy(cache.key_at(l, kv.groups[g].blocks[m / kBlock], h, m % kBlock),
                    cache.key_at(l, src[i / kBlock], h, i % kBlock), c_.head_dim * sizeof(float));
        std::memcpy(cache.value_at(l, kv.groups[g].blocks[m / kBlock], h, m % kBlock),
                    cache.value_at(l, src[i / kBlock], h, i % kBlock), c_.head_dim * sizeof(float));
        ++m;
      }
      kv.set_num_entries(g, m);
    }
    SamplingParams greedy;
    greedy.temperature = 0.0f;
    std::vector<int32_t> input(doc.ids.begin() + doc.n, doc.ids.end()), generated;
    int position = doc.n;
    while (static_cast<int>(generated.size()) < max_tokens) {
      const int q = static_cast<int>(input.size());
      ForwardBatch batch;
      batch.token_ids = input;
      SequenceInput seq;
      seq.request_id = 1;
      seq.num_query_tokens = q;
      seq.start_position = position;
      for (int t = 0; t < q; ++t) batch.positions.push_back(position + t);
      for (size_t g = 0; g < kv.groups.size(); ++g) kv.set_num_entries(g, kv.num_entries(g) + q);
      seq.num_cached_entries = kv.num_entries(0) - q;
      seq.block_table = &kv.groups[0].blocks;
      seq.kv = &kv;
      seq.logits_mode = LogitsMode::kLast;
      seq.sampling = &greedy;
      seq.sample_index = static_cast<int>(generated.size());
      batch.sequences.push_back(seq);
      StepOutput out;
      ORIGAMI_RETURN_IF_ERROR(backend_->execute(batch, &out));
      position += q;
      generated.push_back(out.sampled_tokens[0]);
      input = {generated.back()};
    }
    return generated;
  }

 private:
  static constexpr int kBlock = 16;
  KeptSetAnswerer() = default;
  // Group g's pages of region 0 (the prefill's) or 1 (a selection's).
  std::vector<BlockId> pages(int g, int region) const {
    std::vector<BlockId> p;
    const int first = 1 + (region * heads_ + g) * pages_per_head_;
    for (int i = 0; i < pages_per_head_; ++i) p.push_back(first + i);
    return p;
  }

  ModelConfig c_;
  int heads_ = 0, pages_per_head_ = 0;
  std::unique_ptr<CpuBackend> backend_;
};

}  // namespace origami::analysis
