#include "engine/engine_setup_check.h"

#include <cstdio>

#include "core/host_memory.h"

namespace origami {
namespace {

std::string tokenizer_dir(const EngineConfig& config) {
  return config.tokenizer_dir.empty() ? config.model_dir : config.tokenizer_dir;
}

}  // namespace

Status check_engine_setup(const EngineConfig& config, const ModelConfig& model, const Tokenizer& tokenizer) {
  if (config.max_model_len < 0)
    return invalid_argument("max_model_len must be positive (0 = the model's context), got " +
                            std::to_string(config.max_model_len));
  if (config.max_model_len > model.max_position_embeddings)
    return invalid_argument("--max-model-len " + std::to_string(config.max_model_len) + " exceeds the model's context of " +
                            std::to_string(model.max_position_embeddings) +
                            " tokens (max_position_embeddings in config.json); positions beyond it were never trained");
  // With --dummy-weights the model's numbers mean nothing anyway and benchmarks borrow any
  // tokenizer (random prompt ids stay inside the embedding): a warning there, an error here.
  if (tokenizer.vocab_size() > model.vocab_size && !config.dummy_weights)
    return invalid_argument("the tokenizer in " + tokenizer_dir(config) + " has " + std::to_string(tokenizer.vocab_size()) +
                            " tokens, but the model's embedding has only " + std::to_string(model.vocab_size) +
                            " rows (vocab_size in config.json): is --tokenizer the model's tokenizer?");
  if (config.device == "cpu") {
    // The CPU backend keeps an fp32 copy of every weight; --dummy-weights first builds them in
    // bf16 on the host (Backend::load_dummy).
    const double params = model.parameter_count();
    const double bytes = params * (config.dummy_weights ? 6.0 : 4.0);
    char what[160];
    std::snprintf(what, sizeof what, "loading the model's %.3g parameters on the CPU backend (fp32%s)", params,
                  config.dummy_weights ? ", built from bf16 dummy weights" : "");
    ORIGAMI_RETURN_IF_ERROR(check_host_memory(bytes, what));
  }
  return Status::ok();
}

std::string tokenizer_mismatch_warning(const EngineConfig& config, const ModelConfig& model, const Tokenizer& tokenizer) {
  const int tokens = tokenizer.vocab_size();
  if (tokens > model.vocab_size)  // only reached with --dummy-weights (check_engine_setup)
    return "the tokenizer in " + tokenizer_dir(config) + " has " + std::to_string(tokens) +
           " tokens, but the model's embedding has only " + std::to_string(model.vocab_size) +
           " rows: prompts with ids beyond it will be rejected";
  if (static_cast<double>(tokens) >= 0.9 * model.vocab_size) return "";
  return "the tokenizer in " + tokenizer_dir(config) + " has " + std::to_string(tokens) +
         " tokens, but the model's embedding has " + std::to_string(model.vocab_size) +
         " rows: is --tokenizer the model's tokenizer? Outputs will be garbage if not";
}

}  // namespace origami
