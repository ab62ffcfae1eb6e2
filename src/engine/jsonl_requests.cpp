#include "engine/jsonl_requests.h"

#include <algorithm>
#include <fstream>

#include "core/json_excerpt.h"
#include "core/json_parse.h"
#include "engine/request_fields.h"
#include "engine/request_options_json.h"
#include "engine/sampling_json.h"

namespace origami {
namespace {

std::vector<std::string> known_fields() {
  std::vector<std::string> fields = {kRequestIdField};
  for (const auto* list : {&PromptBuilder::json_fields(), &sampling_json_fields(), &request_options_json_fields()})
    fields.insert(fields.end(), list->begin(), list->end());
  return fields;
}

}  // namespace

std::string check_request_fields(const nlohmann::json& request) {
  if (!request.is_object()) return "a request must be a JSON object, got " + json_excerpt(request);
  static const std::vector<std::string> kKnown = known_fields();
  if (std::string msg = unknown_field_error(request, kKnown); !msg.empty()) {
    std::string all;
    for (const std::string& k : kKnown) all += (all.empty() ? "" : ", ") + k;
    return msg + "; known fields: " + all;
  }
  return "";
}

Expected<std::vector<JsonlRequest>> read_jsonl_requests(const std::string& path, const PromptBuilder& builder,
                                                        const SamplingParams& defaults) {
  std::ifstream in(path);
  if (!in) return not_found("cannot open '" + path + "'");
  std::vector<JsonlRequest> requests;
  // A line's "kv_head_budgets" path is the operator's own file: read here, once per path, as the
  // line is parsed (never on the engine thread), and refused unless a small regular file.
  const HeadBudgetsResolver head_budgets = head_budgets_file_resolver();
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    JsonlRequest& r = requests.emplace_back();
    BatchItem& item = r.item;
    const std::string where = path + ":" + std::to_string(line_no) + ": ";
    item.label = where;
    if (line.find_first_not_of(" \t\r") == std::string::npos) {
      item.error = where + "blank line (every line must be one request; results keep index = line number - 1)";
      continue;
    }
    Expected<nlohmann::json> parsed = parse_json(line, kRequestJsonMaxDepth);
    if (!parsed) {
      item.error = where + parsed.status().message();
      continue;
    }
    nlohmann::json obj = std::move(*parsed);
    if (obj.is_object() && obj.contains(kRequestIdField)) r.id = obj[kRequestIdField];
    if (std::string bad = check_request_fields(obj); !bad.empty()) {
      item.error = where + bad;
      continue;
    }
    Expected<std::vector<int32_t>> ids = builder.from_json(obj);
    Expected<SamplingParams> sp = sampling_params_from_json(obj, defaults);
    Expected<RequestOptions> opts = request_options_from_json(obj, {}, head_budgets);
    if (!ids) item.error = where + ids.status().message();
    else if (!sp) item.error = where + sp.status().message();
    else if (!opts) item.error = where + opts.status().message();
    else {
      item.prompt_token_ids = std::move(*ids);
      item.sampling = std::move(*sp);
      item.options = std::move(*opts);
    }
  }
  if (in.bad()) return invalid_file("'" + path + "': read error after line " + std::to_string(line_no));
  return requests;
}

}  // namespace origami
