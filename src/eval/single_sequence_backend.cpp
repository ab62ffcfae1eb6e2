#include "eval/single_sequence_backend.h"

#include "model/weights.h"

namespace origami::eval {

Expected<std::unique_ptr<SingleSequenceBackend>> SingleSequenceBackend::create(const std::string& model_dir,
                                                                               const ModelConfig& config,
                                                                               int max_tokens, int num_threads) {
  if (max_tokens < 1) return invalid_argument("max tokens must be >= 1");
  std::unique_ptr<SingleSequenceBackend> s(new SingleSequenceBackend());
  s->max_tokens_ = max_tokens;
  BackendOptions options;
  options.device = "cpu";
  options.num_threads = num_threads;
  s->backend_ = std::make_unique<CpuBackend>(options);
  {
    ORIGAMI_ASSIGN_OR_RETURN(ModelWeights weights, load_model_weights(model_dir, config));
    ORIGAMI_RETURN_IF_ERROR(s->backend_->load(config, weights));
  }  // the backend holds its own fp32 copy
  const int pages = (max_tokens + s->block_size_ - 1) / s->block_size_;
  ORIGAMI_RETURN_IF_ERROR(s->backend_->allocate_kv_cache(
      KVLayout::full(config.num_layers, config.num_kv_heads, config.head_dim, s->block_size_, pages + 1, DType::kF32)));
  for (int p = 1; p <= pages; ++p) s->table_.push_back(p);
  return s;
}

Status SingleSequenceBackend::run(const std::vector<int32_t>& tokens, int start, int query_slot, int capture_from,
                                  int first_position) {
  const int n = static_cast<int>(tokens.size());
  if (n < 1 || start < 0 || start + n > max_tokens_)
    return invalid_argument("a step of " + std::to_string(n) + " tokens after " + std::to_string(start) +
                            " cached ones exceeds the " + std::to_string(max_tokens_) + " tokens this backend holds");
  ForwardBatch batch;
  batch.token_ids = tokens;
  const int position = first_position >= 0 ? first_position : start;
  for (int t = 0; t < n; ++t) batch.positions.push_back(position + t);
  SequenceInput seq;
  seq.request_id = 1;
  seq.num_query_tokens = n;
  seq.num_cached_entries = start;
  seq.start_position = position;
  seq.block_table = &table_;
  seq.logits_mode = LogitsMode::kNone;
  if (query_slot >= 0) {
    seq.query_slot = query_slot;
    seq.query_capture_from = capture_from;
  }
  batch.sequences.push_back(seq);
  StepOutput out;
  return backend_->execute(batch, &out);
}

}  // namespace origami::eval
