#include "model/weight_layout.h"

namespace origami {

std::vector<WeightSlot> weight_slots(const ModelConfig& c, ModelWeights* w) {
  const int64_t vocab = c.vocab_size, hidden = c.hidden_size, inter = c.intermediate_size;
  const int64_t q = c.q_size(), kv = c.kv_size(), head_dim = c.head_dim;
  std::vector<WeightSlot> slots;
  if (w->layers.size() != static_cast<size_t>(c.num_layers)) w->layers.resize(c.num_layers);
  slots.push_back({"model.embed_tokens.weight", {vocab, hidden}, WeightKind::kMatrix, &w->embed_tokens});
  for (int i = 0; i < c.num_layers; ++i) {
    LayerWeights& l = w->layers[i];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    slots.push_back({p + "input_layernorm.weight", {hidden}, WeightKind::kNorm, &l.input_norm});
    slots.push_back({p + "self_attn.q_proj.weight", {q, hidden}, WeightKind::kMatrix, &l.q_proj});
    slots.push_back({p + "self_attn.k_proj.weight", {kv, hidden}, WeightKind::kMatrix, &l.k_proj});
    slots.push_back({p + "self_attn.v_proj.weight", {kv, hidden}, WeightKind::kMatrix, &l.v_proj});
    if (c.qkv_bias) {
      slots.push_back({p + "self_attn.q_proj.bias", {q}, WeightKind::kBias, &l.q_bias});
      slots.push_back({p + "self_attn.k_proj.bias", {kv}, WeightKind::kBias, &l.k_bias});
      slots.push_back({p + "self_attn.v_proj.bias", {kv}, WeightKind::kBias, &l.v_bias});
    }
    if (c.qk_norm) {
      slots.push_back({p + "self_attn.q_norm.weight", {head_dim}, WeightKind::kNorm, &l.q_norm});
      slots.push_back({p + "self_attn.k_norm.weight", {head_dim}, WeightKind::kNorm, &l.k_norm});
    }
    slots.push_back({p + "self_attn.o_proj.weight", {hidden, q}, WeightKind::kMatrix, &l.o_proj});
    slots.push_back({p + "post_attention_layernorm.weight", {hidden}, WeightKind::kNorm, &l.post_attn_norm});
    slots.push_back({p + "mlp.gate_proj.weight", {inter, hidden}, WeightKind::kMatrix, &l.gate_proj});
    slots.push_back({p + "mlp.up_proj.weight", {inter, hidden}, WeightKind::kMatrix, &l.up_proj});
    slots.push_back({p + "mlp.down_proj.weight", {hidden, inter}, WeightKind::kMatrix, &l.down_proj});
  }
  slots.push_back({"model.norm.weight", {hidden}, WeightKind::kNorm, &w->final_norm});
  if (!c.tie_word_embeddings) {
    slots.push_back({"lm_head.weight", {vocab, hidden}, WeightKind::kMatrix, &w->lm_head});
  }
  return slots;
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace origami
