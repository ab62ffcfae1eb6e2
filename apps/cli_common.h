#pragma once
// Flags shared by every command that stands up an engine, and small CLI helpers.
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "engine/engine_config.h"
#include "sampling/sampling_params.h"

namespace origami::cli {

struct EngineFlags {
  EngineConfig config;
  std::string kv_cache_memory;  // "2GiB", "512MiB", "1000000" (bytes)
  std::vector<std::string> kv_policy_opts;  // "key=value" (--kv-policy-opt, repeatable)
};

// Registers --model, --tokenizer, --device, --block-size, --max-num-seqs, --max-num-batched-tokens,
// --kv-cache-memory, --num-kv-blocks, --enable-prefix-caching, and the compression flags
// --kv-policy, --kv-budget, --kv-policy-opt, --no-async-compression, --compression-layer-stride,
// --query-slots, --query-window on `cmd`.
void add_engine_flags(CLI::App* cmd, EngineFlags* flags);
// Registers --temperature, --top-p, --top-k, --min-p, --seed, --max-tokens, --ignore-eos, --stop.
void add_sampling_flags(CLI::App* cmd, SamplingParams* params, std::string* seed_text);
// Resolves derived values (memory size strings); returns false after printing an error.
bool finalize_engine_flags(EngineFlags* flags);
bool finalize_sampling_flags(SamplingParams* params, const std::string& seed_text);

// Parses "2GiB", "1.5GB", "512MiB", "4096" into bytes.
bool parse_memory_size(const std::string& text, int64_t* bytes);

// The project's default model: ../shared/models/origami-tiny-qwen3 next to the checkout.
std::string default_model_dir();

// Prints "origami: error: <msg>" to stderr.
void print_error(const std::string& message);

}  // namespace origami::cli
