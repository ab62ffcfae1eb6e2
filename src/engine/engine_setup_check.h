#pragma once
// Checks of an engine configuration against the model and tokenizer it is about to load, made
// before any weight or KV memory is allocated: a value that would be silently clamped, or a size
// that cannot fit, is an error naming the flag at fault.
#include <string>

#include "core/status.h"
#include "engine/engine_config.h"
#include "model/config.h"
#include "tokenizer/tokenizer.h"

namespace origami {

// Errors: max_model_len < 0 or above the model's context (max_position_embeddings: positions
// beyond it were never trained; config.json's rope_scaling already raises it where a model
// supports more); a tokenizer with ids the model's embedding does not have (with real weights;
// with --dummy-weights, where benchmarks borrow any tokenizer, a warning); on the CPU backend,
// weights (fp32, plus the bf16 staging copy of --dummy-weights) larger than the host memory
// available.
Status check_engine_setup(const EngineConfig& config, const ModelConfig& model, const Tokenizer& tokenizer);

// A warning for a tokenizer that fits the embedding but covers far less of it than the model's
// own would (embeddings are padded by a few hundred rows at most): probably not the model's
// tokenizer; or, with --dummy-weights, for one larger than the embedding. Empty when there is
// nothing to say.
std::string tokenizer_mismatch_warning(const EngineConfig& config, const ModelConfig& model, const Tokenizer& tokenizer);

}  // namespace origami
