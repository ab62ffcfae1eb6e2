#pragma once
// Head budget files (kv/head_budgets.h) against a loaded model's config: the identity a file must
// match, and loading with that check (what `origami calibrate` writes and the engine reads).
#include <string>

#include "core/status.h"
#include "kv/head_budgets.h"
#include "model/config.h"

namespace origami {

// The fields of `config` a head budget file records and is checked against.
ModelIdentity model_identity(const ModelConfig& config);

// load_head_budgets() checked against `config`: errors name the file and the field that does
// not match (e.g. "model.num_layers is 28 but the model's is 36").
Expected<HeadBudgets> load_head_budgets_for_model(const std::string& path, const ModelConfig& config);

}  // namespace origami
