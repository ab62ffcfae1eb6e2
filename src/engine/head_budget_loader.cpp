#include "engine/head_budget_loader.h"

namespace origami {

ModelIdentity model_identity(const ModelConfig& config) {
  ModelIdentity id;
  id.model_type = config.model_type;
  id.num_layers = config.num_layers;
  id.num_kv_heads = config.num_kv_heads;
  id.num_attention_heads = config.num_heads;
  id.head_dim = config.head_dim;
  id.hidden_size = config.hidden_size;
  id.vocab_size = config.vocab_size;
  return id;
}

Expected<HeadBudgets> load_head_budgets_for_model(const std::string& path, const ModelConfig& config) {
  const ModelIdentity id = model_identity(config);
  return load_head_budgets(path, &id);
}

}  // namespace origami
