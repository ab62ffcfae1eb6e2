#include "kv/head_budgets.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/file_io.h"
#include "core/json_parse.h"

namespace origami {
namespace {

using nlohmann::json;

std::string num(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// A [layers][heads] matrix field: the right shape, every value finite and within its range.
Status check_matrix(const std::vector<std::vector<double>>& m, const char* name, int layers, int heads, double lo,
                    bool lo_open, double hi) {
  if (static_cast<int>(m.size()) != layers)
    return invalid_argument(std::string(name) + " has " + std::to_string(m.size()) + " layers, expected " +
                            std::to_string(layers) + " (model.num_layers)");
  for (int l = 0; l < layers; ++l) {
    if (static_cast<int>(m[l].size()) != heads)
      return invalid_argument(std::string(name) + "[" + std::to_string(l) + "] has " + std::to_string(m[l].size()) +
                              " heads, expected " + std::to_string(heads) + " (model.num_kv_heads)");
    for (int h = 0; h < heads; ++h) {
      const double v = m[l][h];
      const bool low = lo_open ? !(v > lo) : !(v >= lo);
      if (!std::isfinite(v) || low || v > hi)
        return invalid_argument(std::string(name) + "[" + std::to_string(l) + "][" + std::to_string(h) + "] = " +
                                num(v) + " is not in " + (lo_open ? "(" : "[") + num(lo) + ", " +
                                (std::isinf(hi) ? std::string("inf)") : num(hi) + "]"));
    }
  }
  return Status::ok();
}

// Reads JSON fields by dotted name, so every error says which field is missing or mistyped.
class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  Status object(const json& parent, const std::string& key, const std::string& path, const json** out) const {
    ORIGAMI_RETURN_IF_ERROR(find(parent, key, path, out));
    if (!(*out)->is_object()) return wrong(path, "an object");
    return Status::ok();
  }
  Status integer(const json& parent, const std::string& key, const std::string& path, int* out) const {
    const json* v = nullptr;
    ORIGAMI_RETURN_IF_ERROR(find(parent, key, path, &v));
    if (!v->is_number_integer()) return wrong(path, "an integer");
    const int64_t x = v->get<int64_t>();
    if (x < -(int64_t{1} << 31) || x >= (int64_t{1} << 31)) return wrong(path, "a 32-bit integer");
    *out = static_cast<int>(x);
    return Status::ok();
  }
  Status number(const json& parent, const std::string& key, const std::string& path, double* out) const {
    const json* v = nullptr;
    ORIGAMI_RETURN_IF_ERROR(find(parent, key, path, &v));
    return as_number(*v, path, out);
  }
  Status string(const json& parent, const std::string& key, const std::string& path, std::string* out) const {
    const json* v = nullptr;
    ORIGAMI_RETURN_IF_ERROR(find(parent, key, path, &v));
    if (!v->is_string()) return wrong(path, "a string");
    *out = v->get<std::string>();
    return Status::ok();
  }
  Status int_list(const json& parent, const std::string& key, const std::string& path, std::vector<int>* out) const {
    const json* v = nullptr;
    ORIGAMI_RETURN_IF_ERROR(find(parent, key, path, &v));
    if (!v->is_array()) return wrong(path, "a list of integers");
    for (size_t i = 0; i < v->size(); ++i) {
      const json& e = (*v)[i];
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= (int64_t{1} << 31))
        return wrong(path + "[" + std::to_string(i) + "]", "a non-negative integer");
      out->push_back(static_cast<int>(e.get<int64_t>()));
    }
    return Status::ok();
  }
  // A list of lists of numbers; null (how JSON writers spell NaN) reads as NaN, so that the range
  // check names it.
  Status matrix(const json& parent, const std::string& key, std::vector<std::vector<double>>* out) const {
    const json* v = nullptr;
    ORIGAMI_RETURN_IF_ERROR(find(parent, key, key, &v));
    if (!v->is_array()) return wrong(key, "a list (one list of per-head values per layer)");
    for (size_t l = 0; l < v->size(); ++l) {
      const json& row = (*v)[l];
      const std::string row_path = key + "[" + std::to_string(l) + "]";
      if (!row.is_array()) return wrong(row_path, "a list of per-head numbers");
      std::vector<double> values;
      for (size_t h = 0; h < row.size(); ++h) {
        double x = 0.0;
        if (row[h].is_null()) {
          x = std::nan("");
        } else {
          ORIGAMI_RETURN_IF_ERROR(as_number(row[h], row_path + "[" + std::to_string(h) + "]", &x));
        }
        values.push_back(x);
      }
      out->push_back(std::move(values));
    }
    return Status::ok();
  }

 private:
  Status find(const json& parent, const std::string& key, const std::string& path, const json** out) const {
    auto it = parent.find(key);
    if (it == parent.end()) return invalid_file(source_ + ": missing field '" + path + "'");
    *out = &*it;
    return Status::ok();
  }
  Status as_number(const json& v, const std::string& path, double* out) const {
    if (!v.is_number()) return wrong(path, "a number");
    *out = v.get<double>();
    return Status::ok();
  }
  Status wrong(const std::string& path, const char* expected) const {
    return invalid_file(source_ + ": field '" + path + "' must be " + expected);
  }

  std::string source_;
};

nlohmann::ordered_json matrix_json(const std::vector<std::vector<double>>& m) {
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const auto& row : m) rows.push_back(row);
  return rows;
}

}  // namespace

double HeadBudgets::mean_ratio() const {
  double sum = 0.0;
  size_t count = 0;
  for (const auto& row : ratios) {
    for (double r : row) sum += r;
    count += row.size();
  }
  return count ? sum / static_cast<double>(count) : 0.0;
}

int ratio_token_budget(double ratio, int num_tokens) {
  if (num_tokens <= 0) return 0;
  const double tokens = std::ceil(ratio * static_cast<double>(num_tokens) - 1e-9);
  return static_cast<int>(std::clamp(tokens, 1.0, static_cast<double>(num_tokens)));
}

std::vector<std::vector<int>> HeadBudgets::token_budgets(int num_tokens) const {
  std::vector<std::vector<int>> out(ratios.size());
  for (size_t l = 0; l < ratios.size(); ++l)
    for (size_t h = 0; h < ratios[l].size(); ++h)
      out[l].push_back(head_token_budget(static_cast<int>(l), static_cast<int>(h), num_tokens));
  return out;
}

std::vector<std::vector<int>> HeadBudgets::scaled_token_budgets(int avg_tokens, int num_tokens) const {
  ORIGAMI_CHECK(avg_tokens >= 1 && num_tokens >= 1);
  const double n = static_cast<double>(num_tokens);
  const int per_head = std::min(avg_tokens, num_tokens);
  std::vector<std::vector<int>> out(ratios.size());
  for (size_t l = 0; l < ratios.size(); ++l) {
    const std::vector<double>& b = ratios[l];
    const int heads = static_cast<int>(b.size());
    const int64_t target = static_cast<int64_t>(per_head) * heads;
    // share(s) = clamp(s * B * N, 1, N) summed over heads is continuous and non-decreasing in s,
    // H at s = 0 (<= target) and H * N for s large enough (>= target): bisect for s.
    auto total = [&](double s) {
      double t = 0.0;
      for (double r : b) t += std::clamp(s * r * n, 1.0, n);
      return t;
    };
    double lo = 0.0, hi = 1.0;
    while (total(hi) < static_cast<double>(target) && hi < 1e300) hi *= 2.0;
    for (int it = 0; it < 200; ++it) {
      const double mid = 0.5 * (lo + hi);
      if (total(mid) < static_cast<double>(target)) lo = mid; else hi = mid;
    }
    std::vector<double> share(heads);
    std::vector<int> budget(heads);
    int64_t assigned = 0;
    for (int h = 0; h < heads; ++h) {
      share[h] = std::clamp(hi * b[h] * n, 1.0, n);
      budget[h] = static_cast<int>(std::floor(share[h]));
      assigned += budget[h];
    }
    // Largest remainder: the heads with the largest fractional parts (ties to the lower index)
    // get one more entry until the layer's total is exact; the bisection's upper end makes the
    // shares sum to at least the target, so only fractional parts are handed out (never past N).
    // Fractional parts on a 1e-9 grid, so that shares equal up to the bisection's last bits
    // count as ties (and go to the lower index) rather than to whichever rounded up.
    std::vector<int64_t> frac(heads);
    for (int h = 0; h < heads; ++h) frac[h] = std::llround((share[h] - std::floor(share[h])) * 1e9);
    std::vector<int> order(heads);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return frac[x] > frac[y]; });
    for (int i = 0; assigned < target && i < heads; ++i) {
      const int h = order[i];
      if (budget[h] < num_tokens) {
        ++budget[h];
        ++assigned;
      }
    }
    for (int i = 0; assigned > target && i < heads; ++i) {  // the shares overshot by rounding
      const int h = order[heads - 1 - i];
      if (budget[h] > 1) {
        --budget[h];
        --assigned;
      }
    }
    out[l] = std::move(budget);
  }
  return out;
}

Status validate_head_budgets(const HeadBudgets& b) {
  if (b.version != kHeadBudgetsVersion)
    return invalid_argument("version " + std::to_string(b.version) + " is not supported (this build reads version " +
                            std::to_string(kHeadBudgetsVersion) + ")");
  const ModelIdentity& m = b.model;
  if (m.model_type.empty()) return invalid_argument("model.model_type is empty");
  const std::pair<const char*, int> sizes[] = {{"num_layers", m.num_layers},
                                                {"num_kv_heads", m.num_kv_heads},
                                                {"num_attention_heads", m.num_attention_heads},
                                                {"head_dim", m.head_dim},
                                                {"hidden_size", m.hidden_size},
                                                {"vocab_size", m.vocab_size}};
  for (const auto& [name, value] : sizes)
    if (value < 1) return invalid_argument(std::string("model.") + name + " = " + std::to_string(value) + " must be >= 1");
  if (b.scorer.empty()) return invalid_argument("calibration.scorer is empty");
  if (!std::isfinite(b.alpha) || b.alpha < 0.0)
    return invalid_argument("calibration.alpha = " + num(b.alpha) + " must be a finite number >= 0");
  if (!(b.rho > 0.0 && b.rho <= 1.0)) return invalid_argument("calibration.rho = " + num(b.rho) + " is not in (0, 1]");
  if (b.samples < 1) return invalid_argument("calibration.samples = " + std::to_string(b.samples) + " must be >= 1");
  if (static_cast<int>(b.sample_tokens.size()) != b.samples)
    return invalid_argument("calibration.sample_tokens has " + std::to_string(b.sample_tokens.size()) +
                            " entries, expected calibration.samples = " + std::to_string(b.samples));
  for (size_t i = 0; i < b.sample_tokens.size(); ++i)
    if (b.sample_tokens[i] < 1)
      return invalid_argument("calibration.sample_tokens[" + std::to_string(i) + "] = " +
                              std::to_string(b.sample_tokens[i]) + " must be >= 1");
  ORIGAMI_RETURN_IF_ERROR(check_matrix(b.ratios, "ratios", m.num_layers, m.num_kv_heads, 0.0, true, 1.0));
  ORIGAMI_RETURN_IF_ERROR(check_matrix(b.mean, "mean", m.num_layers, m.num_kv_heads, 0.0, false, 1.0));
  ORIGAMI_RETURN_IF_ERROR(
      check_matrix(b.stddev, "std", m.num_layers, m.num_kv_heads, 0.0, false, std::numeric_limits<double>::infinity()));
  return Status::ok();
}

Status check_head_budgets_model(const HeadBudgets& b, const ModelIdentity& model) {
  const std::string hint = " (the budgets were calibrated for another model: run `origami calibrate` for this one)";
  if (b.model.model_type != model.model_type)
    return invalid_argument("model.model_type is not the model's '" + model.model_type + "'" + hint);
  const std::tuple<const char*, int, int> sizes[] = {
      {"num_layers", b.model.num_layers, model.num_layers},
      {"num_kv_heads", b.model.num_kv_heads, model.num_kv_heads},
      {"num_attention_heads", b.model.num_attention_heads, model.num_attention_heads},
      {"head_dim", b.model.head_dim, model.head_dim},
      {"hidden_size", b.model.hidden_size, model.hidden_size},
      {"vocab_size", b.model.vocab_size, model.vocab_size}};
  for (const auto& [name, file_value, model_value] : sizes)
    if (file_value != model_value)
      return invalid_argument(std::string("model.") + name + " is " + std::to_string(file_value) +
                              " but the model's is " + std::to_string(model_value) + hint);
  return Status::ok();
}

std::string head_budgets_to_json(const HeadBudgets& b) {
  const Status valid = validate_head_budgets(b);
  ORIGAMI_CHECK_MSG(valid.is_ok(), valid.message().c_str());
  nlohmann::ordered_json j;  // written in the order a reader looks for things
  j["format"] = kHeadBudgetsFormat;
  j["version"] = b.version;
  j["model"] = {{"model_type", b.model.model_type},
                {"num_layers", b.model.num_layers},
                {"num_kv_heads", b.model.num_kv_heads},
                {"num_attention_heads", b.model.num_attention_heads},
                {"head_dim", b.model.head_dim},
                {"hidden_size", b.model.hidden_size},
                {"vocab_size", b.model.vocab_size}};
  j["calibration"] = {{"scorer", b.scorer},
                      {"alpha", b.alpha},
                      {"rho", b.rho},
                      {"samples", b.samples},
                      {"sample_tokens", b.sample_tokens}};
  j["ratios"] = matrix_json(b.ratios);
  j["mean"] = matrix_json(b.mean);
  j["std"] = matrix_json(b.stddev);
  return j.dump(2) + "\n";
}

Expected<HeadBudgets> parse_head_budgets(const std::string& text, const std::string& source) {
  Expected<json> parsed = parse_json(text, kFileJsonMaxDepth);
  // Never nlohmann's own message: it quotes the bytes the parser last read (parse_json gives where).
  if (!parsed) return invalid_file(source + ": malformed JSON: " + parsed.status().message());
  return parse_head_budgets_json(*parsed, source);
}

Expected<HeadBudgets> parse_head_budgets_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) return invalid_file(source + ": expected a JSON object (a head budget file)");
  const Reader r(source);
  std::string format;
  ORIGAMI_RETURN_IF_ERROR(r.string(j, "format", "format", &format));
  if (format != kHeadBudgetsFormat)
    return invalid_file(source + ": field 'format' is not '" + kHeadBudgetsFormat + "' (not a head budget file)");
  HeadBudgets b;
  ORIGAMI_RETURN_IF_ERROR(r.integer(j, "version", "version", &b.version));
  if (b.version != kHeadBudgetsVersion)
    return invalid_file(source + ": version " + std::to_string(b.version) +
                        " is not supported (this build reads version " + std::to_string(kHeadBudgetsVersion) +
                        "); recalibrate with this build's `origami calibrate`");
  const json* model = nullptr;
  ORIGAMI_RETURN_IF_ERROR(r.object(j, "model", "model", &model));
  ModelIdentity& m = b.model;
  ORIGAMI_RETURN_IF_ERROR(r.string(*model, "model_type", "model.model_type", &m.model_type));
  ORIGAMI_RETURN_IF_ERROR(r.integer(*model, "num_layers", "model.num_layers", &m.num_layers));
  ORIGAMI_RETURN_IF_ERROR(r.integer(*model, "num_kv_heads", "model.num_kv_heads", &m.num_kv_heads));
  ORIGAMI_RETURN_IF_ERROR(r.integer(*model, "num_attention_heads", "model.num_attention_heads", &m.num_attention_heads));
  ORIGAMI_RETURN_IF_ERROR(r.integer(*model, "head_dim", "model.head_dim", &m.head_dim));
  ORIGAMI_RETURN_IF_ERROR(r.integer(*model, "hidden_size", "model.hidden_size", &m.hidden_size));
  ORIGAMI_RETURN_IF_ERROR(r.integer(*model, "vocab_size", "model.vocab_size", &m.vocab_size));
  const json* cal = nullptr;
  ORIGAMI_RETURN_IF_ERROR(r.object(j, "calibration", "calibration", &cal));
  ORIGAMI_RETURN_IF_ERROR(r.string(*cal, "scorer", "calibration.scorer", &b.scorer));
  ORIGAMI_RETURN_IF_ERROR(r.number(*cal, "alpha", "calibration.alpha", &b.alpha));
  ORIGAMI_RETURN_IF_ERROR(r.number(*cal, "rho", "calibration.rho", &b.rho));
  ORIGAMI_RETURN_IF_ERROR(r.integer(*cal, "samples", "calibration.samples", &b.samples));
  ORIGAMI_RETURN_IF_ERROR(r.int_list(*cal, "sample_tokens", "calibration.sample_tokens", &b.sample_tokens));
  ORIGAMI_RETURN_IF_ERROR(r.matrix(j, "ratios", &b.ratios));
  ORIGAMI_RETURN_IF_ERROR(r.matrix(j, "mean", &b.mean));
  ORIGAMI_RETURN_IF_ERROR(r.matrix(j, "std", &b.stddev));
  Status st = validate_head_budgets(b);
  if (!st.is_ok()) return invalid_file(source + ": " + st.message());
  return b;
}

Expected<HeadBudgets> load_head_budgets(const std::string& path, const ModelIdentity* model) {
  ORIGAMI_ASSIGN_OR_RETURN(std::string text, read_small_regular_file(path, kMaxHeadBudgetsFileBytes));
  ORIGAMI_ASSIGN_OR_RETURN(HeadBudgets b, parse_head_budgets(text, path));
  if (model != nullptr) {
    Status st = check_head_budgets_model(b, *model);
    if (!st.is_ok()) return invalid_argument(path + ": " + st.message());
  }
  return b;
}

Status save_head_budgets(const HeadBudgets& budgets, const std::string& path) {
  ORIGAMI_RETURN_IF_ERROR(validate_head_budgets(budgets));
  const std::string text = head_budgets_to_json(budgets);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return invalid_argument(path + ": cannot open '" + tmp + "' for writing");
    out << text;
    out.flush();
    if (!out) {
      out.close();
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      return invalid_argument(path + ": write error");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    return invalid_argument(path + ": cannot write (" + ec.message() + ")");
  }
  return Status::ok();
}

}  // namespace origami
