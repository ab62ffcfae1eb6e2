// `origami eval`: fidelity of KV compression policies against full KV (docs/fidelity.md).
//
//   origami eval retrieval --data FILE.jsonl [--mode prefill|stream|context|context-emulated|multiturn,
//                          comma-separated] [--limit N]
//   origami eval ppl --text FILE [--context N] [--limit N]
//
// Both take every engine flag; --kv-policy and --kv-budget take comma-separated lists and run a
// sweep: the full-KV reference once (per mode), then every policy at every budget. One engine
// serves every point: its default policy is full KV (so it allocates query slots and global
// score pages that any policy may use) and each request names its point's policy and budget.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "input_path.h"
#include "commands.h"
#include "engine/engine.h"
#include "engine/policy_resolver.h"
#include "eval/eval_report.h"
#include "eval/eval_runner.h"
#include "eval/perplexity_task.h"
#include "eval/point_applicability.h"
#include "eval/conversation_task.h"
#include "eval/retrieval_task.h"
#include "eval/svg_plot.h"
#include "eval/sweep.h"
#include "policy/kv_budget.h"
#include "interrupt.h"
#include "output_file.h"
#include "policy/policy_registry.h"
#include "progress_bar.h"
#include "sched/compression_state.h"

namespace origami::cli {
namespace {

using eval::EvalTask;
using eval::PointResult;
using eval::SweepPoint;

// The engine's query window when no policy asks for a wider one (engine/kv_memory_plan.cpp).
constexpr int kEngineDefaultQueryWindow = 32;

struct EvalFlags {
  EngineFlags engine;
  std::string policies = eval::kFullPolicy;  // comma-separated (replaces the engine's --kv-policy)
  std::string budgets;                       // comma-separated (replaces the engine's --kv-budget)
  bool json = false;
  bool quiet = false;
  std::string plot_path;
  std::string details_path;
  int limit = 0;
  // retrieval
  std::string data_path;
  std::string modes = "stream";
  int max_answer_tokens = 6;
  // ppl
  std::string text_path;
  int context = 0;  // 0: min(2048, the engine's max model length)
};

// A sweep point with the policy options its requests carry.
struct PlannedPoint {
  SweepPoint point;
  PolicyOptionMap options;
  std::shared_ptr<const KVPolicy> policy;  // as plan_sweep built it from point.policy and options; null for the reference
};

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    std::string part = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t b = part.find_first_not_of(" \t"), e = part.find_last_not_of(" \t");
    parts.push_back(b == std::string::npos ? std::string() : part.substr(b, e - b + 1));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return parts;
}

std::string join(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

// Checks the policy and budget lists and the --kv-policy-opt options against the registry and
// expands them into sweep points. An option applies to every listed policy that declares it;
// one that no listed policy declares is an error. Budgets given to no compressing policy are
// fine (full KV has no budget). A policy swept without budgets runs at its default budget,
// written out so that tables, JSON and plots show the number.
bool plan_sweep(const EvalFlags& f, const PolicyOptionMap& user_options, std::vector<PlannedPoint>* planned,
                int* widest_window) {
  const PolicyRegistry& registry = PolicyRegistry::builtin();
  Expected<std::vector<std::string>> policies = eval::parse_policy_list(f.policies);
  if (!policies) {
    print_error(policies.status().message());
    return false;
  }
  for (const std::string& name : *policies) {
    if (registry.find(name) == nullptr) {
      print_error("--kv-policy: unknown policy '" + name + "'; known policies: " + registry.names());
      return false;
    }
  }
  std::vector<int> budgets;
  if (!f.budgets.empty()) {
    Expected<std::vector<int>> b = eval::parse_budget_list(f.budgets);
    if (!b) {
      print_error(b.status().message());
      return false;
    }
    budgets = *b;
  }
  for (const auto& [key, value] : user_options) {
    bool declared = false;
    for (const std::string& name : *policies)
      for (const PolicyOptionSpec& spec : registry.find(name)->options) declared = declared || spec.name == key;
    if (!declared) {
      print_error("--kv-policy-opt: no policy in the sweep (" + join(*policies) + ") has an option '" + key +
                  "' (see `origami policies`)");
      return false;
    }
  }

  std::map<std::string, PolicyOptionMap> options_of;
  std::map<std::string, std::shared_ptr<const KVPolicy>> policy_of;
  *widest_window = 0;
  for (const std::string& name : *policies) {
    PolicyOptionMap opts;
    for (const PolicyOptionSpec& spec : registry.find(name)->options)
      if (auto it = user_options.find(spec.name); it != user_options.end()) opts[spec.name] = it->second;
    Expected<std::shared_ptr<const KVPolicy>> policy = registry.create(name, opts);
    if (!policy) {
      print_error("--kv-policy-opt: " + policy.status().message());
      return false;
    }
    if ((*policy)->needs().window_queries) *widest_window = std::max(*widest_window, (*policy)->needs().window);
    options_of[name] = std::move(opts);
    policy_of[name] = *policy;
  }
  // A budget that a policy refuses at this block size (pagedeviction needs 2 blocks) drops that
  // point from a sweep with a warning, so one policy's limit does not stop everyone's points;
  // a sweep left with nothing to compare is an error.
  std::vector<std::string> refused;
  for (SweepPoint& p : eval::make_sweep(*policies, budgets)) {
    PlannedPoint pp;
    if (!p.reference) {
      pp.options = options_of[p.policy];
      pp.policy = policy_of[p.policy];
      const KVPolicy& policy = *pp.policy;
      // A policy without a budget (kvllm: a ratio of its sliding window) runs at budget 0.
      const bool budgeted = policy.compresses() && policy.takes_budget();
      if (budgeted) p.budget = resolve_kv_budget(p.budget, 0, policy.default_budget());
      if (budgeted) {
        Status st = policy.check_budget(p.budget, f.engine.config.block_size);
        if (!st.is_ok()) {
          refused.push_back(eval::point_label(p) + ": " + st.message());
          continue;
        }
      }
    } else if (auto it = options_of.find(eval::kFullPolicy); it != options_of.end()) {
      pp.options = it->second;
    }
    pp.point = p;
    planned->push_back(std::move(pp));
  }
  const bool any_compared = std::any_of(planned->begin(), planned->end(), [](const PlannedPoint& pp) { return !pp.point.reference; });
  if (!refused.empty() && !any_compared) {
    print_error(refused.front());
    return false;
  }
  for (const std::string& why : refused) std::fprintf(stderr, "origami: skipped %s\n", why.c_str());
  return true;
}

bool parse_modes(const std::string& text, std::vector<eval::RetrievalMode>* modes) {
  for (const std::string& part : split_list(text)) {
    if (part.empty()) {
      print_error("--mode: '" + text + "' has an empty entry; use prefill, stream, context, context-emulated, multiturn or a comma-separated list");
      return false;
    }
    Expected<eval::RetrievalMode> m = eval::parse_retrieval_mode(part);
    if (!m) {
      print_error(m.status().message());
      return false;
    }
    if (std::find(modes->begin(), modes->end(), *m) != modes->end()) {
      print_error("--mode: '" + part + "' is listed twice");
      return false;
    }
    modes->push_back(*m);
  }
  return true;
}

// One merged plot for several retrieval modes: each policy gets a line per mode.
eval::PlotSpec plot_spec_for(const std::vector<std::vector<PointResult>>& groups, const std::string& title) {
  if (groups.size() == 1) return eval::make_plot_spec(groups.front(), title);
  eval::PlotSpec merged;
  for (const std::vector<PointResult>& group : groups) {
    eval::PlotSpec spec = eval::make_plot_spec(group, title);
    const std::string mode = group.empty() ? "" : group.front().mode;
    if (merged.series.empty() && merged.references.empty()) {
      merged = spec;
      merged.series.clear();
      merged.references.clear();
    }
    for (eval::PlotSeries& s : spec.series) {
      const std::string na = " (n/a)";
      const bool not_applied = s.name.size() > na.size() && s.name.compare(s.name.size() - na.size(), na.size(), na) == 0;
      if (not_applied) s.name.resize(s.name.size() - na.size());
      s.name += " (" + mode + ")" + (not_applied ? na : "");
      merged.series.push_back(std::move(s));
    }
    for (eval::PlotReference& r : spec.references) {
      r.name = "full KV, " + mode + r.name.substr(std::string("full KV").size());
      merged.references.push_back(std::move(r));
    }
  }
  return merged;
}

std::string model_name(const std::string& dir) {
  std::filesystem::path p(dir);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();  // a trailing slash
  return p.filename().string();
}

// The layout the sweep's engine lays its KV out in. The engine runs full KV by default and each
// point's policy per request, so its layout would be one group even for a policy that, served as
// the engine's own (`--kv-policy fastkvzip`), runs on per-head pages. On one group such a policy's
// heads all hold the request's largest count: its KV exceeds the budget it is reported at (Fast
// KVzip at 25% of a document evicted almost nothing there). So when no layout is given
// (--heads-per-group, --kv-head-budgets, --group-budget-ratios) and every compressing point's
// policy prefers per-head pages, the engine takes them, as serving that policy would; a sweep that
// mixes it with policies of one group keeps one group and says which points exceed their budget.
void choose_sweep_layout(const std::vector<PlannedPoint>& planned, EngineConfig* config) {
  if (head_layout_given(*config) || config->tensor_parallel_size > 1) return;
  std::vector<std::string> per_head, one_group;
  for (const PlannedPoint& p : planned) {
    if (p.point.policy == eval::kFullPolicy || p.policy == nullptr) continue;
    std::vector<std::string>& names = p.policy->prefers_per_head_pages() ? per_head : one_group;
    if (std::find(names.begin(), names.end(), p.point.policy) == names.end()) names.push_back(p.point.policy);
  }
  if (per_head.empty()) return;
  if (one_group.empty()) {
    config->heads_per_group = 1;
    return;
  }
  std::string list;
  for (const std::string& n : per_head) list += (list.empty() ? "" : ", ") + n;
  print_warning("--kv-policy " + list + " runs on per-head pages when served, but this sweep also holds policies of one " +
                "page table (" + one_group.front() + (one_group.size() > 1 ? ", ..." : "") +
                "), so every point runs on one group, where each head of a " + list +
                " request holds the request's largest count: its KV exceeds its budget. Evaluate " + list +
                " on its own, or give --heads-per-group 1 (every point on per-head pages)");
}

int run_eval(EvalFlags& f, EvalTask task) {
  const bool retrieval = task == EvalTask::kRetrieval;
  if (!finalize_engine_flags(&f.engine, /*build_default_policy=*/false)) return kExitUsage;
  // The policy options go with each request of a point; the engine itself runs full KV by default.
  const PolicyOptionMap user_options = f.engine.config.kv_policy_options;
  EngineConfig& config = f.engine.config;
  config.kv_policy = eval::kFullPolicy;
  config.kv_budget = 0;
  config.kv_policy_options.clear();

  if (f.limit < 0) {
    print_error("--limit must be >= 0 (0 = all), got " + std::to_string(f.limit));
    return kExitUsage;
  }
  std::vector<PlannedPoint> planned;
  int widest_window = 0;
  if (!plan_sweep(f, user_options, &planned, &widest_window)) return kExitUsage;
  if (config.num_query_slots == -1) {
    for (const PlannedPoint& p : planned) {
      if (p.point.policy != eval::kFullPolicy) {
        print_error("--query-slots -1 turns compression off, but the sweep includes '" + p.point.policy + "'");
        return kExitUsage;
      }
    }
  }
  choose_sweep_layout(planned, &config);
  // Policies are chosen per request, so the engine's query window must fit the widest one.
  if (config.query_window == 0 && widest_window > kEngineDefaultQueryWindow) config.query_window = widest_window;

  // No output may be the input: --details is opened (truncated) before the model loads.
  const std::string input_flag = retrieval ? "--data" : "--text";
  const std::string input_file = retrieval ? f.data_path : f.text_path;
  for (const auto& [flag, path] : {std::pair<std::string, std::string>{"--plot", f.plot_path}, {"--details", f.details_path}}) {
    if (Status st = check_not_input(input_flag, input_file, flag, path); !st.is_ok()) {
      print_error(st.message());
      return kExitUsage;
    }
  }
  std::vector<eval::RetrievalMode> modes;
  std::vector<eval::RetrievalExample> examples;
  std::string text;
  if (retrieval) {
    if (f.data_path.empty()) {
      print_error("--data FILE.jsonl is required");
      return kExitUsage;
    }
    if (f.max_answer_tokens < 1) {
      print_error("--max-answer-tokens must be >= 1, got " + std::to_string(f.max_answer_tokens));
      return kExitUsage;
    }
    if (!parse_modes(f.modes, &modes)) return kExitUsage;
    Expected<std::vector<eval::RetrievalExample>> loaded = eval::load_retrieval_examples(input_source(f.data_path), f.limit);
    if (!loaded) {
      print_error("--data: " + loaded.status().message());
      return kExitUsage;
    }
    examples = std::move(*loaded);
  } else {
    if (f.text_path.empty()) {
      print_error("--text FILE is required");
      return kExitUsage;
    }
    if (f.context != 0 && f.context < 2) {
      print_error("--context must be >= 2 tokens, got " + std::to_string(f.context));
      return kExitUsage;
    }
    Expected<std::string> loaded = eval::read_text_file(input_source(f.text_path));
    if (!loaded) {
      print_error("--text: " + loaded.status().message());
      return kExitUsage;
    }
    text = std::move(*loaded);
  }
  if (!f.plot_path.empty()) {
    const std::string ext = std::filesystem::path(f.plot_path).extension().string();
    if (ext != ".svg" && ext != ".SVG") {
      print_error("--plot: '" + f.plot_path + "': only SVG plots are written; name the file *.svg");
      return kExitUsage;
    }
  }
  // Every output path is checked before the model loads, not after an hour of evaluation.
  if (!f.plot_path.empty()) {
    if (Status st = check_output_path("--plot", f.plot_path); !st.is_ok()) {
      print_error(st.message());
      return kExitUsage;
    }
  }
  OutputFile details_file;
  if (!f.details_path.empty()) {
    if (Status st = details_file.open("--details", f.details_path); !st.is_ok()) {
      print_error(st.message());
      return kExitUsage;
    }
  }

  // Conversation modes continue retained contexts (their own requests only: other modes' items opt out).
  if (std::any_of(modes.begin(), modes.end(), eval::is_conversation_mode)) config.retain_contexts = true;
  std::unique_ptr<Engine> created = create_engine(config);
  if (!created) return kExitFailure;
  Engine& engine = *created;
  // Every point's policy, options and budget as the engine will resolve them: a point the engine
  // would reject fails here, before anything runs.
  // What each budgeted point's compressions keep per (layer, KV head), as the layout holds it
  // (head groups padded to their largest member; pages rounded up): how a calibrated non-uniform
  // point is matched with a uniform one at the same KV bytes.
  std::vector<nlohmann::json> kept_per_point(planned.size());
  for (size_t i = 0; i < planned.size(); ++i) {
    const PlannedPoint& p = planned[i];
    RequestOptions ro;
    ro.kv_policy = p.point.policy;
    ro.kv_budget = p.point.budget;
    ro.kv_policy_options = p.options;
    Expected<RequestCompression> c = resolve_request_compression(engine.config(), engine.compression_support(), ro);
    if (!c) {
      print_error(eval::point_label(p.point) + ": " + c.status().message());
      return kExitUsage;
    }
    if (c->enabled() && c->policy->takes_budget()) {
      const int groups = std::max<int>(1, static_cast<int>(c->group_ratios.size()));
      const int block = engine.config().block_size;
      kept_per_point[i] = {{"kv_kept_entries", mean_kept_entries(*c, groups, block, false)},
                           {"kv_kept_paged_entries", mean_kept_entries(*c, groups, block, true)}};
    }
  }

  const Tokenizer& tokenizer = *engine.tokenizer();
  std::vector<std::vector<int32_t>> windows;
  int context = f.context;
  if (!retrieval) {
    const int max_len = engine.config().max_model_len;
    if (context == 0) context = std::min(2048, max_len);
    if (context > max_len) {
      print_error("--context " + std::to_string(context) + " exceeds the engine's maximum sequence length of " +
                  std::to_string(max_len) + " tokens (--max-model-len)");
      return kExitUsage;
    }
    windows = eval::make_windows(tokenizer.encode(text, /*add_special_tokens=*/true), context, f.limit);
    if (windows.empty()) {
      print_error("--text: '" + f.text_path + "' has fewer than 2 tokens");
      return kExitUsage;
    }
  }

  // One list of requests per mode (perplexity: one, stream), built before anything runs: a
  // document context mode cannot split is an error up front.
  const std::vector<eval::RetrievalMode> group_modes = retrieval ? modes : std::vector<eval::RetrievalMode>{eval::RetrievalMode::kStream};
  std::vector<std::vector<eval::EvalItem>> items_of_mode;
  std::vector<std::vector<eval::ConversationItem>> conversations_of_mode;
  for (eval::RetrievalMode mode : group_modes) {
    std::vector<eval::EvalItem>& items = items_of_mode.emplace_back();
    std::vector<eval::ConversationItem>& conversations = conversations_of_mode.emplace_back();
    if (retrieval) {
      for (const eval::RetrievalExample& ex : examples) {
        if (eval::is_conversation_mode(mode)) {
          Expected<eval::ConversationItem> c =
              eval::make_conversation_item(tokenizer, ex, /*first_turn_only=*/mode == eval::RetrievalMode::kContext);
          if (!c) {
            print_error("--data: " + f.data_path + ": --mode " + eval::retrieval_mode_name(mode) + ": " + c.status().message());
            return kExitUsage;
          }
          conversations.push_back(std::move(*c));
        }
        Expected<eval::EvalItem> item = eval::make_retrieval_item(tokenizer, ex, mode, f.max_answer_tokens);
        if (!item) {
          print_error("--data: " + f.data_path + ": --mode " + eval::retrieval_mode_name(mode) + ": " + item.status().message());
          return kExitUsage;
        }
        items.push_back(std::move(*item));
      }
    } else {
      for (const std::vector<int32_t>& w : windows) items.push_back(eval::make_perplexity_item(w));
    }
  }

  nlohmann::json run_info = eval::engine_config_json(engine.config());
  run_info["query_slots"] = engine.compression_support().num_query_slots;
  run_info["query_window"] = engine.compression_support().max_window;
  if (retrieval) {
    run_info["data"] = f.data_path;
    run_info["max_answer_tokens"] = f.max_answer_tokens;
  } else {
    run_info["text"] = f.text_path;
    run_info["context"] = context;
  }
  run_info["limit"] = f.limit;

  // One group of results per mode (perplexity: one group, stream), each with its reference.
  std::vector<std::vector<PointResult>> groups;
  std::vector<nlohmann::json> json_lines;
  int status = kExitOk;
  int num_skipped_points = 0;  // not run or cut short by a signal
  for (size_t m = 0; m < group_modes.size(); ++m) {
    const eval::RetrievalMode mode = group_modes[m];
    const std::vector<eval::EvalItem>& items = items_of_mode[m];
    // The KV a document holds before its answer: what a budget is compared with.
    int max_document_tokens = 0;
    for (const eval::EvalItem& item : items)
      max_document_tokens = std::max(max_document_tokens, static_cast<int>(item.prompt_token_ids.size() + item.forced_token_ids.size()));
    std::vector<PointResult>& group = groups.emplace_back();
    for (const PlannedPoint& p : planned) {
      if (interrupt_signal() != 0) {
        ++num_skipped_points;
        continue;
      }
      const std::string label = std::string(retrieval ? "retrieval " : "ppl ") +
                                (retrieval ? std::string(eval::retrieval_mode_name(mode)) + " " : "") +
                                eval::point_label(p.point);
      const EngineMetrics before = engine.metrics();
      const auto start = std::chrono::steady_clock::now();
      ProgressBar bar(label);
      const eval::PolicyChoice choice{p.point.policy, p.point.budget, p.options};
      BatchHooks hooks;
      hooks.progress = [&](size_t done, size_t total) {
        if (!f.quiet) bar.update(done, total, engine.metrics().num_generated_tokens - before.num_generated_tokens);
      };
      hooks.should_stop = [] { return interrupt_signal() != 0; };
      const bool conversation = retrieval && eval::is_conversation_mode(mode);
      std::vector<eval::EvalItemResult> results;
      std::vector<std::vector<eval::EvalItemResult>> turns;
      if (conversation) {
        turns = eval::run_conversations(engine, conversations_of_mode[m], choice, f.max_answer_tokens, hooks);
        engine.release_retained_contexts();  // the next point starts from an empty pool
      } else {
        results = eval::run_eval_batch(engine, items, choice, hooks);
      }
      if (!f.quiet) bar.finish();
      if (interrupt_signal() != 0) {
        // A point cut short would be scored on the documents that happened to finish first.
        ++num_skipped_points;
        continue;
      }
      PointResult r;
      r.point = p.point;
      r.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      r.num_steps = engine.metrics().num_steps - before.num_steps;
      for (size_t i = 0; i < results.size(); ++i)
        if (results[i].ok)
          r.num_output_tokens += static_cast<int64_t>(items[i].forced_token_ids.size() + results[i].generated_token_ids.size());
      for (const auto& conv : turns)
        for (const eval::EvalItemResult& t : conv)
          if (t.ok) r.num_output_tokens += static_cast<int64_t>(t.generated_token_ids.size());
      std::vector<nlohmann::json> details;
      std::vector<int> turn_correct, turn_counts;
      if (conversation) {
        r.mode = eval::retrieval_mode_name(mode);
        eval::score_conversations(tokenizer, examples, turns, &r, mode == eval::RetrievalMode::kContext, &turn_correct,
                                  &turn_counts, details_file.is_open() ? &details : nullptr);
        for (nlohmann::json& d : details) d["mode"] = r.mode;
      } else if (retrieval) {
        r.mode = eval::retrieval_mode_name(mode);
        eval::score_retrieval(tokenizer, examples, results, &r, details_file.is_open() ? &details : nullptr);
        for (nlohmann::json& d : details) d["mode"] = r.mode;
      } else {
        eval::score_perplexity(results, &r);
        if (details_file.is_open()) {
          for (size_t i = 0; i < results.size(); ++i) {
            nlohmann::json d = {{"window", i},
                                {"policy", p.point.policy},
                                {"budget", p.point.budget},
                                {"tokens", results[i].forced_logprobs.size()}};
            if (results[i].ok) {
              eval::NllTotal nll;
              nll.add_logprobs(results[i].forced_logprobs);
              d["mean_nll"] = nll.mean_nll();
              d["ppl"] = nll.perplexity();
            } else {
              d["error"] = results[i].error;
            }
            details.push_back(std::move(d));
          }
        }
      }
      for (const nlohmann::json& d : details) {
        if (Status st = details_file.write(d.dump() + "\n"); !st.is_ok()) {
          print_error(st.message());
          return kExitFailure;
        }
      }
      r.num_compressions = engine.metrics().num_compressions - before.num_compressions;
      r.evicted_tokens = engine.metrics().num_evicted_tokens - before.num_evicted_tokens;
      r.num_preemptions = engine.metrics().num_preemptions - before.num_preemptions;
      r.max_document_tokens = max_document_tokens;
      eval::decide_applicability(&r);
      if (!r.applies && !f.quiet) std::fprintf(stderr, "origami: %s: n/a: %s\n", label.c_str(), r.not_applied_reason.c_str());
      if (retrieval && mode == eval::RetrievalMode::kContextEmulated && r.num_preemptions > 0) {
        // A request preempted between its document and its compression is recomputed with the
        // question tokens it already has, so those enter the compression's window.
        std::fprintf(stderr,
                     "origami: warning: %s: %lld preemptions; a document preempted before its compression is "
                     "compressed with part of its question (give the engine more KV memory: --kv-cache-memory)\n",
                     label.c_str(), static_cast<long long>(r.num_preemptions));
      }
      if (r.num_failed > 0) {
        std::fprintf(stderr, "origami: %s: %d of %d %s failed: %s\n", label.c_str(), r.num_failed, r.num_documents,
                     retrieval ? "documents" : "windows", r.first_error.c_str());
        status = kExitFailure;  // the point is still reported, over the documents that ran
      }
      nlohmann::json extra = run_info;
      extra["kv_policy_options"] = p.options;
      if (mode == eval::RetrievalMode::kMultiturn && retrieval) {
        // Accuracy of each turn over the documents that have it (later turns see more history).
        nlohmann::json per_turn = nlohmann::json::array();
        std::string line;
        for (size_t t = 0; t < turn_counts.size(); ++t) {
          const double acc = turn_counts[t] > 0 ? static_cast<double>(turn_correct[t]) / turn_counts[t] : 0.0;
          per_turn.push_back({{"turn", t + 1}, {"documents", turn_counts[t]}, {"accuracy", acc}});
          line += (t ? "  " : "") + std::to_string(t + 1) + ": " + std::to_string(static_cast<int>(acc * 1000 + 0.5) / 10.0).substr(0, 5) + "%";
        }
        extra["turn_accuracy"] = per_turn;
        if (!f.quiet) std::fprintf(stderr, "origami: %s: accuracy per turn: %s\n", label.c_str(), line.c_str());
      }
      const size_t index = static_cast<size_t>(&p - planned.data());
      if (kept_per_point[index].is_object())
        for (const auto& [key, value] : kept_per_point[index].items()) extra[key] = value;
      group.push_back(std::move(r));
      const PointResult* reference = group.front().point.reference ? &group.front() : nullptr;
      json_lines.push_back(eval::point_json(group.back(), reference, extra));
      if (f.json) {
        std::cout << json_lines.back().dump() << std::endl;
        if (!flush_stdout()) return kExitFailure;
      }
    }
  }

  // An interrupted run may leave a mode with no finished point.
  std::erase_if(groups, [](const std::vector<PointResult>& g) { return g.empty(); });
  if (!f.json) {
    for (size_t g = 0; g < groups.size(); ++g) {
      if (g > 0) std::cout << "\n";
      std::cout << eval::format_table(groups[g]);
    }
    std::cout.flush();
  }
  if (!f.plot_path.empty() && !groups.empty()) {
    std::string title;
    if (retrieval) {
      std::vector<std::string> names;
      for (eval::RetrievalMode m : modes) names.push_back(eval::retrieval_mode_name(m));
      title = "Retrieval accuracy vs KV budget (" + model_name(config.model_dir) + ", " + join(names) + ", " +
              std::to_string(examples.size()) + " documents)";
    } else {
      title = "Perplexity vs KV budget (" + model_name(config.model_dir) + ", " + std::to_string(windows.size()) +
              " windows of " + std::to_string(context) + " tokens)";
    }
    Status st = eval::write_svg_plot(f.plot_path, plot_spec_for(groups, title));
    if (!st.is_ok()) {
      print_error(st.message());
      return kExitFailure;
    }
  }
  if (Status st = details_file.close(); !st.is_ok()) {
    print_error(st.message());
    return kExitFailure;
  }
  if (!flush_stdout()) return kExitFailure;
  if (interrupt_signal() != 0) {
    const std::string what = std::to_string(num_skipped_points) +
                             " sweep points were not run or were cut short and are left out of the results above";
    report_interrupted(what.c_str());
    return interrupted_exit_code();
  }
  return status;
}

void add_eval_flags(CLI::App* cmd, EvalFlags* f) {
  add_engine_flags(cmd, &f->engine);
  // The sweep takes lists: replace the engine's single-valued --kv-policy / --kv-budget.
  cmd->remove_option(cmd->get_option("--kv-policy"));
  cmd->remove_option(cmd->get_option("--kv-budget"));
  cmd->add_option("--kv-policy", f->policies,
                  "Policies to compare with full KV, comma-separated, e.g. streaming,snapkv,zipage (see `origami policies`)")
      ->capture_default_str();
  cmd->add_option("--kv-budget", f->budgets,
                  "KV budgets in tokens per request, comma-separated, e.g. 256,512,1024 (default: each policy's own)");
  cmd->add_flag("--json", f->json, "Print one JSON object per (mode, policy, budget) instead of the table");
  cmd->add_option("--plot", f->plot_path, "Write the metric vs budget as an SVG plot, one line per policy");
  cmd->add_option("--details", f->details_path, "Write one JSON record per document (window) and point");
  cmd->add_flag("--quiet", f->quiet, "No progress bar");
}

}  // namespace

void register_eval_command(CLI::App& app) {
  CLI::App* eval_cmd = app.add_subcommand("eval", "Fidelity of KV compression policies against full KV (docs/fidelity.md)");
  eval_cmd->require_subcommand(1);

  auto r = std::make_shared<EvalFlags>();
  CLI::App* retrieval = eval_cmd->add_subcommand("retrieval", "Long-range retrieval accuracy (exact match of a 4-digit secret)");
  add_eval_flags(retrieval, r.get());
  retrieval->add_option("--data", r->data_path,
                        "JSONL documents: {\"id\", \"prompt\", \"answer\"} or {\"id\", \"context\", \"turns\": "
                        "[{\"question\", \"answer\"}, ...]} per line (- = stdin)");
  retrieval->add_option("--mode", r->modes,
                        "prefill (the document is the prompt), stream (fed as forced decode tokens), context (the "
                        "document retained and compressed by one request, its question continuing it in a second), "
                        "context-emulated (the same in one request: the question as forced tokens), multiturn (every "
                        "question in sequence, each turn continuing the previous one's KV), or a comma-separated "
                        "list, e.g. prefill,context,stream")
      ->capture_default_str();
  retrieval->add_option("--limit", r->limit, "Evaluate the first N documents (0 = all)");
  retrieval->add_option("--max-answer-tokens", r->max_answer_tokens, "Tokens generated for the answer")->capture_default_str();
  retrieval->callback([r] { set_exit_code(run_eval(*r, EvalTask::kRetrieval)); });

  auto p = std::make_shared<EvalFlags>();
  CLI::App* ppl = eval_cmd->add_subcommand("ppl", "Perplexity with the text fed as forced decode tokens under each policy");
  add_eval_flags(ppl, p.get());
  ppl->add_option("--text", p->text_path, "Plain text file (- = stdin)");
  ppl->add_option("--context", p->context, "Window length in tokens (default: 2048 or the model's maximum length if smaller)");
  ppl->add_option("--limit", p->limit, "Evaluate the first N windows (0 = all)");
  ppl->callback([p] { set_exit_code(run_eval(*p, EvalTask::kPerplexity)); });
}

}  // namespace origami::cli
