// `origami generate`: one prompt (--prompt) or a JSONL batch (--input/--output).
#include <cstdio>
#include <filesystem>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "core/json_parse.h"
#include "engine/batch_runner.h"
#include "engine/engine.h"
#include "engine/jsonl_requests.h"
#include "engine/prompt_builder.h"
#include "input_path.h"
#include "interrupt.h"
#include "output_file.h"
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
  int logprobs = -1;  // --logprobs N: every result lists its tokens' log-probs and top N
};

// Results go out in input order, each as soon as it and every result before it are final, and
// are flushed one by one. When the run stops early (a signal, a failed write), the results that
// finished behind an unfinished one are written after the in-order prefix: the file stays sorted
// by "index" and holds every finished request; unfinished ones are absent.
class OrderedResultWriter {
 public:
  OrderedResultWriter(OutputFile* out, size_t total) : out_(out), lines_(total) {}

  void add(size_t index, std::string line) {
    lines_[index] = std::move(line) + "\n";
    while (next_ < lines_.size() && !lines_[next_].empty()) write(next_++);
  }
  // Writes every result still waiting for an earlier one (after an interruption).
  void write_remaining() {
    for (size_t i = next_; i < lines_.size(); ++i)
      if (!lines_[i].empty()) write(i);
    next_ = lines_.size();
  }
  size_t num_written() const { return num_written_; }
  bool failed() const { return !status_.is_ok(); }
  const Status& status() const { return status_; }

 private:
  void write(size_t i) {
    if (status_.is_ok()) status_ = out_->write(lines_[i]);
    if (status_.is_ok()) ++num_written_;
    lines_[i].clear();
    lines_[i].shrink_to_fit();
  }

  OutputFile* out_;
  std::vector<std::string> lines_;  // "" = not final yet (or already written)
  size_t next_ = 0;
  size_t num_written_ = 0;
  Status status_;
};

nlohmann::json result_json(size_t index, const JsonlRequest& request, const BatchResult& r) {
  nlohmann::json o;
  o["index"] = index;
  if (!request.id.is_null()) o["id"] = request.id;
  if (!r.ok) {
    o["error"] = r.error;
    return o;
  }
  o["text"] = r.text;
  o["token_ids"] = r.output_token_ids;
  o["finish_reason"] = finish_reason_name(r.finish_reason);
  o["num_prompt_tokens"] = r.num_prompt_tokens;
  o["num_output_tokens"] = r.output_token_ids.size();
  if (!request.item.options.forced_output_tokens.empty() && request.item.options.return_forced_logprobs)
    o["forced_logprobs"] = r.forced_logprobs;
  if (request.item.options.logprobs >= 0) {
    // Raw model distribution (log_softmax of the logits, before temperature and filters).
    nlohmann::json lps = nlohmann::json::array();
    for (size_t t = 0; t < r.logprobs.size() && t < r.output_token_ids.size(); ++t) {
      nlohmann::json top = nlohmann::json::array();
      for (const TopLogprob& e : r.logprobs[t].top) top.push_back({{"token_id", e.token}, {"logprob", e.logprob}});
      lps.push_back({{"token_id", r.output_token_ids[t]}, {"logprob", r.logprobs[t].logprob}, {"top_logprobs", top}});
    }
    o["logprobs"] = std::move(lps);
  }
  return o;
}

int run_single_prompt(GenerateFlags& f, Engine& engine, const PromptBuilder& builder, const nlohmann::json& kwargs) {
  Expected<std::vector<int32_t>> ids = f.chat ? builder.from_messages(nlohmann::json::array({{{"role", "user"}, {"content", f.prompt}}}), kwargs)
                                              : builder.from_text(f.prompt);
  if (!ids) {
    print_error(ids.status().to_string());
    return kExitFailure;
  }
  Expected<RequestId> id = engine.add_request(*ids, f.sampling);
  if (!id) {
    print_error(id.status().to_string());
    return kExitFailure;
  }
  // Stream the completion as it is produced.
  FinishReason reason = FinishReason::kNone;
  std::string error;
  bool aborted = false;
  while (engine.has_unfinished()) {
    if (interrupt_signal() != 0 && !aborted) {
      engine.abort_request(*id);
      aborted = true;
    }
    for (const RequestOutput& out : engine.step()) {
      std::fputs(out.new_text.c_str(), stdout);
      std::fflush(stdout);
      if (out.finished) {
        reason = out.finish_reason;
        error = out.error;
      }
    }
  }
  std::fputs("\n", stdout);
  if (!flush_stdout()) return kExitFailure;
  if (reason == FinishReason::kAborted) {
    report_interrupted("the completion above is partial");
    return interrupted_exit_code();
  }
  if (reason == FinishReason::kError) {
    print_error(error);
    return kExitFailure;
  }
  return kExitOk;
}

int run_generate(GenerateFlags& f) {
  if (!finalize_engine_flags(&f.engine) || !finalize_sampling_flags(&f.sampling, f.seed_text)) return kExitUsage;
  const bool batch_mode = !f.input_path.empty();
  if (batch_mode == !f.prompt.empty()) {
    print_error("give either --prompt TEXT or --input FILE.jsonl");
    return kExitUsage;
  }
  if (!batch_mode && f.logprobs >= 0) {
    print_error("--logprobs adds log-probabilities to the JSON results of an --input batch; give --input FILE.jsonl");
    return kExitUsage;
  }
  if (!batch_mode && !f.output_path.empty()) {
    print_error("--output is for --input batches; a --prompt completion is printed to stdout");
    return kExitUsage;
  }
  Expected<nlohmann::json> kwargs_json = parse_json(f.chat_template_kwargs, kRequestJsonMaxDepth);
  if (!kwargs_json || !kwargs_json->is_object()) {
    print_error("--chat-template-kwargs must be a JSON object" +
                (kwargs_json ? std::string() : " (" + kwargs_json.status().message() + ")"));
    return kExitUsage;
  }
  const nlohmann::json kwargs = std::move(*kwargs_json);
  // A FIFO, /dev/stdin, <(...) or "-" is fine: it is read once, after the model loads.
  if (batch_mode) {
    if (Status st = check_input_path("--input", f.input_path); !st.is_ok()) {
      print_error(st.message());
      return kExitUsage;
    }
    if (Status st = check_not_input("--input", f.input_path, "--output", f.output_path); !st.is_ok()) {
      print_error(st.message());
      return kExitUsage;
    }
  }
  // The output is opened (and truncated) before the model loads: a bad path fails at once.
  OutputFile out;
  if (batch_mode) {
    if (Status st = out.open("--output", f.output_path); !st.is_ok()) {
      print_error(st.message());
      return kExitUsage;
    }
  }

  std::unique_ptr<Engine> engine = create_engine(f.engine.config);
  if (!engine) return kExitFailure;
  if (interrupt_signal() != 0) {
    report_interrupted("nothing was run");
    return interrupted_exit_code();
  }
  PromptBuilder builder(engine->tokenizer());
  if (!batch_mode) return run_single_prompt(f, *engine, builder, kwargs);

  Expected<std::vector<JsonlRequest>> requests = read_jsonl_requests(input_source(f.input_path), builder, f.sampling);
  if (!requests) {
    print_error("--input: " + requests.status().message());
    return kExitUsage;
  }
  std::vector<BatchItem> items;
  items.reserve(requests->size());
  for (JsonlRequest& r : *requests) {
    r.item.options.logprobs = f.logprobs;
    items.push_back(r.item);
  }

  OrderedResultWriter writer(&out, items.size());
  ProgressBar bar("generate");
  int failures = 0, capped = 0;
  BatchHooks hooks;
  hooks.progress = [&](size_t done, size_t total) { bar.update(done, total, engine->metrics().num_generated_tokens); };
  hooks.on_result = [&](size_t i, const BatchResult& r) {
    if (r.finish_reason == FinishReason::kAborted) return;  // not finished: not written
    if (!r.ok) ++failures;
    if (r.ok && r.finish_reason == FinishReason::kLength &&
        static_cast<int>(r.output_token_ids.size()) < items[i].sampling.max_tokens)
      ++capped;
    writer.add(i, result_json(i, (*requests)[i], r).dump());
  };
  hooks.should_stop = [&] { return interrupt_signal() != 0 || writer.failed(); };
  std::vector<BatchResult> results = run_batch(*engine, items, hooks);
  bar.finish();
  writer.write_remaining();
  Status closed = out.close();
  if (!writer.status().is_ok() || !closed.is_ok()) {
    print_error(!writer.status().is_ok() ? writer.status().message() : closed.message());
    return kExitFailure;
  }
  if (capped > 0)
    print_warning(std::to_string(capped) + " of " + std::to_string(items.size()) +
                  " requests stopped at the context limit (max_model_len " + std::to_string(engine->config().max_model_len) +
                  " tokens) before max_tokens (finish_reason \"length\")");
  if (failures)
    std::fprintf(stderr, "origami: %d of %zu requests failed (see their \"error\" fields)\n", failures, results.size());
  if (interrupt_signal() != 0) {
    const std::string what = std::to_string(writer.num_written()) + " of " + std::to_string(items.size()) +
                             " results written (sorted by \"index\"; unfinished requests are absent)";
    report_interrupted(what.c_str());
    return interrupted_exit_code();
  }
  return failures > 0 ? kExitFailure : kExitOk;
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
                  "JSONL requests: {\"prompt\" | \"messages\", sampling fields, kv_policy, kv_budget, kv_policy_options...} per line "
                  "(a file, FIFO or <(...); - = stdin)");
  cmd->add_option("--output", flags->output_path, "JSONL results (default: stdout)");
  cmd->add_option("--logprobs", flags->logprobs,
                  "With --input: each result's \"logprobs\" lists every output token's log-probability and the N most "
                  "likely tokens (0-" + std::to_string(kMaxTopLogprobs) + "; the raw model distribution, before temperature)")
      ->check(CLI::Range(0, kMaxTopLogprobs));
  cmd->callback([flags] { set_exit_code(run_generate(*flags)); });
}

}  // namespace origami::cli
