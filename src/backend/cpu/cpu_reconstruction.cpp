// KVzip's reconstruction pass for a compression job on the CPU backend (the `kvzip` policy):
// the job's entries are copied into a private cache (scratch_), the model runs on the job's
// reconstruction tokens (the repeat prompt, then the entries' own tokens) after them, and every
// entry keeps the largest attention any reconstruction query gives it (cpu/kvzip_scores.h).
// The request's own pages are only read: shared prefix pages stay untouched, and the scratch
// cache is swapped in for the pass so that the forward pass itself is the one every step runs.
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kvzip_scores.h"

namespace origami {

Status CpuBackend::reconstruction_scores(const CompressionJob& job, std::vector<float>* scores) {
  const ModelConfig& c = config_;
  const int n = job.num_entries, r = static_cast<int>(job.reconstruction_tokens.size());
  const std::string who = "kvzip compression of request " + std::to_string(job.request_id);
  if (kv_.layout().num_groups() > 1)
    return invalid_argument(who + ": the reconstruction reads every layer and head through one table; head groups "
                            "are not supported");
  if (job.num_positions >= 0 && job.num_positions != n)
    return invalid_argument(who + ": its cache was compressed before (" + std::to_string(n) + " entries for " +
                            std::to_string(job.num_positions) + " positions); KVzip scores an uncompressed context");
  if (r <= n) return invalid_argument(who + ": no reconstruction tokens after its " + std::to_string(n) + " entries");
  if (n < 1) return invalid_argument(who + ": no entries to score");

  // The private cache: the entries in pages 1.., then room for the reconstruction.
  const int bs = kv_.layout().block_size, d = c.head_dim;
  const int pages = (n + r + bs - 1) / bs;
  if (!scratch_.allocated() || scratch_.num_blocks() < pages + 1)
    ORIGAMI_RETURN_IF_ERROR(
        scratch_.allocate(KVLayout::full(c.num_layers, c.num_kv_heads, d, bs, pages + 1, DType::kF32)));
  std::vector<BlockId> table;
  for (int p = 1; p <= pages; ++p) table.push_back(p);
  const std::vector<BlockId>& src = *job.src_blocks;
  for (int l = 0; l < c.num_layers; ++l)
    for (int h = 0; h < c.num_kv_heads; ++h)
      for (int e = 0; e < n; ++e) {
        std::memcpy(scratch_.key_at(l, table[e / bs], h, e % bs), kv_.key_at(l, src[e / bs], h, e % bs), d * sizeof(float));
        std::memcpy(scratch_.value_at(l, table[e / bs], h, e % bs), kv_.value_at(l, src[e / bs], h, e % bs),
                    d * sizeof(float));
      }

  ForwardBatch batch;
  batch.token_ids = job.reconstruction_tokens;
  for (int t = 0; t < r; ++t) batch.positions.push_back(n + t);
  SequenceInput seq;
  seq.request_id = job.request_id;
  seq.num_query_tokens = r;
  seq.num_cached_entries = n;
  seq.start_position = n;
  seq.block_table = &table;
  seq.logits_mode = LogitsMode::kNone;
  batch.sequences.push_back(seq);

  scores->assign(static_cast<size_t>(c.num_layers) * c.num_kv_heads * n, 0.0f);
  auto observer = std::move(layer_observer_);
  layer_observer_ = [&](const LayerActivations& a) {
    cpu::ReconstructionLayer layer;
    layer.qkv = a.qkv;
    layer.qkv_width = a.qkv_width;
    layer.num_tokens = r;
    layer.num_heads = c.num_heads;
    layer.num_kv_heads = c.num_kv_heads;
    layer.head_dim = d;
    // kv_ is the scratch cache during the pass.
    layer.context_key = [&](int h, int i) {
      return static_cast<const float*>(kv_.key_at(a.layer, table[i / bs], h, i % bs));
    };
    layer.num_context = n;
    layer.first_scored = 0;
    std::vector<float*> best(c.num_kv_heads);
    for (int h = 0; h < c.num_kv_heads; ++h)
      best[h] = scores->data() + (static_cast<size_t>(a.layer) * c.num_kv_heads + h) * n;
    cpu::accumulate_reconstruction_scores(layer, best.data(), pool_.get());
  };
  std::swap(kv_, scratch_);
  StepOutput out;
  const Status st = forward(batch, &out);
  std::swap(kv_, scratch_);
  layer_observer_ = std::move(observer);
  return st;
}

}  // namespace origami
