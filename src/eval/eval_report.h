#pragma once
// How sweep results are shown: one JSON object per point, a table, and a plot of the metric
// against the KV budget (one line per policy, full KV as a dashed reference).
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine_config.h"
#include "eval/eval_result.h"
#include "eval/svg_plot.h"

namespace origami::eval {

// The engine settings a result depends on (model, device, block size, KV memory, batching).
nlohmann::json engine_config_json(const EngineConfig& config);

// One result as JSON: task, policy, budget, mode, documents, failures, accuracy (+ correct) or
// ppl (+ tokens, mean NLL), the reference's value and the ratio to it, timing, and the
// `engine` fields merged in at the top level. NaN metrics are written as null, and so are the
// metrics of a point that does not apply ("applies": false, "not_applied": the reason).
nlohmann::json point_json(const PointResult& result, const PointResult* reference, const nlohmann::json& engine);

// A fixed-width table of all results (the first one with point.reference set is the reference);
// points that do not apply show n/a, with a note under the table.
std::string format_table(const std::vector<PointResult>& results);

// Metric vs budget: one series per non-reference policy (points with budget > 0 that apply; a
// policy with none is still named in the legend, "NAME (n/a)", without a line), the reference
// as a horizontal line. Accuracy plots span [0, 1].
PlotSpec make_plot_spec(const std::vector<PointResult>& results, const std::string& title);

}  // namespace origami::eval
