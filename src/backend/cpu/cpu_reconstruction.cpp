// KVzip's reconstruction passes on the CPU backend (the `kvzip` policy's compression and the
// offline scorer, eval/kvzip_scorer.h). Each pass runs in a private cache (scratch_) holding
// context entries, the model reading the repeat prompt and their tokens after them, and every
// entry keeps the largest attention any reconstruction query gives it (cpu/kvzip_scores.h).
// One pass after the whole context, or equal chunks, each pass holding the sinks and its chunk
// with its input at the positions right after the chunk: cached keys are post-RoPE at their own
// positions and RoPE attention depends only on position differences, so every query-key distance
// stays within sinks + 2 chunk + prompt (a 2000-token context in chunks of 1024: ~2060; one pass
// runs its queries at 2000-4000, twice the tiny model's trained context). The sinks are
// re-rotated to the positions just before the chunk (exact: a rotation by the offset). A pass's
// scores are the model's exact attention over sinks + chunk + reconstruction. The source pages
// are only read: shared prefix pages stay untouched, and the scratch cache is swapped in for the
// pass so that the forward pass itself is the one every step runs.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/kvzip_scores.h"

namespace origami {

Status CpuBackend::reconstruction_scores(const CompressionJob& job, std::vector<float>* scores) {
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
  // The job's tokens are the repeat prompt, then the entries' own tokens.
  KVzipReconstruction rec;
  rec.block_table = job.src_blocks;
  rec.num_entries = n;
  rec.context_tokens = job.reconstruction_tokens.data() + (r - n);
  rec.prompt.assign(job.reconstruction_tokens.begin(), job.reconstruction_tokens.end() - n);
  rec.chunk_size = job.recipe->reconstruction_chunk;
  rec.num_sinks = job.recipe->reconstruction_sinks;
  scores->assign(static_cast<size_t>(config_.num_layers) * config_.num_kv_heads * n, 0.0f);
  return kvzip_reconstruction(rec, scores->data());
}

Status CpuBackend::kvzip_reconstruction(const KVzipReconstruction& rec, float* scores) {
  const ModelConfig& c = config_;
  const int n = rec.num_entries, p = static_cast<int>(rec.prompt.size());
  if (n < 1 || rec.block_table == nullptr || rec.context_tokens == nullptr)
    return invalid_argument("kvzip reconstruction: no context to reconstruct");
  if (rec.chunk_size < 0 || rec.num_sinks < 0)
    return invalid_argument("kvzip reconstruction: chunk size and sinks must be >= 0");
  if (kv_.layout().num_groups() > 1)
    return invalid_argument("kvzip reconstruction: head groups are not supported");
  const int chunk = rec.chunk_size > 0 ? std::min(rec.chunk_size, n) : n;
  const int bs = kv_.layout().block_size, d = c.head_dim, half = d / 2;
  const std::vector<BlockId>& src = *rec.block_table;

  // The private cache: sinks, chunk and reconstruction in pages 1.. (page 0 is the null page).
  const int pages = (std::min(rec.num_sinks, n) + 2 * chunk + p + bs - 1) / bs;
  // It stores entries as the main cache does (its KV dtype), so the pass sees what CUDA would.
  const KVLayout& main = kv_.layout();
  if (!scratch_.allocated() || scratch_.num_blocks() < pages + 1 || scratch_.layout().block_size != bs ||
      scratch_.layout().dtype != main.dtype || scratch_.layout().fp8 != main.fp8) {
    KVLayout layout = KVLayout::full(c.num_layers, c.num_kv_heads, d, bs, pages + 1, main.dtype);
    layout.fp8 = main.fp8;
    ORIGAMI_RETURN_IF_ERROR(scratch_.allocate(layout));
  }
  std::vector<BlockId> table;
  for (int page = 1; page <= pages; ++page) table.push_back(page);
  std::vector<float> cos(half), sin(half);

  auto observer = std::move(layer_observer_);
  Status st = Status::ok();
  // ceil(n / chunk) chunks of equal length (within one): a pass's attention spreads over its
  // chunk, so a short last chunk would score its entries higher than the rest for no reason.
  const int num_chunks = (n + chunk - 1) / chunk;
  for (int k = 0; k < num_chunks && st.is_ok(); ++k) {
    const int begin = static_cast<int>(static_cast<int64_t>(k) * n / num_chunks);
    const int end = static_cast<int>(static_cast<int64_t>(k + 1) * n / num_chunks), len = end - begin;
    const int sinks = std::min(rec.num_sinks, begin);  // the first chunk holds its own
    const int num_ctx = sinks + len;
    // Scratch slot i holds entry `i < sinks ? i : begin + i - sinks`; the sinks rotated from
    // position i to begin - sinks + i, so that they sit right before the chunk.
    cpu::rope_cos_sin(begin - sinks, inv_freq_.data(), half, cos.data(), sin.data());
    for (int l = 0; l < c.num_layers; ++l)
      for (int h = 0; h < c.num_kv_heads; ++h)
        for (int i = 0; i < num_ctx; ++i) {
          const int e = i < sinks ? i : begin + (i - sinks);
          float* key = scratch_.key_at(l, table[i / bs], h, i % bs);
          std::memcpy(key, kv_.key_at(l, src[e / bs], h, e % bs), d * sizeof(float));
          std::memcpy(scratch_.value_at(l, table[i / bs], h, i % bs), kv_.value_at(l, src[e / bs], h, e % bs),
                      d * sizeof(float));
          if (i < sinks) {
            // A rotated sink is a new entry: it is stored (rounded) like any other.
            cpu::apply_rope(key, 1, d, cos.data(), sin.data());
            scratch_.round_entry(key);
          }
        }

    ForwardBatch batch;
    batch.token_ids = rec.prompt;
    batch.token_ids.insert(batch.token_ids.end(), rec.context_tokens + begin, rec.context_tokens + end);
    const int r = static_cast<int>(batch.token_ids.size());
    for (int t = 0; t < r; ++t) batch.positions.push_back(end + t);
    SequenceInput seq;
    seq.num_query_tokens = r;
    seq.num_cached_entries = num_ctx;
    seq.start_position = end;
    seq.block_table = &table;
    seq.logits_mode = LogitsMode::kNone;
    batch.sequences.push_back(seq);

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
      layer.num_context = num_ctx;
      layer.first_scored = sinks;
      std::vector<float*> best(c.num_kv_heads);
      for (int h = 0; h < c.num_kv_heads; ++h)
        best[h] = scores + (static_cast<size_t>(a.layer) * c.num_kv_heads + h) * n + begin;
      cpu::accumulate_reconstruction_scores(layer, best.data(), pool_.get());
    };
    std::swap(kv_, scratch_);
    StepOutput out;
    st = forward(batch, &out);
    std::swap(kv_, scratch_);
  }
  layer_observer_ = std::move(observer);
  return st;
}

}  // namespace origami
