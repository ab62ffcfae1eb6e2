#include "eval/sweep.h"

#include <algorithm>
#include <charconv>

#include "policy/kv_budget.h"
#include "policy/policy_registry.h"

namespace origami::eval {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Splits on commas, keeping empty entries so that "a,,b" can be reported.
std::vector<std::string_view> split_commas(std::string_view text) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    parts.push_back(trim(text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start)));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return parts;
}

}  // namespace

Expected<std::vector<std::string>> parse_policy_list(std::string_view text) {
  if (trim(text).empty()) return invalid_argument("--kv-policy: the list of policies is empty");
  std::vector<std::string> names;
  const auto parts = split_commas(text);
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].empty())
      return invalid_argument("--kv-policy: entry " + std::to_string(i + 1) + " of '" + std::string(text) + "' is empty");
    std::string name(parts[i]);
    if (std::find(names.begin(), names.end(), name) != names.end())
      return invalid_argument("--kv-policy: '" + name + "' is listed twice");
    names.push_back(std::move(name));
  }
  return names;
}

Expected<std::vector<int>> parse_budget_list(std::string_view text) {
  if (trim(text).empty()) return invalid_argument("--kv-budget: the list of budgets is empty");
  std::vector<int> budgets;
  const auto parts = split_commas(text);
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string_view p = parts[i];
    if (p.empty())
      return invalid_argument("--kv-budget: entry " + std::to_string(i + 1) + " of '" + std::string(text) + "' is empty");
    long long value = 0;
    const auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), value);
    if (ec != std::errc() || end != p.data() + p.size())
      return invalid_argument("--kv-budget: '" + std::string(p) + "' is not a whole number of tokens");
    if (value < 1 || value > kMaxKvBudget)
      return invalid_argument("--kv-budget: " + std::string(p) + " is out of range; a budget is a positive number of tokens");
    if (std::find(budgets.begin(), budgets.end(), static_cast<int>(value)) != budgets.end())
      return invalid_argument("--kv-budget: " + std::string(p) + " is listed twice");
    budgets.push_back(static_cast<int>(value));
  }
  std::sort(budgets.begin(), budgets.end());
  return budgets;
}

std::vector<SweepPoint> make_sweep(const std::vector<std::string>& policies, const std::vector<int>& budgets) {
  std::vector<SweepPoint> points;
  points.push_back(SweepPoint{kFullPolicy, 0, /*reference=*/true});
  for (const std::string& policy : policies) {
    if (policy == kFullPolicy) continue;  // the reference already covers it
    // A policy that takes no budget (a sliding window's ratio, `kvllm`) runs once, at its options.
    auto created = PolicyRegistry::builtin().create(policy);
    if (budgets.empty() || (created && !(*created)->takes_budget())) {
      points.push_back(SweepPoint{policy, 0, false});
      continue;
    }
    for (int b : budgets) points.push_back(SweepPoint{policy, b, false});
  }
  return points;
}

std::string point_label(const SweepPoint& point) {
  if (point.reference) return point.policy;
  return point.policy + "@" + (point.budget > 0 ? std::to_string(point.budget) : std::string("default"));
}

}  // namespace origami::eval
