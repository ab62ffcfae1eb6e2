// `origami train-gates`: Fast KVzip gate training (docs/gates.md; gates/, eval/gate_training.h).
//
//   origami train-gates --model DIR --data FILE --output gates.safetensors
//       [--samples 60 --max-tokens 1000 --document-stride 50 --epochs 10 --batch 256 --lr 0.2 ...]
//
// Scores sample documents with KVzip's reconstruction pass on the CPU backend (the frozen model),
// keeps each layer's attention inputs, trains every layer's sink-attention gate on them with BCE
// and SGD with momentum, and checks the result on held-out documents of the same file (documents
// d with d % stride == stride / 2; training reads d % stride == 0): Spearman and top-k overlap
// with the exact KVzip scores, for the trained gates and for their initialization.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "cli_common.h"
#include "commands.h"
#include "engine/prompt_builder.h"
#include "eval/gate_training.h"
#include "interrupt.h"
#include "output_file.h"
#include "tokenizer/tokenizer.h"

namespace origami::cli {
namespace {

struct TrainGatesFlags {
  std::string model_dir = default_model_dir();
  std::string tokenizer_dir;
  std::string data_path;
  std::string output_path;
  int threads = 0;
  // Defaults: the recipe of the shipped tiny-model gates (docs/gates.md).
  int samples = 60;
  int heldout_samples = 10;
  int max_tokens = 1000;
  int min_tokens = 256;
  int document_stride = 50;
  int chunk_size = 2048;
  double keep = 0.25;
  gates::GateTrainOptions train = shipped_recipe();
  bool quiet = false;

  static gates::GateTrainOptions shipped_recipe() {
    gates::GateTrainOptions o;  // the paper's lr 0.2 and momentum; smaller batches, more epochs
    o.epochs = 10;
    o.batch_size = 256;
    return o;
  }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void print_quality(const char* label, const eval::GateQuality& q) {
  std::printf("%-12s spearman %.3f  top-%g%% overlap %.3f   per layer:", label, q.spearman, 100.0 * q.keep, q.overlap);
  for (size_t l = 0; l < q.layer_spearman.size(); ++l)
    std::printf(" %.2f/%.2f", q.layer_spearman[l], q.layer_overlap[l]);
  std::printf("\n");
}

int run_train_gates(const TrainGatesFlags& f) {
  if (Status st = check_output_path("--output", f.output_path); !st.is_ok()) {
    print_error(st.message());
    return kExitUsage;
  }
  if (f.heldout_samples > 0 && f.document_stride < 2) {
    print_error("--heldout-samples needs --document-stride >= 2 (held-out documents are those between the "
                "training documents)");
    return kExitUsage;
  }
  std::optional<ModelFiles> files = load_model_files(f.model_dir, f.tokenizer_dir);
  if (!files) return kExitFailure;
  const ModelConfig& config = files->config;
  const std::shared_ptr<Tokenizer>& tokenizer = files->tokenizer;
  // The reconstruction doubles the sequence: keep the context within half the model's window.
  const int max_tokens = std::min(f.max_tokens, config.max_position_embeddings / 2);
  const PromptBuilder builder(tokenizer);
  eval::SampleReadOptions read;
  read.max_samples = f.samples;
  read.max_tokens = max_tokens;
  read.min_tokens = std::min(f.min_tokens, max_tokens);
  read.document_stride = f.document_stride;
  read.document_offset = 0;
  const auto t0 = std::chrono::steady_clock::now();
  Expected<std::vector<eval::CalibrationSample>> train = eval::read_calibration_samples(f.data_path, builder, read);
  if (!train) {
    print_error(train.status().message());
    return kExitUsage;
  }
  std::vector<eval::CalibrationSample> heldout;
  if (f.heldout_samples > 0) {
    read.max_samples = f.heldout_samples;
    read.document_offset = f.document_stride / 2;
    Expected<std::vector<eval::CalibrationSample>> h = eval::read_calibration_samples(f.data_path, builder, read);
    if (!h) {
      print_error("held-out samples: " + h.status().message());
      return kExitUsage;
    }
    heldout = std::move(*h);
  }
  eval::KVzipOptions kvzip;
  kvzip.prompts = eval::kvzip_prompts(*tokenizer);
  kvzip.chunk_size = f.chunk_size;
  Expected<std::unique_ptr<eval::KVzipScorer>> scorer =
      eval::KVzipScorer::create(f.model_dir, config, kvzip, max_tokens, f.threads);
  if (!scorer) {
    print_error(scorer.status().to_string());
    return kExitFailure;
  }
  const gates::GateShape shape = gates::gate_shape_for(config);
  gates::GateTrainingSet set;
  set.shape = shape;
  Expected<std::vector<eval::KVzipResult>> none = eval::score_samples(**scorer, *train, &set, [&](size_t i) {
    if (!f.quiet)
      std::fprintf(stderr, "train-gates: KVzip targets %zu/%zu (%zu tokens, %s), %.1f s\n", i + 1, train->size(),
                   (*train)[i].token_ids.size(), (*train)[i].origin.c_str(), seconds_since(t0));
  });
  if (!none) {
    print_error(none.status().message());
    return kExitFailure;
  }
  if (interrupt_signal() != 0) {
    report_interrupted("no gate file written");
    return interrupted_exit_code();
  }
  const double targets_s = seconds_since(t0);
  const gates::GateWeights init = gates::init_gates(shape, f.train.seed);
  gates::GateWeights trained = init;
  gates::GateTrainOptions train_options = f.train;
  if (train_options.num_threads <= 0) train_options.num_threads = std::max(1, f.threads);
  const auto t1 = std::chrono::steady_clock::now();
  const gates::GateTrainReport report =
      gates::train_gates(set, train_options, &trained, [&](int layer, int epoch, double loss) {
        if (!f.quiet)
          std::fprintf(stderr, "train-gates: layer %d epoch %d loss %.5f, %.1f s\n", layer, epoch + 1, loss,
                       seconds_since(t1));
      });
  const double train_s = seconds_since(t1);

  std::printf("trained gates for %s (%d layers x %d KV heads, G %d, D' %d, %d sinks) on %d tokens from %zu samples: "
              "KVzip targets %.1f s, training %.1f s (%d steps per layer)\n",
              config.model_type.c_str(), shape.num_layers, shape.num_kv_heads, shape.group_size, shape.rank,
              shape.num_sinks, set.num_tokens, train->size(), targets_s, train_s, report.steps_per_layer);
  std::printf("layer  BCE first epoch -> last epoch\n");
  for (int l = 0; l < shape.num_layers; ++l)
    std::printf("%-6d %.5f -> %.5f\n", l, report.epoch_loss[l].front(), report.epoch_loss[l].back());

  trained.metadata["model"] = config.model_type;
  trained.metadata["training_tokens"] = std::to_string(set.num_tokens);
  trained.metadata["training_samples"] = std::to_string(train->size());
  trained.metadata["epochs"] = std::to_string(f.train.epochs);
  trained.metadata["learning_rate"] = std::to_string(f.train.learning_rate);
  trained.metadata["momentum"] = std::to_string(f.train.momentum);
  trained.metadata["batch_size"] = std::to_string(f.train.batch_size);
  if (!heldout.empty()) {
    const auto t2 = std::chrono::steady_clock::now();
    Expected<std::vector<eval::KVzipResult>> scored = eval::score_samples(**scorer, heldout, nullptr);
    if (!scored) {
      print_error("held-out check: " + scored.status().message());
      return kExitFailure;
    }
    gates::GateTrainingSet heldout_set;
    heldout_set.shape = shape;
    for (const eval::KVzipResult& r : *scored) eval::append_training_rows(r, &heldout_set);
    std::printf("held-out: %zu samples, %d tokens (%.1f s)\nlayer  BCE trained (initial)\n", heldout.size(),
                heldout_set.num_tokens, seconds_since(t2));
    for (int l = 0; l < shape.num_layers; ++l)
      std::printf("%-6d %.5f (%.5f)\n", l, gates::gate_layer_loss(heldout_set, trained.layers[l], l),
                  gates::gate_layer_loss(heldout_set, init.layers[l], l));
    std::printf("agreement with exact KVzip: mean over layers, then per layer spearman/overlap\n");
    const eval::GateQuality q = eval::measure_gate_quality(trained, *scored, f.keep, kvzip.num_sinks);
    print_quality("trained", q);
    print_quality("initial", eval::measure_gate_quality(init, *scored, f.keep, kvzip.num_sinks));
    trained.metadata["heldout_spearman"] = std::to_string(q.spearman);
    trained.metadata["heldout_topk_overlap"] = std::to_string(q.overlap);
  }
  if (Status st = gates::save_gates(f.output_path, trained); !st.is_ok()) {
    print_error(st.message());
    return kExitFailure;
  }
  std::printf("wrote %s\n", f.output_path.c_str());
  return flush_stdout() ? kExitOk : kExitFailure;
}

}  // namespace

void register_train_gates_command(CLI::App& app) {
  auto f = std::make_shared<TrainGatesFlags>();
  CLI::App* cmd = app.add_subcommand(
      "train-gates", "Train Fast KVzip's KV-eviction gates on KVzip reconstruction scores (CPU): writes safetensors");
  cmd->add_option("--model", f->model_dir, "HuggingFace model folder")->capture_default_str();
  cmd->add_option("--tokenizer", f->tokenizer_dir, "Tokenizer folder (default: the model folder)");
  cmd->add_option("--data", f->data_path,
                  "Training text: documents separated by \"\\n\\0\\n\" lines (or JSONL prompts); never an eval set")
      ->required();
  cmd->add_option("--output", f->output_path, "Where to write the gates (.safetensors)")->required();
  cmd->add_option("--threads", f->threads, "CPU threads (0 = all cores)")->check(CLI::Range(0, 1 << 16));
  cmd->add_option("--samples", f->samples, "Training samples (one window per document first)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--heldout-samples", f->heldout_samples, "Held-out samples for the quality check (0 = none)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--max-tokens", f->max_tokens, "Context tokens per sample (at most half the model's context)")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  cmd->add_option("--min-tokens", f->min_tokens, "Shorter windows are skipped")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  cmd->add_option("--document-stride", f->document_stride,
                  "Train on documents d % stride == 0, hold out d % stride == stride / 2")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  cmd->add_option("--chunk-size", f->chunk_size,
                  "Most context tokens per KVzip reconstruction pass (longer contexts: equal chunks, each "
                  "reconstructed right after itself)")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  cmd->add_option("--keep", f->keep, "Kept share for the top-k overlap check")
      ->check(CLI::Range(1e-6, 1.0))
      ->capture_default_str();
  cmd->add_option("--epochs", f->train.epochs, "Passes over the training tokens")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--lr", f->train.learning_rate, "SGD learning rate")->check(CLI::Range(0.0, 1e6))->capture_default_str();
  cmd->add_option("--momentum", f->train.momentum, "SGD momentum")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  cmd->add_option("--batch", f->train.batch_size, "Tokens per SGD step")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  cmd->add_option("--seed", f->train.seed, "Initialization and token order")->capture_default_str();
  cmd->add_flag("--quiet", f->quiet, "No progress on stderr");
  cmd->callback([f] { set_exit_code(run_train_gates(*f)); });
}

}  // namespace origami::cli
