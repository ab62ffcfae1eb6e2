// `origami bench`: offline throughput benchmark (all requests submitted at once).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <memory>
#include <random>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "engine/batch_runner.h"
#include "engine/engine.h"
#include "engine/jsonl_requests.h"
#include "engine/prompt_builder.h"
#include "model/config.h"
#include "input_path.h"
#include "interrupt.h"
#include "output_file.h"
#include "latency_stats.h"
#include "progress_bar.h"

namespace origami::cli {
namespace {

// A million requests is far beyond any offline benchmark; more only exhausts memory.
constexpr int kMaxNumPrompts = 1'000'000;
// 2^28 random prompt tokens (1 GiB of ids).
constexpr int64_t kMaxRandomPromptTokens = int64_t{1} << 28;

struct BenchFlags {
  EngineFlags engine;
  int num_prompts = 64;
  int input_len = 128;
  int output_len = 128;
  std::string input_path;
  bool json = false;
  bool quiet = false;
  uint64_t dataset_seed = 0;
};

// Random prompts of exactly input_len tokens, outputs of exactly output_len (ignore_eos).
std::vector<BatchItem> random_dataset(const BenchFlags& f, int vocab_size) {
  std::mt19937_64 rng(f.dataset_seed);
  std::uniform_int_distribution<int32_t> token(0, vocab_size - 1);
  std::vector<BatchItem> items(f.num_prompts);
  for (auto& item : items) {
    item.prompt_token_ids.resize(f.input_len);
    for (auto& t : item.prompt_token_ids) t = token(rng);
    item.sampling.temperature = 0.0f;
    item.sampling.max_tokens = f.output_len;
    item.sampling.ignore_eos = true;
  }
  return items;
}

bool file_dataset(const BenchFlags& f, const PromptBuilder& builder, std::vector<BatchItem>* items) {
  SamplingParams defaults;
  defaults.temperature = 0.0f;
  defaults.max_tokens = f.output_len;
  Expected<std::vector<JsonlRequest>> requests = read_jsonl_requests(input_source(f.input_path), builder, defaults);
  if (!requests) {
    print_error("--input: " + requests.status().message());
    return false;
  }
  for (JsonlRequest& r : *requests) items->push_back(std::move(r.item));
  return true;
}

// The random dataset's size, checked against the model's context (--max-model-len, else
// max_position_embeddings) and a memory bound on the prompts' token ids.
Status check_random_dataset(const BenchFlags& f) {
  // A model folder that cannot be read is the engine's setup error (exit 1), reported when it
  // loads; the context is checked only when the config can be read.
  Expected<ModelConfig> model = load_model_config(f.engine.config.model_dir);
  if (model && model->max_position_embeddings > 0) {
    const int64_t context =
        f.engine.config.max_model_len > 0 ? f.engine.config.max_model_len : model->max_position_embeddings;
    for (const auto& [flag, value] : {std::pair<const char*, int>{"--input-len", f.input_len}, {"--output-len", f.output_len}}) {
      if (value > context)
        return invalid_argument(std::string(flag) + " " + std::to_string(value) + " is longer than the model's context (" +
                                std::to_string(context) + " tokens, max_model_len)");
    }
  }
  const int64_t total = static_cast<int64_t>(f.num_prompts) * f.input_len;
  if (total > kMaxRandomPromptTokens)
    return invalid_argument("--num-prompts x --input-len is " + std::to_string(total) + " prompt tokens; at most " +
                            std::to_string(kMaxRandomPromptTokens) + " are generated (4 bytes each)");
  return Status::ok();
}

// How many failures are quoted on stderr: enough to see a pattern, short enough to read.
constexpr size_t kErrorsShown = 3;

int run_bench(BenchFlags& f) {
  if (!finalize_engine_flags(&f.engine)) return kExitUsage;
  // Ranges (CLI11 checks them while parsing): --num-prompts in [1, 10^6], lengths >= 1. What
  // depends on the model (its context) is checked here, before the model loads or any prompt
  // is allocated.
  if (f.input_path.empty()) {
    if (Status st = check_random_dataset(f); !st.is_ok()) {
      print_error(st.message());
      return kExitUsage;
    }
  } else if (Status st = check_input_path("--input", f.input_path); !st.is_ok()) {
    print_error(st.message());
    return kExitUsage;
  }
  std::unique_ptr<Engine> engine = create_engine(f.engine.config);
  if (!engine) return kExitFailure;
  Engine& eng = *engine;
  std::vector<BatchItem> items;
  if (f.input_path.empty()) {
    items = random_dataset(f, eng.model_config().vocab_size);
  } else {
    PromptBuilder builder(eng.tokenizer());
    if (!file_dataset(f, builder, &items)) return kExitUsage;
  }

  ProgressBar bar("bench");
  const double start = eng.now();
  BatchHooks hooks;
  hooks.progress = [&](size_t done, size_t total) {
    if (!f.quiet) bar.update(done, total, eng.metrics().num_generated_tokens);
  };
  hooks.should_stop = [] { return interrupt_signal() != 0; };
  std::vector<BatchResult> results = run_batch(eng, items, hooks);
  const double wall = eng.now() - start;
  if (!f.quiet) bar.finish();

  // An interrupted run reports the requests that finished; the aborted ones are not counted.
  std::vector<double> ttft, tpot, e2e;
  int64_t out_tokens = 0, in_tokens = 0;
  int failed = 0, interrupted = 0, capped = 0;
  std::vector<std::string> first_errors;
  for (size_t i = 0; i < results.size(); ++i) {
    const BatchResult& r = results[i];
    if (r.finish_reason == FinishReason::kAborted) {
      ++interrupted;
      continue;
    }
    if (!r.ok) {
      ++failed;
      if (first_errors.size() < kErrorsShown) first_errors.push_back("request " + std::to_string(i) + ": " + r.error);
      continue;
    }
    // Stopped by the context (max_model_len) before its max_tokens: fewer tokens than asked.
    if (r.finish_reason == FinishReason::kLength && static_cast<int>(r.output_token_ids.size()) < items[i].sampling.max_tokens)
      ++capped;
    out_tokens += static_cast<int64_t>(r.output_token_ids.size());
    in_tokens += r.num_prompt_tokens;
    ttft.push_back(r.first_token_time - start);
    e2e.push_back(r.finish_time - start);
    if (r.output_token_ids.size() > 1)
      tpot.push_back((r.finish_time - r.first_token_time) / static_cast<double>(r.output_token_ids.size() - 1));
  }
  const EngineMetrics& m = eng.metrics();
  nlohmann::json j;
  j["model"] = f.engine.config.model_dir;
  j["device"] = f.engine.config.device;
  j["dummy_weights"] = f.engine.config.dummy_weights;
  j["quantization"] = f.engine.config.quantization;
  j["num_prompts"] = results.size();
  j["completed"] = static_cast<int>(results.size()) - failed - interrupted;
  j["failed"] = failed;
  j["capped_by_context"] = capped;
  j["max_model_len"] = eng.config().max_model_len;
  if (interrupted > 0 || interrupt_signal() != 0) j["interrupted"] = interrupted;
  j["input_tokens"] = in_tokens;
  j["output_tokens"] = out_tokens;
  j["wall_seconds"] = wall;
  j["output_tokens_per_second"] = wall > 0 ? out_tokens / wall : 0.0;
  j["total_tokens_per_second"] = wall > 0 ? (out_tokens + in_tokens) / wall : 0.0;
  j["mean_ttft_ms"] = mean_of(ttft) * 1e3;
  j["p99_ttft_ms"] = percentile_of(ttft, 99) * 1e3;
  j["mean_tpot_ms"] = mean_of(tpot) * 1e3;
  j["p99_tpot_ms"] = percentile_of(tpot, 99) * 1e3;
  j["mean_e2e_ms"] = mean_of(e2e) * 1e3;
  j["peak_running_requests"] = m.peak_running;
  j["peak_kv_blocks"] = m.peak_kv_blocks_used;
  j["kv_blocks_total"] = m.num_kv_blocks_total;
  j["block_size"] = f.engine.config.block_size;
  j["num_steps"] = m.num_steps;
  j["num_preemptions"] = m.num_preemptions;
  j["prefix_cached_tokens"] = m.num_prefix_cached_tokens;
  j["execute_seconds"] = m.execute_seconds;
  j["schedule_seconds"] = m.schedule_seconds;
  j["schedule_ms_per_step"] = m.num_steps > 0 ? 1e3 * m.schedule_seconds / static_cast<double>(m.num_steps) : 0.0;
  j["kv_policy"] = f.engine.config.kv_policy;
  j["kv_budget"] = f.engine.config.kv_budget;
  j["kv_policy_options"] = f.engine.config.kv_policy_options;
  j["async_compression"] = f.engine.config.async_compression;
  j["kv_reservation"] = f.engine.config.reserve_bounded_kv;
  j["full_kv_reservation"] = f.engine.config.reserve_full_kv;
  j["num_compressions"] = m.num_compressions;
  j["evicted_tokens"] = m.num_evicted_tokens;
  j["kept_kv_pages"] = m.num_kept_kv_pages;
  j["compression_seconds"] = m.compression_seconds;
  j["compression_time_share"] = wall > 0 ? m.compression_seconds / wall : 0.0;
  j["compression_device_seconds"] = m.compression_device_seconds;
  j["compression_device_time_share"] = wall > 0 ? m.compression_device_seconds / wall : 0.0;
  j["query_slots"] = m.num_query_slots;
  j["query_slot_waits"] = m.num_query_slot_waits;
  if (f.json) {
    std::cout << j.dump() << std::endl;
  } else {
    std::printf("requests            %zu (%d failed", results.size(), failed);
    if (capped > 0) std::printf(", %d capped by the context of %d tokens", capped, eng.config().max_model_len);
    if (interrupted > 0) std::printf(", %d interrupted", interrupted);
    std::printf(")\n");
    std::printf("input / output tok  %lld / %lld\n", static_cast<long long>(in_tokens), static_cast<long long>(out_tokens));
    std::printf("wall time           %.3f s\n", wall);
    std::printf("output throughput   %.1f tok/s (TPS)\n", j["output_tokens_per_second"].get<double>());
    std::printf("total throughput    %.1f tok/s\n", j["total_tokens_per_second"].get<double>());
    std::printf("mean TTFT           %.2f ms (p99 %.2f)\n", j["mean_ttft_ms"].get<double>(), j["p99_ttft_ms"].get<double>());
    std::printf("mean TPOT           %.2f ms (p99 %.2f)\n", j["mean_tpot_ms"].get<double>(), j["p99_tpot_ms"].get<double>());
    std::printf("peak running        %d\n", m.peak_running);
    std::printf("peak KV blocks      %d of %d (block size %d)\n", m.peak_kv_blocks_used, m.num_kv_blocks_total,
                f.engine.config.block_size);
    std::printf("preemptions         %lld\n", static_cast<long long>(m.num_preemptions));
    std::printf("steps               %lld (scheduler %.3f ms per step)\n", static_cast<long long>(m.num_steps),
                j["schedule_ms_per_step"].get<double>());
    std::printf("KV policy           %s", f.engine.config.kv_policy.c_str());
    if (f.engine.config.kv_budget > 0) std::printf(" (budget %d)", f.engine.config.kv_budget);
    std::printf(", %d query slots\n", m.num_query_slots);
    std::printf("compressions        %lld (%lld tokens evicted, %lld query-slot waits)\n",
                static_cast<long long>(m.num_compressions), static_cast<long long>(m.num_evicted_tokens),
                static_cast<long long>(m.num_query_slot_waits));
    // Engine time is what compression cost the step loop (near zero when async); device time is
    // how long the backend was busy compressing (overlapping decode steps when async).
    std::printf("compression time    %.3f s engine (%.1f%% of wall, %s), %.3f s on the device (%.1f%% of wall)\n",
                m.compression_seconds, 100.0 * j["compression_time_share"].get<double>(),
                f.engine.config.async_compression ? "async" : "sync", m.compression_device_seconds,
                100.0 * j["compression_device_time_share"].get<double>());
  }
  if (!flush_stdout()) return kExitFailure;
  if (failed > 0) {
    std::fprintf(stderr, "origami: %d of %zu requests failed; the first %s:\n", failed, results.size(),
                 first_errors.size() == 1 ? "error" : (std::to_string(first_errors.size()) + " errors").c_str());
    for (const std::string& e : first_errors) std::fprintf(stderr, "  %s\n", e.c_str());
  }
  if (capped > 0)
    print_warning(std::to_string(capped) + " requests stopped at the context limit (max_model_len " +
                  std::to_string(eng.config().max_model_len) + " tokens) before their max_tokens; their output counts are lower");
  if (interrupt_signal() != 0) {
    const std::string what = "the metrics above cover the " + std::to_string(results.size() - interrupted) +
                             " requests that finished; " + std::to_string(interrupted) + " were aborted";
    report_interrupted(what.c_str());
    return interrupted_exit_code();
  }
  return failed > 0 ? kExitFailure : kExitOk;
}

}  // namespace

void register_bench_command(CLI::App& app) {
  auto flags = std::make_shared<BenchFlags>();
  CLI::App* cmd = app.add_subcommand("bench", "Offline throughput benchmark");
  add_engine_flags(cmd, &flags->engine);
  cmd->add_option("--num-prompts", flags->num_prompts, "Number of random prompts (at most 10^6)")
      ->check(CLI::Range(1, kMaxNumPrompts))->capture_default_str();
  cmd->add_option("--input-len", flags->input_len, "Prompt length of random prompts (at most the model's context)")
      ->check(CLI::Range(1, std::numeric_limits<int>::max()))->capture_default_str();
  cmd->add_option("--output-len", flags->output_len, "Tokens generated per request (ignore_eos; at most the model's context)")
      ->check(CLI::Range(1, std::numeric_limits<int>::max()))->capture_default_str();
  cmd->add_option("--input", flags->input_path, "JSONL requests instead of random prompts (a file, FIFO or <(...); - = stdin)");
  cmd->add_option("--dataset-seed", flags->dataset_seed, "Seed of the random prompts");
  cmd->add_flag("--json", flags->json, "Print the results as one JSON object");
  cmd->add_flag("--quiet", flags->quiet, "No progress bar");
  cmd->callback([flags] { set_exit_code(run_bench(*flags)); });
}

namespace {
int g_exit_code = 0;
}
void set_exit_code(int code) { g_exit_code = code; }
int exit_code() { return g_exit_code; }

}  // namespace origami::cli
