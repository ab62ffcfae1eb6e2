// `origami calibrate`: TANGRAM's offline head-budget calibration (docs/policies.md, "Calibration
// and head budgets"; eval/head_calibration.h).
//
//   origami calibrate --model DIR --data FILE --scorer snapkv|keydiff|knorm --samples 50
//       --alpha 2 --rho 0.25 --output budgets.json
//
// Prefills each sample with full KV on the CPU backend, scores it as the CPU compression does,
// runs the per-layer non-uniform top-k at retention rho, and writes B = min(1, mean + alpha * std)
// of every head's kept fraction, then prints per-layer ratios and the KV memory budget-aware
// clustering needs against adjacent grouping.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "cli_common.h"
#include "commands.h"
#include "engine/head_budget_loader.h"
#include "engine/prompt_builder.h"
#include "eval/head_calibration.h"
#include "interrupt.h"
#include "kv/head_grouping.h"
#include "output_file.h"
#include "tokenizer/tokenizer.h"

namespace origami::cli {
namespace {

constexpr int kDefaultMinTokens = 256;

struct CalibrateFlags {
  std::string model_dir = default_model_dir();
  std::string tokenizer_dir;
  std::string device = "cpu";
  int threads = 0;
  std::string data_path;
  std::string output_path;
  eval::CalibrationOptions options;
  eval::SampleReadOptions samples;  // min_tokens comes from min_tokens below
  int min_tokens = 0;               // 0: min(kDefaultMinTokens, --max-tokens)
  bool quiet = false;
};

void print_summary(const HeadBudgets& b) {
  std::printf("layer  min    mean   max    (budget ratio B per KV head)\n");
  double all_min = 1.0, all_max = 0.0;
  for (int l = 0; l < b.num_layers(); ++l) {
    double lo = 1.0, hi = 0.0, sum = 0.0;
    for (double r : b.ratios[l]) {
      lo = std::min(lo, r);
      hi = std::max(hi, r);
      sum += r;
    }
    all_min = std::min(all_min, lo);
    all_max = std::max(all_max, hi);
    std::printf("%-6d %.3f  %.3f  %.3f\n", l, lo, sum / static_cast<double>(b.ratios[l].size()), hi);
  }
  std::printf("all    %.3f  %.3f  %.3f\n", all_min, b.mean_ratio(), all_max);
  std::printf("KV memory needed (share of full KV, per-group page tables, long documents):\n");
  std::printf("  per head (H_p = 1): %.3f\n", b.mean_ratio());
  bool any = false;
  for (int hp : {2, 4}) {
    if (b.num_kv_heads() % hp != 0) continue;
    Expected<HeadGrouping> clustered = cluster_heads(b.ratios, hp);
    Expected<HeadGrouping> adjacent = adjacent_heads(b.ratios, hp);
    if (!clustered || !adjacent) continue;
    std::printf("  H_p = %d: clustered %.3f, adjacent %.3f\n", hp, grouping_memory_fraction(*clustered),
                grouping_memory_fraction(*adjacent));
    any = true;
  }
  if (!any) std::printf("  (H_p = 2 and 4 do not divide the %d KV heads)\n", b.num_kv_heads());
}

int run_calibrate(const CalibrateFlags& f) {
  eval::SampleReadOptions read = f.samples;
  // Unless given, the shortest sample is 256 tokens or the whole --max-tokens when that is less.
  read.min_tokens = f.min_tokens > 0 ? f.min_tokens : std::min(kDefaultMinTokens, read.max_tokens);
  if (read.min_tokens > read.max_tokens) {
    print_error("--min-tokens " + std::to_string(read.min_tokens) + " is above --max-tokens " +
                std::to_string(read.max_tokens));
    return kExitUsage;
  }
  if (f.device != "cpu") {
    print_error("calibrate: --device " + f.device +
                " is not supported: calibration scores the fp32 cache of the CPU backend (use --device cpu)");
    return kExitUsage;
  }
  if (Status st = check_output_path("--output", f.output_path); !st.is_ok()) {
    print_error(st.message());
    return kExitUsage;
  }
  Expected<ScoreRecipe> recipe = eval::calibration_recipe(f.options.scorer);
  if (!recipe) {
    print_error(recipe.status().message());
    return kExitUsage;
  }
  std::optional<ModelFiles> files = load_model_files(f.model_dir, f.tokenizer_dir);
  if (!files) return kExitFailure;
  const ModelConfig& config = files->config;
  const std::shared_ptr<Tokenizer>& tokenizer = files->tokenizer;
  read.max_tokens = std::min(read.max_tokens, config.max_position_embeddings);
  read.min_tokens = std::min(read.min_tokens, read.max_tokens);
  const PromptBuilder builder(tokenizer);
  Expected<std::vector<eval::CalibrationSample>> samples = eval::read_calibration_samples(f.data_path, builder, read);
  if (!samples) {
    print_error(samples.status().message());
    return kExitUsage;
  }
  if (static_cast<int>(samples->size()) < read.max_samples)
    print_warning(f.data_path + " holds only " + std::to_string(samples->size()) + " samples of at least " +
                  std::to_string(read.min_tokens) + " tokens (asked for " + std::to_string(read.max_samples) + ")");
  int longest = 0;
  for (const auto& s : *samples) longest = std::max(longest, static_cast<int>(s.token_ids.size()));
  Expected<std::unique_ptr<eval::PrefillScorer>> scorer =
      eval::PrefillScorer::create(f.model_dir, config, *recipe, longest, f.threads);
  if (!scorer) {
    print_error(scorer.status().to_string());
    return kExitFailure;
  }

  std::vector<eval::SampleRetention> retention;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < samples->size(); ++i) {
    if (interrupt_signal() != 0) {
      report_interrupted("no budget file written");
      return interrupted_exit_code();
    }
    const eval::CalibrationSample& s = (*samples)[i];
    Expected<eval::HeadScores> scores = (*scorer)->score(s.token_ids);
    if (!scores) {
      print_error(s.origin + ": " + scores.status().message());
      return kExitFailure;
    }
    retention.push_back(eval::measure_retention(*scores, f.options.rho));
    if (!f.quiet) {
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr, "calibrate: sample %zu/%zu (%zu tokens, %s) done, %.1f s\n", i + 1, samples->size(),
                   s.token_ids.size(), s.origin.c_str(), secs);
    }
  }
  const HeadBudgets budgets = eval::summarize_retention(retention, f.options, model_identity(config));
  OutputFile out;
  Status st = out.open("--output", f.output_path);
  if (st.is_ok()) st = out.write(head_budgets_to_json(budgets));
  if (st.is_ok()) st = out.close();
  if (!st.is_ok()) {
    print_error(st.message());
    return kExitFailure;
  }
  std::printf("calibrated %s (%d layers x %d KV heads) on %d samples with %s, rho %g, alpha %g -> %s\n",
              config.model_type.c_str(), budgets.num_layers(), budgets.num_kv_heads(), budgets.samples,
              budgets.scorer.c_str(), budgets.rho, budgets.alpha, f.output_path.c_str());
  print_summary(budgets);
  return flush_stdout() ? kExitOk : kExitFailure;
}

}  // namespace

void register_calibrate_command(CLI::App& app) {
  auto f = std::make_shared<CalibrateFlags>();
  CLI::App* cmd = app.add_subcommand(
      "calibrate", "Calibrate per-head KV budget ratios offline (TANGRAM): writes a head budget JSON file");
  cmd->add_option("--model", f->model_dir, "HuggingFace model folder (config.json, *.safetensors, tokenizer.json)")
      ->capture_default_str();
  cmd->add_option("--tokenizer", f->tokenizer_dir, "Tokenizer folder (default: the model folder)");
  cmd->add_option("--device", f->device, "cpu (calibration scores the CPU backend's fp32 cache)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--threads", f->threads, "CPU threads (0 = all cores)")->check(CLI::Range(0, 1 << 16));
  cmd->add_option("--data", f->data_path,
                  "Sample documents: JSONL (\"prompt\" or \"messages\" per line) or text (documents separated by "
                  "\"\\n\\0\\n\" lines)")
      ->required();
  cmd->add_option("--scorer", f->options.scorer, "Token scorer: snapkv, keydiff or knorm (the policy's default recipe)")
      ->check(CLI::IsMember({"snapkv", "keydiff", "knorm"}))
      ->capture_default_str();
  cmd->add_option("--samples", f->samples.max_samples, "Sample documents to measure")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--alpha", f->options.alpha, "Safety margin: B = min(1, mean + alpha * std)")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  cmd->add_option("--rho", f->options.rho, "Target global retention of the per-layer top-k, in (0, 1]")
      ->check(CLI::Range(1e-9, 1.0))
      ->capture_default_str();
  cmd->add_option("--max-tokens", f->samples.max_tokens,
                  "Tokens per sample (longer documents are cut; capped at the model's context)")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  cmd->add_option("--min-tokens", f->min_tokens,
                  "Shorter documents / windows are skipped (default: 256, or --max-tokens when that is less)")
      ->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--output", f->output_path, "Where to write the head budget JSON file")->required();
  cmd->add_flag("--quiet", f->quiet, "No per-sample progress on stderr");
  cmd->callback([f] { set_exit_code(run_calibrate(*f)); });
}

}  // namespace origami::cli
