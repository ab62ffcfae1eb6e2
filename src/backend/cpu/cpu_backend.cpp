#include "backend/cpu/cpu_backend.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "backend/cpu/cpu_attention.h"
#include "backend/cpu/cpu_compression.h"
#include "backend/forward_batch_validation.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/check.h"
#include "core/fp8.h"
#include "model/fp8_weights.h"
#include "gates/sink_attention_gate.h"
#include "sampling/logprob.h"
#include "sampling/sampler.h"

namespace origami {
namespace {

constexpr size_t kDefaultKvBytes = size_t{1} << 30;

// Converts a tensor after checking its shape, so that a weight set that does not match the
// config (dummy weights, a partial checkpoint) is reported by name rather than read out of bounds.
Status take_tensor(const TensorView& t, std::vector<int64_t> shape, std::vector<float>* out) {
  if (t.empty()) return not_found("weights: tensor '" + t.name + "' is missing");
  if (t.shape != shape) {
    auto fmt = [](const std::vector<int64_t>& s) {
      std::string r = "[";
      for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
      return r + "]";
    };
    return invalid_file("weights: tensor '" + t.name + "' has shape " + fmt(t.shape) + ", expected " + fmt(shape));
  }
  *out = t.to_f32();
  return Status::ok();
}

// Stacks one projection's rows (or bias) under the previous ones.
void append(std::vector<float>* dst, const std::vector<float>& src) { dst->insert(dst->end(), src.begin(), src.end()); }

}  // namespace

CpuBackend::CpuBackend(const BackendOptions& options)
    : pool_(std::make_unique<cpu::ThreadPool>(options.num_threads)), options_(options) {}

void CpuBackend::for_rows(int num_tokens, const std::function<void(int)>& fn) {
  constexpr int kRowsPerItem = 16;
  if (num_tokens < 2 * kRowsPerItem) {
    for (int t = 0; t < num_tokens; ++t) fn(t);
    return;
  }
  cpu::parallel_for(pool_.get(), (num_tokens + kRowsPerItem - 1) / kRowsPerItem, [&](int item) {
    for (int t = item * kRowsPerItem; t < std::min(num_tokens, (item + 1) * kRowsPerItem); ++t) fn(t);
  });
}

Status CpuBackend::load(const ModelConfig& c, const ModelWeights& w) {
  if (c.hidden_size <= 0 || c.num_heads <= 0 || c.num_kv_heads <= 0 || c.head_dim <= 0 || c.vocab_size <= 0 ||
      c.intermediate_size <= 0 || c.num_layers <= 0)
    return invalid_argument("model config: sizes must be positive");
  if (c.num_heads % c.num_kv_heads != 0)
    return invalid_argument("model config: num_attention_heads (" + std::to_string(c.num_heads) +
                            ") must be a multiple of num_key_value_heads (" + std::to_string(c.num_kv_heads) + ")");
  if (c.head_dim % 2 != 0) return invalid_argument("model config: head_dim must be even for rotary embeddings");
  if (static_cast<int>(w.layers.size()) != c.num_layers)
    return invalid_file("weights: " + std::to_string(w.layers.size()) + " layers, config says " +
                        std::to_string(c.num_layers));
  const int64_t hidden = c.hidden_size, inter = c.intermediate_size, vocab = c.vocab_size;
  const int64_t q_size = c.q_size(), kv_size = c.kv_size();

  ORIGAMI_RETURN_IF_ERROR(take_tensor(w.embed_tokens, {vocab, hidden}, &embed_));
  ORIGAMI_RETURN_IF_ERROR(take_tensor(w.final_norm, {hidden}, &final_norm_));
  lm_head_.clear();
  const bool tied = w.lm_head.empty() || w.lm_head.data == w.embed_tokens.data;
  if (!tied) ORIGAMI_RETURN_IF_ERROR(take_tensor(w.lm_head, {vocab, hidden}, &lm_head_));

  // Qwen2's q/k/v biases, fused in q, k, v order as the weights are (both weight paths).
  auto take_qkv_bias = [&](const LayerWeights& lw, Layer* layer) -> Status {
    std::vector<float> qb, kb, vb;
    ORIGAMI_RETURN_IF_ERROR(take_tensor(lw.q_bias, {q_size}, &qb));
    ORIGAMI_RETURN_IF_ERROR(take_tensor(lw.k_bias, {kv_size}, &kb));
    ORIGAMI_RETURN_IF_ERROR(take_tensor(lw.v_bias, {kv_size}, &vb));
    append(&layer->qkv.bias, qb);
    append(&layer->qkv.bias, kb);
    append(&layer->qkv.bias, vb);
    return Status::ok();
  };
  layers_.assign(c.num_layers, Layer{});
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = w.layers[l];
    Layer& layer = layers_[l];
    ORIGAMI_RETURN_IF_ERROR(take_tensor(lw.input_norm, {hidden}, &layer.input_norm));
    ORIGAMI_RETURN_IF_ERROR(take_tensor(lw.post_attn_norm, {hidden}, &layer.post_attn_norm));
    if (c.qk_norm) {
      ORIGAMI_RETURN_IF_ERROR(take_tensor(lw.q_norm, {c.head_dim}, &layer.q_norm));
      ORIGAMI_RETURN_IF_ERROR(take_tensor(lw.k_norm, {c.head_dim}, &layer.k_norm));
    }
    if (uses_fp8(options_, c)) {
      const std::array<std::vector<int64_t>, 7> shapes = {{{q_size, hidden}, {kv_size, hidden}, {kv_size, hidden},
                                                           {hidden, q_size}, {inter, hidden}, {inter, hidden},
                                                           {hidden, inter}}};
      const auto linears = lw.linears();
      for (size_t i = 0; i < linears.size(); ++i) {
        const TensorView& t = *linears[i].weight;
        if (t.empty()) return not_found("weights: tensor '" + t.name + "' is missing");
        if (t.shape != shapes[i])
          return invalid_file("weights: tensor '" + t.name + "' does not have the shape the config implies");
      }
      ORIGAMI_RETURN_IF_ERROR(load_fp8_linears(lw, &layer));
      if (c.qkv_bias) {
        ORIGAMI_RETURN_IF_ERROR(take_qkv_bias(lw, &layer));
      }
      continue;
    }
    if (lw.q_proj.dtype == DType::kF8E4M3)  // unreachable through the loader (config says FP8)
      return invalid_argument("weights: FP8 projections need --quantization fp8");
    std::vector<float> q, k, v, o, gate, up, down;
    ORIGAMI_RETURN_IF_ERROR(take_tensor(lw.q_proj, {q_size, hidden}, &q));
    ORIGAMI_RETURN_IF_ERROR(take_tensor(lw.k_proj, {kv_size, hidden}, &k));
    ORIGAMI_RETURN_IF_ERROR(take_tensor(lw.v_proj, {kv_size, hidden}, &v));
    ORIGAMI_RETURN_IF_ERROR(take_tensor(lw.o_proj, {hidden, q_size}, &o));
    ORIGAMI_RETURN_IF_ERROR(take_tensor(lw.gate_proj, {inter, hidden}, &gate));
    ORIGAMI_RETURN_IF_ERROR(take_tensor(lw.up_proj, {inter, hidden}, &up));
    ORIGAMI_RETURN_IF_ERROR(take_tensor(lw.down_proj, {hidden, inter}, &down));

    layer.qkv = {{}, {}, static_cast<int>(q_size + 2 * kv_size), c.hidden_size};
    layer.qkv.weight.reserve(static_cast<size_t>(layer.qkv.out_features) * hidden);
    append(&layer.qkv.weight, q);
    append(&layer.qkv.weight, k);
    append(&layer.qkv.weight, v);
    if (c.qkv_bias) {
      ORIGAMI_RETURN_IF_ERROR(take_qkv_bias(lw, &layer));
    }
    layer.o = {std::move(o), {}, c.hidden_size, static_cast<int>(q_size)};
    layer.gate_up = {{}, {}, static_cast<int>(2 * inter), c.hidden_size};
    layer.gate_up.weight.reserve(static_cast<size_t>(2 * inter) * hidden);
    append(&layer.gate_up.weight, gate);
    append(&layer.gate_up.weight, up);
    layer.down = {std::move(down), {}, c.hidden_size, c.intermediate_size};
  }
  inv_freq_ = cpu::rope_inv_freq(c.rope, c.head_dim);
  config_ = c;
  loaded_ = true;
  return Status::ok();
}

Status CpuBackend::load_fp8_linears(const LayerWeights& lw, Layer* layer) const {
  std::array<Fp8Matrix, 7> m;
  const auto linears = lw.linears();
  for (size_t i = 0; i < linears.size(); ++i) {
    auto r = fp8_matrix(*linears[i].weight, *linears[i].scales);
    if (!r.has_value()) return Status(r.status().code(), "weights: " + r.status().message());
    m[i] = std::move(r).value();
  }
  auto make = [](const Fp8Matrix& f) {
    Linear l;
    l.weight = f.dequantize();
    l.out_features = static_cast<int>(f.rows);
    l.in_features = static_cast<int>(f.cols);
    l.fp8 = true;
    l.input_scale = f.input_scale;
    return l;
  };
  layer->qkv = make(stack_fp8_rows({&m[0], &m[1], &m[2]}));
  layer->o = make(m[3]);
  layer->gate_up = make(stack_fp8_rows({&m[4], &m[5]}));
  layer->down = make(m[6]);
  return Status::ok();
}

size_t CpuBackend::available_kv_bytes(size_t requested_bytes) const {
  if (requested_bytes > 0) return requested_bytes;
  // Default: 1 GiB, but never more than a quarter of the machine's memory.
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page_size > 0) {
    const size_t quarter = static_cast<size_t>(pages) * static_cast<size_t>(page_size) / 4;
    return std::min(kDefaultKvBytes, quarter);
  }
  return kDefaultKvBytes;
}

size_t CpuBackend::kv_page_bytes(const KVLayout& layout) const {
  KVLayout stored = layout;
  stored.dtype = DType::kF32;
  stored.fp8 = false;
  return stored.page_bytes(0);
}

Status CpuBackend::allocate_kv_cache(const KVLayout& layout) {
  if (loaded_ && (layout.num_layers != config_.num_layers || layout.num_kv_heads != config_.num_kv_heads ||
                  layout.head_dim != config_.head_dim))
    return invalid_argument("KV layout (" + std::to_string(layout.num_layers) + " layers, " +
                            std::to_string(layout.num_kv_heads) + " KV heads, head_dim " +
                            std::to_string(layout.head_dim) + ") does not match the model");
  return kv_.allocate(layout);
}

void CpuBackend::copy_block(int group, BlockId src, BlockId dst) {
  ORIGAMI_CHECK(group >= 0 && group < kv_.layout().num_groups());
  ORIGAMI_CHECK(src > 0 && src < kv_.num_blocks() && dst > 0 && dst < kv_.num_blocks());
  kv_.copy_block(src, dst);
}

Status CpuBackend::validate(const ForwardBatch& batch) const {
  if (!loaded_) return invalid_argument("cpu backend: execute() before load()");
  if (!kv_.allocated()) return invalid_argument("cpu backend: execute() before allocate_kv_cache()");
  ForwardBatchLimits limits;
  limits.vocab_size = config_.vocab_size;
  limits.block_size = kv_.layout().block_size;
  limits.num_blocks = kv_.num_blocks();
  limits.num_query_slots = kv_.compression_configured() ? kv_.compression_config().num_query_slots : -1;
  limits.num_groups = kv_.layout().num_groups();
  return validate_forward_batch(batch, limits);
}

Status CpuBackend::configure_compression(const CompressionConfig& config) {
  if (!loaded_) return invalid_argument("cpu backend: configure_compression() before load()");
  if (!kv_.allocated()) return invalid_argument("cpu backend: configure_compression() before allocate_kv_cache()");
  compressor_.reset();
  ORIGAMI_RETURN_IF_ERROR(kv_.configure_compression(config, config_.num_heads));
  compressor_ = std::make_unique<cpu::CpuCompressor>(&kv_, 1.0f / std::sqrt(static_cast<float>(config_.head_dim)),
                                                     pool_.get());
  return Status::ok();
}

size_t CpuBackend::query_slot_bytes(int max_window) const {
  if (!loaded_ || max_window <= 0) return 0;
  return static_cast<size_t>(config_.num_layers) * max_window * config_.num_heads * config_.head_dim * sizeof(float);
}

void CpuBackend::capture_queries(int layer_idx, const ForwardBatch& batch) {
  const int qkv_width = config_.q_size() + 2 * config_.kv_size();
  const int max_window = kv_.compression_config().max_window;
  for (const SequenceInput& seq : batch.sequences) {
    if (seq.query_slot < 0) continue;
    for (int t = 0; t < seq.num_query_tokens; ++t) {
      const int e = seq.num_cached_entries + t;
      if (e < seq.query_capture_from) continue;
      // Keyed by position, which compaction never changes (CompressionJob::num_positions).
      std::memcpy(kv_.query_row(layer_idx, seq.query_slot, (seq.start_position + t) % max_window),
                  ws_.qkv.data() + static_cast<size_t>(seq.query_start + t) * qkv_width,
                  static_cast<size_t>(config_.q_size()) * sizeof(float));
    }
  }
}

Status CpuBackend::load_gates(const gates::GateWeights& g) {
  if (!loaded_) return invalid_argument("cpu backend: load_gates() before load()");
  if (Status st = gates::check_gate_shape(g, config_); !st.is_ok())
    return invalid_argument("cpu backend: " + st.message());
  if (!kv_.has_global_scores())
    return invalid_argument("cpu backend: gate scores are written to the global-score pages; configure compression "
                            "with global scores before load_gates()");
  gates_ = std::make_unique<gates::GateWeights>(g);
  return Status::ok();
}

void CpuBackend::write_gate_scores(int layer_idx, const ForwardBatch& batch, int num_tokens,
                                   const std::vector<std::vector<cpu::HeadTable>>& tables) {
  const int heads = config_.num_kv_heads, hidden = config_.hidden_size, bs = kv_.layout().block_size;
  gate_rows_.resize(static_cast<size_t>(num_tokens) * heads);
  // Rows are independent, so the pool splits them (the gate is ~3% of a layer's work).
  constexpr int kRowsPerItem = 16;
  cpu::parallel_for(pool_.get(), (num_tokens + kRowsPerItem - 1) / kRowsPerItem, [&](int item) {
    const int t0 = item * kRowsPerItem, rows = std::min(kRowsPerItem, num_tokens - t0);
    gates::gate_scores(gates_->shape, gates_->layers[layer_idx], ws_.h.data() + static_cast<size_t>(t0) * hidden,
                       rows, hidden, gate_rows_.data() + static_cast<size_t>(t0) * heads);
  });
  for (size_t s = 0; s < batch.sequences.size(); ++s) {
    const SequenceInput& seq = batch.sequences[s];
    for (int g = 0; g < heads; ++g) {
      const cpu::HeadTable& table = tables[s][static_cast<size_t>(g)];
      const cpu::HeadPages pages = kv_.head(layer_idx, g);
      for (int t = 0; t < seq.num_query_tokens; ++t) {
        const int slot = table.num_cached_entries + t;
        pages.f[static_cast<size_t>(table.block_table[slot / bs]) * pages.f_block_stride + slot % bs] =
            gate_rows_[static_cast<size_t>(seq.query_start + t) * heads + g];
      }
    }
  }
}

void CpuBackend::linear(const Linear& layer, int num_rows, const float* in, float* out) const {
  if (layer.fp8) {
    // Round each input row to E4M3 (its own scale, or the static one) before the fp32 GEMM.
    const size_t k = static_cast<size_t>(layer.in_features);
    std::vector<float>& q = ws_.fp8_input;
    if (q.size() < static_cast<size_t>(num_rows) * k) q.resize(static_cast<size_t>(num_rows) * k);
    std::memcpy(q.data(), in, static_cast<size_t>(num_rows) * k * sizeof(float));
    fake_quantize_rows_fp8(q.data(), static_cast<size_t>(num_rows), k, k, layer.input_scale);
    in = q.data();
  }
  cpu::gemm_nt(num_rows, layer.out_features, layer.in_features, in, layer.in_features, layer.weight.data(),
               layer.in_features, layer.bias.empty() ? nullptr : layer.bias.data(), out, layer.out_features,
               pool_.get());
}

cpu::HeadTable CpuBackend::group_table(const SequenceInput& seq, int group) {
  if (group == 0 || seq.kv == nullptr) return {seq.block_table->data(), seq.num_cached_entries};
  const size_t g = static_cast<size_t>(group);
  return {seq.kv->groups[g].blocks.data(), seq.kv->num_entries(g) - seq.num_query_tokens};
}

void CpuBackend::run_layer(int layer_idx, const ForwardBatch& batch, int num_tokens) {
  const ModelConfig& c = config_;
  const Layer& layer = layers_[layer_idx];
  const int hidden = c.hidden_size, d = c.head_dim, half = d / 2;
  const int q_size = c.q_size(), kv_size = c.kv_size();
  const int qkv_width = q_size + 2 * kv_size;
  const int inter = c.intermediate_size;
  float* x = ws_.x.data();
  float* h = ws_.h.data();
  float* qkv = ws_.qkv.data();

  // Attention block. qkv rows: [q heads | k heads | v heads], each head head_dim wide.
  for_rows(num_tokens, [&](int t) {
    cpu::rms_norm(1, hidden, x + static_cast<size_t>(t) * hidden, hidden, layer.input_norm.data(), c.rms_norm_eps,
                  h + static_cast<size_t>(t) * hidden, hidden);
  });
  linear(layer.qkv, num_tokens, h, qkv);
  for_rows(num_tokens, [&](int t) {
    float* q = qkv + static_cast<size_t>(t) * qkv_width;
    float* k = q + q_size;
    if (c.qk_norm) {
      cpu::rms_norm(c.num_heads, d, q, d, layer.q_norm.data(), c.rms_norm_eps, q, d);
      cpu::rms_norm(c.num_kv_heads, d, k, d, layer.k_norm.data(), c.rms_norm_eps, k, d);
    }
    const float* cos = ws_.rope_cos.data() + static_cast<size_t>(t) * half;
    const float* sin = ws_.rope_sin.data() + static_cast<size_t>(t) * half;
    cpu::apply_rope(q, c.num_heads, d, cos, sin);
    cpu::apply_rope(k, c.num_kv_heads, d, cos, sin);
  });
  capture_queries(layer_idx, batch);
  if (layer_observer_) layer_observer_({layer_idx, num_tokens, h, qkv, qkv_width});

  // New entries go to slots num_cached_entries.. of each sequence (per KV head: of its head
  // group's table); positions (RoPE) are logical and may run ahead of the slots once a cache has
  // been compressed.
  const int bs = kv_.layout().block_size;
  std::vector<cpu::KVHeadPages> heads(static_cast<size_t>(c.num_kv_heads));
  std::vector<int> head_group(static_cast<size_t>(c.num_kv_heads));
  for (int g = 0; g < c.num_kv_heads; ++g) {
    const cpu::HeadPages p = kv_.head(layer_idx, g);
    heads[static_cast<size_t>(g)] = {p.k, p.v, p.block_stride};
    head_group[static_cast<size_t>(g)] = p.group;
  }
  // [sequence][KV head]: the table and length each head reads.
  std::vector<std::vector<cpu::HeadTable>> tables(batch.sequences.size());
  std::vector<cpu::AttentionSequence> att_seqs;
  att_seqs.reserve(batch.sequences.size());
  for (size_t s = 0; s < batch.sequences.size(); ++s) {
    const SequenceInput& seq = batch.sequences[s];
    std::vector<cpu::HeadTable>& seq_tables = tables[s];
    for (int g = 0; g < c.num_kv_heads; ++g) seq_tables.push_back(group_table(seq, head_group[static_cast<size_t>(g)]));
    for (int t = 0; t < seq.num_query_tokens; ++t) {
      const float* row = qkv + static_cast<size_t>(seq.query_start + t) * qkv_width;
      for (int g = 0; g < c.num_kv_heads; ++g) {
        const cpu::HeadTable& table = seq_tables[static_cast<size_t>(g)];
        const int slot = table.num_cached_entries + t;
        const BlockId block = table.block_table[slot / bs];
        float* key = kv_.key_at(layer_idx, block, g, slot % bs);
        float* value = kv_.value_at(layer_idx, block, g, slot % bs);
        std::memcpy(key, row + q_size + g * d, d * sizeof(float));
        std::memcpy(value, row + q_size + kv_size + g * d, d * sizeof(float));
        kv_.round_entry(key);
        kv_.round_entry(value);
      }
    }
    att_seqs.push_back({seq.query_start, seq.num_query_tokens, seq.num_cached_entries, seq.block_table->data(),
                        seq_tables.data()});
  }
  if (gates_ && kv_.has_global_scores()) write_gate_scores(layer_idx, batch, num_tokens, tables);
  cpu::AttentionShape shape{c.num_heads, c.num_kv_heads, d, bs, 1.0f / std::sqrt(static_cast<float>(d))};
  cpu::paged_attention(shape, att_seqs, qkv, qkv_width, heads, ws_.attn.data(), q_size, pool_.get());
  linear(layer.o, num_tokens, ws_.attn.data(), h);
  cpu::add_inplace(x, h, static_cast<size_t>(num_tokens) * hidden);

  // MLP block: down(silu(gate(h)) * up(h)).
  for_rows(num_tokens, [&](int t) {
    cpu::rms_norm(1, hidden, x + static_cast<size_t>(t) * hidden, hidden, layer.post_attn_norm.data(),
                  c.rms_norm_eps, h + static_cast<size_t>(t) * hidden, hidden);
  });
  linear(layer.gate_up, num_tokens, h, ws_.gate_up.data());
  for_rows(num_tokens, [&](int t) {
    const float* gu = ws_.gate_up.data() + static_cast<size_t>(t) * 2 * inter;
    cpu::silu_mul(1, inter, gu, gu + inter, 2 * inter, ws_.act.data() + static_cast<size_t>(t) * inter, inter);
  });
  linear(layer.down, num_tokens, ws_.act.data(), h);
  cpu::add_inplace(x, h, static_cast<size_t>(num_tokens) * hidden);
}

Status CpuBackend::execute(const ForwardBatch& batch, StepOutput* out) {
  ORIGAMI_RETURN_IF_ERROR(validate(batch));
  if (compressor_ && !batch.compressions.empty()) {
    // KVzip jobs: their scores first (a model run of their own), then the shared selection.
    std::vector<std::vector<float>> scores(batch.compressions.size());
    for (size_t j = 0; j < batch.compressions.size(); ++j)
      if (batch.compressions[j].recipe != nullptr && batch.compressions[j].recipe->reconstruction_scores)
        ORIGAMI_RETURN_IF_ERROR(reconstruction_scores(batch.compressions[j], &scores[j]));
    compressor_->set_reconstruction_scores(std::move(scores));
  }
  compressions_.start(compressor_.get(), batch, out);
  out->sampled_tokens.clear();
  out->all_logits.clear();
  out->token_logprobs.clear();
  out->logprobs.clear();
  const Status st = batch.sequences.empty() ? Status::ok() : forward(batch, out);
  compressions_.collect(compressor_.get(), out);
  return st;
}

Status CpuBackend::forward(const ForwardBatch& batch, StepOutput* out) {
  const ModelConfig& c = config_;
  const int num_tokens = static_cast<int>(batch.token_ids.size());
  const int hidden = c.hidden_size, half = c.head_dim / 2, vocab = c.vocab_size;
  const size_t n = static_cast<size_t>(num_tokens);
  ws_.x.resize(n * hidden);
  ws_.h.resize(n * hidden);
  ws_.qkv.resize(n * (c.q_size() + 2 * c.kv_size()));
  ws_.attn.resize(n * c.q_size());
  ws_.gate_up.resize(n * 2 * c.intermediate_size);
  ws_.act.resize(n * c.intermediate_size);
  ws_.rope_cos.resize(n * half);
  ws_.rope_sin.resize(n * half);

  for (int t = 0; t < num_tokens; ++t) {
    std::memcpy(ws_.x.data() + static_cast<size_t>(t) * hidden,
                embed_.data() + static_cast<size_t>(batch.token_ids[t]) * hidden, hidden * sizeof(float));
    cpu::rope_cos_sin(batch.positions[t], inv_freq_.data(), half, ws_.rope_cos.data() + static_cast<size_t>(t) * half,
                      ws_.rope_sin.data() + static_cast<size_t>(t) * half);
  }
  if (trace_ != nullptr) trace_->residual.assign(c.num_layers, {});
  for (int l = 0; l < c.num_layers; ++l) {
    run_layer(l, batch, num_tokens);
    if (trace_ != nullptr) trace_->residual[l].assign(ws_.x.begin(), ws_.x.begin() + static_cast<size_t>(num_tokens) * hidden);
  }

  // Logits only for the rows that are sampled or returned.
  const size_t num_seqs = batch.sequences.size();
  std::vector<int> rows;              // token rows that need logits
  std::vector<int> first_row(num_seqs, -1);  // index into `rows` of each sequence's first logits row
  for (size_t s = 0; s < num_seqs; ++s) {
    const SequenceInput& seq = batch.sequences[s];
    if (seq.logits_mode == LogitsMode::kNone) continue;
    first_row[s] = static_cast<int>(rows.size());
    const int begin = seq.logits_mode == LogitsMode::kAll ? seq.query_start : seq.query_start + seq.num_query_tokens - 1;
    for (int t = begin; t < seq.query_start + seq.num_query_tokens; ++t) rows.push_back(t);
  }
  const int num_rows = static_cast<int>(rows.size());
  std::vector<float> normed(static_cast<size_t>(num_rows) * hidden);  // [num_rows, hidden]
  std::vector<float> logits(static_cast<size_t>(num_rows) * vocab);   // [num_rows, vocab]
  for (int r = 0; r < num_rows; ++r)
    cpu::rms_norm(1, hidden, ws_.x.data() + static_cast<size_t>(rows[r]) * hidden, hidden, final_norm_.data(),
                  c.rms_norm_eps, normed.data() + static_cast<size_t>(r) * hidden, hidden);
  const std::vector<float>& head = lm_head_.empty() ? embed_ : lm_head_;
  cpu::gemm_nt(num_rows, vocab, hidden, normed.data(), hidden, head.data(), hidden, nullptr, logits.data(), vocab,
               pool_.get());

  out->sampled_tokens.assign(num_seqs, -1);
  out->all_logits.assign(num_seqs, {});
  out->token_logprobs.assign(num_seqs, std::numeric_limits<float>::quiet_NaN());
  out->logprobs.assign(num_seqs, TokenLogprobs{std::numeric_limits<float>::quiet_NaN(), {}});
  // Sampling may sort much of the vocabulary (top-p), so sequences sample in parallel.
  cpu::parallel_for(pool_.get(), static_cast<int>(num_seqs), [&](int s) {
    const SequenceInput& seq = batch.sequences[s];
    if (seq.logits_mode == LogitsMode::kNone) return;
    const int count = seq.logits_mode == LogitsMode::kAll ? seq.num_query_tokens : 1;
    const float* first = logits.data() + static_cast<size_t>(first_row[s]) * vocab;
    const float* last = first + static_cast<size_t>(count - 1) * vocab;
    if (seq.logit_adjustments != nullptr && !seq.logit_adjustments->empty()) {
      // An adjusted copy: logprobs below stay on the raw logits.
      thread_local std::vector<float> adjusted;
      adjusted.assign(last, last + vocab);
      seq.logit_adjustments->apply(adjusted.data());
      out->sampled_tokens[s] = sample_token(adjusted.data(), vocab, *seq.sampling, seq.seed, seq.sample_index);
    } else {
      out->sampled_tokens[s] = sample_token(last, vocab, *seq.sampling, seq.seed, seq.sample_index);
    }
    if (seq.logprob_token >= 0) out->token_logprobs[s] = log_softmax_at(last, vocab, seq.logprob_token);
    if (seq.num_top_logprobs >= 0) {
      const int32_t chosen = seq.logprob_token >= 0 ? seq.logprob_token : out->sampled_tokens[s];
      out->logprobs[s] = token_logprobs(last, vocab, chosen, seq.num_top_logprobs);
    }
    if (seq.logits_mode == LogitsMode::kAll) out->all_logits[s].assign(first, first + static_cast<size_t>(count) * vocab);
  });
  return Status::ok();
}

}  // namespace origami
