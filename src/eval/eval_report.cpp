#include "eval/eval_report.h"

#include <cstdio>
#include <map>

namespace origami::eval {
namespace {

const PointResult* find_reference(const std::vector<PointResult>& results) {
  for (const PointResult& r : results)
    if (r.point.reference) return &r;
  return nullptr;
}

std::string fixed(double v, int decimals) {
  if (!std::isfinite(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// NaN is not JSON; null says "no value" to every reader.
nlohmann::json number_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

}  // namespace

nlohmann::json engine_config_json(const EngineConfig& c) {
  return {{"model", c.model_dir},
          {"device", c.device},
          {"dummy_weights", c.dummy_weights},
          {"quantization", c.quantization},
          {"block_size", c.block_size},
          {"heads_per_group", c.heads_per_group},  // 0: one group (the model's KV heads share a table)
          {"kv_cache_dtype", kv_cache_dtype_name(c.kv_cache_dtype)},
          {"max_num_seqs", c.max_num_seqs},
          {"max_num_batched_tokens", c.max_num_batched_tokens},
          {"enable_chunked_prefill", c.enable_chunked_prefill},
          {"enable_prefix_caching", c.enable_prefix_caching},
          {"max_model_len", c.max_model_len},
          {"kv_cache_bytes", c.kv_cache_bytes},
          {"num_kv_blocks", c.num_kv_blocks},
          {"kv_policy_options", c.kv_policy_options},
          {"async_compression", c.async_compression},
          {"async_scheduling", c.async_scheduling},
          {"compression_layer_stride", c.compression_layer_stride},
          {"threads", c.num_threads},
          {"seed", c.seed}};
}

nlohmann::json point_json(const PointResult& r, const PointResult* reference, const nlohmann::json& engine) {
  nlohmann::json j;
  const bool retrieval = r.task == EvalTask::kRetrieval;
  j["task"] = retrieval ? "retrieval" : "ppl";
  j["policy"] = r.point.policy;
  j["budget"] = r.point.budget;
  j["reference"] = r.point.reference;
  j["mode"] = r.mode;
  j["num_documents"] = r.num_documents;
  j["failed"] = r.num_failed;
  if (!r.first_error.empty()) j["error"] = r.first_error;
  const double ref = reference ? reference->metric() : std::numeric_limits<double>::quiet_NaN();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // A point whose policy never acted has no metric of its own (eval/point_applicability.h).
  const double metric = r.applies ? r.metric() : nan;
  j["applies"] = r.applies;
  if (!r.applies) j["not_applied"] = r.not_applied_reason;
  if (retrieval) {
    j["accuracy"] = number_or_null(metric);
    j["correct"] = r.num_correct;
    j["accuracy_full"] = number_or_null(ref);
    // Relative fidelity: 1.0 = as accurate as full KV.
    j["accuracy_ratio"] = number_or_null(ref > 0 ? metric / ref : nan);
  } else {
    j["ppl"] = number_or_null(metric);
    j["mean_nll"] = number_or_null(r.applies && r.nll.num_tokens ? r.nll.mean_nll() : nan);
    j["num_tokens"] = r.nll.num_tokens;
    j["ppl_full"] = number_or_null(ref);
    // 1.0 = no loss; above 1 the policy's perplexity is that many times full KV's.
    j["ppl_ratio"] = number_or_null(ref > 0 ? metric / ref : nan);
  }
  j["num_compressions"] = r.num_compressions;
  j["evicted_tokens"] = r.evicted_tokens;
  j["num_preemptions"] = r.num_preemptions;
  j["max_document_tokens"] = r.max_document_tokens;
  j["wall_seconds"] = r.wall_seconds;
  j["num_steps"] = r.num_steps;
  j["num_output_tokens"] = r.num_output_tokens;
  for (const auto& [key, value] : engine.items())
    if (!j.contains(key)) j[key] = value;
  return j;
}

std::string format_table(const std::vector<PointResult>& results) {
  const PointResult* ref = find_reference(results);
  const bool retrieval = !results.empty() && results.front().task == EvalTask::kRetrieval;
  std::string out;
  char line[256];
  if (retrieval) {
    std::snprintf(line, sizeof line, "%-18s %8s %8s %9s %9s %8s %7s %9s\n", "policy", "budget", "mode", "accuracy",
                  "correct", "vs full", "failed", "time (s)");
  } else {
    std::snprintf(line, sizeof line, "%-18s %8s %8s %10s %10s %8s %7s %9s\n", "policy", "budget", "windows", "tokens",
                  "ppl", "vs full", "failed", "time (s)");
  }
  out += line;
  for (const PointResult& r : results) {
    const std::string budget = r.point.reference ? "-" : r.point.budget > 0 ? std::to_string(r.point.budget) : "default";
    const double ref_value = ref ? ref->metric() : std::numeric_limits<double>::quiet_NaN();
    const double ratio = ref_value > 0 ? r.metric() / ref_value : std::numeric_limits<double>::quiet_NaN();
    // n/a: the policy never acted here (eval/point_applicability.h); its number would be full KV's.
    const std::string na = "n/a";
    if (retrieval) {
      const std::string correct = r.applies ? std::to_string(r.num_correct) + "/" + std::to_string(r.num_documents) : na;
      std::snprintf(line, sizeof line, "%-18s %8s %8s %9s %9s %8s %7d %9.1f\n", r.point.policy.c_str(), budget.c_str(),
                    r.mode.c_str(), r.applies ? fixed(r.accuracy(), 3).c_str() : na.c_str(), correct.c_str(),
                    r.applies ? fixed(ratio, 3).c_str() : na.c_str(), r.num_failed, r.wall_seconds);
    } else {
      std::snprintf(line, sizeof line, "%-18s %8s %8d %10lld %10s %8s %7d %9.1f\n", r.point.policy.c_str(), budget.c_str(),
                    r.num_documents, static_cast<long long>(r.nll.num_tokens),
                    r.applies ? fixed(r.perplexity(), 3).c_str() : na.c_str(), r.applies ? fixed(ratio, 3).c_str() : na.c_str(),
                    r.num_failed, r.wall_seconds);
    }
    out += line;
  }
  bool any_not_applied = false;
  for (const PointResult& r : results) any_not_applied = any_not_applied || !r.applies;
  if (any_not_applied)
    out += "n/a: the policy compressed nothing although the documents exceed its budget (not a score)\n";
  return out;
}

PlotSpec make_plot_spec(const std::vector<PointResult>& results, const std::string& title) {
  PlotSpec spec;
  spec.title = title;
  spec.x_label = "KV budget (tokens per request)";
  const bool retrieval = !results.empty() && results.front().task == EvalTask::kRetrieval;
  spec.y_label = retrieval ? "retrieval accuracy" : "perplexity";
  if (retrieval) {
    spec.y_min = 0.0;
    spec.y_max = 1.0;
  }
  // Series in the order policies first appear.
  std::vector<std::string> order;
  std::map<std::string, PlotSeries> by_policy;
  for (const PointResult& r : results) {
    if (r.point.reference) {
      spec.references.push_back(PlotReference{"full KV (" + fixed(r.metric(), 3) + ")", r.metric()});
      continue;
    }
    if (r.point.budget <= 0) continue;  // a policy default has no place on a budget axis
    if (!by_policy.count(r.point.policy)) {
      order.push_back(r.point.policy);
      by_policy[r.point.policy].name = r.point.policy;
    }
    // A point where the policy never acted is left out: its value would be full KV's.
    if (r.applies) by_policy[r.point.policy].points.emplace_back(static_cast<double>(r.point.budget), r.metric());
  }
  for (const std::string& p : order) {
    PlotSeries& s = by_policy[p];
    if (s.points.empty()) s.name += " (n/a)";  // listed, with no line: it never compressed here
    spec.series.push_back(std::move(s));
  }
  return spec;
}

}  // namespace origami::eval
