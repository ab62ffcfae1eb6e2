#pragma once
// Flags shared by every command that stands up an engine, and small CLI helpers.
#include <CLI/CLI.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_config.h"
#include "sampling/sampling_params.h"

namespace origami::cli {

// The exit status of every command (docs/reliability.md):
//   0    everything asked for was done (every request / document succeeded);
//   1    something failed: a request or document (its result says why; the others are still
//        written), the model or engine could not be set up, or a write failed;
//   2    usage: a bad flag or value, an unreadable input or an unwritable output path, found
//        before any work starts;
//   130 / 143  interrupted by SIGINT / SIGTERM (the finished results are written).
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

struct EngineFlags {
  EngineConfig config;
  std::string kv_cache_memory;  // "2GiB", "512MiB", "1000000" (bytes)
  std::string kv_cache_dtype = "auto";  // --kv-cache-dtype: auto | bf16 | fp8
  std::vector<std::string> kv_policy_opts;  // "key=value" (--kv-policy-opt, repeatable)
  // --retain-contexts / --no-retain-contexts (neither: the command's default; `serve` retains).
  bool retain_contexts = false;
  bool no_retain_contexts = false;
  std::string retained_kv_memory;  // --retained-kv-memory: "50%", "0.5" (a share of the pool) or a size
  // --async-scheduling / --no-async-scheduling (the last given wins, as for any boolean flag);
  // neither: on where steps launch asynchronously (--device cuda), off on the CPU backend, where
  // it would overlap nothing.
  bool async_scheduling = false;
  CLI::Option* async_scheduling_flag = nullptr;  // whether either was given (count() > 0)
  // --block-size, where given (count() > 0); else finalize_engine_flags picks default_block_size().
  CLI::Option* block_size_flag = nullptr;
};

// Registers --model, --tokenizer, --device, --block-size, --max-num-seqs, --max-num-batched-tokens,
// --kv-cache-memory, --num-kv-blocks, --enable-prefix-caching, and the compression flags
// --kv-policy, --kv-budget, --kv-policy-opt, --no-async-compression, --[no-]async-scheduling, --compression-layer-stride,
// --query-slots, --query-window, and --retain-contexts / --no-retain-contexts / --retained-kv-memory
// on `cmd`.
void add_engine_flags(CLI::App* cmd, EngineFlags* flags);
// Registers --temperature, --top-p, --top-k, --min-p, --seed, --max-tokens, --ignore-eos, --stop.
void add_sampling_flags(CLI::App* cmd, SamplingParams* params, std::string* seed_text);
// Resolves derived values (memory size strings) and rejects, before the model loads, values that
// would be ignored or refused later (a repeated --kv-policy-opt key, --kv-budget for a policy that
// does not compress, an unknown policy or a bad option value, a --group-budget-ratios value
// outside (0, 1]); returns false after printing an error. `build_default_policy`: the engine's
// default policy takes --kv-policy-opt (eval gives the options to its sweep's policies instead).
bool finalize_engine_flags(EngineFlags* flags, bool build_default_policy = true);
// Engine::create, with a clear error (nullptr, after printing it) for any failure including
// running out of memory while loading, and warnings (a tokenizer that does not look like the
// model's) on stderr.
std::unique_ptr<Engine> create_engine(const EngineConfig& config);
bool finalize_sampling_flags(SamplingParams* params, const std::string& seed_text);

// Parses "2GiB", "1.5GB", "512MiB", "4096" into bytes.
bool parse_memory_size(const std::string& text, int64_t* bytes);

// The project's default model: ../shared/models/origami-tiny-qwen3 next to the checkout.
std::string default_model_dir();

// A model's config and tokenizer (from tokenizer_dir, else the model folder), for the offline
// commands that run no engine (calibrate, train-gates); on failure the error is printed and the
// result is empty.
struct ModelFiles {
  ModelConfig config;
  std::shared_ptr<Tokenizer> tokenizer;
};
std::optional<ModelFiles> load_model_files(const std::string& model_dir, const std::string& tokenizer_dir);

// Prints "origami: error: <msg>" to stderr.
void print_error(const std::string& message);
// Prints "origami: warning: <msg>" to stderr.
void print_warning(const std::string& message);

}  // namespace origami::cli
