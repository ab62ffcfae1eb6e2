// `origami generate`: one prompt (--prompt) or a JSONL batch (--input/--output).
#include <fstream>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "engine/batch_runner.h"
#include "engine/engine.h"
#include "engine/prompt_builder.h"
#include "engine/request_options_json.h"
#include "engine/sampling_json.h"
#include "progress_bar.h"

namespace origami::cli {
namespace {

struct GenerateFlags {
  EngineFlags engine;
  SamplingParams sampling;
  std::string seed_text;
  std::string prompt;
  bool chat = false;
  std::string chat_template_kwargs = "{}";
  std::string input_path;
  std::string output_path;
};

// Reads the JSONL batch. A line that is not valid gets an error result; the others still run.
std::vector<BatchItem> read_batch(const std::string& path, const PromptBuilder& builder, const SamplingParams& defaults,
                                  std::vector<nlohmann::json>* lines, bool* ok) {
  std::vector<BatchItem> items;
  std::ifstream in(path);
  if (!in) {
    print_error("--input: cannot open '" + path + "'");
    *ok = false;
    return items;
  }
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    BatchItem item;
    nlohmann::json obj = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const std::string where = path + ":" + std::to_string(line_no) + ": ";
    if (obj.is_discarded()) {
      item.error = where + "not valid JSON";
    } else {
      Expected<std::vector<int32_t>> ids = builder.from_json(obj);
      Expected<SamplingParams> sp = sampling_params_from_json(obj, defaults);
      Expected<RequestOptions> opts = request_options_from_json(obj);
      if (!ids) item.error = where + ids.status().message();
      else if (!sp) item.error = where + sp.status().message();
      else if (!opts) item.error = where + opts.status().message();
      else {
        item.prompt_token_ids = std::move(*ids);
        item.sampling = std::move(*sp);
        item.options = std::move(*opts);
      }
    }
    lines->push_back(obj.is_discarded() ? nlohmann::json(nullptr) : obj);
    items.push_back(std::move(item));
  }
  return items;
}

int run_generate(GenerateFlags& f) {
  if (!finalize_engine_flags(&f.engine) || !finalize_sampling_flags(&f.sampling, f.seed_text)) return 2;
  const bool batch_mode = !f.input_path.empty();
  if (batch_mode == !f.prompt.empty()) {
    print_error("give either --prompt TEXT or --input FILE.jsonl");
    return 2;
  }
  nlohmann::json kwargs = nlohmann::json::parse(f.chat_template_kwargs, nullptr, false);
  if (kwargs.is_discarded() || !kwargs.is_object()) {
    print_error("--chat-template-kwargs must be a JSON object");
    return 2;
  }

  Expected<std::unique_ptr<Engine>> engine = Engine::create(f.engine.config);
  if (!engine) {
    print_error(engine.status().to_string());
    return 1;
  }
  PromptBuilder builder((*engine)->tokenizer());

  if (!batch_mode) {
    Expected<std::vector<int32_t>> ids = f.chat ? builder.from_messages(nlohmann::json::array({{{"role", "user"}, {"content", f.prompt}}}), kwargs)
                                                : builder.from_text(f.prompt);
    if (!ids) {
      print_error(ids.status().to_string());
      return 1;
    }
    Expected<RequestId> id = (*engine)->add_request(*ids, f.sampling);
    if (!id) {
      print_error(id.status().to_string());
      return 1;
    }
    // Stream the completion as it is produced.
    FinishReason reason = FinishReason::kNone;
    std::string error;
    while ((*engine)->has_unfinished()) {
      for (const RequestOutput& out : (*engine)->step()) {
        std::cout << out.new_text << std::flush;
        if (out.finished) {
          reason = out.finish_reason;
          error = out.error;
        }
      }
    }
    std::cout << std::endl;
    if (reason == FinishReason::kError) {
      print_error(error);
      return 1;
    }
    return 0;
  }

  std::vector<nlohmann::json> lines;
  bool ok = true;
  std::vector<BatchItem> items = read_batch(f.input_path, builder, f.sampling, &lines, &ok);
  if (!ok) return 2;
  std::ofstream out_file;
  std::ostream* out = &std::cout;
  if (!f.output_path.empty()) {
    out_file.open(f.output_path);
    if (!out_file) {
      print_error("--output: cannot write '" + f.output_path + "'");
      return 2;
    }
    out = &out_file;
  }
  ProgressBar bar("generate");
  Engine& eng = **engine;
  std::vector<BatchResult> results =
      run_batch(eng, items, [&](size_t done, size_t total) { bar.update(done, total, eng.metrics().num_generated_tokens); });
  bar.finish();
  int failures = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const BatchResult& r = results[i];
    nlohmann::json o;
    o["index"] = i;
    if (lines[i].is_object() && lines[i].contains("id")) o["id"] = lines[i]["id"];
    if (!r.ok) {
      o["error"] = r.error;
      ++failures;
    } else {
      o["text"] = r.text;
      o["token_ids"] = r.output_token_ids;
      o["finish_reason"] = finish_reason_name(r.finish_reason);
      o["num_prompt_tokens"] = r.num_prompt_tokens;
      o["num_output_tokens"] = r.output_token_ids.size();
      if (!items[i].options.forced_output_tokens.empty() && items[i].options.return_forced_logprobs)
        o["forced_logprobs"] = r.forced_logprobs;
    }
    *out << o.dump() << "\n";
  }
  out->flush();
  if (failures) std::fprintf(stderr, "origami: %d of %zu requests failed (see their \"error\" fields)\n", failures, results.size());
  return 0;
}

}  // namespace

void register_generate_command(CLI::App& app) {
  auto flags = std::make_shared<GenerateFlags>();
  flags->sampling.temperature = 0.0f;  // a CLI completion is greedy unless asked otherwise
  flags->sampling.max_tokens = 64;
  CLI::App* cmd = app.add_subcommand("generate", "Complete a prompt, or a JSONL batch of requests");
  add_engine_flags(cmd, &flags->engine);
  add_sampling_flags(cmd, &flags->sampling, &flags->seed_text);
  cmd->add_option("--prompt", flags->prompt, "Prompt text");
  cmd->add_flag("--chat", flags->chat, "Wrap --prompt as a user message in the model's chat template");
  cmd->add_option("--chat-template-kwargs", flags->chat_template_kwargs, "Extra chat template variables as JSON, e.g. '{\"enable_thinking\": false}'");
  cmd->add_option("--input", flags->input_path,
                  "JSONL requests: {\"prompt\" | \"messages\", sampling fields, kv_policy, kv_budget, kv_policy_options...} per line");
  cmd->add_option("--output", flags->output_path, "JSONL results (default: stdout)");
  cmd->callback([flags] { set_exit_code(run_generate(*flags)); });
}

}  // namespace origami::cli
